"""The build toolchain: pins, digests, idempotent steps, load/verify, mori import, doctor.

Tests that need the installed toolchain (``make setup``) skip when it is absent;
none of them modifies it (damage is done to temporary copies).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.toolchain import (
    Toolchain,
    compile_env,
    doctor,
    load_toolchain,
    toolchain_root,
)
from gemmar_aot.toolchain import ccobc, fetch, pins
from gemmar_aot.toolchain.digest import verify_sha256
from gemmar_aot.util.filedigest import sha256_file, tree_digest
from gemmar_aot.toolchain.fingerprint import (
    fingerprint_digest,
    MORI_EP_SOURCE_GLOBS,
    mori_source_files,
    non_portable_values,
)
from gemmar_aot.toolchain.install import Step, run_step
from gemmar_aot.toolchain.mori_import import BuildTimePlaceholder
from gemmar_aot.toolchain.paths import ROOT_ENV, Layout, checkout_dir

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def real_root() -> Path:
    root = toolchain_root()
    if not (root / "toolchain.json").is_file():
        pytest.skip(f"no toolchain at {root}: run `make setup`")
    return root


@pytest.fixture(scope="session")
def real_tc(real_root) -> Toolchain:
    return load_toolchain(real_root)


@pytest.fixture
def tmp_toolchain(real_root, tmp_path) -> Path:
    """A copy of what load_toolchain reads: toolchain.json, the bitcode, the
    ld.lld wrapper and mori's generator sources, the EP ones included (not the whole 70 MB)."""
    src, dst = Layout(real_root), Layout(tmp_path / "tc")
    dst.root.mkdir()
    shutil.copy2(src.toolchain_json, dst.toolchain_json)
    shutil.copytree(src.cco_bc.parent, dst.cco_bc.parent)
    shutil.copytree(src.rocm_path, dst.rocm_path)
    for rel in (mori_source_files(src.mori_dir) + mori_source_files(src.mori_dir, MORI_EP_SOURCE_GLOBS)
                + ["mori/ops/gemm_ar/op.py"]):
        (dst.mori_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src.mori_dir / rel, dst.mori_dir / rel)
    return dst.root


def _assert_names_fix(err: ToolchainError) -> None:
    assert "make setup" in str(err) and "python -m gemmar_aot.toolchain setup" in str(err), str(err)


# ---------------------------------------------------------------- pins and digests


def test_build_pins_match_pyproject():
    pyproject = tomllib.loads((checkout_dir() / "pyproject.toml").read_text())
    build = set(pyproject["project"]["optional-dependencies"]["build"])
    assert f"flydsl=={pins.FLYDSL_VERSION}" in build
    assert f"torch=={pins.TORCH_VERSION}" in build
    assert f"ziglang=={pins.ZIGLANG_VERSION}" in build


def test_pin_filenames_carry_their_versions():
    for pin in (pins.MORI, pins.TRITON):
        assert pin.filename.startswith(f"{pin.project.replace('-', '_')}-{pin.version}-")
        assert len(pin.sha256) == 64
    deb = pins.LIBCLANG_COMMON
    assert deb.filename.startswith(deb.package + "_") and deb.filename.endswith(f"_{deb.arch}.deb")


def test_verify_sha256_accepts_the_pinned_digest(tmp_path):
    f = tmp_path / "thing.whl"
    f.write_bytes(b"payload")
    assert verify_sha256(f, sha256_file(f)) == sha256_file(f)


def test_verify_sha256_mismatch_names_file_expected_and_actual(tmp_path):
    f = tmp_path / "thing.whl"
    f.write_bytes(b"payload")
    expected = "0" * 64
    with pytest.raises(ToolchainError) as e:
        verify_sha256(f, expected, fix="update the pin")
    msg = str(e.value)
    assert "thing.whl" in msg and expected in msg and sha256_file(f) in msg and "update the pin" in msg


