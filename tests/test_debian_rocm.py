"""Debian's own ROCm 7.2.4 compiler, the oracle for mori's hipcc kernels (``gemmar_aot.toolchain.debian_rocm``).

Cheap tests of the pins, the checks and the fixes run everywhere; those that run Debian's programs need
the tree ``make setup`` installs and a host where it can run (root, or user namespaces), and skip
saying which is missing. None compiles: ``-###`` shows what would run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from gemmar_aot.toolchain import debian_rocm, rocm_sdk
from gemmar_aot.toolchain.debian_rocm import COMPILE, DEBS, LIBRARY, RUNS
from gemmar_aot.toolchain.paths import toolchain_root
from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import is_hex64

BY_NAME = {d.package: d for d in DEBS}


# ---------------------------------------------------------------- the pins


def test_the_pin_table_is_consistent():
    assert len(BY_NAME) == len(DEBS), "a package is pinned twice"
    for d in DEBS:
        assert d.role in (RUNS, LIBRARY, COMPILE) and d.suite in rocm_sdk.SUITES, d
        assert is_hex64(d.sha256) and d.size > 0, d
        # Debian's pool names a file by package, version without its epoch, and architecture
        assert re.fullmatch(r"pool/main/(lib)?[a-z0-9]/[a-z0-9.+-]+/[a-z0-9.+-]+_[^_:]+_(amd64|all)\.deb", d.pool), d.pool
    assert debian_rocm.download_size() == sum(d.size for d in DEBS)
    assert BY_NAME["hipcc"].version == "7.2.4+dfsg-1~exp1" and BY_NAME["clang-22"].version == "1:22.1.8-1~deb13u5"
    # hipcc Depends: rocm-device-libs-22 (= its own version); clang-22 Depends: the same LLVM build throughout
    assert BY_NAME["rocm-device-libs-22"].version == BY_NAME["hipcc"].version
    llvm = {d.package: d.version for d in DEBS if d.source_dir == "l/llvm-toolchain-22"}
    assert set(llvm) == {"clang-22", "lld-22", "clang-tools-22", "llvm-22", "libllvm22", "libclang-cpp22",
                         "libclang-common-22-dev"} and set(llvm.values()) == {"1:22.1.8-1~deb13u5"}
    # Debian's glibc 2.41 (hipcc needs >= 2.38): the C library that runs and the headers a compile reads agree
    assert BY_NAME["libc6"].version == BY_NAME["libc6-dev"].version == "2.41-12+deb13u5"
    assert BY_NAME["libstdc++6"].version == BY_NAME["libstdc++-14-dev"].version == BY_NAME["libgcc-14-dev"].version


def test_the_hip_sdk_it_shares_with_our_compiles_is_pinned_the_same():
    """The HIP headers, device libraries and hsakmt headers our hipcc kernels compile against are the
    very files the oracle's compile reads: same version, same sha256."""
    for pin in rocm_sdk.DEBS:
        d = BY_NAME[pin.package]
        assert (d.version, d.suite, d.sha256, d.pool) == (pin.version, pin.suite, pin.sha256, pin.pool), pin.package
        assert d.role == COMPILE


def test_the_table_is_what_the_pin_command_prints():
    """``python -m gemmar_aot.toolchain.debian_rocm pin`` prints rows this module takes as they are."""
    text = Path(debian_rocm.__file__).read_text()
    assert debian_rocm.table_text(list(DEBS)) in text


def test_every_program_and_marker_is_a_path_in_the_tree():
    for rel in (*debian_rocm.PROGRAMS, *debian_rocm.MARKERS):
        assert not rel.startswith("/") and ".." not in rel, rel
    assert "usr/bin/hipcc" in debian_rocm.PROGRAMS and debian_rocm.HIPCC == "/usr/bin/hipcc"
    # the environment the programs run in names nothing of the host, and no ROCM_PATH (clang reads it too)
    assert debian_rocm.ENV["HIP_PATH"] == "/usr" and "ROCM_PATH" not in debian_rocm.ENV


# ---------------------------------------------------------------- what is missing, and the fixes


def test_problems_name_what_is_missing(tmp_path):
    assert debian_rocm.problems(tmp_path) == [f"{tmp_path / 'debian-rocm'} is missing"]
    assert debian_rocm.output_digest(tmp_path) is None
    tree = tmp_path / "debian-rocm"
    tree.mkdir()
    bad = debian_rocm.problems(tmp_path)
    assert f"{tree}/usr/bin/hipcc is missing" in bad
    assert f"{tree}/usr/lib/llvm-22/lib/clang/22/amdgcn/bitcode/oclc_isa_version_950.bc is missing" in bad
    assert any(debian_rocm.RECORD in p and "pinned packages" in p for p in bad)
    with pytest.raises(ToolchainError, match="(?s)not set up: .*usr/bin/hipcc is missing.*make setup"):
        debian_rocm.run_hipcc(["--version"], root=tmp_path)
    with pytest.raises(ToolchainError):
        debian_rocm.describe(tmp_path)


