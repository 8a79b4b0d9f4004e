"""A manifest's closure in the remote cache (gemmar_aot.closure), against a real nginx.

The round trips are counted by a proxy in front of nginx that delays every request (the fault
proxy, given a delay), not guessed. The oracle for every byte is the smoke store the session
compiled itself: the lock a closure-fed build writes must be that store's lock, byte for byte.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from nginx_server import FaultProxy

from test_remote_build import SMOKE, _build, _lock_bytes, _lock_entries
from gemmar_aot.closure import PACK_PATH
from gemmar_aot.store import Store, reapi

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
    assert s["remote"]["bytes_down"] <= 1.3 * pack.size_bytes
    # every record and code object is in the local store, verified: a second build is all local
    again = _build(tmp_path / "fresh", None)
    assert (again["compiled"], again["local_hits"]) == (0, n)
    st = Store(tmp_path / "fresh")
    for key, (_kind, blob) in _lock_entries(smoke_store).items():
        rec, _code = st.load(key)
        assert rec["blob"]["digest"] == blob


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
    assert c["per_key_requests"] == 2 * missing and c["per_key_bytes"] > 0
    assert _lock_bytes(tmp_path / "full") == _lock_bytes(smoke_store)
    assert c["uploaded"]


def _full_closure_key(smoke_store: Path) -> str:
    from gemmar_aot.artifact_model import read_lock
    from gemmar_aot.closure import closure_key
    from gemmar_aot.keys import derive_code_digest

    lock = read_lock(smoke_store / "locks" / "smoke.lock.json")
    return closure_key(manifest={"name": lock.manifest.name, "sha256": lock.manifest.sha256},
                       profile=lock.toolchain.profile or "default", toolchain_digest=lock.toolchain.digest,
                       keys=lock.kernels(), derive_code=derive_code_digest())
