"""Reusing large result arrays: memory that is already mapped is twice as fast to write.

Writing a freshly allocated 64 MB array costs about twice a copy into existing memory: the
operating system maps every page on first touch. A collective must hand each rank an array
of its own, but in a training loop the previous step's result is usually dropped by the time
the next one is made. :class:`ArrayPool` keeps the large arrays it handed out and gives one
back out once nothing else refers to it: neither the caller, nor a view of it (a view's
``.base`` is the array), nor a Tensor or torch tensor wrapping it.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np

MIN_POOLED_BYTES = 1 << 20
"""Smaller arrays come from the ordinary allocator (which already reuses small blocks)."""


def _references_when_only_pooled() -> int:
    # The reference count getrefcount reports, inside ArrayPool.empty's loop, for an array
    # that only the pool holds (the list, the loop variable, getrefcount's argument).
    owners = [np.empty(1)]
    for array in owners:
        return sys.getrefcount(array)
    raise AssertionError


_UNUSED = _references_when_only_pooled()


class ArrayPool:
    """Hands out C-contiguous arrays, reusing the large ones nothing else refers to anymore.

    ``max_bytes`` bounds the memory the pool keeps; beyond it arrays are simply allocated.
    Call :meth:`clear` to let the kept memory go (a simulated world does at the end of a run).
    """

    def __init__(self, max_bytes: int = 2 << 30) -> None:
        self.max_bytes = max_bytes
        self._owned: dict[tuple[tuple[int, ...], np.dtype], list[np.ndarray]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype`` that no one else uses."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_POOLED_BYTES:
            return np.empty(shape, dtype)
        key = (tuple(shape), dtype)
        with self._lock:
            owned = self._owned.setdefault(key, [])
            for array in owned:
                if sys.getrefcount(array) == _UNUSED:
                    return array
            array = np.empty(shape, dtype)
            if self._bytes + nbytes <= self.max_bytes:
                owned.append(array)
                self._bytes += nbytes
            return array

    def clear(self) -> None:
        """Forget every kept array (those still in use stay valid: they are ordinary arrays)."""
        with self._lock:
            self._owned.clear()
            self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes
