"""A lock's blob index (gemmar_aot.store.blob_index): the code objects a lock names, a frame per rank.

The build writes it beside the lock; a rank getting ready takes its code objects from it, each
checked against the digest and size its lock names, and from the store whatever the index lacks
or holds wrong (said once, at WARNING). Nothing in it is trusted by itself.
"""

from __future__ import annotations

import logging
import shutil

import pytest

from fakes import FakeCommunicator, FakeHipDriver
from gemmar_aot.model.lock import read_lock
from gemmar_aot.runtime import GemmAllReduceOp
from gemmar_aot.store import Store
from gemmar_aot.store.blob_index import BlobIndex, BlobIndexError, build_blob_index, encode_blob_index, lock_rank_blob_groups
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.store.store_errors import BlobNotFoundError

N, WORLD = 1024, 2


def _lock_path(store):
    return store / "locks" / "smoke.lock.json"


def _op(store, lock, rank=0):
    return GemmAllReduceOp(FakeCommunicator(rank=rank, nranks=WORLD), n=N, k=256, m_max=512, artifacts=store,
                           driver=FakeHipDriver([lock]), self_test=False)


def test_the_build_writes_every_code_object_of_the_lock_grouped_by_rank(smoke_store, smoke_lock):
    index = BlobIndex.read(LockBundle(_lock_path(smoke_store)).blob_index)
    st = Store(smoke_store, readonly=True)
    kernels = smoke_lock.kernels()
    assert {e.blob.hash for e in kernels.values()} == {d for g in lock_rank_blob_groups(smoke_lock) for d in g}
    for e in kernels.values():
        assert index.blob(e.blob.hash, e.blob.size) == st.load_blob(e.blob.hash, e.blob.size)
    # rank 0's group is the first frame, and holds rank 0's code objects only
    rank0 = set(lock_rank_blob_groups(smoke_lock)[0])
    assert {index._find(d[:16])[0] for d in rank0} == {0}
    # the same lock and store give the same bytes
    assert build_blob_index(smoke_lock, st.load_blob) == LockBundle(_lock_path(smoke_store)).blob_index.read_bytes()


