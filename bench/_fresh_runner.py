"""What the remote-cache benchmarks share: their options, and one ``gemmar-aot build`` as a runner
runs it (a process of its own, ``--json``), timed."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def arg_parser(doc: str) -> argparse.ArgumentParser:
    """``--store`` (a warm store of ``--manifest``), ``--delay`` (seconds added to every request),
    ``--rounds``, ``--json-out``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--manifest", type=Path, default=ROOT / "manifests" / "dsv4-pro-wo_b.toml")
    ap.add_argument("--delay", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json-out", type=Path)
    return ap


def build(manifest: Path, store: Path, remote: str | None, *extra: str) -> dict:
    """``gemmar-aot build MANIFEST --store STORE [--remote REMOTE *extra] --json``, no remote or key
    from the environment; it must compile nothing (the store or the remote is warm). Its wall
    seconds, the build's own, requests, bytes down, and its closure and compile-key summaries."""
    cmd = [sys.executable, "-m", "gemmar_aot", "build", str(manifest), "--store", str(store), "--json", "-q"]
    if remote:
        cmd += ["--remote", remote, *extra]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GEMMAR_AOT_REMOTE", "GEMMAR_AOT_COMPILE_KEY", "GEMMAR_AOT_TRUSTED_COMPILE_KEYS"))}
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"build failed: {p.stderr[-2000:]}")
    s = json.loads(p.stdout)
    if s["compiled"]:
        raise SystemExit(f"the build compiled {s['compiled']} kernels ({s.get('compile_keys')}): --store must be "
                         f"warm for the manifest (and, where signatures are checked, every entry signed)")
    r = s.get("remote") or {}
    return {"wall_s": wall, "build_wall_s": s["wall_seconds"], "requests": r.get("requests", 0),
            "bytes_down": r.get("bytes_down", 0), "closure": s.get("closure"), "compile_keys": s.get("compile_keys")}


def arm(runs: list[dict]) -> dict:
    """One arm's rounds (``build``'s results): the medians, every wall time, and the last round's
    requests, bytes down, closure and compile-key summaries."""
    last = runs[-1]
    return {"wall_s_median": round(statistics.median(r["wall_s"] for r in runs), 3),
            "build_wall_s_median": round(statistics.median(r["build_wall_s"] for r in runs), 3),
            "walls_s": [round(r["wall_s"], 3) for r in runs], "requests": last["requests"],
            "bytes_down": last["bytes_down"], "closure": last["closure"], "compile_keys": last["compile_keys"]}


@contextmanager
def closure_taken_off(cache_dir: Path, closure_key: str):
    """The manifest's closure entries (``/ac/KEY`` and its "latest" twin: the same bytes) off the
    cache whose files are ``cache_dir`` for a per-key run, and put back after."""
    ac = cache_dir / "ac"
    exact = (ac / closure_key).read_bytes()
    files = {p: p.read_bytes() for p in ac.iterdir() if p.read_bytes() == exact}
    for p in files:
        p.unlink()
    try:
        yield
    finally:
        for p, data in files.items():
            p.write_bytes(data)
