"""Python's cyclic garbage collector held off while a rank gets ready.

Getting ready allocates tens of thousands of small, acyclic objects (the lock's JSON, its
records, code-object metadata, launch plans) and frees most of them again. Each 700
allocations CPython runs a collection, and every tenth of those walks the older
generations too. In a serving process those hold everything torch has allocated, so one
unlucky full collection can cost more than the whole startup. Nothing made while getting
ready needs the collector (reference counting frees it), so it is paused for that window
and given back exactly as it was found.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; re-enable it after only if it was enabled."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
