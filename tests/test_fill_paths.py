"""Every path that fills a store leaves one that ``gemmar-aot verify`` passes, against a real nginx.

``verify`` is run as a user runs it (the CLI, ``--json``) on stores filled by: a local compile, a
closure hit, a closure refused and the per-key fallback, per-key hits, an export and its
import. (The sharded build and its merge, the audit's repair and the second toolchain profile
are checked where their own tests build them: test_remote_build, test_audit, test_closure,
test_profiles.) The oracle is the store's own bytes: each blob decodes to its digest, each
record's blobs are there; nothing here reads what our build recorded about itself.

A store that lacks launchers (filled by an older gemmar-aot, or from a remote that lost them)
is *degraded*, not damaged: ``verify`` says so with its cost and fix and passes, ``--strict``
fails, and ``--remote`` mends it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import drop_closures
from nginx_server import FaultProxy

import tree_copy
from store_health import assert_verifies_clean, verify_cli
from test_closure import _closure_of
from test_remote_build import SMOKE, _build, _copy_store, _lock_bytes, _lock_entries
from gemmar_aot.store import Store
from gemmar_aot.store.backend import record_launcher

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent


def _launchers(store: Path) -> set[str]:
    """The launchers the store's records name (a hipcc code object, which mori loads whole, has none)."""
    st = Store(store, readonly=True)
    found = (record_launcher(st.read_record_file(k)) for k, _p in st.local.iter_record_files())
    return {ln.hash for ln in found if ln is not None}


def test_a_local_compile_verifies_clean(smoke_store, tmp_path):
    assert_verifies_clean(_copy_store(smoke_store, tmp_path / "a"))


def test_a_closure_hit_brings_the_launchers_and_verifies_clean(smoke_store, warm_remote, tmp_path):
    s = _build(tmp_path / "fresh", warm_remote.url)
    assert s["closure"]["status"] == "hit" and s["compiled"] == 0
    assert s["remote"]["requests"] == 2  # the entry and the pack: the launchers ride in the pack
    assert _launchers(tmp_path / "fresh") == _launchers(smoke_store)
    assert_verifies_clean(tmp_path / "fresh")


def test_per_key_hits_bring_the_launchers_and_verify_clean(smoke_store, per_key_remote, tmp_path):
    n = len(_lock_entries(smoke_store))
    s = _build(tmp_path / "b", per_key_remote.url)
    assert (s["compiled"], s["remote_hits"]) == (0, n)
    # two requests a kernel, and one per launcher: kernels of one builder call share theirs
    assert s["closure"]["per_key_requests"] == 2 * n + len(_launchers(smoke_store))
    assert_verifies_clean(tmp_path / "b")


def test_a_refused_closure_and_its_per_key_fallback_verify_clean(smoke_store, warm_remote, tmp_path):
    probe = _build(tmp_path / "probe", warm_remote.url)
    pack = _closure_of(warm_remote, probe["closure"]["key"])
    flip = lambda m, p, _n: ("flip", 5000) if m == "GET" and p.endswith(pack.hash) else None  # noqa: E731
    with FaultProxy(warm_remote.port, flip) as px:
        s = _build(tmp_path / "b", px.url, remote_read_only=True)
    assert s["closure"]["status"] == "refused" and s["compiled"] == 0
    assert_verifies_clean(tmp_path / "b")


def test_an_export_and_its_import_verify_clean(smoke_store, tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "gemmar_aot", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=ROOT, timeout=300)
    lock = smoke_store / "locks" / "smoke.lock.json"
    p = run("export", str(lock), str(tmp_path / "exp"), "--store", str(smoke_store), "--json")
    assert p.returncode == 0, p.stderr
    assert_verifies_clean(tmp_path / "exp")
    p = run("import", str(tmp_path / "exp"), "--store", str(tmp_path / "imp"), "--json")
    assert p.returncode == 0, p.stderr
    assert_verifies_clean(tmp_path / "imp")


