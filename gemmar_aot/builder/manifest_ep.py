"""A manifest's ``[[ep]]`` entries checked: mori's EP dispatch/combine v2 (FlyDSL backend).

One entry is one EP configuration of one world; the build makes every rank's kernels of it::

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

The (block, warp) variants come from the named device's table in mori 1.2.4
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
}
_HEADER_RE = re.compile(r"""^[ \t]*\[\[[ \t]*(?:ep|"ep"|'ep')[ \t]*\]\]""")
#: What a multi-node deployment is told (mori's FlyDSL backend refuses it).
INTERNODE_FIX = ("mori's FlyDSL backend serves one node only; multi-node EP runs mori's HIP backend, which "
                 "compiles through mori's own JIT (README: what multi-node EP still compiles); drop "
                 "gpu_per_node or set it to world")


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


def check_ep(ck: Checker, i: int, raw: Any, line: int | None) -> EpEntry | None:
    """The entry ``raw`` (the i-th ``[[ep]]``) checked; None after reporting its problems."""
    before = len(ck.problems)
    entry = open_entry(ck, "ep", i, raw, line, EP_KEYS)
    if entry is None:
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
