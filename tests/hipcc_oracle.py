"""The oracle of the hipcc byte-parity tests: mori's own ``compile_genco``, in a process of its own.

    python tests/hipcc_oracle.py ROCM_PATH MORI_DIR CACHE_DIR VARIANTS_JSON

For each variant (source, dir, arch, nic, host_proxy) it sets what mori reads in a pod --
``$MORI_GPU_ARCHS``, ``$MORI_DEVICE_NIC``, ``$MORI_ENABLE_HOST_PROXY``, ``$ROCM_PATH`` (a fake
ROCm whose ``bin/hipcc`` is ``tests/hipcc_shim.py``), ``$MORI_JIT_CACHE_DIR`` -- and calls mori's
``mori.jit.core.compile_genco(name, source_dir)``, which builds its hipcc command and runs it.
One test double besides the hipcc shim: mori's ionic CCQE probe (a library and the NICs'
firmware in sysfs) answers as the variant says. Prints one JSON line: [{variant, path, sha256}].
mori's package is imported bare (its ``__init__`` loads ROCm's libraries); nothing of gemmar_aot.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path


def main(rocm: str, mori_dir: str, cache: str, variants: list[dict]) -> list[dict]:
    pkg = Path(mori_dir) / "mori"
    mod = types.ModuleType("mori")
    spec = importlib.machinery.ModuleSpec("mori", None, is_package=True)
    spec.submodule_search_locations = [str(pkg)]
    mod.__spec__, mod.__path__ = spec, [str(pkg)]
    sys.modules["mori"] = mod
    os.environ.update(ROCM_PATH=rocm, MORI_JIT_CACHE_DIR=cache)
    for k in ("ENABLE_PROFILER", "MORI_DEBUG_INFO", "MORI_ENABLE_HOST_PROXY", "MORI_DISABLE_IONIC_CCQE"):
        os.environ.pop(k, None)
    core = importlib.import_module("mori.jit.core")
    config = importlib.import_module("mori.jit.config")
    out = []
    for v in variants:
        os.environ["MORI_GPU_ARCHS"] = v["arch"]
        os.environ["MORI_DEVICE_NIC"] = "ionic" if v["nic"] == "ionic-ccqe" else v["nic"]
        if v["host_proxy"]:
            os.environ["MORI_ENABLE_HOST_PROXY"] = "1"
        else:
            os.environ.pop("MORI_ENABLE_HOST_PROXY", None)
        config._cached_config = None  # mori caches its build config (the arch) per process
        core.is_ccqe_enabled = lambda ccqe=(v["nic"] == "ionic-ccqe"): ccqe  # the firmware probe's answer
        path = core.compile_genco(v["source"], source_dir=v["dir"])
        out.append({"variant": v, "path": path, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()})
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))
