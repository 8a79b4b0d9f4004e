"""Builds sharing a remote cache: a real nginx (WebDAV PUT) on 127.0.0.1, the real compiler.

Faults are injected by a small proxy in front of nginx (tests/nginx_server.FaultProxy):
500s, stalls, a server killed mid-upload, truncated or altered blobs. What is checked is
what a user relies on: nothing wrong is ever loaded, the build always finishes (locally
when it must, with one warning), and the lock is byte-identical to a plain local build.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from store_health import assert_verifies_clean
from nginx_server import FaultProxy, Nginx
from conftest import MINI

from gemmar_aot.builder.pipeline import run_build
from gemmar_aot.store import Store
from gemmar_aot.store.remote import reapi

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "smoke.toml"

def _copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.lock", "*.claim", "quarantine"))
    return dst


def _build(store: Path, remote: str | None, manifest: Path = SMOKE, **kw) -> dict:
    return run_build(manifest, store=store, jobs=2, progress=False, remote=remote, **kw)


def _lock_bytes(store: Path, name: str = "smoke") -> bytes:
    return (store / "locks" / f"{name}.lock.json").read_bytes()


def _lock_entries(store: Path, name: str = "smoke") -> dict[str, tuple[str, str]]:
    """key -> (kind, blob hash) of every kernel the lock names."""
    from gemmar_aot.model.lock import read_lock

    st = Store(store, readonly=True)
    out = {}
    for key in read_lock(store / "locks" / f"{name}.lock.json").check_parts().action_keys():
        rec = st.get_record(key)
        out[key] = (rec["spec"]["kind"], rec["blob"]["hash"])
    return out


def _a_cheap_kernel_with_its_own_blob(store: Path, name: str = "smoke") -> tuple[str, str]:
    """(key, blob hash) of a phase kernel (a FlyDSL one: no GEMM, no hipcc code object) of lock
    ``name`` whose code object no other key shares."""
    from gemmar_aot.model.hipcc import SOURCES

    entries = _lock_entries(store, name)
    users: dict[str, int] = {}
    for _, h in entries.values():
        users[h] = users.get(h, 0) + 1
    return sorted((k, h) for k, (kind, h) in entries.items()
                  if kind != "gemm" and kind not in SOURCES and users[h] == 1)[0]


def assert_remote_is_consistent(server: Nginx) -> int:
    """Every /ac/ entry is an ActionResult whose output files are in /cas/ with the right bytes: a
    kernel's (record, code object, launcher) or a manifest's closure (pack, lock, record index).
    Returns how many kernel entries there are."""
    from gemmar_aot.builder.closure import INDEX_PATH, LOCK_PATH, PACK_PATH

    cas = server.files("cas")
    kernels = 0
    for key, path in server.files("ac").items():
        ar = reapi.decode_action_result(path.read_bytes())
        paths = {f.path for f in ar.output_files}
        assert paths in ({reapi.RECORD_PATH, reapi.CODE_PATH, reapi.LAUNCHER_PATH},
                         {reapi.RECORD_PATH, reapi.CODE_PATH},  # a hipcc code object: no launcher
                         {PACK_PATH, LOCK_PATH, INDEX_PATH}), key
        kernels += reapi.RECORD_PATH in paths
        for f in ar.output_files:
            data = cas[f.digest.hash].read_bytes()
            assert hashlib.sha256(data).hexdigest() == f.digest.hash and len(data) == f.digest.size
    return kernels


def test_a_second_store_compiles_nothing_and_writes_the_same_lock(smoke_store, per_key_remote, tmp_path):
    n = len(_lock_entries(smoke_store))
    assert assert_remote_is_consistent(per_key_remote) == n
    s = _build(tmp_path / "b", per_key_remote.url)
    assert (s["compiled"], s["remote_hits"], s["local_hits"], s["uploads"]) == (0, n, 0, 0)
    assert s["remote"]["bytes_down"] > 0 and s["remote"]["errors"] == 0
    assert s["store_optimize"] is None  # a fetch-only build trains and repacks nothing
    assert _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "stats", "--store", str(tmp_path / "b"), "--json",
                        "--remote", per_key_remote.url], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)["remote"]
    assert r["reachable"] and r["local_entries_on_remote"] == n
    assert r["locks"]["smoke.lock.json"] == {"keys": n, "on_remote": n}
    assert r["last_build"]["remote_hits"] == n and r["last_build"]["local_hits"] == 0
    again = _build(tmp_path / "b", per_key_remote.url)  # now everything is local
    assert (again["local_hits"], again["remote_hits"], again["uploads"]) == (n, 0, 0)


def test_sharded_builds_and_a_final_job_give_the_single_build_lock(mini_store, nginx, tmp_path):
    """The CI recipe: shards sign what they compile with a compile key; the final job takes only
    what that key signed, compiles nothing and writes the single build's lock; so does a fresh runner.
    (mini.toml: one kernel of each family; the shards compile all of it.)"""
    from gemmar_aot.trust.signing_keys import generate_key, load_signing_key
    from gemmar_aot.trust.trust_set import load_trust

    key, pub, keyid = generate_key(tmp_path / "keys", "shards")
    signer, trust = load_signing_key(key), load_trust(pub)
    compiled = 0
    for i in range(1, 5):
        s = _build(tmp_path / f"shard{i}", nginx.url, MINI, shard=(i, 4), compile_key=signer)
        assert s["failed"] == 0 and s["lock_file"] is None and s["shard"] == f"{i}/4", s.get("failures")
        assert s["uploads"] == s["compiled"] == s["compile_keys"]["signed"]
        compiled += s["compiled"]
    n = len(_lock_entries(mini_store, "mini"))
    assert compiled == n  # the shares are disjoint and cover the plan
    final = _build(tmp_path / "final", nginx.url, MINI, trusted_compile_keys=trust)
    assert (final["compiled"], final["remote_hits"]) == (0, n)
    assert final["compile_keys"]["vouched_by"] == {keyid: n} and final["compile_keys"]["refused"] == {}
    assert _lock_bytes(tmp_path / "final", "mini") == _lock_bytes(mini_store, "mini")
    assert final["closure"]["status"] == "miss" and final["closure"]["uploaded"]  # shards upload none
    fresh = _build(tmp_path / "fresh", nginx.url, MINI, trusted_compile_keys=trust)
    assert fresh["closure"]["status"] == "hit"
    assert _lock_bytes(tmp_path / "fresh", "mini") == _lock_bytes(mini_store, "mini")
    assert fresh["compile_keys"]["vouched_by"] == {keyid: n}  # the closure carried the shards' signatures
    for i in range(1, 5):
        assert_verifies_clean(tmp_path / f"shard{i}")
    assert_verifies_clean(tmp_path / "final")
    assert_verifies_clean(tmp_path / "fresh")


@pytest.mark.parametrize("fault", [("truncate", 9), ("flip", 200)], ids=["truncated", "altered"])
def test_a_bad_blob_from_the_remote_is_refused_quarantined_and_rebuilt(smoke_store, per_key_remote, tmp_path,
                                                                        fault, capfd):
    key, digest = _a_cheap_kernel_with_its_own_blob(smoke_store)
    good = (per_key_remote.data / "cas" / digest).read_bytes()
    with FaultProxy(per_key_remote.port, lambda m, p, n: fault if m == "GET" and p.endswith(digest) else None) as px:
        s = _build(tmp_path / "b", px.url)
    assert s["failed"] == 0 and s["compiled"] == 1 and s["remote_hits"] == s["distinct_specs"] - 1
    assert s["remote"]["corrupt_refused"] >= 1
    assert capfd.readouterr().err.count("warning:") == 1
    # the bad bytes sit in quarantine with the reason, never in the store proper
    q = Store(tmp_path / "b").quarantine_dir
    reasons = [p.read_text() for p in q.glob("*.reason")]
    assert any(digest in r and "sha256" in r for r in reasons)
    bad = [p for p in q.iterdir() if not p.name.endswith(".reason")]
    assert bad and all(p.read_bytes() != good for p in bad)
    st = Store(tmp_path / "b")
    rec, code = st.load(key)
    assert hashlib.sha256(code).hexdigest() == digest
    assert _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)


def test_a_record_whose_blob_is_gone_is_a_miss_and_gets_repaired(smoke_store, per_key_remote, tmp_path, capfd):
    key, digest = _a_cheap_kernel_with_its_own_blob(smoke_store)
    (per_key_remote.data / "cas" / digest).unlink()
    s = _build(tmp_path / "b", per_key_remote.url)
    assert (s["compiled"], s["remote_hits"], s["remote"]["errors"]) == (1, s["distinct_specs"] - 1, 0)
    assert "warning:" not in capfd.readouterr().err  # a miss is not a failure
    assert hashlib.sha256((per_key_remote.data / "cas" / digest).read_bytes()).hexdigest() == digest  # re-uploaded
    assert _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)


def test_a_server_killed_mid_upload_leaves_no_entry_without_its_blobs(smoke_store, tmp_path, capfd):
    server = Nginx(tmp_path / "nginx").start()
    puts = []

    def fault(method, path, n):
        if method == "PUT":
            puts.append(path)
            if len(puts) == 25:
                return ("call", server.kill)
        return None

    try:
        with FaultProxy(server.port, fault) as px:
            s = _build(_copy_store(smoke_store, tmp_path / "a"), px.url)
        assert s["failed"] == 0 and s["compiled"] == 0 and s["lock_file"]
        assert s["remote"]["errors"] >= 1 and s["remote"]["down"] and 0 < s["uploads"] < s["distinct_specs"]
        assert capfd.readouterr().err.count("warning:") == 1
        assert _lock_bytes(tmp_path / "a") == _lock_bytes(smoke_store)
        server.start()  # the same data directory, after the crash
        assert assert_remote_is_consistent(server) == s["uploads"]
    finally:
        server.stop()


@pytest.mark.parametrize("fault", [("status", 500), ("stall", 5.0)], ids=["500s", "timeouts"])
def test_a_failing_remote_costs_one_warning_and_the_build_goes_on(smoke_store, nginx, tmp_path, fault, capfd,
                                                                   monkeypatch):
    monkeypatch.setenv("GEMMAR_AOT_REMOTE_TIMEOUT", "0.3")
    with FaultProxy(nginx.port, lambda m, p, n: fault) as px:
        s = _build(_copy_store(smoke_store, tmp_path / "a"), px.url)
        seen = len(px.seen)
    assert s["failed"] == 0 and s["compiled"] == 0 and s["lock_file"]
    assert s["remote"]["down"] and s["remote"]["errors"] >= 1 and s["uploads"] == 0
    assert seen <= 3  # the first request's attempts; after that the remote is left alone
    err = capfd.readouterr().err
    assert err.count("warning:") == 1 and ("500" in err or "timed out" in err)


def test_remote_required_makes_an_unreachable_remote_fatal(smoke_store, tmp_path):
    dead = Nginx(tmp_path / "n").start()
    url = dead.url
    dead.stop()
    store = _copy_store(smoke_store, tmp_path / "a")
    env = {**__import__("os").environ, "GEMMAR_AOT_REMOTE": url, "GEMMAR_AOT_REMOTE_TIMEOUT": "1"}
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(SMOKE), "--store", str(store), "-q",
                        "--remote-required"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and "required" in p.stderr and url in p.stderr
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(SMOKE), "--store", str(store), "-q"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert p.returncode == 0 and p.stderr.count("warning:") == 1, p.stderr
    assert "0 compiled" in p.stdout and "1 failed" in p.stdout


def test_read_only_fetches_and_never_uploads(smoke_store, nginx, tmp_path):
    with FaultProxy(nginx.port) as px:
        s = _build(_copy_store(smoke_store, tmp_path / "a"), px.url, remote_read_only=True)
        assert s["uploads"] == 0 and not any(m == "PUT" for m, _ in px.seen) and not nginx.files("ac")
        _build(tmp_path / "a", nginx.url)  # a trusted job fills the cache
        px.seen.clear()
        s = _build(tmp_path / "b", px.url, remote_read_only=True)
        assert (s["compiled"], s["remote_hits"], s["uploads"]) == (0, s["distinct_specs"], 0)
        assert not any(m == "PUT" for m, _ in px.seen)
        assert s["remote"]["read_only"]


def test_concurrent_builders_on_one_remote(nginx, tmp_path, tiny_manifest):
    manifest = tiny_manifest
    cmd = [sys.executable, "-m", "gemmar_aot", "build", str(manifest), "-j", "1", "--json", "-q",
           "--remote", nginx.url]
    procs = [subprocess.Popen(cmd + ["--store", str(tmp_path / f"s{i}")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for i in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out))
    assert all(o["failed"] == 0 and o["remote"]["errors"] == 0 for o in outs)
    assert _lock_bytes(tmp_path / "s0", "tiny") == _lock_bytes(tmp_path / "s1", "tiny")
    # As many kernels as the lock names (split modes build a GEMM per rank, so not a fixed count).
    n = len(_lock_entries(tmp_path / "s0", "tiny"))
    assert n == outs[0]["distinct_specs"] and n >= 3
    assert assert_remote_is_consistent(nginx) == n
    third = _build(tmp_path / "s2", nginx.url, manifest)
    assert (third["compiled"], third["remote_hits"]) == (0, n)
    assert _lock_bytes(tmp_path / "s2", "tiny") == _lock_bytes(tmp_path / "s0", "tiny")


def test_the_packaging_job_builds_its_wheel_from_the_remote(smoke_store, warm_remote, tmp_path):
    """After sharded builds, `gemmar-aot wheel` with $GEMMAR_AOT_REMOTE compiles nothing."""
    env = {**__import__("os").environ, "GEMMAR_AOT_REMOTE": warm_remote.url}
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "wheel", str(SMOKE), "--store", str(tmp_path / "s"),
                        "--out", str(tmp_path / "dist"), "--json", "-q"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    b = out["build"]
    assert b["compiled"] == 0 and b["remote_hits"] == b["distinct_specs"]
    assert b["closure"]["status"] == "hit" and b["remote"]["requests"] <= 6  # one pack, not a GET a kernel
    assert list((tmp_path / "dist").glob("*.whl"))
