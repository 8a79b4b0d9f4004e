"""What the remote-cache benchmarks share: their options, and one ``gemmar-aot build`` as a runner
runs it (a process of its own, ``--json``), timed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
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