def test_verify_sha256_missing_file(tmp_path):
    with pytest.raises(ToolchainError, match="missing"):
        verify_sha256(tmp_path / "absent.deb", "0" * 64)


def test_tree_digest_depends_on_names_and_content_not_location(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d / "sub").mkdir(parents=True)
        (tmp_path / d / "sub" / "x.py").write_text("x = 1\n")
        (tmp_path / d / "y.py").write_text("y = 2\n")
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    (tmp_path / "b" / "y.py").write_text("y = 3\n")
    assert tree_digest(tmp_path / "a") != tree_digest(tmp_path / "b")
    (tmp_path / "b" / "y.py").write_text("y = 2\n")
    (tmp_path / "b" / "y.py").rename(tmp_path / "b" / "z.py")
    assert tree_digest(tmp_path / "a") != tree_digest(tmp_path / "b")


# ---------------------------------------------------------------- downloads


def _fake_apt(monkeypatch, payload: bytes, *, lists_have_it: bool):
    """Replace apt-get with a fake that 'downloads' ``payload``; returns the call log."""
    calls: list[list[str]] = []

    def fake_run(cmd, *, what, cwd=None, fix=""):
        calls.append(list(cmd[:2]))
        if cmd[:2] == ["apt-get", "download"]:
            if not lists_have_it and ["apt-get", "update"] not in calls:
                raise ToolchainError(f"{what} failed (exit 100):\n    E: Unable to locate package {cmd[2]}")
            (Path(cwd) / "fake_1%3a1.0-1_amd64.deb").write_bytes(payload)
        return ""

    monkeypatch.setattr(fetch, "run", fake_run)
    monkeypatch.setattr(fetch.os, "geteuid", lambda: 0)
    monkeypatch.setattr(fetch.shutil, "which", lambda name: f"/usr/bin/{name}")
    return calls


def test_fetch_deb_runs_apt_update_when_lists_lack_the_package(tmp_path, monkeypatch):
    payload = b"!<arch>\nnot really a deb"
    pin = pins.DebPin("libfake-dev", "1:1.0-1", "amd64", "libfake-dev_1%3a1.0-1_amd64.deb", hashlib.sha256(payload).hexdigest())
    calls = _fake_apt(monkeypatch, payload, lists_have_it=False)
    got = fetch.fetch_deb(pin, tmp_path / "dl")
    assert calls == [["apt-get", "download"], ["apt-get", "update"], ["apt-get", "download"]]
    assert got == tmp_path / "dl" / pin.filename and got.read_bytes() == payload
    calls.clear()
    assert fetch.fetch_deb(pin, tmp_path / "dl") == got and calls == []  # verified cache hit: no apt


def test_fetch_deb_rejects_a_download_with_the_wrong_digest(tmp_path, monkeypatch):
    pin = pins.DebPin("libfake-dev", "1:1.0-1", "amd64", "libfake-dev_1%3a1.0-1_amd64.deb", "0" * 64)
    _fake_apt(monkeypatch, b"something else", lists_have_it=True)
    with pytest.raises(ToolchainError) as e:
        fetch.fetch_deb(pin, tmp_path / "dl")
    assert "sha256 mismatch" in str(e.value) and "0" * 64 in str(e.value)
    assert not (tmp_path / "dl" / pin.filename).exists()


# ---------------------------------------------------------------- idempotent steps


