"""A sequence lock: searches run beside writers and still see one state of a composite.

A composite (a ``Searcher``: an index and its vectors; a ``ShardedIndex``: several shards)
is written in several steps. Writers take the lock one at a time and bump a version before
and after a write, so the version is odd while one is under way; a reader notes the version,
reads without any lock, and keeps its result only if the version was even and did not move
(Lameter, "Effective synchronization on Linux/NUMA systems", 2005: the Linux seqlock).
After a few overlapped tries the reader takes the lock itself, so a stream of writes
cannot starve it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["SeqLock"]

T = TypeVar("T")


class SeqLock:
    """Writers one at a time (:meth:`writing`); readers optimistic (:meth:`read`).

    ``reentrant=True`` lets a writer call a method that takes :attr:`lock` again.
    """

    def __init__(self, tries: int = 3, *, reentrant: bool = False):
        self.lock: Any = threading.RLock() if reentrant else threading.Lock()
        self.version = 0  # odd while a write is under way
        self.tries = tries

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the lock for one write; the version is odd inside."""
        with self.lock:
            self.version += 1
            try:
                yield
            finally:
                self.version += 1

    def read(
        self,
        fn: Callable[..., T],
        *args: Any,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> T:
        """``fn(*args)`` as of one state: run again when it overlapped a write (or raised
        ``retry_on``, as a read of a half-written state may); the last try holds the lock,
        where ``retry_on`` propagates."""
        for _ in range(self.tries):
            version = self.version
            if version % 2:
                continue
            try:
                result = fn(*args)
            except retry_on:
                continue
            if version == self.version:
                return result
        with self.lock:
            return fn(*args)
