"""mori's own JIT v2 (``libmori_jit.so``), in a process of its own: the oracle of the jitv2 parity tests.

    python tests/jitv2_mori.py compile REQUEST_JSON   # mori compiles each plan with a hipcc double
    python tests/jitv2_mori.py pod REQUEST_JSON       # mori in a pod gemmar-aot serves, no compiler

REQUEST_JSON: ``mori_dir``, ``hip_lib`` (the HIP runtime double, ``tests/hipstub``), ``arch``, ``nic``
(a variant of ``gemmar_aot.model.hipcc.NICS``), ``plans`` ([{"plan", "request"}]: what mori's plan
constructor is given), and per mode:

* ``compile``: ``cache`` (a fresh ``$MORI_JIT_CACHE_DIR``) and ``hipcc`` (``$MORI_JIT_HIPCC``: a shell
  line running ``tests/hipcc_shim.py``, ROCm's hipcc as a test double on the toolchain's clang). mori
  renders, keys, runs the double and publishes; nothing of gemmar_aot is imported.
* ``pod``: ``artifacts`` (a store) and ``root`` (``$GEMMAR_AOT_MORI_JIT_DIR``); no ``ROCM_PATH``, no
  hipcc. gemmar-aot's pod hook (``gemmar_aot.mori_patch``) serves mori's plans, as in a pod with
  ``GEMMAR_AOT_PATCH_MORI=1``; what mori computes (its key: the cache entry it opens) is mori's.

Prints one JSON object: per plan, the cache entry mori used (relative to its cache root) and the
sha256 of the code object there, or the error mori's plan constructor raised (in a pod, a compile
mori asks for is refused: a plan without an error was served without one).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
from pathlib import Path

NICS = {"mlx5": ("mlx5", "0"), "bnxt": ("bnxt", "0"), "ionic": ("ionic", "0"), "ionic-ccqe": ("ionic", "1")}


def _mori(req: dict) -> None:
    from jitv2_oracle import _bare  # mori's packages made bare, as the launch oracle makes them

    ctypes.CDLL(req["hip_lib"], mode=ctypes.RTLD_GLOBAL)  # mori's libraries bind to it by soname
    pkg = Path(req["mori_dir"]) / "mori"
    _bare("mori", pkg)
    _bare("mori.ops", pkg / "ops")


def _made(plans: list[dict], cache_root) -> list[dict]:
    import mori.jit.v2.plan_api as plan_api

    plan_api.load_library("libmori_ops_v2.so")
    out = []
    for p in plans:
        try:
            plan = plan_api.make_plan(p["plan"])(**p["request"])
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            out.append({"plan": p["plan"], "error": f"{type(exc).__name__}: {exc}"})
            continue
        d = Path(plan.info["cacheDir"])
        out.append({"plan": p["plan"], "cache_entry": d.relative_to(cache_root()).as_posix(),
                    "sha256": hashlib.sha256((d / "kernel.hsaco").read_bytes()).hexdigest()})
    return out


def compile_mode(req: dict) -> dict:
    nic, ccqe = NICS[req["nic"]]
    for k in [k for k in os.environ if k.startswith("MORI_")] + ["ROCM_PATH"]:
        os.environ.pop(k, None)
    os.environ.update(MORI_JIT_ARCH=req["arch"], MORI_DEVICE_NIC=nic, MORI_DEVICE_IONIC_CCQE=ccqe,
                      MORI_JIT_CACHE_DIR=req["cache"], MORI_JIT_HIPCC=req["hipcc"], MORI_WAVE_SIZE="64")
    _mori(req)
    return {"plans": _made(req["plans"], lambda: Path(req["cache"]))}


def pod_mode(req: dict) -> dict:
    nic, ccqe = NICS[req["nic"]]
    for k in [k for k in os.environ if k.startswith("MORI_")] + ["ROCM_PATH", "HIP_PATH"]:
        os.environ.pop(k, None)
    os.environ.update(MORI_GPU_ARCHS=req["arch"], MORI_DEVICE_NIC=nic, MORI_WAVE_SIZE="64",
                      GEMMAR_AOT_MORI_JIT_DIR=req["root"], GEMMAR_AOT_ARTIFACTS=req["artifacts"])
    if ccqe == "1":
        os.environ["MORI_DEVICE_IONIC_CCQE"] = "1"
    _mori(req)
    from gemmar_aot import mori_patch

    mori_patch.install()
    import mori.jit.core as core

    core.is_ccqe_enabled = lambda: ccqe == "1"  # the firmware probe's answer (no NIC here)
    out = _made(req["plans"], lambda: Path(os.environ["MORI_JIT_CACHE_DIR"]))
    return {"plans": out, "cache": os.environ.get("MORI_JIT_CACHE_DIR"), "hipcc": os.environ.get("MORI_JIT_HIPCC")}


if __name__ == "__main__":
    mode, request = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"compile": compile_mode, "pod": pod_mode}[mode](request)))
