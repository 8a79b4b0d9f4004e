"""A manifest's fields checked: the ``[manifest]`` table and each ``[[tuple]]`` on its own,
every problem collected with the file, entry, line, field, value, rule and fix
(:mod:`gemmar_aot.builder.manifest` says what the fields mean, expands the checked tuples into
workloads and bounds the whole manifest).

A checked tuple is a :class:`Draft`: its typed fields, every rule of its mode
(:mod:`gemmar_aot.model.rules`) holding, its M values not yet expanded.
"""

from __future__ import annotations

import datetime
import difflib
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from gemmar_aot.model import rules
from gemmar_aot.builder.workload import MODES

#: Targets a manifest may name: the FlyDSL ops' (its [[tuple]] and FlyDSL [[ep]] entries), and MI300X's,
#: whose manifest holds mori's hipcc-JIT ([[hipcc]]) and JIT v2 (HIP-backend [[ep]]) entries only.
FLYDSL_ARCH = "gfx950"
SUPPORTED_ARCHS = (FLYDSL_ARCH, "gfx942")
#: Manifest format versions this parser reads.
FORMAT_VERSIONS = (1,)
#: Most M values one tuple may expand to (before padding).
MAX_M_VALUES = 1024

_MANIFEST_KEYS = ("name", "description", "arch", "format")
_RANGE_KEYS = ("start", "stop", "step")

#: Every key a tuple may have: (required, what it is, an example).
_TUPLE_KEYS: dict[str, tuple[bool, str, str]] = {
    "transport": (True, "the mode", 'transport = "fused-sdma"'),
    "m": (True, "the M values", "m = 4096"),
    "n": (True, "the GEMM's N (output columns)", "n = 7168"),
    "k": (True, "the GEMM's K", "k = 2048"),
    "world": (True, "the number of ranks", "world = 8"),
    "quant": (True, "the quantisation", 'quant = "blockscale"'),
    "gather_dtype": (False, "", 'gather_dtype = "bf16"'),
    "gather_transport": (False, "", 'gather_transport = "lsa"'),
    "block_m": (False, "", "block_m = 128"),
    "block_n": (False, "", "block_n = 256"),
    "m_max": (False, "", "m_max = 16384"),
    "sdma_queues": (False, "", "sdma_queues = 1"),
}

#: Keys that only make sense for some modes, and which.
_MODE_ONLY_KEYS = {
    "gather_dtype": rules.COLLECTIVE_TRANSPORTS,
    "gather_transport": rules.COLLECTIVE_TRANSPORTS,
    "m_max": rules.COLLECTIVE_TRANSPORTS,
    "sdma_queues": rules.SDMA_TRANSPORTS,
    "block_m": rules.COLLECTIVE_TRANSPORTS + ("gemm-only",),
    "block_n": rules.COLLECTIVE_TRANSPORTS + ("gemm-only",),
}

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_TUPLE_HEADER_RE = re.compile(r"""^[ \t]*\[\[[ \t]*(?:tuple|"tuple"|'tuple')[ \t]*\]\]""")
_TUPLE_ARRAY_RE = re.compile(r"""^[ \t]*(?:tuple|"tuple"|'tuple')[ \t]*=""")


# --------------------------------------------------------------------------
# Rendering values and keys the way a TOML file spells them
# --------------------------------------------------------------------------

_MAX_RENDER = 80


def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(k: str) -> str:
    return k if _BARE_KEY_RE.fullmatch(k) else _toml_str(k)


def render(v: Any, depth: int = 0) -> str:
    if depth > 3:
        return "..."
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, (int, str)):
        text = str(v) if isinstance(v, int) else _toml_str(v)
    elif isinstance(v, float):
        text = "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    elif isinstance(v, list):
        text = "[" + ", ".join(render(x, depth + 1) for x in v[:8]) + (", ...]" if len(v) > 8 else "]")
    elif isinstance(v, dict):
        items = [f"{_key(str(k))} = {render(x, depth + 1)}" for k, x in list(v.items())[:8]]
        text = "{ " + ", ".join(items) + (", ... }" if len(v) > 8 else " }") if items else "{}"
    elif isinstance(v, (datetime.date, datetime.time)):
        text = v.isoformat()
    else:  # pragma: no cover - tomllib produces nothing else
        text = repr(v)
    if len(text) > _MAX_RENDER:
        text = text[: _MAX_RENDER - 3] + "..."
    return text


