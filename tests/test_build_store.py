"""The build and the store together: warm rebuilds, exact recompiles, concurrency,
corruption, gc, export/import and explain -- through the real compiler and CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemmar_aot.builder.pipeline import run_build
from gemmar_aot.model.lock import read_lock
from gemmar_aot.store import Store, inventory
from conftest import MINI

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "smoke.toml"

SMALL = """
[manifest]
name = "{name}"

[[tuple]]
transport = "fused-sdma"
m = {ms}
n = 1024
k = {k}
world = 2
quant = "blockscale"
m_max = 512
"""


def _cli(*args, cwd=ROOT):
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", *args], capture_output=True, text=True, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def _copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.lock"))
    return dst


def test_changing_one_builder_argument_recompiles_exactly_the_affected_specs(smoke_build, tmp_path):
    """K=512 -> 768 on one tuple: only that tuple's GEMMs are new; phases do not depend on K."""
    _, store = smoke_build
    st = _copy_store(store, tmp_path / "store")
    text = SMOKE.read_text()
    needle = 'm = [256, 512]\nn = 1024\nk = 512'
    assert needle in text
    changed = tmp_path / "smoke.toml"
    changed.write_text(text.replace(needle, 'm = [256, 512]\nn = 1024\nk = 768'))
    summary = run_build(changed, store=st, jobs=2, progress=False)
    assert summary["failed"] == 0
    assert summary["compiled"] == 2 * 2  # 2 M x 2 ranks, GEMM only
    assert set(summary["by_kind"]) == {"fused-sdma:gemm"}
    assert summary["hits"] == summary["distinct_specs"] - 4