def test_run_step_skips_verified_output_and_redoes_changed(tmp_path):
    layout = Layout(tmp_path)
    out = tmp_path / "out.txt"
    runs = []

    def make(inputs):
        return Step(
            name="demo",
            what="demo step",
            inputs=inputs,
            output=lambda: sha256_file(out) if out.is_file() else None,
            run=lambda: (runs.append(1), out.write_text("built\n")),
        )

    log: list[str] = []
    d1 = run_step(layout, make({"v": 1}), log.append)
    assert len(runs) == 1
    assert run_step(layout, make({"v": 1}), log.append) == d1 and len(runs) == 1  # verified, skipped
    out.write_text("tampered\n")
    assert run_step(layout, make({"v": 1}), log.append) == d1 and len(runs) == 2  # output changed: redone
    out.unlink()
    run_step(layout, make({"v": 1}), log.append)
    assert len(runs) == 3  # output missing: redone
    run_step(layout, make({"v": 2}), log.append)
    assert len(runs) == 4  # inputs changed: redone
    assert any("(output changed)" in line for line in log)
    assert any("(inputs changed)" in line for line in log)


# ---------------------------------------------------------------- fingerprint


def test_non_portable_values_detects_paths_and_hostname():
    host = socket.gethostname()
    fp = {
        "ok": ["clang version 22.1.8", "-Imori-1.2.4/mori/_jit-sources", "--rocm-path=hip", "LLD 22.1.8"],
        "bad": ["/abs/path", "-I/usr/include", "--hip-path=/opt/rocm", f"built on {host}"],
    }
    bad = non_portable_values(fp)
    assert sorted(bad) == sorted(fp["bad"] if len(host) >= 3 else fp["bad"][:3])


def test_fingerprint_has_no_absolute_paths_or_hostname(real_root):
    text = (real_root / "toolchain.json").read_text()
    fp = json.loads(text)
    assert non_portable_values(fp) == []
    assert str(real_root) not in text and str(checkout_dir()) not in text
    host = socket.gethostname()
    if len(host) >= 3:
        assert host not in text
    assert fp["digest"] == fingerprint_digest(fp)


def test_fingerprint_records_every_input(real_tc):
    fp = real_tc.fingerprint
    assert fp["target"] == {"arch": "gfx950", "code_object_version": 6}
    assert fp["flydsl"]["version"] == pins.FLYDSL_VERSION and len(fp["flydsl"]["package_digest"]) == 64
    assert fp["torch"]["version"].split("+")[0] == pins.TORCH_VERSION
    assert fp["mori"]["version"] == pins.MORI.version and fp["mori"]["wheel_sha256"] == pins.MORI.sha256
    assert fp["linker"]["identity"].startswith("LLD ")
    assert fp["flydsl_opt_level"] in (0, 1, 2, 3)
    bc = fp["cco_bitcode"]
    assert bc["sha256"] == sha256_file(real_tc.cco_bc)
    if bc["source"] == "built":
        assert bc["build"]["flags"] == ccobc.clang_args(Layout(real_tc.root, real_tc.profile))
        assert f"-cuid={pins.CCO_CUID}" in bc["build"]["flags"]


# ---------------------------------------------------------------- load_toolchain


def test_load_toolchain_and_compile_env(real_tc):
    env = compile_env(real_tc)
    assert env["COMPILE_ONLY"] == "1" and env["ARCH"] == "gfx950"
    assert env["FLYDSL_RUNTIME_ENABLE_CACHE"] == "0" and env["MORI_DISABLE_JIT"] == "1"
    assert Path(env["ROCM_PATH"], "llvm", "bin", "ld.lld").is_file()
    assert env["MORI_CCO_BC"] == str(real_tc.cco_bc)
    assert (real_tc.mori_dir / "mori" / "ops" / "gemm_ar" / "op.py").is_file()


def test_root_env_override(tmp_toolchain, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_toolchain))
    assert toolchain_root() == tmp_toolchain.resolve()
    assert load_toolchain().root == tmp_toolchain.resolve()


def test_load_toolchain_without_toolchain(tmp_path):
    with pytest.raises(ToolchainError) as e:
        load_toolchain(tmp_path)
    assert "toolchain.json" in str(e.value)
    _assert_names_fix(e.value)