def _fake_apt(monkeypatch, out: str) -> list:
    calls = []

    def apt_get(apt_root, *args, cwd=None):
        calls.append(args)
        return subprocess.CompletedProcess(["apt-get", *args], 100, "", out)

    monkeypatch.setattr(debian_rocm, "apt_get", apt_get)
    monkeypatch.setattr(debian_rocm, "prepare_apt", lambda apt_root: None)
    return calls


@pytest.mark.skipif(shutil.which("apt-cache") is None, reason="apt-cache is not on this host (not Debian)")
def test_a_pin_the_archive_no_longer_serves_fails_with_the_exact_fix(tmp_path, monkeypatch):
    """Experimental versions get replaced: setup then says which pin is gone, where the verified file is
    kept (snapshot.debian.org at VERIFIED_ON) and where and how to move the pin."""
    gone = replace(BY_NAME["hipcc"], version="7.2.3+dfsg-1~exp1", sha256="0" * 64)
    monkeypatch.setattr(debian_rocm, "DEBS", (gone,))
    calls = _fake_apt(monkeypatch, "E: Version '7.2.3+dfsg-1~exp1' for 'hipcc' was not found\n")
    (tmp_path / "apt").mkdir()  # an apt root with no lists: apt-cache knows no hipcc at all
    with pytest.raises(ToolchainError) as e:
        debian_rocm.fetch_all(tmp_path / "downloads", tmp_path / "apt")
    msg = str(e.value)
    assert calls == [("download", "hipcc=7.2.3+dfsg-1~exp1")]
    assert "Debian's experimental suite no longer serves hipcc 7.2.3+dfsg-1~exp1 (experimental)" in msg
    assert ("https://snapshot.debian.org/archive/debian/" + debian_rocm.VERIFIED_ON
            + "/pool/main/r/rocm-llvm/hipcc_7.2.3+dfsg-1~exp1_amd64.deb") in msg
    assert f"place it in {tmp_path / 'downloads'}/hipcc_7.2.3+dfsg-1~exp1_amd64.deb" in msg
    assert "move the pin" in msg and "gemmar_aot/toolchain/debian_rocm.py (DEBS" in msg and "pin` prints" in msg


def test_a_pin_the_real_archive_lists_no_longer_hold_says_what_they_hold(tmp_path):
    """The same, against the private apt configuration's real lists: the fix says what Debian has now."""
    apt_root = toolchain_root() / "apt"
    if not any((apt_root / "lists").glob("*_Packages*")):
        pytest.skip(f"the toolchain's private apt lists are not set up at {apt_root} (make setup)")
    hipcc = BY_NAME["hipcc"]
    gone = replace(hipcc, version="7.2.3+dfsg-1~exp1", sha256="0" * 64)
    err = debian_rocm._download_failed([gone], subprocess.CompletedProcess([], 100, "", "E: Version was not found"),
                                       apt_root, tmp_path)
    assert f"it has {hipcc.version} (sha256 {hipcc.sha256})" in str(err)


