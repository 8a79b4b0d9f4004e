"""Compile workers die with their build: SIGTERM (clean stop) and SIGKILL (no clean-up at all).

Real builds of the smoke manifest, killed while their workers are alive. Only processes
this test started are signalled, by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