def type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, (datetime.date, datetime.time)):
        return "a date/time"
    return type(v).__name__  # pragma: no cover


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f'; did you mean "{close[0]}"?' if close else ""


def _one_of(choices) -> str:
    quoted = [f'"{c}"' for c in choices]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _nearest_multiples(value: int, step: int, floor: int) -> str:
    lo = max(floor, value // step * step)
    hi = max(floor, -(-value // step) * step)
    return str(lo) if lo == hi else f"{lo} or {hi}"


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


class Checker:
    """Collects problems and warnings for one manifest."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        self.problems: list[str] = []
        self.warnings: list[str] = []

    # --- messages ---

    def problem(self, entry: str, message: str) -> None:
        self.problems.append(f"{self.path}: {entry}: {message}")

    def bad(self, entry: str, field: str, value: Any, rule: str, fix: str) -> None:
        self.problem(entry, f"{field} = {render(value)}: {rule}; {fix}")

    # --- typed fields ---

    def integer(self, entry: str, field: str, value: Any, example: str, *, minimum: int = 1) -> int | None:
        """``value`` as an int in [minimum, INT32_MAX], or None after reporting why not."""
        hint = f"write a whole number, e.g. {example}"
        if isinstance(value, bool):
            self.bad(entry, field, value, "must be an integer, not a boolean", hint)
            return None
        if isinstance(value, float):
            if value == value and value not in (float("inf"), float("-inf")) and value.is_integer():
                self.bad(entry, field, value, "must be an integer, not a float", f"write {field} = {int(value)}")
            else:
                self.bad(entry, field, value, "must be an integer, not a float", hint)
            return None
        if isinstance(value, str):
            if re.fullmatch(r"[+-]?[0-9]{1,30}", value.strip()):
                self.bad(entry, field, value, "must be an integer, not a string",
                         f"drop the quotes: {field} = {int(value.strip())}")
            else:
                self.bad(entry, field, value, "must be an integer, not a string", hint)
            return None
        if not isinstance(value, int):
            self.bad(entry, field, value, f"must be an integer, not {type_name(value)}", hint)
            return None
        if value < minimum:
            self.bad(entry, field, value, f"must be at least {minimum}", hint)
            return None
        if value > rules.INT32_MAX:
            self.bad(entry, field, value,
                     f"must be at most {rules.INT32_MAX} (kernel arguments are 32-bit)", hint)
            return None
        return value

    def choice(self, entry: str, field: str, value: Any, choices, *, extra: str = "") -> str | None:
        """``value`` if it is one of ``choices`` (strings), else None after reporting."""
        if not isinstance(value, str):
            self.bad(entry, field, value, f"must be a string, not {type_name(value)}",
                     f"use {_one_of(choices)}")
            return None
        if value in choices:
            return value
        if value.strip().lower() in choices:
            fix = f'write {field} = "{value.strip().lower()}" (lower case, no spaces)'
        else:
            fix = f"use {_one_of(choices)}{_suggest(value, choices)}"
        self.bad(entry, field, value, f"{field} must be one of {_one_of(choices)}{extra}", fix)
        return None

    # --- lines ---

    def tuple_lines(self, count: int) -> list[int | None]:
        """Line of each ``[[tuple]]`` header (1-based), or None when unknown."""
        lines = self.text.splitlines()
        heads = [i + 1 for i, line in enumerate(lines) if _TUPLE_HEADER_RE.match(line)]
        if len(heads) == count:
            return list(heads)
        arrays = [i + 1 for i, line in enumerate(lines) if _TUPLE_ARRAY_RE.match(line)]
        if not heads and len(arrays) == 1:  # tuple = [ {...}, ... ]
            return [arrays[0]] * count
        return [None] * count


def unknown_key(ck: Checker, entry: str, key: Any, allowed, what: str) -> None:
    shown = _key(str(key))
    ck.problem(
        entry,
        f"unknown key {shown}: {what} takes only {', '.join(allowed)}; "
        f"remove it{_suggest(str(key), allowed)}",
    )


def open_entry(ck: Checker, section: str, i: int, raw: Any, line: int | None, keys) -> str | None:
    """The name of the i-th ``[[section]]`` entry (``section[i] (line L)``) after reporting its keys
    outside ``keys``; None, after saying so, when it is not a table."""
    entry = f"{section}[{i}]" + (f" (line {line})" if line else "")
    article = "an" if section[0] in "aeiou" else "a"
    if not isinstance(raw, dict):
        ck.problem(entry, f"{article} [[{section}]] entry must be a table, not {render(raw)}")
        return None
    for key in raw:
        if key not in keys:
            unknown_key(ck, entry, key, tuple(keys), f"{article} [[{section}]] entry")
    return entry


def check_manifest_table(ck: Checker, table: Any, default_name: str) -> tuple[str, str, str]:
    name, description, arch = default_name, "", "gfx950"
    entry = "[manifest]"
    if not isinstance(table, dict):
        ck.problem("top level", f"manifest = {render(table)}: [manifest] must be a table, not "
                   f"{type_name(table)}; write it as a [manifest] section")
        return name, description, arch
    for key in table:
        if key not in _MANIFEST_KEYS:
            unknown_key(ck, entry, key, _MANIFEST_KEYS, "[manifest]")
    if "name" in table:
        v = table["name"]
        if not isinstance(v, str):
            ck.bad(entry, "name", v, f"must be a string, not {type_name(v)}", 'write e.g. name = "my-model"')
        elif not _NAME_RE.fullmatch(v):
            ck.bad(entry, "name", v,
                   "a name is 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit "
                   "(it names the artifacts built from this manifest)",
                   "rename it, or remove the key to use the file's name")
        else:
            name = v
    if "description" in table:
        v = table["description"]
        if not isinstance(v, str):
            ck.bad(entry, "description", v, f"must be a string, not {type_name(v)}", "put it in quotes")
        else:
            description = v
    if "arch" in table:
        v = table["arch"]
        if not isinstance(v, str) or v not in SUPPORTED_ARCHS:
            ck.bad(entry, "arch", v, f"the supported targets are {_one_of(SUPPORTED_ARCHS)} (MI355X; MI300X for "
                   "[[hipcc]] and HIP-backend [[ep]] entries only)",
                   f'write arch = "{SUPPORTED_ARCHS[0]}" or remove the key')
        else:
            arch = v
    if "format" in table:
        v = table["format"]
        if isinstance(v, bool) or not isinstance(v, int) or v not in FORMAT_VERSIONS:
            ck.bad(entry, "format", v,
                   f"this gemmar-aot reads manifest format {', '.join(map(str, FORMAT_VERSIONS))}",
                   "write format = 1 or remove the key")
    return name, description, arch


def _m_values(ck: Checker, entry: str, value: Any) -> Sequence[int] | None:
    """The M values a tuple asks for, unpadded, or None after reporting (a range stays a
    ``range``: a tuple's values are made one at a time, when they are expanded)."""
    example = "m = 4096, m = [256, 512] or m = { start = 4096, stop = 16384, step = 1024 }"
    if isinstance(value, dict):
        ok = True
        for key in value:
            if key not in _RANGE_KEYS:
                unknown_key(ck, entry, key, _RANGE_KEYS, "an M range")
                ok = False
        got: dict[str, int] = {}
        for key in _RANGE_KEYS:
            if key not in value:
                ck.problem(entry, f"m = {render(value)}: an M range needs start, stop and step; "
                           f"add {key}, e.g. {example}")
                ok = False
                continue
            iv = ck.integer(entry, f"m.{key}", value[key], f"m.{key} = 1024")
            if iv is None:
                ok = False
            else:
                got[key] = iv
        if not ok:
            return None
        start, stop, step = got["start"], got["stop"], got["step"]
        if start > stop:
            ck.bad(entry, "m", value, f"start ({start}) is greater than stop ({stop})",
                   "swap them; stop is inclusive")
            return None
        count = (stop - start) // step + 1
        if count > MAX_M_VALUES:
            ck.bad(entry, "m", value, f"the range has {count} values, more than the {MAX_M_VALUES} "
                   "a tuple may expand to", "use a larger step or split the tuple")
            return None
        if (stop - start) % step:
            last = start + (count - 1) * step
            ck.warnings.append(
                f"{ck.path}: {entry}: m = {render(value)}: stop {stop} is not start + a multiple of "
                f"step; the last M is {last}"
            )
        return range(start, stop + 1, step)
    if isinstance(value, list):
        if not value:
            ck.bad(entry, "m", value, "the M list is empty", f"list at least one M, e.g. {example}")
            return None
        if len(value) > MAX_M_VALUES:
            ck.bad(entry, "m", value, f"the list has {len(value)} values, more than the "
                   f"{MAX_M_VALUES} a tuple may have", "split the tuple")
            return None
        out = []
        for j, item in enumerate(value):
            iv = ck.integer(entry, f"m[{j}]", item, f"m = [{4096 if j == 0 else '..., 4096'}]")
            if iv is not None:
                out.append(iv)
        return out if len(out) == len(value) else None
    if isinstance(value, int) and not isinstance(value, bool):
        iv = ck.integer(entry, "m", value, "m = 4096")
        return None if iv is None else [iv]
    ck.bad(entry, "m", value, f"M must be an integer, an array of integers or a range table, not "
           f"{type_name(value)}", f"write e.g. {example}")
    return None


#: Fixes for the rules in :mod:`gemmar_aot.model.rules`, by rule name: f(value, fields) -> text.
_FIXES = {
    "quant": lambda v, f: f"use {_one_of(rules.QUANTS)}",
    "mode_quant": lambda v, f: ('set quant = "mxfp8", or use transport = "split-lsa" for a '
                                f"{v} GEMM with its all-reduce"),
    "block_m_quant": lambda v, f: f"set block_m = {rules.MXFP8_BLOCK_M} or remove it",
    "tile_m": lambda v, f: (f"use {_nearest_multiples(v, rules.TILE_M_GRANULE, rules.TILE_M_GRANULE)}"
                            " or remove it"),
    "block_n": lambda v, f: f"set block_n = {rules.DEFAULT_BLOCK_N} or remove it",
    "wire_dtype": lambda v, f: ('remove gather_dtype, or use transport = "fused-sdma" or "split-sdma" '
                                "for an fp8 gather"),
    "wire_transport": lambda v, f: 'remove gather_transport, or use transport = "fused-sdma"',
    "k": lambda v, f: f"use {_nearest_multiples(v, rules.SCALE_BLOCK_K, rules.MIN_K)}",
    "n": lambda v, f: f"the nearest supported N are {_nearest_multiples(v, _n_step(f), _n_step(f))}",
    "n_narrow": lambda v, f: f"the nearest supported N are {_nearest_multiples(v, _n_step(f), _n_step(f))}",
    "world": lambda v, f: f"use {', '.join(map(str, rules.WORLD_SIZES[:-1]))} or {rules.WORLD_SIZES[-1]}",
    "fp8_gather_n": lambda v, f: (f'use gather_dtype = "bf16" (N = {v} works with the bf16 gather), or an '
                                  f"N that is a multiple of {rules.FP8_GATHER_N_MULTIPLE}"),
    "gemv_k": lambda v, f: f"use {_nearest_multiples(v, rules.GEMV_STEP_K, rules.GEMV_STEP_K)}",
    "gemv_n": lambda v, f: f"use {_nearest_multiples(v, rules.MXFP8_BLOCK, rules.MXFP8_BLOCK)}",
}


def _n_step(f: dict) -> int:
    group = rules.MXFP8_BLOCK if f.get("quant") == "mxfp8" else rules.SCALE_BLOCK_K
    return max(f.get("block_n") or rules.DEFAULT_BLOCK_N, group)


def _check_keys(ck: Checker, entry: str, raw: dict, transport: str | None) -> None:
    """Unknown keys, missing required keys, and keys the tuple's mode does not take."""
    for key in raw:
        if key not in _TUPLE_KEYS:
            unknown_key(ck, entry, key, tuple(_TUPLE_KEYS), "a tuple")
    for key, (required, what, example) in _TUPLE_KEYS.items():
        if required and key not in raw:
            ck.problem(entry, f"{key} is missing: every tuple needs {what}; add e.g. {example}")
    if transport is None:
        return
    for key, modes in _MODE_ONLY_KEYS.items():
        if key in raw and transport not in modes:
            ck.bad(entry, key, raw[key], f'{key} does not apply to transport "{transport}" '
                   f"(only to {_one_of(modes)})", "remove it")


def _parse_fields(ck: Checker, entry: str, raw: dict, transport: str | None) -> dict:
    """Every field as a typed value, its default when absent, or None when invalid (reported)."""
    def integer(key: str, default: int | None = None) -> int | None:
        if key not in raw:
            return default
        return ck.integer(entry, key, raw[key], _TUPLE_KEYS[key][2])

    def takes(key: str) -> bool:
        return key in raw and (transport is None or transport in _MODE_ONLY_KEYS[key])

    f: dict[str, Any] = {"transport": transport}
    for key in ("n", "k", "world"):
        f[key] = integer(key)
    f["quant"] = ck.choice(entry, "quant", raw["quant"], rules.QUANTS) if "quant" in raw else None
    f["m_max"] = integer("m_max") if takes("m_max") else None
    f["sdma_queues"] = integer("sdma_queues", 1) if takes("sdma_queues") else 1
    f["gather_dtype"] = (ck.choice(entry, "gather_dtype", raw["gather_dtype"], rules.GATHER_DTYPES)
                         if takes("gather_dtype") else "bf16")
    f["gather_transport"] = (ck.choice(entry, "gather_transport", raw["gather_transport"],
                                       rules.GATHER_TRANSPORTS) if takes("gather_transport") else "lsa")
    f["block_n"] = integer("block_n", rules.DEFAULT_BLOCK_N) if takes("block_n") else rules.DEFAULT_BLOCK_N
    if takes("block_m"):
        f["block_m"] = integer("block_m")
    elif transport in rules.MXFP8_ONLY_TRANSPORTS:
        f["block_m"] = rules.MXFP8_BLOCK_M
    elif f["quant"] is None:
        f["block_m"] = None
    else:
        f["block_m"] = rules.default_block_m(f["quant"])
    f["m_values"] = _m_values(ck, entry, raw["m"]) if "m" in raw else None
    return f


def _problems_of(f: dict):
    """The rules of the tuple's mode (rules.py's, in the op's order) over the parsed fields."""
    shape = dict(n=f["n"], k=f["k"], quant=f["quant"])
    if f["transport"] == "gemv":
        return rules.mxfp8_gemv_problems(**shape)
    if f["transport"] == "gemm-only":
        return rules.mxfp8_gemm_problems(**shape, block_m=f["block_m"], block_n=f["block_n"])
    return rules.gemm_ar_problems(
        **shape, world=f["world"], block_m=f["block_m"], block_n=f["block_n"], gather_dtype=f["gather_dtype"],
        gather_transport=f["gather_transport"], sdma_queues=f["sdma_queues"], m_max=f["m_max"],
        transport=f["transport"] or "fused-sdma")


def _apply_rules(ck: Checker, entry: str, f: dict) -> None:
    """Report every rule the fields break, each with its fix; a broken field becomes None."""
    for field, rule, why in list(_problems_of(f)):
        value = f[field]
        ck.bad(entry, field, value, why, _FIXES[rule](value, f))
        f[field] = None


def padded(f: dict, m_values: Sequence[int] | None = None) -> Iterator[int]:
    """The tuple's M values (or ``m_values``, padded by the tuple's rules) padded, in order, one at a time."""
    transport = f["transport"]
    m_values = f["m_values"] if m_values is None else m_values
    if transport == "gemv":
        return (rules.gemv_bucket(m) if m <= rules.GEMV_MAX_M else m for m in m_values)
    if transport == "gemm-only":
        return (rules.gemm_only_padded_m(m) for m in m_values)
    world, block_m = f["world"], f["block_m"]
    return (rules.padded_m(m, world, block_m) for m in m_values)


def _check_m_rules(ck: Checker, entry: str, f: dict) -> tuple[bool, int | None]:
    """The M-dependent rules over the tuple's largest padded M: (all hold, the padded m_max).
    Every mode's padding is monotone, so the largest M pads to the largest padded M: one
    value is padded here, never the tuple's up to 1024."""
    biggest_req = max(f["m_values"])
    largest = next(padded(f, [biggest_req]))
    n, k, m_max = f["n"], f["k"], f["m_max"]
    if f["transport"] == "gemv" and rules.check_gemv_m(biggest_req):
        ck.bad(entry, "m", biggest_req, rules.check_gemv_m(biggest_req),
               'list M values up to 32 (the buckets are 1, 2, 4, 8, 16 and 32), and use transport = '
               '"gemm-only" for larger M')
        return False, None
    why = rules.check_int32_extents(largest, n, k)
    if why:
        ck.bad(entry, "m", biggest_req, f"padded to {largest}, {why}",
               f"keep M at or below {rules.INT32_MAX // max(n, k)}")
        return False, None
    if m_max is None:
        return True, None
    m_max_pad = rules.padded_m(m_max, f["world"], f["block_m"])
    if m_max_pad < largest:
        ck.bad(entry, "m_max", m_max, f"m_max pads to {m_max_pad}, smaller than the largest padded M of "
               f"this tuple (m = {biggest_req} pads to {largest})",
               f"raise m_max to at least {largest}, or remove it (the default is the group's largest "
               "padded M)")
        return False, None
    why = rules.check_int32_extents(m_max_pad, n, k)
    if why:
        ck.bad(entry, "m_max", m_max, f"padded to {m_max_pad}, {why}",
               f"keep m_max at or below {rules.INT32_MAX // max(n, k)}")
        return False, None
    return True, m_max_pad


@dataclass(frozen=True)
class Draft:
    """A checked [[tuple]] before its M values are expanded into workloads."""

    fields: dict  # the parsed fields (``m_values`` unpadded)
    common: dict  # the workload fields every M of the tuple shares
    m_max: int | None  # padded
    source: str


def check_tuple(ck: Checker, i: int, raw: Any, line: int | None) -> Draft | None:
    """One [[tuple]], checked -> its draft, or None after reporting every problem."""
    entry = f"tuple[{i}]" + (f" (line {line})" if line else "")
    if not isinstance(raw, dict):
        ck.problem(entry, f"{render(raw)} is {type_name(raw)}, but each [[tuple]] must be a table; "
                   "write each tuple as a [[tuple]] section")
        return []
    n_before = len(ck.problems)
    transport = ck.choice(entry, "transport", raw["transport"], MODES) if "transport" in raw else None
    _check_keys(ck, entry, raw, transport)
    f = _parse_fields(ck, entry, raw, transport)
    _apply_rules(ck, entry, f)
    # Every rule that failed has reported itself; with none failed, every field holds a valid value.
    if len(ck.problems) > n_before:
        return None
    ok, m_max_pad = _check_m_rules(ck, entry, f)
    if not ok:
        return None
    common = {key: f[key] for key in COMMON}
    return Draft(f, common, m_max_pad, f"{ck.path}:{entry}")


#: The workload fields a tuple's M values share, in :meth:`~gemmar_aot.builder.workload.Workload.identity`'s
#: order around M.
COMMON = ("transport", "n", "k", "world", "quant", "gather_dtype", "gather_transport", "block_m", "block_n",
          "sdma_queues")


__all__ = [
    "COMMON",
    "Checker",
    "Draft",
    "FORMAT_VERSIONS",
    "MAX_M_VALUES",
    "FLYDSL_ARCH",
    "open_entry",
    "SUPPORTED_ARCHS",
    "check_manifest_table",
    "check_tuple",
    "padded",
    "render",
    "type_name",
    "unknown_key",
]
