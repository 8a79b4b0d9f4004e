"""A manifest's closure in the remote cache (gemmar_aot.builder.closure), against a real nginx.

The round trips are counted by a proxy in front of nginx that delays every request (the fault
proxy, given a delay), not guessed. The oracle for every byte is the smoke store the session
compiled itself: the lock a closure-fed build writes must be that store's lock, byte for byte.
The audit of a poisoned closure distrusts every remote hit and compiles the whole manifest, so
that test stands on tests/fixtures/mini.toml's store (one kernel of each family) instead.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from store_health import assert_verifies_clean
from nginx_server import FaultProxy

from test_remote_build import MINI, SMOKE, _build, _lock_bytes, _lock_entries
from gemmar_aot.builder.closure import PACK_PATH
from gemmar_aot.store import Store
from gemmar_aot.store.remote import reapi

pytestmark = pytest.mark.compile

DELAY = 0.05  # seconds a request, as for a runner in another region


def _closure_of(server, key: str):
    ar = reapi.decode_action_result((server.data / "ac" / key).read_bytes())
    return ar.file(PACK_PATH).digest


def test_the_seed_build_uploads_the_closure_and_a_fresh_store_needs_a_few_requests(smoke_store, warm_remote,
                                                                                     tmp_path):
    n = len(_lock_entries(smoke_store))
    with FaultProxy(warm_remote.port, delay=DELAY) as px:
        s = _build(tmp_path / "fresh", px.url)
        seen = list(px.seen)
    c = s["closure"]
    assert c["status"] == "hit" and c["entries"] == n and c["per_key_lookups"] == 0
    assert (s["compiled"], s["local_hits"], s["remote_hits"]) == (0, 0, n)
    assert _lock_bytes(tmp_path / "fresh") == _lock_bytes(smoke_store)
    assert len(seen) == s["remote"]["requests"] == 2, seen  # the entry (the probe too), the pack
    pack = _closure_of(warm_remote, c["key"])
    assert s["remote"]["bytes_down"] <= 1.3 * pack.size
    # every record and code object is in the local store, verified: a second build is all local
    again = _build(tmp_path / "fresh", None)
    assert (again["compiled"], again["local_hits"]) == (0, n)
    st = Store(tmp_path / "fresh")
    for key, (_kind, blob) in _lock_entries(smoke_store).items():
        rec, _code = st.load(key)
        assert rec["blob"]["hash"] == blob


@pytest.mark.parametrize("fault", [("truncate", 100), ("flip", 5000)], ids=["truncated", "damaged"])
def test_a_bad_pack_is_refused_quarantined_and_the_build_looks_up_per_key(smoke_store, warm_remote, tmp_path,
                                                                          fault, capfd):
    n = len(_lock_entries(smoke_store))
    probe = _build(tmp_path / "probe", warm_remote.url)
    pack = _closure_of(warm_remote, probe["closure"]["key"])
    with FaultProxy(warm_remote.port, lambda m, p, _n: fault if m == "GET" and p.endswith(pack.hash) else None) as px:
        s = _build(tmp_path / "b", px.url)
    c = s["closure"]
    assert c["status"] == "refused" and pack.hash in c["problem"]
    assert (s["compiled"], s["remote_hits"], c["per_key_lookups"]) == (0, n, n)
    assert _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)
    reasons = [p.read_text() for p in Store(tmp_path / "b").quarantine_dir.glob("*.reason")]
    assert any(pack.hash in r for r in reasons)
    assert capfd.readouterr().err.count("warning:") == 1


def test_a_closure_entry_of_another_manifest_is_refused(smoke_store, warm_remote, tmp_path, tiny_manifest):
    """A writer points the smoke closure's key at the tiny manifest's closure (valid bytes, every
    digest consistent): the lock inside is another manifest's, so it is refused."""
    probe = _build(tmp_path / "probe", warm_remote.url)
    tiny = _build(tmp_path / "tiny", warm_remote.url, manifest=tiny_manifest)
    assert tiny["closure"]["uploaded"]
    shutil.copyfile(warm_remote.data / "ac" / tiny["closure"]["key"], warm_remote.data / "ac" / probe["closure"]["key"])
    s = _build(tmp_path / "b", warm_remote.url)
    c = s["closure"]
    assert c["status"] == "refused" and "not this manifest's" in c["problem"]
    assert s["compiled"] == 0 and _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)
    assert c["uploaded"]  # the right closure is written back over it
    again = _build(tmp_path / "c", warm_remote.url)
    assert again["closure"]["status"] == "hit"