@pytest.mark.parametrize("way", ["closure", "per-key"])
def test_a_derive_code_change_on_a_remote_fed_store_compiles_nothing(smoke_store, warm_remote, tmp_path, way):
    """Offline: the launchers the remote served are in the store, so the new derive code derives
    every record again from the store's own blobs."""
    if way == "per-key":
        drop_closures(warm_remote)
    store = tmp_path / "store"
    s = _build(store, warm_remote.url)
    assert s["compiled"] == 0 and (s["closure"]["status"] == "hit") == (way == "closure")
    tree = tree_copy.rewrite_parser(tree_copy.copy_tree(tmp_path / "derive-edit"))
    n = len(_lock_entries(smoke_store))
    summary = tree_copy.build(tree, SMOKE, store)  # no --remote
    assert (summary["compiled"], summary["rederived"], summary["hits"]) == (0, n, n)
    back = tree_copy.build(None, SMOKE, store)
    assert (back["compiled"], back["rederived"]) == (0, n)
    assert _lock_bytes(store) == _lock_bytes(smoke_store)
    assert_verifies_clean(store)


def test_a_store_without_launchers_is_degraded_not_damaged_and_remote_mends_it(smoke_store, warm_remote,
                                                                               tmp_path):
    store = _copy_store(smoke_store, tmp_path / "old")
    st = Store(store)
    gone = _launchers(store)
    for d in gone:
        st.blob_path(d).unlink()
    n_records = sum(1 for k, _p in st.local.iter_record_files() if "launcher" in st.read_record_file(k))
    rc, out = verify_cli(store)
    assert rc == 0 and out["problems"] == [] and out["ok"]
    [g] = out["degraded"]
    assert g["kind"] == "launcher" and g["count"] == n_records
    assert {e["launcher"] for e in g["entries"]} == gone
    assert g["compile_seconds"] > 0 and "--remote URL" in g["fix"]
    text = subprocess.run([sys.executable, "-m", "gemmar_aot", "verify", "--store", str(store)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert text.returncode == 0 and "DEGRADED launcher" in text.stdout and "BAD" not in text.stdout
    assert not list((store / "quarantine").glob("*")) if (store / "quarantine").exists() else True
    rc, out = verify_cli(store, "--strict")
    assert rc == 1 and not out["ok"] and out["problems"] == []
    # the remote that served them mends it: every launcher fetched, each checked against its digest
    rc, out = verify_cli(store, "--remote", warm_remote.url)
    assert rc == 0 and out["fetched"]["fetched"] == len(gone) and out["fetched"]["absent"] == []
    assert out["degraded"] == []
    assert_verifies_clean(store)


def test_a_missing_blob_is_still_damage(smoke_store, tmp_path):
    """Degraded never hides damage: a record whose code object is gone fails verify."""
    store = _copy_store(smoke_store, tmp_path / "d")
    st = Store(store)
    key = next(k for k, _p in st.local.iter_record_files())
    st.blob_path(st.read_record_file(key)["blob"]["hash"]).unlink()
    rc, out = verify_cli(store)
    assert rc == 1 and [p["kind"] for p in out["problems"]] == ["record"] and "missing" in out["problems"][0]["problem"]


def test_a_read_through_store_takes_the_launcher_with_the_entry(smoke_store, per_key_remote, tmp_path):
    from gemmar_aot.store.remote.remote_backend import HttpBackend

    key = sorted(k for k, (kind, _h) in _lock_entries(smoke_store).items() if kind == "gemm")[0]
    st = Store(tmp_path / "rt", remote=HttpBackend(per_key_remote.url, writable=False))
    rec = st.get_record(key)
    assert rec is not None and st.has_blob(record_launcher(rec).hash)
    shutil.rmtree(tmp_path / "rt" / "locks", ignore_errors=True)
    assert_verifies_clean(tmp_path / "rt")