def test_load_toolchain_bitcode_missing(tmp_toolchain):
    assert load_toolchain(tmp_toolchain).root == tmp_toolchain.resolve()  # the copy is valid
    Layout(tmp_toolchain).cco_bc.unlink()
    with pytest.raises(ToolchainError) as e:
        load_toolchain(tmp_toolchain)
    assert "libmori_cco_device.bc" in str(e.value) and "missing" in str(e.value)
    _assert_names_fix(e.value)


def test_load_toolchain_bitcode_digest_wrong(tmp_toolchain):
    bc = Layout(tmp_toolchain).cco_bc
    bc.write_bytes(bc.read_bytes() + b"\0")
    with pytest.raises(ToolchainError) as e:
        load_toolchain(tmp_toolchain)
    assert "sha256" in str(e.value) and sha256_file(bc) in str(e.value)
    _assert_names_fix(e.value)


def test_load_toolchain_mori_sources_changed(tmp_toolchain):
    op = Layout(tmp_toolchain).mori_pkg / "ops" / "gemm_ar" / "layout.py"
    op.write_text(op.read_text() + "\n# edited\n")
    with pytest.raises(ToolchainError, match="generator sources") as e:
        load_toolchain(tmp_toolchain)
    _assert_names_fix(e.value)


def test_load_toolchain_fingerprint_edited(tmp_toolchain):
    p = Layout(tmp_toolchain).toolchain_json
    fp = json.loads(p.read_text())
    fp["flydsl_opt_level"] = 3
    p.write_text(json.dumps(fp))
    with pytest.raises(ToolchainError, match="edited") as e:
        load_toolchain(tmp_toolchain)
    _assert_names_fix(e.value)


# ---------------------------------------------------------------- cco bitcode


def test_cco_bitcode_build_is_reproducible(real_tc, tmp_path):
    """Two builds from the installed inputs give identical bytes (and, unless the
    bitcode came from $MORI_CCO_BC, the installed one)."""
    a = ccobc.build_cco_bitcode(Layout(real_tc.root, real_tc.profile), tmp_path / "a" / "libmori_cco_device.bc")
    b = ccobc.build_cco_bitcode(Layout(real_tc.root, real_tc.profile), tmp_path / "b" / "x.bc")
    assert a == b == sha256_file(tmp_path / "b" / "x.bc")
    if real_tc.fingerprint["cco_bitcode"]["source"] == "built":
        assert a == real_tc.fingerprint["cco_bitcode"]["sha256"]
    assert str(real_tc.root).encode() not in (tmp_path / "b" / "x.bc").read_bytes()


def test_cco_bitcode_build_names_missing_inputs(tmp_path):
    with pytest.raises(ToolchainError, match="inputs are missing") as e:
        ccobc.build_cco_bitcode(Layout(tmp_path), tmp_path / "out.bc")
    assert "cco_device_wrapper.cpp" in str(e.value)
    _assert_names_fix(e.value)


# ---------------------------------------------------------------- mori import


