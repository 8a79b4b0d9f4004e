"""The plans mori's EP v2 HIP backend makes for a config, by mori's own code: the plan half of ``jitv2``.

``python -m gemmar_aot_kernels.jitv2_plans REQUEST_JSON`` (a process of its own) prints, for each
config of the request, mori's refusal or the distinct translation units its op would compile:
plan, request, rendered text, hipcc flags, entry symbol (``gemmar_aot_kernels.jitv2.spec`` makes a
spec of each). The request: ``toolchain_root``, ``mori_dir``, ``work`` (a scratch directory),
``arch``, ``nic`` (a variant of ``model.hipcc.NICS``), ``topology`` (the device's KFD identity:
CU count, gfx_target_version, PCI device id) and ``configs`` (mori's ``EpDispatchCombineConfig``
fields, dtypes by name).

What runs is mori's: its config class (its checks, the geometry its HIP tuning tables give for the
device), its HIP backend's ``_unsupported``, ``_specs_from`` and ``_build_kernels`` (intranode) or
``_build_internode_kernels``, which create every plan the op's construction creates; each plan
creation renders, keys and calls ``$MORI_JIT_HIPCC`` -- here a hipcc of ours that records the command
and writes a placeholder (``jitv2.hipcc_main``, capture mode) -- and mori publishes it. What is
not mori's: the op's ``__init__`` (it needs a GPU: torch.cuda, a communicator), replaced by the few
attributes those methods read; the device identity (``mori.ops.utils.topology``, which reads KFD
sysfs) answered with the request's; the arena's communicator (nothing is allocated). Rank does not
reach a translation unit (mori binds it at launch), so one rank's plans are every rank's.

Not in any key: what it finds is (the spec holds the text, the flags and the request).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from . import jitv2

#: Dtype names a manifest uses -> torch's attribute names.
TORCH_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp8_e4m3fn": "float8_e4m3fn",
                "fp8_e4m3fnuz": "float8_e4m3fnuz", "fp4": "float4_e2m1fn_x2"}
_DTYPE_FIELDS = ("data_type", "dispatch_data_type", "combine_data_type")
_ENTRY_RE = re.compile(r"\b(mori_ep_\w+)\b")


class _Window:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def close(self) -> None:
        pass


class _Communicator:
    """What mori's ``SymmArena`` asks of a communicator: an allocation's address and a window handle.
    Nothing is allocated: the plans never touch the window (it is a launch argument)."""

    def alloc_mem(self, nbytes: int):
        return _Window(ptr=0x7F0000000000)

    def register_window(self, ptr: int, nbytes: int):
        return _Window(handle=0xC0C0, local_ptr=ptr)


def _record_requests(plan_api) -> list[tuple[str, dict]]:
    """Every ``mori_jit_plan_create`` call from now on, as (plan, {field: value})."""
    lib = plan_api._load()
    create = lib.mori_jit_plan_create
    calls: list[tuple[str, dict]] = []

    def recording(kernel, arch, names, values, n):
        calls.append((kernel.decode(), {names[i].decode(): int(values[i]) for i in range(n)}))
        return create(kernel, arch, names, values, n)

    lib.mori_jit_plan_create = recording
    return calls


def plans_of(cfg_fields: dict, *, arch: str, nic: str, topology: tuple, cache: Path, calls: list) -> list[dict]:
    """The distinct translation units mori's HIP backend compiles for one config (see the module)."""
    import torch

    from mori.ops.dispatch_combine_v2.dispatch_combine_op import EpDispatchCombineConfig
    from mori.ops.dispatch_combine_v2.hip_backend import EpDispatchCombineOpHip
    from mori.ops.dispatch_combine_v2.symm_arena import SymmArena

    fields = {k: (getattr(torch, TORCH_DTYPES[v]) if k in _DTYPE_FIELDS and v is not None else v)
              for k, v in cfg_fields.items()}
    cfg = EpDispatchCombineConfig(**fields, kernel_backend="hip")
    op = object.__new__(EpDispatchCombineOpHip)
    op.cfg = cfg
    op._is1250 = arch.startswith("gfx125")
    op._multi_processor_count = topology[0]
    op._tokoff_wanted = False
    op._device_index = 0
    op.dispatch_staging = None  # mori 1.2.5: gfx1250's dispatch staging buffer (no arch built here has one)
    bad = op._unsupported(cfg)
    if bad:
        raise ValueError("hip backend cannot serve this config:\n  " + "\n  ".join(bad))
    first = len(calls)
    if cfg.is_internode:
        op._build_internode_kernels(cfg)
    else:
        op._dispatch_specs, op._combine_specs = op._specs_from(cfg)
        op._build_kernels(cfg, SymmArena(_Communicator(), op._regions(cfg)))
    made = calls[first:]
    if len(made) != len(op._plans):
        raise RuntimeError(f"mori created {len(op._plans)} plans through {len(made)} plan_create calls")
    units: dict[str, dict] = {}
    for (kernel, request), p in zip(made, op._plans):
        entry_dir = Path(p.info["cacheDir"])
        rel = entry_dir.relative_to(cache).as_posix()
        if rel in units:
            continue
        text = (entry_dir / "kernel.hip").read_text()
        entries = _ENTRY_RE.findall(text)
        units[rel] = {"arch": arch, "nic": nic, "plan": kernel, "request": request, "text": text,
                      "flags": jitv2.hipcc_flags(json.loads((entry_dir / "hipcc.json").read_text())),
                      "entry": entries[-1] if entries else "", "cache_entry": rel,
                      "launch": {"grid": p.info.get("gridX"), "block": p.info.get("blockX"),
                                 "shared": p.info.get("sharedBytes")}}
    return sorted(units.values(), key=lambda u: (u["plan"], u["entry"]))


def enumerate_plans(req: dict) -> list[dict]:
    """For each config of the request: ``{"units": [...]}`` or ``{"error": mori's words}``."""
    work = Path(req["work"])
    cache = work / "mori-jit"
    hipcc = jitv2.write_hipcc(work / "hipcc", "capture:")
    plan_api = jitv2.mori_v2(Path(req["mori_dir"]), Path(req["toolchain_root"]) / "hip-standin" / "libamdhip64.so.7",
                             req["arch"], req["nic"], cache, hipcc)
    import mori.ops.utils as gpu_utils

    topology = tuple(req["topology"])
    gpu_utils.topology = lambda: topology  # the device the tuning tables are read for
    calls = _record_requests(plan_api)
    out = []
    for fields in req["configs"]:
        try:
            out.append({"units": plans_of(fields, arch=req["arch"], nic=req["nic"], topology=topology, cache=cache,
                                          calls=calls)})
        except (ValueError, TypeError) as exc:  # mori's refusal of the config, in its words
            out.append({"error": str(exc)})
    return out


def main(argv: list[str]) -> int:
    print(json.dumps(enumerate_plans(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
