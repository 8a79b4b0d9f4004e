"""``gemmar-aot build``: manifest -> plan -> compile -> artifacts.

Validation happens before anything is started: the manifest (all errors at once)
and the toolchain (loaded and verified in this process, so a missing piece is
one clear error rather than a broken worker pool). Each finished kernel is
written as it arrives, atomically, so an interrupted build keeps what it had.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from gemmar_aot.compiler.worker import CompileResult
from gemmar_aot.spec import KernelSpec


def checkout_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_out() -> Path:
    env = os.environ.get("GEMMAR_AOT_STORE")
    return Path(env) if env else checkout_root() / "artifacts"


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def run_build(manifest_path: Path, *, out: Path | None = None, jobs: int | None = None,
              debug_locations: bool = False, only: tuple[str, ...] = (),
              progress: bool = True, toolchain_root: str | None = None) -> dict:
    from gemmar_aot.compiler.driver import compile_all
    from gemmar_aot.manifest import load_manifest
    from gemmar_aot.plan import make_plan
    from gemmar_aot.toolchain import load_toolchain

    manifest = load_manifest(manifest_path)
    plan = make_plan(manifest)
    tc = load_toolchain(toolchain_root)
    out = Path(out) if out is not None else default_out()
    specs = [s for s in plan.specs if not only or s.kind in only]

    atomic_write(out / "plans" / f"{manifest.name}.json", _json_bytes(plan.to_json()))
    fingerprint = tc.fingerprint

    def on_result(spec: KernelSpec, res: CompileResult) -> None:
        if not res.ok:
            return
        base = out / "kernels" / spec.spec_id
        atomic_write(base.with_suffix(".co"), res.code)
        atomic_write(base.with_suffix(".json"), _json_bytes({
            "spec": spec.to_json(),
            "metadata": res.metadata,
            "launch": res.launch,
            "compile_seconds": round(res.seconds, 3),
            "toolchain": fingerprint,
        }))

    t0 = time.perf_counter()
    results = compile_all(specs, jobs=jobs, toolchain_root=toolchain_root,
                          debug_locations=debug_locations, on_result=on_result, progress=progress)
    wall = time.perf_counter() - t0

    by_kind: dict[str, dict] = defaultdict(lambda: {"count": 0, "seconds": 0.0, "bytes": 0})
    failures = []
    for spec, res in results:
        if res.ok:
            k = by_kind[f"{spec.recipe}:{spec.kind}"]
            k["count"] += 1
            k["seconds"] += res.seconds
            k["bytes"] += len(res.code)
        else:
            failures.append({"spec_id": spec.spec_id, "label": spec.label(), "error": res.error})
    for k in by_kind.values():
        k["mean_seconds"] = round(k["seconds"] / k["count"], 3)
        k["seconds"] = round(k["seconds"], 3)
    summary = {
        "manifest": manifest.name,
        "out": str(out),
        "jobs": jobs or os.cpu_count(),
        "kernel_instances": plan.instances,
        "distinct_specs": len(plan.specs),
        "selected_specs": len(specs),
        "compiled": sum(1 for _, r in results if r.ok),
        "failed": len(failures),
        "wall_seconds": round(wall, 3),
        "cpu_seconds": round(sum(r.seconds for _, r in results), 3),
        "by_kind": dict(by_kind),
        "failures": sorted(failures, key=lambda f: f["label"]),
    }
    atomic_write(out / "builds" / f"{manifest.name}.json", _json_bytes(summary))
    return summary
