"""Compile workers and hipcc compiles die with their build: SIGTERM (clean stop) and SIGKILL (no clean-up at all).

Real builds of the smoke manifest, killed while their workers are alive. Only processes
this test started are signalled, by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "smoke.toml"


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            out.update(int(x) for x in text.split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped counts as dead: it holds no memory)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


def _start_build(tmp_path: Path, jobs: int = 2):
    return subprocess.Popen([sys.executable, "-m", "gemmar_aot", "build", str(SMOKE), "--store",
                             str(tmp_path / "store"), "-j", str(jobs), "-q"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_workers(proc, jobs: int = 2) -> set[int]:
    deadline = time.monotonic() + 120
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < jobs:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        workers = {p for p in _children(proc.pid) if b"spawn_main" in _cmdline(p)}
        time.sleep(0.1)
    assert len(workers) == jobs, f"the build started {sorted(workers)}, expected {jobs} workers"
    # Everything multiprocessing started for it (the workers and its resource tracker).
    return {p for p in _children(proc.pid) if b"multiprocessing" in _cmdline(p)}


def _wait_gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = {p for p in pids if _alive(p)}
        if not left:
            return set()
        time.sleep(0.1)
    return {p for p in pids if _alive(p)}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_worker_survives_its_build(tmp_path, sig):
    proc = _start_build(tmp_path)
    workers: set[int] = set()
    try:
        workers = _wait_workers(proc)
        time.sleep(1.0)  # let them get into their imports
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
        survivors = _wait_gone(workers, 15)
        assert not survivors, f"workers {sorted(survivors)} outlived their build after {sig.name}"
        if sig == signal.SIGTERM:
            assert proc.returncode == 130, err[-2000:]  # the same clean stop as Ctrl-C
            assert "interrupted" in err
        else:
            assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in workers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


# ---------------------------------------------------------------- hipcc compiles: clang and all under it

#: One source whose compile runs long enough (~30 s) to be killed mid-compile; killed ~2 s in, it costs little.
HIPCC_MANIFEST = """[manifest]
name = "hipcc-kill"
arch = "gfx950"

[[hipcc]]
sources = ["ep_internode_v1"]
archs = ["gfx950"]
nics = ["mlx5"]
"""


def _stat_fields(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for c in _children(todo.pop()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _live_in_groups(pgids: set[int]) -> set[int]:
    """Live processes (zombies excluded) of the process groups ``pgids``: what a snapshot of PIDs
    would miss, a process forked after it, is caught by its group."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = _stat_fields(int(name))
            if len(f) > 2 and f[0] not in (b"Z", b"X") and int(f[2]) in pgids:
                out.add(int(name))
    return out


class HipccBuild(NamedTuple):
    proc: subprocess.Popen
    tree: set[int]  # every hipcc compile process and everything under it, once clang runs
    groups: set[int]  # their process groups
    systmp: Path  # the build's system temp directory (TMPDIR)
    store: Path


@contextlib.contextmanager
def hipcc_build_compiling(tmp_path: Path, *extra: str, env: dict | None = None, manifest: str = HIPCC_MANIFEST,
                          anywhere: bool = False) -> Iterator[HipccBuild]:
    """A build of ``manifest`` into ``tmp_path/store`` with ``TMPDIR`` a directory of its own,
    handed over once clang's ``-cc1`` runs under it (``anywhere``: under a compile process the build
    did not start itself -- a Ray worker's -- started after it); whatever of it is left is killed on
    the way out."""
    m, systmp, store = tmp_path / "hipcc-kill.toml", tmp_path / "systmp", tmp_path / "store"
    m.write_text(manifest)
    systmp.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(store), "-q", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**(env or os.environ), "TMPDIR": str(systmp)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    tree: set[int] = set()
    try:
        tree, groups = _wait_for_clang(proc, anywhere)
        yield HipccBuild(proc, tree, groups, systmp, store)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in tree:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _started(pid: int) -> int:
    """A process's start time (clock ticks since boot)."""
    f = _stat_fields(pid)
    return int(f[19]) if len(f) > 19 else 0


def _wait_for_clang(proc: subprocess.Popen, anywhere: bool = False) -> tuple[set[int], set[int]]:
    deadline = time.monotonic() + 180
    since = _started(proc.pid)
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if anywhere:
            tree = {int(n) for n in os.listdir("/proc") if n.isdigit() and b"hipcc_process" in _cmdline(int(n))
                    and _started(int(n)) >= since}
            tree |= set().union(set(), *(_descendants(p) for p in tree))
        else:
            tree = _descendants(proc.pid)
        compiles = {p for p in tree if b"hipcc_process" in _cmdline(p)}
        if any(b"-cc1" in _cmdline(p) for p in tree) and compiles:
            under = set().union(*(_descendants(p) for p in compiles)) | compiles
            return under, {int(_stat_fields(p)[2]) for p in under if len(_stat_fields(p)) > 2}
        time.sleep(0.02)
    raise AssertionError("no clang -cc1 ran under the build within 180 s")


