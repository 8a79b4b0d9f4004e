"""A manifest's ``[[ep]]`` entries checked: mori's EP dispatch/combine v2, either backend.

One entry is one EP configuration of one world; the build makes every rank's kernels of it. The
FlyDSL backend (the default)::

    [[ep]]
    world = 8
    hidden = 7168
    max_tokens = 4096          # per rank (mori: max_num_inp_token_per_rank)
    experts = 256              # routed experts in all; per rank = experts / world
    topk = 8
    dispatch_dtype = "bf16"    # bf16 | fp32 | fp8_e4m3fn | fp8_e4m3fnuz | fp4
    device = "MI355X"          # whose tuning table picks the (block, warp) variants
    # optional: combine_dtype (default: dispatch_dtype), combine_mode ("gather" | "scatter"),
    #           quant_type ("none" | "fp8_direct_cast" | "fp8_blockwise"), scale_dim,
    #           scale_type_size, max_total_recv_tokens, std_moe (false), replay (true),
    #           gpu_per_node (= world: mori's FlyDSL backend is intranode only)

The HIP backend (mori's JIT v2: ``kernel_backend = "hip"``; the only backend with a multi-node
path, ``gpu_per_node < world``) takes the same fields in mori's names, its own device list
(MI355X, MI350X: gfx950; MI300X, MI325X, MI308X: gfx942), and ``nics`` (mori's NIC variants, as
``[[hipcc]]``'s), ``internode_kernel`` and ``num_qp_per_pe``; mori's own code checks it and finds
its plans when the plan runs (``gemmar_aot.builder.plan_jitv2``).

The FlyDSL backend's (block, warp) variants come from the named device's table in mori 1.2.4
(``gemmar_aot.model.ep``), never from the build host. Every problem names the file, the
entry and its line, the field, the value, the rule (mori's own words where mori refuses)
and a fix, like a ``[[tuple]]``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gemmar_aot.builder.manifest_check import Checker, open_entry
from gemmar_aot.model.ep import (
    COMBINE_MODES,
    DEVICE_ALIASES,
    DEVICES,
    DTYPES,
    QUANT_TYPES,
    EpConfig,
    config_problems,
    resolved,
)

#: Every key an entry may have: (required, an example).
EP_KEYS: dict[str, tuple[bool, str]] = {
    "world": (True, "world = 8"),
    "hidden": (True, "hidden = 7168"),
    "max_tokens": (True, "max_tokens = 4096"),
    "experts": (True, "experts = 256"),
    "topk": (True, "topk = 8"),
    "dispatch_dtype": (True, 'dispatch_dtype = "bf16"'),
    "device": (True, 'device = "MI355X"'),
    "combine_dtype": (False, 'combine_dtype = "bf16"'),
    "combine_mode": (False, 'combine_mode = "gather"'),
    "quant_type": (False, 'quant_type = "none"'),
    "scale_dim": (False, "scale_dim = 0"),
    "scale_type_size": (False, "scale_type_size = 0"),
    "max_total_recv_tokens": (False, "max_total_recv_tokens = 0"),
    "std_moe": (False, "std_moe = false"),
    "replay": (False, "replay = true"),
    "gpu_per_node": (False, "gpu_per_node = 8"),
    "kernel_backend": (False, 'kernel_backend = "hip"'),
    # the HIP backend's (mori's JIT v2) only:
    "nics": (False, 'nics = ["mlx5"]'),
    "internode_kernel": (False, 'internode_kernel = "auto"'),
    "num_qp_per_pe": (False, "num_qp_per_pe = 2"),
}
#: Keys only a HIP-backend entry takes, and the FlyDSL backend's only.
HIP_ONLY_KEYS = ("nics", "internode_kernel", "num_qp_per_pe")
FLYDSL_ONLY_KEYS = ("replay",)
BACKENDS = ("flydsl", "hip")
#: mori's internode kernel families (``EpDispatchCombineConfig.internode_kernel``).
INTERNODE_KERNELS = ("auto", "v2", "v2_ll")
#: A device's identity as KFD's sysfs reports it (``mori.ops.utils.topology``: CU count,
#: gfx_target_version, PCI device id) -- what mori's HIP tuning tables are chosen by -- and its arch.
HIP_DEVICES: dict[str, tuple[str, tuple[int, int, int]]] = {
    "MI355X": ("gfx950", (256, 90500, 0x75A3)),
    "MI350X": ("gfx950", (256, 90500, 0x75A0)),
    "MI300X": ("gfx942", (304, 90402, 0x74A1)),
    "MI325X": ("gfx942", (304, 90402, 0x74A5)),
    "MI308X": ("gfx942", (80, 90402, 0x74A2)),
}
_HEADER_RE = re.compile(r"""^[ \t]*\[\[[ \t]*(?:ep|"ep"|'ep')[ \t]*\]\]""")
#: What a multi-node deployment is told (mori's FlyDSL backend refuses it).
INTERNODE_FIX = ('set kernel_backend = "hip": multi-node EP runs mori\'s HIP backend (mori\'s JIT v2), which '
                 "this build makes too; or drop gpu_per_node (or set it to world) for the FlyDSL backend")


@dataclass(frozen=True)
class EpHipEntry:
    """A checked HIP-backend ``[[ep]]`` (mori's JIT v2): mori's config fields (``EpDispatchCombineConfig``'s
    names, dtypes by name, rank 0: no translation unit depends on the rank), the device whose table
    picks the geometry, its arch, the NIC variants, and where it was written."""

    fields: tuple[tuple[str, Any], ...]
    device: str
    nics: tuple[str, ...]
    source: str  # "path:ep[i] (line L)"

    @property
    def arch(self) -> str:
        return HIP_DEVICES[self.device][0]

    @property
    def topology(self) -> tuple[int, int, int]:
        return HIP_DEVICES[self.device][1]

    def config(self) -> dict[str, Any]:
        return dict(self.fields)

    @property
    def internode(self) -> bool:
        c = self.config()
        return c.get("gpu_per_node") is not None and c["gpu_per_node"] < c["world_size"]

    def to_json(self) -> dict:
        return {"kernel_backend": "hip", "config": self.config(), "device": self.device, "arch": self.arch,
                "nics": list(self.nics), "source": self.source}


@dataclass(frozen=True)
class EpEntry:
    """A checked ``[[ep]]``: its resolved configuration and where it was written."""

    config: EpConfig
    source: str  # "path:ep[i] (line L)", as a tuple's


def entry_lines(ck: Checker, count: int) -> list[int | None]:
    """Line of each ``[[ep]]`` header (1-based), or None when unknown."""
    heads = [i + 1 for i, line in enumerate(ck.text.splitlines()) if _HEADER_RE.match(line)]
    return heads if len(heads) == count else [None] * count


def _flag(ck: Checker, entry: str, field: str, value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    ck.bad(entry, field, value, f"{field} must be true or false", f"write {field} = {'true' if value else 'false'}")
    return None


def check_ep(ck: Checker, i: int, raw: Any, line: int | None) -> EpEntry | EpHipEntry | None:
    """The entry ``raw`` (the i-th ``[[ep]]``) checked; None after reporting its problems."""
    before = len(ck.problems)
    entry = open_entry(ck, "ep", i, raw, line, EP_KEYS)
    if entry is None:
        return None
    backend = ck.choice(entry, "kernel_backend", raw.get("kernel_backend", "flydsl"), BACKENDS)
    if backend is None:
        return None
    if backend == "hip":
        return check_ep_hip(ck, entry, raw)
    for key in HIP_ONLY_KEYS:
        if key in raw:
            ck.bad(entry, key, raw[key], "only a HIP-backend entry takes it (mori's JIT v2)",
                   f'add kernel_backend = "hip", or drop {key}')
    if len(ck.problems) > before:
        return None
    for key, (required, example) in EP_KEYS.items():
        if required and key not in raw:
            ck.problem(entry, f"missing {key}; add e.g. {example}")
    if len(ck.problems) > before:
        return None
    f: dict[str, Any] = {}
    for key in ("world", "hidden", "max_tokens", "experts", "topk"):
        f[key] = ck.integer(entry, key, raw[key], EP_KEYS[key][1])
    for key in ("scale_dim", "scale_type_size", "max_total_recv_tokens"):
        f[key] = ck.integer(entry, key, raw.get(key, 0), EP_KEYS[key][1], minimum=0)
    f["dispatch_dtype"] = ck.choice(entry, "dispatch_dtype", raw["dispatch_dtype"], tuple(DTYPES))
    f["combine_dtype"] = ck.choice(entry, "combine_dtype", raw.get("combine_dtype", raw["dispatch_dtype"]),
                                   tuple(DTYPES))
    f["combine_mode"] = ck.choice(entry, "combine_mode", raw.get("combine_mode", "gather"), COMBINE_MODES)
    f["quant_type"] = ck.choice(entry, "quant_type", raw.get("quant_type", "none"), QUANT_TYPES)
    f["device"] = ck.choice(entry, "device", raw["device"], tuple(DEVICES) + tuple(DEVICE_ALIASES),
                            extra=" (a gfx950 device table of mori 1.2.4)")
    f["std_moe"] = _flag(ck, entry, "std_moe", raw.get("std_moe", False))
    f["replay"] = _flag(ck, entry, "replay", raw.get("replay", True))
    if len(ck.problems) > before:
        return None
    if "gpu_per_node" in raw:
        g = ck.integer(entry, "gpu_per_node", raw["gpu_per_node"], f"gpu_per_node = {f['world']}")
        if g is not None and g != f["world"]:
            ck.bad(entry, "gpu_per_node", g, f"gpu_per_node={g} < world_size={f['world']} selects the internode "
                   "path, which only the 'hip' backend implements", INTERNODE_FIX)
    if f["experts"] % f["world"]:
        ck.bad(entry, "experts", f["experts"], f"routed experts are split evenly over the {f['world']} ranks "
               f"(mori: num_experts_per_rank)", f"use a multiple of {f['world']}")
    if f["topk"] > f["experts"]:
        ck.bad(entry, "topk", f["topk"], f"a token is routed to at most the {f['experts']} experts",
               f"use topk <= {f['experts']}")
    if len(ck.problems) > before:
        return None
    config = resolved(EpConfig(**f))
    for field, why in config_problems(config):
        ck.bad(entry, field, raw.get(field, getattr(config, field, None)), f"mori refuses it: {why}",
               "change it to a configuration mori's FlyDSL backend serves (see the rule)")
    if len(ck.problems) > before:
        return None
    return EpEntry(config, f"{ck.path}:{entry}")


def check_ep_hip(ck: Checker, entry: str, raw: dict) -> EpHipEntry | None:
    """A ``kernel_backend = "hip"`` entry checked: its fields in mori's config names. What mori's
    config and HIP backend themselves refuse is found when the plan runs mori's code on it."""
    from gemmar_aot.model.hipcc import NICS

    before = len(ck.problems)
    for key, (required, example) in EP_KEYS.items():
        if required and key not in raw:
            ck.problem(entry, f"missing {key}; add e.g. {example}")
    for key in FLYDSL_ONLY_KEYS:
        if key in raw:
            ck.bad(entry, key, raw[key], "mori's HIP backend has no routing replay (its op refuses it)",
                   f"drop {key}, or build this entry for the FlyDSL backend")
    if len(ck.problems) > before:
        return None
    f: dict[str, Any] = {"rank": 0}
    for key, name in (("world", "world_size"), ("hidden", "hidden_dim"), ("max_tokens", "max_num_inp_token_per_rank"),
                      ("topk", "num_experts_per_token")):
        f[name] = ck.integer(entry, key, raw[key], EP_KEYS[key][1])
    experts = ck.integer(entry, "experts", raw["experts"], EP_KEYS["experts"][1])
    for key in ("scale_dim", "scale_type_size", "max_total_recv_tokens"):
        f[key] = ck.integer(entry, key, raw.get(key, 0), EP_KEYS[key][1], minimum=0)
    if "gpu_per_node" in raw:
        f["gpu_per_node"] = ck.integer(entry, "gpu_per_node", raw["gpu_per_node"], EP_KEYS["gpu_per_node"][1])
    if "num_qp_per_pe" in raw:
        f["num_qp_per_pe"] = ck.integer(entry, "num_qp_per_pe", raw["num_qp_per_pe"], EP_KEYS["num_qp_per_pe"][1])
    disp = ck.choice(entry, "dispatch_dtype", raw["dispatch_dtype"], tuple(DTYPES))
    comb = ck.choice(entry, "combine_dtype", raw.get("combine_dtype", raw["dispatch_dtype"]), tuple(DTYPES))
    f["quant_type"] = ck.choice(entry, "quant_type", raw.get("quant_type", "none"), QUANT_TYPES)
    f["combine_mode"] = ck.choice(entry, "combine_mode", raw.get("combine_mode", "gather"), COMBINE_MODES)
    f["internode_kernel"] = ck.choice(entry, "internode_kernel", raw.get("internode_kernel", "auto"),
                                      INTERNODE_KERNELS)
    f["enable_std_moe"] = _flag(ck, entry, "std_moe", raw.get("std_moe", False))
    device = ck.choice(entry, "device", raw["device"], tuple(HIP_DEVICES),
                       extra=" (whose HIP tuning table picks the kernels' geometry)")
    nics = raw.get("nics", ["mlx5"])
    if isinstance(nics, str):
        nics = [nics]
    if not isinstance(nics, list) or not nics or any(n not in NICS for n in nics):
        ck.bad(entry, "nics", raw.get("nics"), f"must be a list of mori's NIC variants ({', '.join(NICS)})",
               'write e.g. nics = ["mlx5", "ionic"]')
    if len(ck.problems) > before:
        return None
    if experts % f["world_size"]:
        ck.bad(entry, "experts", experts, f"routed experts are split evenly over the {f['world_size']} ranks "
               f"(mori: num_experts_per_rank)", f"use a multiple of {f['world_size']}")
        return None
    f["num_experts_per_rank"] = experts // f["world_size"]
    if comb == disp:
        f["data_type"] = disp
    else:
        f["dispatch_data_type"], f["combine_data_type"] = disp, comb
    return EpHipEntry(tuple(sorted(f.items())), device, tuple(dict.fromkeys(nics)), f"{ck.path}:{entry}")