def test_concurrent_builders_compile_each_spec_once(tmp_path):
    """Two builds of overlapping manifests into one store, at the same time."""
    store = tmp_path / "store"
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text(SMALL.format(name="a", ms="[256, 512]", k=256))
    b.write_text(SMALL.format(name="b", ms="[512]", k=256))
    procs = [subprocess.Popen([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(store),
                               "-j", "1", "--json", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for m in (a, b)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out))
    union = read_lock(store / "locks" / "a.lock.json").action_keys() | read_lock(
        store / "locks" / "b.lock.json").action_keys()
    assert read_lock(store / "locks" / "b.lock.json").action_keys() <= union
    assert sum(o["compiled"] for o in outs) == len(union)  # every key compiled exactly once
    assert inventory.verify(Store(store)).clean


def test_flipped_byte_is_detected_quarantined_and_rebuilt(smoke_build, tmp_path):
    _, store = smoke_build
    st_root = _copy_store(store, tmp_path / "store")
    lock = read_lock(st_root / "locks" / "smoke.lock.json")
    digest = sorted(lock.blob_digests())[0]
    blob = st_root / "blobs" / "sha256" / digest[:2] / f"{digest}.zst"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x40
    blob.write_bytes(bytes(data))

    code, out, err = _cli("verify", "--store", str(st_root), "--json")
    assert code == 1
    problems = json.loads(out)["problems"]
    assert any(digest in p["path"] for p in problems)
    assert not blob.exists()  # quarantined
    summary = run_build(SMOKE, store=st_root, jobs=1, progress=False)
    users = {e.key for _w, e in lock.iter_entries() if e.blob.hash == digest}
    # The first of the keys using the blob recompiles it; the others (identical output) then
    # find it verified in the store under their own records.
    assert summary["compiled"] >= 1 and summary["compiled"] + summary["hits"] == summary["selected_specs"]
    assert summary["compiled"] <= len(users)
    assert inventory.verify(Store(st_root)).clean
    assert blob.exists()


def test_gc_keeps_what_the_lock_references(smoke_build, tmp_path):
    _, store = smoke_build
    st_root = _copy_store(store, tmp_path / "store")
    st = Store(st_root)
    st.put("e" * 64, b"not referenced by any lock", {"note": "orphan"})
    before = {r["key"] for r in inventory.ls(st)}
    code, out, err = _cli("gc", "--store", str(st_root), "--keep", str(st_root / "locks" / "smoke.lock.json"), "--json")
    assert code == 0, err
    after = {r["key"] for r in inventory.ls(Store(st_root))}
    assert after == before - {"e" * 64}
    assert after == read_lock(st_root / "locks" / "smoke.lock.json").action_keys()
    assert inventory.verify(Store(st_root)).clean


def test_export_import_round_trip(smoke_build, tmp_path):
    _, store = smoke_build
    lock_file = store / "locks" / "smoke.lock.json"
    code, out, err = _cli("export", str(lock_file), str(tmp_path / "bundle"), "--store", str(store))
    assert code == 0, err
    code, out, err = _cli("import", str(tmp_path / "bundle"), "--store", str(tmp_path / "other"))
    assert code == 0, err
    other = Store(tmp_path / "other")
    lock = read_lock(tmp_path / "other" / "locks" / "smoke.lock.json")
    for key in lock.action_keys():
        rec, code_bytes = other.load(key)
        assert rec["key"] == key and len(code_bytes) == rec["blob"]["size"]
    # A build against the imported store compiles nothing.
    summary = run_build(SMOKE, store=tmp_path / "other", jobs=1, progress=False)
    assert summary["compiled"] == 0


def test_explain_names_the_changed_ingredient(smoke_build):
    from gemmar_aot.builder.explain import check_lock
    from gemmar_aot.toolchain import load_toolchain

    _, store = smoke_build
    lock = read_lock(store / "locks" / "smoke.lock.json")
    fp = load_toolchain().fingerprint
    assert check_lock(lock, Store(store, readonly=True), fp)["up_to_date"]
    other = json.loads(json.dumps(fp))
    other["cco_bitcode"]["sha256"] = "0" * 64
    res = check_lock(lock, Store(store, readonly=True), other)
    clang = len(lock.hipcc) + len(lock.jitv2)  # mori's hipcc and JIT v2 kernels link no cco bitcode
    flydsl = len(lock.action_keys()) - clang
    assert res["stale"] == flydsl and res["distinct_keys"] == len(lock.action_keys())
    assert res["stale_by_ingredient"] == {"toolchain.cco_bitcode_sha256": flydsl}
    other["hipcc"]["clang"] = "clang version 23.0.0"  # and they alone hash clang's identity
    res = check_lock(lock, Store(store, readonly=True), other)
    assert res["stale_by_ingredient"] == {"toolchain.cco_bitcode_sha256": flydsl, "toolchain.clang": clang}
    assert [c["ingredient"] for c in res["toolchain_changed"]] == ["toolchain.cco_bitcode_sha256"]


def test_interrupted_build_keeps_finished_kernels(tmp_path):
    """Ctrl-C mid-build: a clear message, exit 130, a consistent store, and a rerun finishes the rest.
    (mini.toml: one kernel of each family, each executor interrupted alike.)"""
    import signal
    import time

    store = tmp_path / "store"
    # SIGINT as at a terminal: a shell without job control starts background jobs (a test run
    # started with `&`) with SIGINT ignored, and a child would inherit that and never see it
    p = subprocess.Popen([sys.executable, "-m", "gemmar_aot", "build", str(MINI), "--store", str(store),
                          "-j", "1", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if (store / "ac").is_dir() and any((store / "ac").rglob("*.json.zst")):
            break
        time.sleep(0.1)
    if p.poll() is not None:
        pytest.skip("the build finished before it could be interrupted")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err and "run the same command again" in err
    kept = len(inventory.ls(Store(store)))
    assert kept >= 1 and inventory.verify(Store(store)).clean
    summary = run_build(MINI, store=store, jobs=1, progress=False)
    assert summary["failed"] == 0
    assert summary["hits"] + summary["compiled"] == summary["distinct_specs"]
    assert summary["hits"] >= kept