def assert_nothing_left(b: HipccBuild, seconds: float = 5, work_dir: Path | None = None) -> None:
    """Within ``seconds``: no process of the build's compiles or of their groups runs, the build's
    temp directory is empty and so is the compiles' ``work_dir`` (default: the store's ``work/``; a
    compile's directory goes with it)."""
    deadline = time.monotonic() + seconds
    work_dir = work_dir or b.store / "work"
    while time.monotonic() < deadline:
        left = {p for p in b.tree if _alive(p)} | _live_in_groups(b.groups)
        work = sorted(p.name for p in work_dir.iterdir()) if work_dir.is_dir() else []
        if not left and not work:
            break
        time.sleep(0.1)
    assert not left, [(p, _cmdline(p)[:120]) for p in left]
    assert not work, f"left in the store's work/: {work}"
    assert not list(b.systmp.iterdir()), f"left in the temp directory: {sorted(p.name for p in b.systmp.iterdir())}"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_a_hipcc_compile_ends_with_its_build_and_leaves_nothing(tmp_path, sig):
    """A build killed mid-compile (SIGKILL: no clean-up at all; SIGTERM, SIGINT: a clean stop) takes
    its hipcc compile, clang's driver, ``-cc1`` and all, within 5 s, and leaves nothing in the temp
    directory or the store's work/."""
    with hipcc_build_compiling(tmp_path) as b:
        b.proc.send_signal(sig)
        _out, err = b.proc.communicate(timeout=60)
        assert_nothing_left(b)
        if sig == signal.SIGKILL:
            assert b.proc.returncode == -signal.SIGKILL
        else:
            assert b.proc.returncode == 130, err[-2000:]
            assert "interrupted" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_hipcc_compile_removes_its_directories_and_the_build_names_the_signal(tmp_path, sig):
    """The compile process itself stopped (not its build): clang goes with it, its directories go, and
    the build reports that spec failed by that signal (and nothing else)."""
    with hipcc_build_compiling(tmp_path, "--json") as b:
        os.kill(min(p for p in b.tree if b"hipcc_process" in _cmdline(p)), sig)
        out, err = b.proc.communicate(timeout=120)
        assert b.proc.returncode == 1, err[-2000:]
        summary = json.loads(out)
        assert summary["failed"] == 1 and summary["compiled"] == 0
        assert f"stopped by {sig.name}" in json.dumps(summary["failures"]), summary["failures"]
        assert_nothing_left(b)


def test_a_hipcc_build_killed_mid_compile_resumes_to_the_same_lock(smoke_store, tmp_path):
    """The torture test for ``[[hipcc]]`` specs: smoke's hipcc entries (13 code objects, two compiles at
    a time), killed with SIGKILL while clang runs, leave no process, temp file or work directory; the
    same command run again finishes with nothing failed, a store that verifies clean, and a lock
    byte-identical to the one the same manifest gets from the store of an uninterrupted build."""
    import shutil

    from store_health import assert_verifies_clean

    from gemmar_aot.builder.manifest import tomllib

    m = tmp_path / "hipcc-torture.toml"  # smoke's [[hipcc]] entries
    m.write_text('[manifest]\nname = "hipcc-torture"\narch = "gfx950"\n\n' + "".join(
        "[[hipcc]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in e.items()) + "\n"
        for e in tomllib.loads(SMOKE.read_text())["hipcc"]))
    with hipcc_build_compiling(tmp_path, "-j", "2", manifest=m.read_text()) as b:
        b.proc.kill()
        b.proc.communicate(timeout=60)
        assert_nothing_left(b)
    systmp, store = b.systmp, b.store
    env = {**os.environ, "TMPDIR": str(systmp)}
    build = [sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(store), "-j", "2", "-q", "--json"]
    again = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert summary["failed"] == 0 and summary["distinct_specs"] == 13, summary
    assert not list(systmp.iterdir()) and not list((store / "work").iterdir())
    assert_verifies_clean(store)
    reference = tmp_path / "reference"
    shutil.copytree(smoke_store, reference)
    ref = subprocess.run(build[:6] + [str(reference), "-q", "--json"], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=300)
    assert ref.returncode == 0 and json.loads(ref.stdout)["compiled"] == 0, ref.stderr[-3000:]
    name = "locks/hipcc-torture.lock.json"
    assert (store / name).read_bytes() == (reference / name).read_bytes()


def test_a_hipcc_compile_into_a_store_named_relative_to_the_working_directory(tmp_path):
    """`make build` passes --out artifacts (relative): the compile's work directory is its TMPDIR, and
    clang runs in a staging directory elsewhere, so it must be absolute (a fresh clone's CI found it)."""
    m = tmp_path / "rel.toml"
    m.write_text('[manifest]\nname = "rel"\narch = "gfx950"\n\n[[hipcc]]\nsources = ["cast_kernel"]\n'
                 'archs = ["gfx950"]\nnics = ["mlx5"]\n')
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", m.name, "--store", "relstore", "-q", "--json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads(p.stdout)
    assert (s["compiled"], s["failed"]) == (1, 0), s["failures"]
    assert not list((tmp_path / "relstore" / "work").iterdir())


def test_a_ray_nodes_compile_first_removes_what_a_machine_that_died_left_in_its_work_dir(tmp_path):
    """A node's compiles work under its toolchain's ``work/``; a compile killed with its whole machine
    leaves its directory there. The node's next compile task removes the stale ones and leaves a
    fresh one (another task's compile in flight) alone."""
    from gemmar_aot.compiler.ray_executor import _compile_whole
    from gemmar_aot.toolchain import load_toolchain

    work = load_toolchain().root / "work"
    old, fresh = work / "hipcc-ep_intranode_v1-stale000", work / "jitv2-ep_dispatch-inflight0"
    try:
        for d in (old, fresh):
            (d / ".stage-x").mkdir(parents=True)
            (d / ".stage-x" / "ep.o").write_bytes(b"half a clang temporary")
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        assert _compile_whole([], {"fingerprint": {"profile": "default"}}) == []
        assert not old.exists() and fresh.is_dir()
    finally:
        for d in (old, fresh):
            subprocess.run(["rm", "-rf", str(d)], check=True)