def test_a_verified_file_in_the_downloads_is_taken_without_apt(tmp_path, monkeypatch):
    data = b"not really a deb"
    pin = replace(BY_NAME["dash"], sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    monkeypatch.setattr(debian_rocm, "DEBS", (pin,))
    calls = _fake_apt(monkeypatch, "")
    (tmp_path / pin.filename).write_bytes(data)
    assert debian_rocm.fetch_all(tmp_path, tmp_path / "no-apt-here") == [tmp_path / pin.filename]
    assert calls == [] and not (tmp_path / "no-apt-here").exists()


def test_a_file_of_another_sha256_is_refused(tmp_path, monkeypatch):
    pin = replace(BY_NAME["dash"], sha256="1" * 64)
    monkeypatch.setattr(debian_rocm, "DEBS", (pin,))

    def apt_get(apt_root, *args, cwd=None):
        (Path(cwd) / pin.filename).write_bytes(b"rebuilt")
        return subprocess.CompletedProcess(["apt-get"], 0, "", "")

    monkeypatch.setattr(debian_rocm, "apt_get", apt_get)
    monkeypatch.setattr(debian_rocm, "prepare_apt", lambda apt_root: None)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(ToolchainError, match="(?s)does not have the pinned sha256 1111.*refused.*move the pin"):
        debian_rocm.fetch_all(tmp_path / "dl", tmp_path / "apt")
    assert not (tmp_path / "dl" / pin.filename).exists()


# ---------------------------------------------------------------- how it runs


def test_the_chroot_command(monkeypatch, tmp_path):
    monkeypatch.setattr(debian_rocm, "runner_problem", lambda: None)
    argv = debian_rocm.hipcc_argv(["--version"], "/tmp/job-x", root=tmp_path)
    tail = [str(tmp_path / "debian-rocm"), "/bin/sh", "-c", 'cd "$0" && exec "$@"', "/tmp/job-x", "/usr/bin/hipcc",
            "--version"]
    assert argv[-len(tail):] == tail and Path(argv[-len(tail) - 1]).name == "chroot"
    if os.geteuid() != 0:  # not root: the chroot in a user namespace of our own
        assert argv[:3] == ["unshare", "--user", "--map-root-user"]
    monkeypatch.setattr(debian_rocm, "runner_problem", lambda: "not root, and no unshare")
    with pytest.raises(ToolchainError, match="(?s)cannot run on this host: not root.*fix: run as root"):
        debian_rocm.hipcc_argv(["--version"], root=tmp_path)


def test_outputs_are_copied_back_but_never_through_a_symlink(tmp_path):
    job, cwd, elsewhere = tmp_path / "job", tmp_path / "cwd", tmp_path / "elsewhere"
    for d in (job / "sub", cwd, elsewhere):
        d.mkdir(parents=True)
    (job / "in.hip").write_text("x")
    before = debian_rocm._files(job)
    (job / "out.co").write_bytes(b"co")
    (job / "sub" / "t.o").write_bytes(b"o")
    debian_rocm._copy_back(job, cwd, before)
    assert (cwd / "out.co").read_bytes() == b"co" and (cwd / "sub" / "t.o").read_bytes() == b"o"
    assert not (cwd / "in.hip").exists()  # an input, unchanged: not copied back
    (job / "linked").mkdir()
    (cwd / "linked").symlink_to(elsewhere)
    (job / "linked" / "x.o").write_bytes(b"x")
    with pytest.raises(ToolchainError, match="outside"):
        debian_rocm._copy_back(job, cwd, debian_rocm._files(job) | {"linked/x.o": None})
    assert not (elsewhere / "x.o").exists()


# ---------------------------------------------------------------- the installed tree


@pytest.fixture(scope="module")
def tree_root() -> Path:
    root = toolchain_root()
    bad = debian_rocm.problems(root)
    if bad:
        pytest.skip(f"Debian's ROCm is not set up ({bad[0]}): run `make setup`")
    if debian_rocm.runner_problem():
        pytest.skip(f"Debian's ROCm cannot run on this host: {debian_rocm.runner_problem()}")
    return root


def test_debian_hipcc_says_what_it_is(tree_root):
    v = debian_rocm.versions(tree_root)
    assert v["hip"].startswith("HIP version: 7.2.53211")
    assert v["clang"] == "Debian clang version 22.1.8 (1~deb13u5)"
    fp = debian_rocm.fingerprint(tree_root)
    assert fp["debs"][0] == {"package": "hipcc", "version": "7.2.4+dfsg-1~exp1", "sha256": BY_NAME["hipcc"].sha256}
    assert is_hex64(fp["tree_digest"])


def test_every_program_starts_in_the_tree(tree_root):
    """The set is closed for what runs: every program finds every library it needs in the tree."""
    first = debian_rocm.check_runs(debian_rocm.tree_dir(tree_root))
    assert first["usr/lib/llvm-22/bin/lld"].startswith("Debian LLD 22.1.8")
    assert first["usr/lib/llvm-22/bin/clang-offload-bundler"].startswith("Debian clang-offload-bundler version 22.1.8")


#: Run in a process of its own (mori's JIT driver is imported bare there): mori's hipcc arguments for
#: a variant, paths relative to a staging directory and ``-cuid`` fixed as our compiles fix them, and the
#: clang arguments our ``clang_argv`` makes of mori's command.
_MORI_COMMAND = """
import json, sys
from pathlib import Path
import gemmar_aot_kernels.hipcc as h
params = json.loads(sys.argv[2])
argv, root = h.hipcc_argv(params, Path(sys.argv[1]))
args, it = [], iter(argv[1:])
for a in it:
    args += ["-o", "out.hsaco"] if a == "-o" and next(it) else [h._relative(a, root)]
cuid = "-cuid=" + h.cuid(params)
print(json.dumps([args + [cuid], h.clang_argv(argv, root, "out.hsaco") + [cuid]]))
"""


def _mori_command(mori_dir: Path, source: str, arch: str, nic: str) -> tuple[list[str], list[str]]:
    import json
    import sys

    params = {"source": source, "dir": "src/ops/kernels", "arch": arch, "nic": nic, "host_proxy": False}
    p = subprocess.run([sys.executable, "-c", _MORI_COMMAND, str(mori_dir), json.dumps(params)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    args, ours = json.loads(p.stdout)
    return args, ours


@pytest.mark.parametrize("source,arch,nic", [("ep_local_expert_count", "gfx950", "mlx5"),
                                             ("ep_intranode", "gfx942", "ionic-ccqe")])
def test_debian_hipcc_hands_clang_the_command_our_compile_runs(tree_root, tmp_path, source, arch, nic):
    """Debian's real hipcc, given mori's own ``_hipcc_genco`` command, runs clang++ on exactly the
    arguments ``gemmar_aot_kernels.hipcc.clang_argv`` makes of it (``-###``: nothing is compiled)."""
    from gemmar_aot.toolchain import load_toolchain

    mori_dir = load_toolchain().mori_dir
    args, ours = _mori_command(mori_dir, source, arch, nic)
    (tmp_path / "mori").symlink_to(mori_dir / "mori" / "_jit-sources")
    p = debian_rocm.run_hipcc([*args, "-###"], tmp_path, verbose=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    cmd = next(line for line in p.stdout.splitlines() if line.startswith("hipcc-cmd: ")).split()[1:]
    assert cmd[0] == "/usr/lib/llvm-22/bin/clang++"
    assert [a.strip('"') for a in cmd[1:-1]] == ours and cmd[-1] == r"-\#\#\#"
    assert "--lto-partitions=8" in p.stderr and "clang-offload-bundler" in p.stderr


def _clang_commands(out: str) -> list[str]:
    """hipcc's clang command and clang's own (``-###``), temporary file names made neutral."""
    lines = [x for x in out.splitlines() if x.startswith(("hipcc-cmd: ", ' "/usr/'))]
    return [re.sub(r"-[0-9a-f]{6}\.(o|out)\b", r".\1", x) for x in lines]


def test_without_proc_hipcc_runs_clang_as_it_does_with_proc(tree_root):
    """The chroot has no ``/proc`` (mounting one needs privileges), so hipcc cannot read
    ``/proc/self/exe`` and is given ``HIP_PATH=/usr`` instead: what it derives from ``/usr/bin/hipcc``
    itself. Its clang command and clang's own commands are those of a chroot with ``/proc`` mounted."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounting /proc in a private mount namespace needs root and unshare")
    tree = debian_rocm.tree_dir(tree_root)
    job = Path(tempfile.mkdtemp(prefix="job-", dir=tree / "tmp"))
    try:
        (job / "t.hip").write_text("#include <hip/hip_runtime.h>\n__global__ void k(int *p) { *p = 1; }\n")
        inner = "/" + job.relative_to(tree).as_posix()
        argv = debian_rocm.hipcc_argv(["--genco", "--offload-arch=gfx950", "-O2", "t.hip", "-o", "t.co", "-###"], inner,
                                      tree_root)
        env = {**debian_rocm.ENV, "HIPCC_VERBOSE": "7"}
        without = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        mounted = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                   'mount -t proc proc "$0/proc" || exit 99; exec "$@"', str(tree), *argv]
        with_proc = subprocess.run(mounted, env={k: v for k, v in env.items() if k != "HIP_PATH"}, capture_output=True,
                                   text=True, timeout=120)
    finally:
        shutil.rmtree(job, ignore_errors=True)
    if with_proc.returncode == 99:
        pytest.skip(f"this host does not let root mount /proc in a mount namespace: {with_proc.stderr.strip()}")
    assert without.returncode == 0 and with_proc.returncode == 0, without.stderr + with_proc.stderr
    assert "HIP_PATH=/usr" in with_proc.stdout and "HIP_CLANG_PATH=/usr/lib/llvm-22/bin" in with_proc.stdout
    ours, theirs = _clang_commands(without.stdout + without.stderr), _clang_commands(with_proc.stdout + with_proc.stderr)
    assert len(ours) == 4 and ours == theirs  # hipcc-cmd, clang -cc1, lld, clang-offload-bundler
    assert not (tree / "proc" / "self").exists()  # the mount was the namespace's own
