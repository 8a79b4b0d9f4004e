"""The store used from many threads at once (the remote cache's look-ups and uploads do).

A zstd compressor shared between threads corrupts frames or crashes the process; the
codec keeps one per thread. Before that, this test failed on every run with "zstd round
trip ... failed (Data corruption detected)" or a segmentation fault.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import zstandard

from gemmar_aot.store import Store


@pytest.mark.parametrize("with_dictionary", [False, True])
def test_concurrent_puts_store_exactly_what_was_given(tmp_path, with_dictionary):
    st = Store(tmp_path / "s", durable=False)
    blobs = [os.urandom(1500) + bytes(20000) + os.urandom(1500) + i.to_bytes(4, "little") for i in range(300)]
    if with_dictionary:
        st.local.set_dictionary(zstandard.train_dictionary(16384, blobs[:200]).as_bytes())
    with ThreadPoolExecutor(8) as pool:
        refs = list(pool.map(st.put_blob, blobs))
    fresh = Store(tmp_path / "s", readonly=True)
    assert [fresh.load_blob(r.hash, r.size) for r in refs] == blobs


def test_threads_writing_first_into_an_empty_store_create_it_once(tmp_path):
    """The remote cache's look-up threads may each be the first to write into a new store.

    Without a lock around the store's layout creation, one thread read the new store
    while another was creating it and refused it as "store directories but no
    STORE_FORMAT file" (about one fresh store in fifteen; it failed CI's concurrent-
    builders test). 60 fresh stores make the old race show with near certainty."""
    from gemmar_aot.store.local import DirectoryBackend

    for i in range(60):
        b = DirectoryBackend(tmp_path / f"s{i}", durable=False)
        with ThreadPoolExecutor(8) as pool:
            digests = list(pool.map(lambda j: b.put_blob(os.urandom(64) + bytes([j])), range(8)))
        fresh = DirectoryBackend(tmp_path / f"s{i}", readonly=True)
        assert all(len(fresh.get_blob(d)) == 65 for d in digests)