def test_a_manifest_one_tuple_away_takes_the_latest_closure_and_looks_up_only_the_rest(smoke_store, warm_remote,
                                                                                       tmp_path):
    text = SMOKE.read_text()
    # the second tuple (fused-sdma at K=512) out: its GEMMs are the only kernels it adds
    blocks = re.split(r"(?m)^(?=\[\[tuple\]\])", text)
    assert "k = 512" in blocks[2] and "fused-sdma" in blocks[2]
    reduced = tmp_path / "smoke.toml"
    reduced.write_text("".join(blocks[:2] + blocks[3:]))
    full = _lock_entries(smoke_store)

    s = _build(tmp_path / "reduced", warm_remote.url, manifest=reduced)  # the full closure has all of it
    c = s["closure"]
    assert c["status"] == "partial" and c["per_key_lookups"] == 0 and s["compiled"] == 0
    assert c["entries"] == len(_lock_entries(tmp_path / "reduced")) < len(full)
    assert c["uploaded"]  # now the latest closure of "smoke"
    # the full manifest's own closure gone: it takes the reduced one's and looks up the K=512 GEMMs
    (warm_remote.data / "ac" / _full_closure_key(smoke_store)).unlink()
    with FaultProxy(warm_remote.port, delay=DELAY) as px:
        s = _build(tmp_path / "full", px.url)
    c = s["closure"]
    missing = len(full) - c["entries"]
    assert c["status"] == "partial" and 0 < missing == c["per_key_lookups"]
    assert s["compiled"] == 0 and s["remote_hits"] == len(full)
    # two a kernel (record, code object), and one for each launcher the closure did not bring
    st = Store(smoke_store, readonly=True)
    launchers = lambda keys: {st.get_record(k)["launcher"]["hash"] for k in keys  # noqa: E731
                              if "launcher" in st.get_record(k)}  # a hipcc code object has none
    reduced_keys = set(_lock_entries(tmp_path / "reduced"))
    new_launchers = launchers(set(full) - reduced_keys) - launchers(reduced_keys)
    assert c["per_key_requests"] == 2 * missing + len(new_launchers) and c["per_key_bytes"] > 0
    assert _lock_bytes(tmp_path / "full") == _lock_bytes(smoke_store)
    assert c["uploaded"]


def _full_closure_key(smoke_store: Path) -> str:
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.builder.closure import closure_key
    from gemmar_aot.compiler.keys import derive_code_digest

    lock = read_lock(smoke_store / "locks" / "smoke.lock.json")
    return closure_key(manifest={"name": lock.manifest.name, "sha256": lock.manifest.sha256},
                       profile=lock.toolchain.profile or "default", toolchain_digest=lock.toolchain.digest,
                       keys=lock.kernels(), derive_code=derive_code_digest())


def _forge_closure(server, store: Path, key: str, *, name: str = "smoke", edit_lock=None, edit_index=None) -> None:
    """Put a closure under ``key`` made from lock ``name`` of ``store``, with the lock document and
    the record index bytes passed through ``edit_lock``/``edit_index``: what a writer of the remote
    can do. Every digest of the result is consistent."""
    from lock_docs import read_doc

    from gemmar_aot.model.lock_codec import encode_lock_doc
    from gemmar_aot.model.types import Digest
    from gemmar_aot.builder.closure import INDEX_PATH, LOCK_PATH
    from gemmar_aot.store.pack_encode import pack_closure
    from gemmar_aot.model.bundle import LockBundle

    lock_path = store / "locks" / f"{name}.lock.json"
    doc = read_doc(lock_path)
    index = LockBundle(lock_path).record_index.read_bytes()
    raws = None
    if edit_lock is not None:
        doc, index, raws = edit_lock(doc)
    if edit_index is not None:
        index = edit_index(index)
    lock_bytes = encode_lock_doc(doc)
    st = Store(store, readonly=True)
    if raws is None:
        from gemmar_aot.model.lock import Lock

        raws = {e.blob.hash: st.load_blob(e.blob.hash) for e in Lock.from_bytes(lock_bytes).kernels().values()}
    lock_d, index_d = Digest.of(lock_bytes), Digest.of(index)
    pack = pack_closure(raws, {lock_d.hash: lock_bytes, index_d.hash: index})
    pack_d = Digest.of(pack)
    for d, data in ((pack_d, pack), (lock_d, lock_bytes), (index_d, index)):
        (server.data / "cas" / d.hash).write_bytes(data)
    ar = reapi.ActionResult(tuple(reapi.OutputFile(p, d) for p, d in
                                  ((PACK_PATH, pack_d), (LOCK_PATH, lock_d), (INDEX_PATH, index_d))))
    (server.data / "ac" / key).write_bytes(reapi.encode_action_result(ar))


def test_a_closure_another_gemmar_aot_wrote_is_a_plain_miss_never_quarantined(smoke_store, warm_remote, tmp_path,
                                                                                capfd):
    """Its lock is of another lock schema (every digest consistent, the bytes intact): not this
    gemmar-aot's to read, so neither damage nor a warning. The build goes on to the manifest's
    latest closure (this gemmar-aot's, the probe's), as past an evicted one."""
    from gemmar_aot.model.bundle import LockBundle

    n = len(_lock_entries(smoke_store))
    probe = _build(tmp_path / "probe", warm_remote.url)
    capfd.readouterr()
    from gemmar_aot.model.lock import read_lock

    lock_path = smoke_store / "locks" / "smoke.lock.json"
    index = LockBundle(lock_path).record_index.read_bytes()
    st = Store(smoke_store, readonly=True)
    raws = {e.blob.hash: st.load_blob(e.blob.hash) for e in read_lock(lock_path).kernels().values()}
    _forge_closure(warm_remote, smoke_store, probe["closure"]["key"],
                   edit_lock=lambda doc: ({**doc, "schema": 4}, index, raws))
    s = _build(tmp_path / "b", warm_remote.url)
    c = s["closure"]
    assert (c["status"], c["source"], c["problem"]) == ("partial", "latest", None), c
    assert (s["compiled"], s["remote_hits"], c["per_key_lookups"]) == (0, n, 0)
    assert _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)
    assert not list(Store(tmp_path / "b").quarantine_dir.glob("*.reason"))
    assert "warning:" not in capfd.readouterr().err


