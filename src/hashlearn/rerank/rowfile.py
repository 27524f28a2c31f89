"""RowFile: the rows of a float matrix on disk, read by explicit I/O of only the rows asked for.

A refine stage rescores a few hundred scattered rows per query. Through a memory map, even one
advised ``MADV_RANDOM``, a row costs at least the 4 KiB page it sits on (10.7x the bytes of a
96-d float32 row; ``bench/rerank_store.py``), and the pages stay in the page cache, so an index
whose vectors file is larger than RAM evicts itself. A ``RowFile`` reads each batch of rows
with ``O_DIRECT`` (Linux): the page cache is bypassed and a row costs the disk's logical blocks
it spans (512 B: one or two per 384-byte row, about 2.3x its bytes on average). Rows whose
blocks touch are read in one request; requests go out on a few threads, so a cold disk sees
several at a time. Where ``O_DIRECT`` is refused (tmpfs, macOS) rows are read with plain
``pread`` advised ``POSIX_FADV_RANDOM`` (page granularity, the page cache in the way).

Used by :class:`~hashlearn.rerank.store.VectorStore` for saves loaded with
``mmap="direct"`` (``Searcher.load``, ``EmbeddingIndex.load``).
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import threading
import weakref

import numpy as np

__all__ = ["RowFile"]

#: requests at most this many at a time (a virtio or NVMe queue takes them in parallel)
_READERS = 8
#: a batch of fewer requests than this is read on the calling thread
_SERIAL_BELOW = 32
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _readers() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(_READERS, "hashlearn-rowfile")
        return _pool


class RowFile:
    """Rows ``0..n-1`` of a C-ordered ``(n, d)`` float array stored at byte ``offset`` of
    ``path`` (a ``.npy`` body, for instance), read on demand by :meth:`take`.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "v.npy")
    >>> np.save(path, np.arange(12, dtype=np.float32).reshape(4, 3))
    >>> rows = RowFile.of(np.load(path, mmap_mode="r"))
    >>> rows.take(np.array([1, 3])).tolist()
    [[3.0, 4.0, 5.0], [9.0, 10.0, 11.0]]
    """

    def __init__(self, path: str | os.PathLike, offset: int, shape: tuple[int, int], dtype):
        self.path = os.fspath(path)
        self.offset = int(offset)
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64) or self.offset % self.dtype.itemsize:
            raise ValueError(f"RowFile needs float32/float64 rows at an aligned offset: {self!r}")
        self.row_bytes = self.shape[1] * self.dtype.itemsize
        end = self.offset + self.shape[0] * self.row_bytes
        size = os.stat(self.path).st_size
        if size < end:
            raise ValueError(f"{self.path} holds {size} bytes; rows end at byte {end}")
        self._fd, self.block, self.direct = _open(self.path)
        weakref.finalize(self, os.close, self._fd)

    @classmethod
    def of(cls, arr) -> RowFile:
        """The file under a C-contiguous ``numpy.memmap`` (or a view of its whole extent)."""
        base = arr
        while base is not None and not isinstance(base, np.memmap):
            base = getattr(base, "base", None)
        filename = getattr(base, "filename", None)
        whole = base is not None and base.size == arr.size
        if filename is None or arr.ndim != 2 or not arr.flags.c_contiguous or not whole:
            raise ValueError("direct reads need the vectors memory-mapped from a file (mmap=True)")
        return cls(filename, base.offset, arr.shape, arr.dtype)  # type: ignore[union-attr]

    def __reduce__(self):  # re-opened by path where it is unpickled (a dask worker)
        return RowFile, (self.path, self.offset, self.shape, self.dtype.str)

    def __repr__(self) -> str:
        return f"RowFile({self.path!r}, offset={self.offset}, shape={self.shape}, {self.dtype})"

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows ``rows`` (ascending, distinct, in ``[0, n)``) as a new ``(len, d)`` array."""
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return np.zeros((0, self.shape[1]), self.dtype)
        if rows[0] < 0 or rows[-1] >= self.shape[0] or np.any(rows[1:] <= rows[:-1]):
            raise ValueError(f"rows must be ascending and distinct in [0, {self.shape[0]})")
        b = self.block
        first = self.offset + rows * self.row_bytes  # each row's bytes [first, first + row_bytes)
        lo = first // b * b
        hi = -(-(first + self.row_bytes) // b) * b
        new_run = np.ones(len(rows), bool)
        new_run[1:] = lo[1:] > hi[:-1]  # blocks that touch go in one request
        starts = np.flatnonzero(new_run)
        run_lo = lo[starts]
        run_hi = hi[np.append(starts[1:], len(rows)) - 1]
        lengths = run_hi - run_lo
        at = np.concatenate([[0], np.cumsum(lengths)])  # each request's place in the buffer
        buf = mmap.mmap(-1, int(at[-1]))  # page-aligned, as O_DIRECT wants
        view = memoryview(buf)
        requests = list(zip(run_lo.tolist(), at[:-1].tolist(), lengths.tolist(), strict=True))

        def read(batch):
            for off, place, length in batch:
                _read_fully(self._fd, view[place : place + length], off, self.path)

        if len(requests) < _SERIAL_BELOW:
            read(requests)
        else:
            batches = [requests[i::_READERS] for i in range(_READERS)]
            list(_readers().map(read, batches))
        run_of_row = np.cumsum(new_run) - 1
        place = at[run_of_row] + (first - run_lo[run_of_row])  # bytes into buf
        flat = np.frombuffer(buf, self.dtype)
        return flat[(place // self.dtype.itemsize)[:, None] + np.arange(self.shape[1])]


def _open(path: str) -> tuple[int, int, bool]:
    """``(fd, block, direct)``: the file opened ``O_DIRECT`` with the smallest block size a
    read accepts (512 or 4096), or plainly (advised random access) where that fails."""
    flag = getattr(os, "O_DIRECT", 0)
    plain = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    if flag:
        try:
            fd = os.open(path, plain | flag)
        except OSError:
            pass
        else:
            probe = mmap.mmap(-1, 4096)
            try:
                for block in (512, 4096):
                    try:
                        os.preadv(fd, [memoryview(probe)[:block]], 0)
                        return fd, block, True
                    except OSError:
                        continue
            finally:
                probe.close()
            os.close(fd)
    fd = os.open(path, plain)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd, 1, False


def _read_fully(fd: int, into: memoryview, offset: int, path: str) -> None:
    """Fill ``into`` from ``offset``. A regular file reads short only at its end, which the
    last block of a request may pass: the rest, past the rows, is zero-filled."""
    got = os.preadv(fd, [into], offset)
    if got < len(into):
        into[got:] = bytes(len(into) - got)
