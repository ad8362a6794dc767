"""Page-locking host memory for a GPU's copies, page by page (ps.torch's
CUDA staging: _exchange.py)."""

import bisect
import ctypes
import mmap

import torch


# cudaErrorHostMemoryAlreadyRegistered: some of the pages were locked already
_CUDA_ALREADY_REGISTERED = 712


def _cudart_clear_error():
    """A function that clears the CUDA runtime's last error.

    A failed runtime call leaves its error behind as the thread's "last
    error" even when the caller handles it, and torch checks every kernel
    launch with cudaGetLastError: the next launch would raise an error that
    was not its own.  torch's cudart binding has no cudaGetLastError, so it
    is called in the libcudart this process already loaded (the one torch
    uses: the same file is the same library).  Where torch has the runtime
    linked in, a kernel launch consumes the error instead: its check raises
    it, and clears it first."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libcudart.so" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).cudaGetLastError
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return fn

    def by_launch():
        try:
            torch.zeros(1, device="cuda")
        except RuntimeError:
            pass
    return by_launch


class _Pinner:
    """Page-locks host memory for DMA copies to and from the GPU, page by page.

    cudaHostRegister locks whole pages, and a range that overlaps one already
    registered fails ("part or all of the requested memory range is already
    mapped").  The exchange's buffers are 64-byte aligned, so small ones share
    pages: registering each buffer failed from the second on.  So this
    registers page-aligned runs of pages not yet locked, each page once, and
    clears the runtime's error after any failure (see _cudart_clear_error).
    Best effort: a buffer left unpinned works, only its copies are slower.
    register(addr, bytes, flags) -> int and unregister(addr) are
    cudaHostRegister and cudaHostUnregister; clear() clears the last error."""

    def __init__(self, register, unregister, clear, page=mmap.PAGESIZE):
        self._register, self._unregister, self._clear = register, unregister, clear
        self.page = page
        self._runs = []        # sorted (first page, last page) locked, by us or found locked
        self.ranges = []       # (address, bytes) we registered, for unpin_all
        self.error = 0         # the first failure but "already registered": pinning stops

    def pin(self, ptr, nbytes):
        if self.error or nbytes <= 0:
            return
        cur, last = ptr // self.page, (ptr + nbytes - 1) // self.page
        gaps = []
        for a, b in self._runs:
            if a > last:
                break
            if b >= cur:
                if a > cur:
                    gaps.append((cur, a - 1))
                cur = b + 1
        if cur <= last:
            gaps.append((cur, last))
        for a, b in gaps:
            if not self.error:
                self._pin_run(a, b)

    def _pin_run(self, a, b):
        addr, size = a * self.page, (b - a + 1) * self.page
        rc = int(self._register(addr, size, 0))
        if rc == 0:
            self.ranges.append((addr, size))
        else:
            self._clear()
            if rc != _CUDA_ALREADY_REGISTERED:
                self.error = rc
                return
        bisect.insort(self._runs, (a, b))

    def unpin_all(self):
        for addr, _ in self.ranges:
            if int(self._unregister(addr)) != 0:
                self._clear()
        self.ranges = []
        self._runs = []