def test_a_closure_whose_record_index_is_damaged_inside_is_refused_not_fatal(smoke_store, warm_remote, tmp_path):
    """The pack and every digest are consistent, but one group of the index does not decompress: the
    refusal comes when the group is read (lazily), and the build still goes on per key."""
    from index_frames import read_frames

    probe = _build(tmp_path / "probe", warm_remote.url)

    def damage(index: bytes) -> bytes:
        head, _groups = read_frames_bytes(index)
        start = len(index) - sum(n for n, _p in head["groups"])
        data = bytearray(index)
        data[start + head["groups"][0][0] // 2] ^= 0x20
        return bytes(data)

    def read_frames_bytes(index: bytes):
        p = tmp_path / "idx.zst"
        p.write_bytes(index)
        return read_frames(p)

    _forge_closure(warm_remote, smoke_store, probe["closure"]["key"], edit_index=damage)
    s = _build(tmp_path / "b", warm_remote.url)
    assert s["closure"]["status"] == "refused" and "record index" in s["closure"]["problem"]
    assert s["compiled"] == 0 and _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)


def test_a_poisoned_closure_is_caught_by_the_audit_and_replaced(mini_store, mini_remote, tmp_path):
    """A writer forges the closure: the victim kernel's entry names another kernel's code object,
    with lock, record and index rewritten to agree. The audit catches it, every remote hit is
    distrusted, and the right closure replaces the forged one: the next fresh build, unaudited,
    gets the right lock. (mini.toml: the distrusted remote means compiling the whole manifest.)"""
    import copy

    from lock_docs import kernel_entry

    from gemmar_aot.model.lock_codec import encode_lock_doc
    from gemmar_aot.model.lock import Lock
    from gemmar_aot.store.record import record_digest
    from gemmar_aot.builder.audit import sample
    from gemmar_aot.store.record_index import encode_index, lock_rank_groups
    from test_remote_build import _a_cheap_kernel_with_its_own_blob

    store, remote = mini_store, mini_remote
    probe = _build(tmp_path / "probe", remote.url, MINI)
    victim, vblob = _a_cheap_kernel_with_its_own_blob(store, "mini")
    entries = _lock_entries(store, "mini")
    donor = sorted(k for k, (kd, h) in entries.items() if kd == entries[victim][0] and h != vblob)[0]
    st = Store(store, readonly=True)

    def poison(doc):
        true_rec, _ = st.load(victim)
        donor_rec, _ = st.load(donor)
        forged = {**copy.deepcopy(donor_rec), "key": victim, "spec": true_rec["spec"],
                  "ingredients": true_rec["ingredients"]}
        k = kernel_entry(doc, victim)
        k["blob"] = {"hash": donor_rec["blob"]["hash"], "size": donor_rec["blob"]["size"]}
        k["record"] = record_digest(forged).to_json()
        lock = Lock.from_bytes(encode_lock_doc(doc))
        recs = {key: (forged if key == victim else st.load(key)[0], e.blob.hash) for key, e in lock.kernels().items()}
        index = encode_index(recs, groups=lock_rank_groups(lock))
        raws = {e.blob.hash: st.load_blob(e.blob.hash) for e in lock.kernels().values()}
        return doc, index, raws

    _forge_closure(remote, store, probe["closure"]["key"], name="mini", edit_lock=poison)
    naive = _build(tmp_path / "naive", remote.url, MINI, remote_read_only=True)
    assert naive["closure"]["status"] == "hit" and _lock_bytes(tmp_path / "naive", "mini") != _lock_bytes(store, "mini")
    seed = next(s for s in range(1000) if victim in sample(entries, 3, s)[0])
    s = _build(tmp_path / "audited", remote.url, MINI, audit_remote=3, audit_seed=seed)
    assert [f["key"] for f in s["audit"]["findings"]] == [victim]
    assert s["closure"]["uploaded"] and _lock_bytes(tmp_path / "audited", "mini") == _lock_bytes(store, "mini")
    assert_verifies_clean(tmp_path / "audited")  # the audit's repair leaves a whole store
    again = _build(tmp_path / "fresh", remote.url, MINI)
    assert again["closure"]["status"] == "hit" and _lock_bytes(tmp_path / "fresh", "mini") == _lock_bytes(store, "mini")
