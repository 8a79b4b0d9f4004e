"""HIP-backend ``[[ep]]`` entries planned: the translation units mori's JIT v2 compiles for each, found
by mori's own code.

What an entry needs is whatever mori's HIP backend makes at op construction for that config on
that device: for intranode, a dispatch and a combine plan per (block, warp) of the device's HIP
tuning table; for internode, the eight passes of each geometry bucket, one translation unit per
pass (geometry is a launch argument there). Nothing here restates that: each (arch, NIC variant,
device) runs ``gemmar_aot_kernels.jitv2_plans`` once, in a process of its own
(:mod:`gemmar_aot.compiler.hipcc_process`, which takes it down with the build), and a spec is made
of each distinct unit (``gemmar_aot_kernels.jitv2.spec``). A config mori refuses is a manifest
error in mori's words, naming the entry.

Rank is not in a unit (mori binds it at launch): a unit serves every rank of the world.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from gemmar_aot.builder.manifest_ep import EpHipEntry
from gemmar_aot.model.spec import KernelSpec
from gemmar_aot.util.errors import ManifestError
from gemmar_aot_kernels import jitv2 as jitv2_recipe


@dataclass(frozen=True)
class JitV2Plan:
    """One HIP-backend ``[[ep]]`` entry planned: each unit mori's op compiles for it (per NIC variant:
    plan, entry symbol, mori's cache entry, launch geometry) and its spec, in the same order."""

    entry: EpHipEntry
    units: tuple[dict, ...]
    specs: tuple[KernelSpec, ...]

    def to_json(self) -> dict:
        return {**self.entry.to_json(),
                "units": [{k: u[k] for k in ("nic", "plan", "entry", "cache_entry", "launch")} | {"spec_id": s.spec_id}
                          for u, s in zip(self.units, self.specs)]}


def plan_jitv2(entries: Sequence[EpHipEntry], toolchain: Any, work_root: Path | None = None) -> tuple[JitV2Plan, ...]:
    """The plans of ``entries``, with ``toolchain``'s mori (its root, its profile's mori). ``work_root``:
    where the scratch directories go (a build's store ``work/``; else the temp directory)."""
    if not entries:
        return ()
    groups: dict[tuple, list[tuple[int, str]]] = {}
    for i, e in enumerate(entries):
        for nic in e.nics:
            groups.setdefault((e.arch, nic, e.topology), []).append((i, nic))
    found: dict[tuple[int, str], dict] = {}
    for (arch, nic, topology), members in groups.items():
        configs = [entries[i].config() for i, _nic in members]
        results = _enumerate(toolchain, arch, nic, topology, configs, work_root)
        for (i, n), res in zip(members, results):
            found[(i, n)] = res
    problems = []
    for i, e in enumerate(entries):
        for nic in e.nics:
            err = found[(i, nic)].get("error")
            if err:
                problems.append(f"{e.source}: mori's HIP backend refuses this config on {e.device} (NIC {nic}): "
                                + err.replace("\n", " ") + "; change it to a configuration mori's HIP backend serves")
    if problems:
        raise ManifestError(sorted(set(problems)))
    out = []
    for i, e in enumerate(entries):
        units = tuple(u for nic in e.nics for u in found[(i, nic)]["units"])
        out.append(JitV2Plan(e, units, tuple(jitv2_recipe.spec(u) for u in units)))
    return tuple(out)


#: What a plan step's answer depends on besides its request: mori's Python that decides the plans
#: (its config, HIP backend, tuning tables, plan API), relative to the unpacked wheel.
MORI_PLAN_SOURCES = ("mori/ops/dispatch_combine_v2/*.py", "mori/ops/utils.py", "mori/jit/v2/*.py")


def _answer_key(toolchain: Any, req: dict) -> str:
    """The cache key of a plan step's answer: the request, mori's deciding Python and JIT v2 libraries
    and trees (the toolchain's fingerprint of them), and our code that asks (``gemmar_aot_kernels.jitv2``
    and ``jitv2_plans``)."""
    import hashlib

    from gemmar_aot_kernels import jitv2_plans

    h = hashlib.sha256(json.dumps({k: v for k, v in req.items() if k != "work"}, sort_keys=True).encode())
    h.update(json.dumps(toolchain.fingerprint.get("jitv2"), sort_keys=True).encode())
    for pattern in MORI_PLAN_SOURCES:
        for f in sorted(Path(toolchain.mori_dir).glob(pattern)):
            h.update(f"{f.name}\0".encode() + f.read_bytes())
    for mod in (jitv2_recipe, jitv2_plans):
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()


def _enumerate(toolchain: Any, arch: str, nic: str, topology: tuple, configs: list[dict],
               work_root: Path | None) -> list[dict]:
    """``gemmar_aot_kernels.jitv2_plans`` on ``configs`` in a process of its own (under the compile
    process's guard: it dies with us, and removes its scratch directory). An answer is kept in the
    toolchain's ``cache/jitv2-plans/`` under :func:`_answer_key`: the same request of the same mori
    is answered from there (a plan re-runs mori's code only when something it reads changed)."""
    req = {"toolchain_root": str(toolchain.root), "mori_dir": str(toolchain.mori_dir), "arch": arch, "nic": nic,
           "topology": list(topology), "configs": configs}
    cached = Path(toolchain.root) / "cache" / "jitv2-plans" / f"{_answer_key(toolchain, req)}.json"
    try:
        return json.loads(cached.read_text())
    except (OSError, ValueError):
        pass
    answer = _run_plans(toolchain, req, work_root)
    try:
        from gemmar_aot.util.atomic_write import atomic_write_bytes

        atomic_write_bytes(cached, json.dumps(answer).encode(), durable=False)
    except OSError:
        pass  # a read-only toolchain: planned again next time
    return answer


def _run_plans(toolchain: Any, req: dict, work_root: Path | None) -> list[dict]:
    arch, nic = req["arch"], req["nic"]
    if work_root is not None:
        Path(work_root).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"jitv2-plans-{arch}-{nic}-", dir=work_root))
    try:
        req = {**req, "work": str(work)}
        from gemmar_aot.compiler.hipcc_process import BUILD_PID_ENV

        p = subprocess.run([sys.executable, "-m", "gemmar_aot.compiler.hipcc_process", "plans", json.dumps(req),
                            str(work)], capture_output=True, text=True, timeout=900, start_new_session=True,
                           env={**os.environ, BUILD_PID_ENV: str(os.getpid())})
        if p.returncode != 0:
            raise RuntimeError(f"finding the JIT v2 plans with mori's code ({arch}, NIC {nic}) failed (exit "
                               f"{p.returncode}):\n{p.stderr[-4000:]}")
        return json.loads(p.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