_IMPORT_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain
    tc = load_toolchain()
    os.environ.update(compile_env(tc))
    import_mori_device(tc)
    import_mori_device(tc)  # idempotent
    import mori.ops.gemm_ar.op, mori.ops.gemm_ar.kernels_fused, mori.ops.gemm_ar.kernels_sdma
    import mori.ops.gemm_ar.kernels_lsa, mori.ops.gemm_ar.layout, mori.ops.gemm_ar.gemm
    import mori.tensor_utils
    from mori.cco.device import find_cco_bitcode
    mapped = sorted({l.split()[-1] for l in open("/proc/self/maps")
                     if str(tc.mori_dir) in l})
    print(json.dumps({
        "op_file": mori.ops.gemm_ar.op.__file__,
        "modules": sorted(m for m in sys.modules if m == "mori" or m.startswith("mori.")),
        "mapped": mapped,
        "bitcode": find_cco_bitcode(),
        "placeholder": repr(mori.ops.gemm_ar.op.CCODevCommRequirements),
    }))
    """
)


def test_import_mori_device_in_fresh_process(real_tc):
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE],
        capture_output=True,
        text=True,
        env={**os.environ, ROOT_ENV: str(real_tc.root)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["op_file"].startswith(str(real_tc.mori_dir))
    assert not [m for m in out["modules"] if m.startswith(("mori.cpp", "mori.jit", "mori.ir")) or m == "mori.cco.cco"]
    assert out["mapped"] == [], "a native mori library was loaded"
    assert out["bitcode"] == str(real_tc.cco_bc)
    assert "build-time placeholder" in out["placeholder"]


def test_build_time_placeholder_refuses_use():
    p = BuildTimePlaceholder("mori.cco.CCODevCommRequirements")
    with pytest.raises(RuntimeError, match="build-time placeholder"):
        p()
    with pytest.raises(RuntimeError, match="build-time placeholder"):
        p.gda_connection_type = 0
    assert "CCODevCommRequirements" in repr(p) and p == p and hash(p) == hash(p)


_DRAIN_PROBE = textwrap.dedent(
    """
    import os, sys
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain
    tc = load_toolchain(); os.environ.update(compile_env(tc)); import_mori_device(tc)
    import flydsl.expr as fx
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context
    from mori.ops.gemm_ar.op import _build_cfg
    from mori.ops.gemm_ar.kernels_sdma import build_sdma_phases
    cfg = _build_cfg(world_size=2, m_pad=512, n=1024, block_m=128, gather_dtype="bf16",
                     gather_transport="lsa", counter_capacity=8, shape_slots=4, shape_index=1,
                     capacity_m=1024)
    drain = build_sdma_phases(cfg, 0, queues=1)["drain"]
    drain(0, 0, stream=fx.Stream(None))
    _key, art = drain._last_compiled
    with _create_mlir_context():
        m = ir.Module.parse(art.ir)
        binary = next(op for op in m.body.operations if op.operation.name == "gpu.binary")
        data = bytes(gpu.ObjectAttr(binary.operation.attributes["objects"][0]).object)
    sys.stdout.buffer.write(data)
    """
)


@pytest.mark.compile
def test_sdma_drain_compiles_and_links_for_gfx950(real_tc):
    """End to end: FlyDSL + mori + the cco bitcode + ld.lld give a gfx950 code object."""
    proc = subprocess.run(
        [sys.executable, "-c", _DRAIN_PROBE],
        capture_output=True,
        env={**os.environ, ROOT_ENV: str(real_tc.root)},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    co = proc.stdout
    assert co[:4] == b"\x7fELF"
    assert int.from_bytes(co[18:20], "little") == 0xE0  # EM_AMDGPU
    assert int.from_bytes(co[48:52], "little") & 0xFF == 0x4F  # EF_AMDGPU_MACH_AMDGCN_GFX950
    assert real_tc.fingerprint["linker"]["identity"].encode() in co  # .comment "Linker: LLD ..."


# ---------------------------------------------------------------- doctor


def test_doctor_on_installed_toolchain(real_root):
    checks = doctor(real_root)
    names = [c.name for c in checks]
    assert names == ["python", "flydsl", "torch", "clang", "mori sources", "cco bitcode", "ld.lld", "hip sdk (hipcc)",
                     "debian rocm (oracle)", "toolchain.json"]
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    by = {c.name: c for c in checks}
    assert by["flydsl"].detail == pins.FLYDSL_VERSION
    assert by["ld.lld"].detail.startswith("LLD ")
    assert by["hip sdk (hipcc)"].detail.startswith("libamdhip64-dev 7.2.4-1~exp2, rocm-device-libs-22 7.2.4+dfsg-1~exp1")


def test_doctor_on_empty_root_names_fixes(tmp_path):
    checks = {c.name: c for c in doctor(tmp_path)}
    for name in ("mori sources", "cco bitcode", "ld.lld", "hip sdk (hipcc)", "debian rocm (oracle)", "toolchain.json"):
        assert not checks[name].ok
        assert "make setup" in checks[name].fix
    assert checks["python"].ok and checks["flydsl"].ok


def test_doctor_cli_exit_codes(real_root, tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "gemmar_aot.toolchain", "--root", str(real_root), "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert all(c["ok"] for c in json.loads(ok.stdout))
    bad = subprocess.run(
        [sys.executable, "-m", "gemmar_aot.toolchain", "--root", str(tmp_path), "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "fix: run `make setup`" in bad.stdout


def test_staging_dir_replaces_on_success_and_keeps_old_on_failure(tmp_path):
    from gemmar_aot.toolchain.fsutil import staging_dir

    target = tmp_path / "out"
    with staging_dir(target) as tmp:
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with pytest.raises(RuntimeError):
        with staging_dir(target) as tmp:
            (tmp / "a").write_text("2")
            raise RuntimeError("boom")
    assert (target / "a").read_text() == "1"  # the old install survives a failed one
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging left behind


def test_linker_wrapper_outlives_the_venv_that_installed_it(tmp_path, monkeypatch):
    """A toolchain shared by several checkouts ($GEMMAR_AOT_TOOLCHAIN) must keep linking when
    the virtualenv whose ziglang installed it is deleted: the wrapper runs its own zig."""
    from gemmar_aot.toolchain import linker
    from gemmar_aot.toolchain.tools import zig_dir

    venv_zig = tmp_path / "venv-ziglang"
    venv_zig.mkdir()
    shutil.copy2(zig_dir() / "zig", venv_zig / "zig")
    monkeypatch.setattr(linker, "zig_dir", lambda: venv_zig)
    wrapper = tmp_path / "tc" / "rocm" / "llvm" / "bin" / "ld.lld"
    identity = linker.install_ld_lld(wrapper)
    assert identity.startswith("LLD ")
    shutil.rmtree(venv_zig)  # the installing venv is gone
    out = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("LLD "), out.stderr
    assert str(venv_zig) not in wrapper.read_text()


def test_a_hip_sdk_pin_the_archive_no_longer_serves_fails_setup_with_the_exact_fix(tmp_path):
    """Experimental versions get replaced: a pinned version Debian no longer serves is refused saying
    what the archive holds now, where the verified file is kept (snapshot.debian.org), and how to
    move the pin; a verified file in the download cache is taken as it is, with no network."""
    import shutil
    from dataclasses import replace

    from gemmar_aot.toolchain import load_toolchain, rocm_sdk

    root = load_toolchain().root
    if not (root / "apt" / "sources.list").is_file():
        pytest.skip("the toolchain's private apt configuration is not set up (make setup)")
    hip = rocm_sdk.DEBS[0]
    gone = replace(hip, version="7.2.3-1~exp1", pool="pool/main/r/rocm-hipamd/libamdhip64-dev_7.2.3-1~exp1_amd64.deb",
                   sha256="0" * 64)
    with pytest.raises(ToolchainError) as e:
        rocm_sdk.fetch(gone, tmp_path / "downloads", root / "apt")
    msg = str(e.value)
    assert "Debian's experimental suite no longer serves libamdhip64-dev 7.2.3-1~exp1 (experimental)" in msg
    assert f"it has {hip.version} (sha256 {hip.sha256})" in msg
    assert f"https://snapshot.debian.org/archive/debian/{rocm_sdk.VERIFIED_ON}/{gone.pool}" in msg
    assert "move the pin" in msg and "gemmar_aot/toolchain/rocm_sdk.py" in msg
    cached = tmp_path / "cached"
    cached.mkdir()
    shutil.copy2(root / "downloads" / hip.filename, cached / hip.filename)
    assert rocm_sdk.fetch(hip, cached, tmp_path / "no-apt-here") == cached / hip.filename
    assert not (tmp_path / "no-apt-here").exists()  # no apt run for a verified file