def test_a_rank_gets_ready_from_the_index_alone(smoke_store, smoke_lock, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    shutil.rmtree(store / "blobs")  # no code object left in the store: only the index can serve them
    op = _op(store, smoke_lock)
    try:
        assert op.m_values == (256, 512)
    finally:
        op.close()


def test_with_both_indexes_beside_the_lock_the_store_is_never_opened(smoke_store, smoke_lock, monkeypatch):
    """Every record and code object of a rank comes from the lock's two indexes: getting ready opens
    no store (it would read its format file for nothing). Without the indexes it is opened."""
    opened = []
    real = Store.__init__
    monkeypatch.setattr(Store, "__init__", lambda self, *a, **k: opened.append(a) or real(self, *a, **k))
    _op(smoke_store, smoke_lock).close()
    assert opened == []


def test_a_store_is_opened_when_an_index_lacks_what_a_rank_needs(smoke_store, smoke_lock, tmp_path, monkeypatch):
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    LockBundle(_lock_path(store)).blob_index.unlink()
    opened = []
    real = Store.__init__
    monkeypatch.setattr(Store, "__init__", lambda self, *a, **k: opened.append(a) or real(self, *a, **k))
    _op(store, smoke_lock).close()
    assert [a[0] for a in opened] == [store]


def test_without_the_index_the_store_serves(smoke_store, smoke_lock, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    LockBundle(_lock_path(store)).blob_index.unlink()
    _op(store, smoke_lock).close()


def test_a_damaged_index_is_said_once_and_the_store_serves(smoke_store, smoke_lock, tmp_path, caplog):
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    path = LockBundle(_lock_path(store)).blob_index
    data = bytearray(path.read_bytes())
    frames = BlobIndex.read(path)._frames
    start = len(data) - sum(len(f) for f in frames)  # after the header's frame
    group0 = len(frames[0])
    data[start + group0 // 2] ^= 0xFF  # in rank 0's frame: its checksum no longer holds
    path.write_bytes(bytes(data))
    with pytest.raises(BlobIndexError, match="does not decompress|truncated"):
        BlobIndex.read(path).blob(lock_rank_blob_groups(smoke_lock)[0][0])
    with caplog.at_level(logging.WARNING, logger="gemmar_aot.runtime"):
        _op(store, smoke_lock, rank=0).close()
    said = [r.getMessage() for r in caplog.records if "blobs.zst" in r.getMessage()]
    assert len(said) == 1 and "reading the code objects from the store instead" in said[0], said


def test_an_index_holding_other_bytes_is_refused_per_code_object(smoke_store, smoke_lock, tmp_path, caplog):
    """A well-formed index whose frame holds another code object under a digest: hashed and
    refused (BlobIndexError), the store serves it; with no store behind it, the store's error."""
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    st = Store(store, readonly=True)
    sizes = {e.blob.hash: e.blob.size for e in smoke_lock.kernels().values()}
    groups = lock_rank_blob_groups(smoke_lock)
    victim = sorted(groups[0])[0]

    def blob_of(d):
        raw = st.load_blob(d, sizes[d])
        return raw[:-1] + bytes([raw[-1] ^ 1]) if d == victim else raw

    path = LockBundle(_lock_path(store)).blob_index
    path.write_bytes(encode_blob_index(groups, blob_of))
    with pytest.raises(BlobIndexError, match=f"is not {victim}"):
        BlobIndex.read(path).blob(victim, sizes[victim])
    with caplog.at_level(logging.WARNING, logger="gemmar_aot.runtime"):
        _op(store, smoke_lock).close()
    assert any(victim in r.getMessage() for r in caplog.records)
    st.blob_path(victim).unlink()
    with pytest.raises(BlobNotFoundError):
        _op(store, smoke_lock)


def test_an_index_of_another_schema_or_not_an_index_is_refused(tmp_path):
    import zstandard

    from gemmar_aot.model.spec import canonical_json

    cctx = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True)
    p = tmp_path / "x.blobs.zst"
    p.write_bytes(cctx.compress(canonical_json({"format": "gemmar-aot blob index", "schema": 99,
                                                "groups": []}).encode()))
    with pytest.raises(BlobIndexError, match="schema 99, this gemmar-aot reads 1"):
        BlobIndex.read(p)
    p.write_bytes(b"not zstd at all")
    with pytest.raises(BlobIndexError, match="its header does not decompress"):
        BlobIndex.read(p)
    assert BlobIndex.read(tmp_path / "absent.blobs.zst") is None


def test_a_lock_read_back_names_the_same_groups(smoke_store):
    lock = read_lock(_lock_path(smoke_store))
    groups = lock_rank_blob_groups(lock)
    variants = {(h.variant.arch, h.variant.nic, h.variant.host_proxy) for h in lock.hipcc}
    jitv2 = {(j.variant.arch, j.variant.nic) for j in lock.jitv2}
    # the hipcc and the JIT v2 code objects: a group per (arch, NIC) a pod can ask for, each kind apart
    assert len(variants) == 5 and len(jitv2) == 2
    whole = len(variants) + len(jitv2)
    assert len(groups) == max(r.rank for t in lock.tuples for r in t.ranks) + 1 + whole
    assert {frozenset(g) for g in groups[-whole:]} == {
        frozenset(h.entry.blob.hash for h in lock.hipcc if (h.variant.arch, h.variant.nic, h.variant.host_proxy) == v)
        for v in variants} | {frozenset(j.entry.blob.hash for j in lock.jitv2 if (j.variant.arch, j.variant.nic) == v)
                              for v in jitv2}


def test_an_index_that_cannot_be_read_is_said_and_the_store_serves(smoke_store, smoke_lock, tmp_path, caplog):
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    path = LockBundle(_lock_path(store)).blob_index
    path.unlink()
    path.mkdir()  # not a file: reading it fails with an OSError
    with caplog.at_level(logging.WARNING, logger="gemmar_aot.runtime"):
        _op(store, smoke_lock).close()
    assert any("cannot be read" in r.getMessage() for r in caplog.records)
