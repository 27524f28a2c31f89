"""A forked child can search after its parent ran a multi-threaded search (issue 18 item 2).

Before the fix the child inherited a thread pool object whose threads did not exist in the
child, so a multi-threaded search in the child waited forever. Every child here runs under a
timeout so that a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import pytest

import hashlearn
from hashlearn import FlatIndex, MultiIndexHashing

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or sys.platform == "darwin", reason="needs POSIX fork"
)

N_BITS = 64


def _data():
    rng = np.random.default_rng(0)
    db = rng.integers(0, 256, size=(3000, N_BITS // 8), dtype=np.uint8)
    q = rng.integers(0, 256, size=(600, N_BITS // 8), dtype=np.uint8)
    return db, q


def _child_search(index, q, conn) -> None:
    # Multi-threaded search in the child: this is what hung.
    D, I = index.search(q, 5, n_threads=4)
    conn.send((D, I))
    conn.close()


def _parent_index(kind):
    db, q = _data()
    index = (FlatIndex if kind == "flat" else MultiIndexHashing)(N_BITS)
    index.add(db)
    # The parent runs a multi-threaded search first, so the pool has live threads at fork.
    expected = index.search(q, 5, n_threads=4)
    return index, q, expected


@pytest.mark.parametrize("kind", ["flat", "mih"])
def test_multiprocessing_fork_children_search(kind):
    index, q, (D_ref, I_ref) = _parent_index(kind)
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child_search, args=(index, q, send))
        proc.start()
        send.close()
        try:
            assert recv.poll(30), "forked child did not finish its search within 30 s"
            D, I = recv.recv()
        finally:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        assert proc.exitcode == 0
        np.testing.assert_array_equal(D, D_ref)
        np.testing.assert_array_equal(I, I_ref)


def test_os_fork_child_searches_with_default_threads():
    index, q, (D_ref, I_ref) = _parent_index("flat")
    hashlearn.set_num_threads(4)  # the child's n_threads=None search uses 4 threads
    try:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: exit with 0 only when the search finished and matches
            code = 1
            try:
                os.close(read_fd)
                D, I = index.search(q, 5)
                code = 0 if np.array_equal(D, D_ref) and np.array_equal(I, I_ref) else 2
                os.write(write_fd, b"x")
            finally:
                os._exit(code)
        os.close(write_fd)
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("os.fork child did not finish its search within 30 s")
        os.close(read_fd)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        hashlearn.set_num_threads(None)


def test_parent_pool_still_works_after_fork():
    index, q, (D_ref, I_ref) = _parent_index("flat")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    D, I = index.search(q, 5, n_threads=4)
    np.testing.assert_array_equal(D, D_ref)
    np.testing.assert_array_equal(I, I_ref)
