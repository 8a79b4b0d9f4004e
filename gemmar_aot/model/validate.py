"""Reading a lock document: every field checked, each refusal naming the file, the JSON path,
the value and the fix (:class:`~.schema.LockFileError`).

Every check has a fast path made of C-level operations (a key-set comparison, a set of
element types) and, only when that fails, a slow path that finds the first offending value and
names it. A rank's part is read when first used (:class:`_LockPart`)."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Sequence

from gemmar_aot.model.launch import LaunchRecord, LaunchRecordError
from gemmar_aot.model.layout import CallLayout, WindowLayout, _CALL_FIELDS, _WINDOW_STR_FIELDS, _WINDOW_TUPLE_FIELDS
from gemmar_aot.model.types import (
    Digest, LaunchEntry, LockEp, LockTuple, RankLaunches, TupleId, _TUPLE_ID_CHOICES, _TUPLE_ID_FIELDS, _TUPLE_ID_INTS,
    _TUPLE_ID_KINDS, _TUPLE_ID_OPT_INTS, _TUPLE_ID_STRS, is_hex64
)
from gemmar_aot.model.schema import (
    LOCK_SCHEMA, LockFileError, _ARG_KEYS, _ARG_KINDS, _DIGEST_KEYS, _EP_KEYS, _KERNEL_KEYS, _PARAM_TYPES,
    _PART_KEYS,
    _PART_REF_KEYS, _REBUILD, _RECORD_KEYS, _TUPLE_KEYS, _WINDOW_INT_FIELDS, _WINDOW_KEYS
)
from gemmar_aot.util.filedigest import sha256_hex

_KEYSETS: dict[tuple, frozenset] = {}
_INT = frozenset({int})
_STR = frozenset({str})
_STR_INT = frozenset({str, int})


def _all_hex64(strs: list[str]) -> bool:
    """Whether every string is 64 lowercase hex digits (two C passes over all of them at once)."""
    if set(map(len, strs)) != {64}:
        return False
    joined = "".join(strs)
    try:
        return bytes.fromhex(joined).hex() == joined  # .hex() is lowercase without spaces
    except ValueError:
        return False


def _validated(cls, values: dict):
    """An instance of frozen dataclass ``cls`` from values (field -> value) the reader has already
    checked in bulk (skips the per-instance checks of ``__post_init__``, which dominate reading a
    large lock). A dict, not keywords: a window layout's 36 fields packed as keywords cost six times
    as much."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


_LAUNCH_FIELDS = tuple(f.name for f in fields(LaunchRecord))


def _with_symbol(record: LaunchRecord, symbol: str) -> LaunchRecord:
    """A lock's (symbol-free, checked) launch record for kernel ``symbol``: its field values
    shared, as ``dataclasses.replace`` would, at less than half the cost (nothing to re-check)."""
    values = {f: getattr(record, f) for f in _LAUNCH_FIELDS}
    values["kernel"] = symbol
    return _validated(LaunchRecord, values)


def _keyset(keys: tuple) -> frozenset:
    ks = _KEYSETS.get(keys)
    if ks is None:
        ks = _KEYSETS[keys] = frozenset(keys)
    return ks


def show_value(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def type_name(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "null"}.get(type(v), type(v).__name__)


def _types(xs) -> frozenset:
    return frozenset(map(type, xs))


class _KernelTable:
    """A lock's kernels by action key: validated JSON entries, turned into LaunchEntry on first use."""

    def __init__(self, raw: dict[str, dict], records: list[LaunchRecord]):
        self.raw = raw
        self.records = records
        self.entries_by_key: dict[str, LaunchEntry] = {}
        self.by_symbol: dict[tuple[int, str], LaunchRecord] = {}

    @classmethod
    def of(cls, entries: dict[str, LaunchEntry]) -> "_KernelTable":
        t = cls(dict.fromkeys(entries), [])
        t.entries_by_key.update(entries)
        return t

    def entry(self, key: str) -> LaunchEntry:
        e = self.entries_by_key.get(key)
        if e is None:
            k = self.raw[key]
            idx, symbol = k["launch"], k["symbol"]
            launch = self.by_symbol.get((idx, symbol))
            if launch is None:
                launch = self.by_symbol[idx, symbol] = _with_symbol(self.records[idx], symbol)
            # the digests' JSON objects hold exactly a Digest's fields (kernels_valid checked them)
            e = self.entries_by_key[key] = _validated(LaunchEntry, {
                "kind": k["kind"], "key": key, "blob": _validated(Digest, k["blob"]), "launch": launch,
                "record": _validated(Digest, k["record"])})
        return e

    def entries(self, keys: tuple[str, ...]) -> tuple[LaunchEntry, ...]:
        return tuple(self.entry(k) for k in keys)


class _LockPart:
    """One rank's part of a lock: checked (against the digest the head names, when read from
    bytes), parsed and validated on first use, then kept: ``(kernel table, {tuple index:
    (launch keys, self-test keys)})``."""

    __slots__ = ("reader", "index", "rank", "ref", "data", "records", "tuples", "got")

    def __init__(self, reader: "DocReader", index: int, rank: int, ref: Digest | None, data: Any,
                 records: list[LaunchRecord]):
        self.reader, self.index, self.rank, self.ref, self.data = reader, index, rank, ref, data
        self.records = records
        self.tuples: set[int] = set()  # the tuples whose head lists this rank
        self.got: tuple[_KernelTable, dict[int, tuple[tuple[str, ...], tuple[str, ...]]]] | None = None

    def __getstate__(self) -> dict:
        # ``data`` may be a view of the lock file's bytes (model.lock._lines): copied out to pickle
        return {k: bytes(v) if isinstance(v, memoryview) else v for k in self.__slots__
                for v in (getattr(self, k),)}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def load(self) -> tuple["_KernelTable", dict[int, tuple[tuple[str, ...], tuple[str, ...]]]]:
        # Two threads may both get here first: each parses the same bytes to equal values (the
        # bytes are kept, never cleared under another reader), and the first result stays.
        got = self.got
        if got is None:
            got = self.reader.part(self)
            if self.got is None:
                self.got = got
            got = self.got
        return got


class DocReader:
    """Builds typed values from parsed lock JSON; every failure names the file, the JSON path,
    the value and the fix."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, msg: str, fix: str = _REBUILD) -> LockFileError:
        return LockFileError(f"{self.where}: {path} {msg}; {fix}")

    # ---- shapes and scalars (each returns its value or raises naming it) ----

    def obj(self, v: Any, path: str, keys: tuple) -> dict:
        if type(v) is dict and v.keys() == _keyset(keys):
            return v
        if type(v) is not dict:
            raise self.fail(path, f"is {type_name(v)} ({show_value(v)}), expected an object")
        missing = [k for k in keys if k not in v]
        if missing:
            raise self.fail(path, f"has no {', '.join(repr(k) for k in missing)} (a required field)")
        extra = sorted(k for k in v if k not in keys)
        raise self.fail(path, f"has unknown field(s) {', '.join(repr(k) for k in extra)} for lock schema "
                              f"{LOCK_SCHEMA}", "it was edited or written by another gemmar-aot; " + _REBUILD)

    def list(self, v: Any, path: str) -> list:
        if type(v) is not list:
            raise self.fail(path, f"is {type_name(v)} ({show_value(v)}), expected a list")
        return v

    def int(self, v: Any, path: str, lo: int = 0) -> int:
        if type(v) is int and v >= lo:
            return v
        if type(v) is not int:
            raise self.fail(path, f"is {type_name(v)} ({show_value(v)}), expected an integer")
        raise self.fail(path, f"is {v}, expected an integer >= {lo}")

    def ints(self, vs: Sequence[Any], paths, lo: int = 0) -> None:
        """Every value an integer >= lo (``paths(i)`` names the i-th)."""
        if vs and (_types(vs) != _INT or min(vs) < lo):
            for i, v in enumerate(vs):
                self.int(v, paths(i), lo)

    def opt_int(self, v: Any, path: str, lo: int = 0) -> int | None:
        return None if v is None else self.int(v, path, lo)

    def str(self, v: Any, path: str, choices: Sequence[str] = (), empty: bool = False) -> str:
        if type(v) is str and (v or empty) and (not choices or v in choices):
            return v
        if type(v) is not str:
            raise self.fail(path, f"is {type_name(v)} ({show_value(v)}), expected a string")
        if not v and not empty:
            raise self.fail(path, "is an empty string")
        raise self.fail(path, f"is {v!r}, expected one of {', '.join(choices)}")

    def strs(self, vs: list, path: str, choices: tuple = ()) -> None:
        if _types(vs) - _STR or (choices and not _keyset(choices).issuperset(vs)):
            for i, v in enumerate(vs):
                self.str(v, f"{path}[{i}]", choices, empty=True)

    def opt_str(self, v: Any, path: str) -> str | None:
        return None if v is None else self.str(v, path)

    def hex64(self, v: Any, path: str, what: str = "a sha256") -> str:
        if not is_hex64(v):
            raise self.fail(path, f"is {show_value(v)}, expected {what} (64 lowercase hex digits)")
        return v

    def digest(self, v: Any, path: str) -> Digest:
        if type(v) is dict and v.keys() == _keyset(_DIGEST_KEYS):
            try:
                return Digest(v["hash"], v["size"])  # validates
            except ValueError:
                pass
        o = self.obj(v, path, _DIGEST_KEYS)
        self.hex64(o["hash"], f"{path}.hash")
        self.int(o["size"], f"{path}.size")
        raise AssertionError("unreachable: an invalid digest passed every check")

    def json_value(self, v: Any, path: str) -> Any:
        t = type(v)
        if t is dict:
            for k, x in v.items():
                self.json_value(x, f"{path}.{k}")
        elif t is list:
            for i, x in enumerate(v):
                self.json_value(x, f"{path}[{i}]")
        elif t is float:
            raise self.fail(path, f"is {v!r}; a lock holds no fractional numbers")
        return v

    def parts(self, v: Any, lines: list[bytes] | None, records: list[LaunchRecord]) -> dict[int, _LockPart]:
        """Rank -> its part, from the head's ``parts``: references to ``lines`` (checked against
        them when loaded), or inline documents."""
        out: dict[int, _LockPart] = {}
        self.list(v, "$.parts")
        if lines is not None:
            if lines[-1:] != [b""] or len(lines) != len(v) + 1:
                raise self.fail("$.parts", f"names {len(v)} part(s), the file has {max(len(lines) - 1, 0)} line(s) "
                                           f"after the head" + ("" if lines[-1:] == [b""] else
                                                                " and does not end in a newline (truncated?)"))
        for i, x in enumerate(v):
            path = f"$.parts[{i}]"
            if lines is not None:
                o = self.obj(x, path, _PART_REF_KEYS)
                rank = self.int(o["rank"], f"{path}.rank")
                ref = self.digest({"hash": o["hash"], "size": o["size"]}, path)
                part = _LockPart(self, i, rank, ref, lines[i], records)
            else:
                o = self.obj(x, path, _PART_KEYS)
                rank = self.int(o["rank"], f"{path}.rank")
                part = _LockPart(self, i, rank, None, o, records)
            if out and rank <= max(out):
                raise self.fail(f"{path}.rank", f"is {rank}: parts are in increasing rank order, one per rank")
            out[rank] = part
        return out

    def part(self, p: _LockPart) -> tuple[_KernelTable, dict[int, tuple[tuple[str, ...], tuple[str, ...]]]]:
        """Check, parse and validate part ``p`` (see :class:`_LockPart`)."""
        path = f"$.parts[{p.index}]"
        v = p.data
        if p.ref is not None:
            if len(v) != p.ref.size or sha256_hex(v) != p.ref.hash:
                got = Digest.of(v)
                raise LockFileError(f"{self.where}: rank {p.rank}'s part (line {p.index + 2}) is {got}, the head "
                                    f"names {p.ref}: the file is damaged or was edited; {_REBUILD}")
            try:
                v = json.loads(bytes(v))  # a view of the lock file's bytes (model.lock._lines)
            except (ValueError, UnicodeDecodeError) as exc:
                raise self.fail(path, f"(line {p.index + 2}) is not JSON ({exc})") from None
            self.obj(v, path, _PART_KEYS)
            if v["rank"] != p.rank:
                raise self.fail(f"{path}.rank", f"is {show_value(v['rank'])}, the head names the part of rank {p.rank}")
        table = self.kernels(v["kernels"], p.records, f"{path}.kernels")
        seqs: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        for j, item in enumerate(self.list(v["launches"], f"{path}.launches")):
            ip = f"{path}.launches[{j}]"
            if type(item) is not list or len(item) != 3:
                raise self.fail(ip, f"is {show_value(item)}, expected [tuple index, [action keys launched], "
                                    f"[action keys self-tested]]")
            ti = self.int(item[0], f"{ip}[0]")
            if ti not in p.tuples or ti in seqs:
                raise self.fail(f"{ip}[0]", f"is {ti}: " + ("a repeated tuple" if ti in seqs else
                                                            f"$.tuples[{ti}] does not list rank {p.rank}"))
            seqs[ti] = (self.refs(item[1], f"{ip}[1]", table, f"{path}.kernels"),
                        self.refs(item[2], f"{ip}[2]", table, f"{path}.kernels"))
        missing = sorted(p.tuples - seqs.keys())
        if missing:
            raise self.fail(f"{path}.launches", f"has nothing for tuple(s) {missing}, which list rank {p.rank}")
        return table, seqs

    def kernels(self, v: Any, records: list[LaunchRecord], path: str) -> _KernelTable:
        if type(v) is not dict:
            raise self.fail(path, f"is {type_name(v)}, expected an object (action key -> kernel)")
        if self.kernels_valid(v, records):
            return _KernelTable(v, records)
        return _KernelTable.of(self.kernels_slow(v, records, path))

    def kernels_valid(self, v: dict, records: list[LaunchRecord]) -> bool:
        """Every check at once (one regex over all digests, type sets); False when any fails."""
        ks, ds = _keyset(_KERNEL_KEYS), _keyset(_DIGEST_KEYS)
        try:
            entries = list(v.values())
            if any([type(k) is not dict or k.keys() != ks for k in entries]):
                return False
            blobs = [k["blob"] for k in entries]
            recs = [k["record"] for k in entries]
            if any([type(d) is not dict or d.keys() != ds for d in blobs + recs]):
                return False
            hashes = [*v, *(d["hash"] for d in blobs), *(d["hash"] for d in recs)]
            sizes = [*(d["size"] for d in blobs), *(d["size"] for d in recs)]
            kinds = [k["kind"] for k in entries]
            symbols = [k["symbol"] for k in entries]
            idx = [k["launch"] for k in entries]
            return not entries or bool(
                _types(hashes) == _STR and _all_hex64(hashes)
                and _types(sizes) == _INT and min(sizes) >= 0
                and _types(kinds) == _STR and all(kinds) and _types(symbols) == _STR and all(symbols)
                and _types(idx) == _INT and min(idx) >= 0 and max(idx) < len(records))
        except TypeError:  # e.g. an unhashable value
            return False

    def kernels_slow(self, v: dict, records: list[LaunchRecord], where: str) -> dict[str, LaunchEntry]:
        """One entry at a time: finds the first bad value and names it."""
        out = {}
        n = len(records)
        keyset = _keyset(_KERNEL_KEYS)
        by_symbol: dict[tuple[int, str], LaunchRecord] = {}
        for key, k in v.items():
            path = f"{where}.{key}"
            if type(k) is not dict or k.keys() != keyset:
                self.obj(k, path, _KERNEL_KEYS)
            idx = k["launch"]
            if type(idx) is not int or not 0 <= idx < n:
                raise self.fail(f"{path}.launch", f"is {show_value(idx)}, expected an index into $.launch_records "
                                                  f"(0..{n - 1})")
            kind = self.str(k["kind"], f"{path}.kind")
            symbol = self.str(k["symbol"], f"{path}.symbol")
            launch = by_symbol.get((idx, symbol))
            if launch is None:
                launch = by_symbol[idx, symbol] = _with_symbol(records[idx], symbol)
            blob, record = self.digest(k["blob"], f"{path}.blob"), self.digest(k["record"], f"{path}.record")
            try:
                entry = LaunchEntry(kind, key, blob, launch, record)
            except ValueError:  # the action key
                raise self.fail(where, f"has key {show_value(key)}, expected an action key (64 lowercase hex "
                                       f"digits)") from None
            out[key] = entry
        return out

    def launch_record(self, v: Any, path: str) -> LaunchRecord:
        o = self.obj(v, path, _RECORD_KEYS)
        self.strs(self.list(o["params"], f"{path}.params"), f"{path}.params", _PARAM_TYPES)
        self.strs(self.list(o["kernel_arg_types"], f"{path}.kernel_arg_types"), f"{path}.kernel_arg_types",
                  _PARAM_TYPES)
        self.strs(self.list(o["kernel_args"], f"{path}.kernel_args"), f"{path}.kernel_args")
        nparams = len(o["params"])
        for i, a in enumerate(self.list(o["args"], f"{path}.args")):
            ap = f"{path}.args[{i}]"
            self.obj(a, ap, _ARG_KEYS)
            self.str(a["name"], f"{ap}.name")
            self.str(a["kind"], f"{ap}.kind", _ARG_KINDS)
            self.str(a["dtype"], f"{ap}.dtype", empty=True)
            ps = self.list(a["params"], f"{ap}.params")
            if ps and (_types(ps) != _INT or min(ps) < 0 or max(ps) >= nparams):
                for j, p in enumerate(ps):
                    if type(p) is not int or not 0 <= p < nparams:
                        raise self.fail(f"{ap}.params[{j}]", f"is {show_value(p)}, expected a host parameter index "
                                                             f"(0..{nparams - 1})")
        program = self.list(o["program"], f"{path}.program")
        for i, ins in enumerate(program):
            if type(ins) is not list or len(ins) < 2 or not _STR_INT.issuperset(map(type, ins)):
                raise self.fail(f"{path}.program[{i}]", f"is {show_value(ins)}, expected [result, op, operands...] of "
                                                        f"strings and integers")
        for what in ("grid", "block"):
            g = self.list(o[what], f"{path}.{what}")
            if len(g) != 3 or not _STR_INT.issuperset(map(type, g)):
                raise self.fail(f"{path}.{what}", f"is {show_value(g)}, expected three integers or program values")
        sp = self.int(o["stream_param"], f"{path}.stream_param")
        if sp >= nparams:
            raise self.fail(f"{path}.stream_param", f"is {sp}, but the record has {nparams} host parameters")
        try:
            return LaunchRecord.from_json({**o, "kernel": ""})  # each kernel entry gives its symbol
        except LaunchRecordError as exc:
            raise self.fail(path, f"is not a launch record ({exc})") from None

    def tuple(self, v: Any, path: str, ti: int, parts: dict[int, _LockPart]) -> LockTuple:
        t = self.tuple_fast(v, ti, parts)
        if t is None:
            t = self.tuple_slow(v, path, ti, parts)
        for r in t.ranks:
            parts[r.rank].tuples.add(ti)
        return t

    def tuple_fast(self, v: Any, ti: int, parts: dict[int, _LockPart]) -> LockTuple | None:
        """The common case checked in bulk (type sets, one subset test); None when anything is off."""
        try:
            if type(v) is not dict or v.keys() != _keyset(_TUPLE_KEYS):
                return None
            ints = [v[f] for f in _TUPLE_ID_INTS]
            strs = [v[f] for f in _TUPLE_ID_STRS]
            opts = [v[f] for f in _TUPLE_ID_OPT_INTS if v[f] is not None]
            if (_types(ints) != _INT or min(ints) < 1 or _types(strs) != _STR or not all(strs)
                    or any(v[f] not in choices for f, choices in _TUPLE_ID_CHOICES.items())
                    or type(v["source"]) is not str or opts and (_types(opts) != _INT or min(opts) < 1)):
                return None
            tid = _validated(TupleId, {f: v[f] for f in _TUPLE_ID_FIELDS})
            lay = v["layout"]
            if (lay is None) == tid.collective:
                return None
            layout = None if lay is None else self.window_fast(lay)
            if lay is not None and (layout is None or layout.call is None or layout.call.m != tid.m or (
                    layout.world, layout.n, layout.block_m, layout.gather_dtype, layout.gather_transport) != (
                    tid.world, tid.n, tid.block_m, tid.gather_dtype, tid.gather_transport)):
                return None
            ranks = v["ranks"]
            if type(ranks) is not list or ranks and (_types(ranks) != _INT or len(set(ranks)) != len(ranks)
                                                     or not parts.keys() >= set(ranks) or max(ranks) >= tid.world):
                return None
        except TypeError:  # an unhashable value in a type or key set
            return None
        return _validated(LockTuple, {"id": tid, "source": v["source"], "layout": layout, "ranks": tuple(
            [_validated(RankLaunches, {"rank": rank, "_pending": (parts[rank], ti)}) for rank in ranks])})

    def window_fast(self, v: Any) -> WindowLayout | None:
        if type(v) is not dict or v.keys() != _keyset(_WINDOW_KEYS):
            return None
        ints = [v[f] for f in _WINDOW_INT_FIELDS]
        seqs = [v[f] for f in _WINDOW_TUPLE_FIELDS]
        strs = [v[f] for f in _WINDOW_STR_FIELDS]
        if (_types(ints) != _INT or min(ints) < 0 or _types(strs) != _STR or not all(strs)
                or _types(seqs) != {list} or any([x and (_types(x) != _INT or min(x) < 0) for x in seqs])):
            return None
        c = v["call"]
        call = None
        if c is not None:
            if type(c) is not dict or c.keys() != _keyset(_CALL_FIELDS):
                return None
            cv = [c[f] for f in _CALL_FIELDS]
            if _types(cv) != _INT or min(cv) < 0:
                return None
            call = _validated(CallLayout, c)
        values = dict(v)  # every key is a field (checked above): the sequences as tuples, the call made
        values.update(zip(_WINDOW_TUPLE_FIELDS, map(tuple, seqs)), call=call)
        return _validated(WindowLayout, values)

    def tuple_slow(self, v: Any, path: str, ti: int, parts: dict[int, _LockPart]) -> LockTuple:
        """One value at a time: finds the first bad one and names it."""
        self.obj(v, path, _TUPLE_KEYS)
        check = {"int": lambda x, p, f: self.int(x, p, 1), "int | None": lambda x, p, f: self.opt_int(x, p, 1),
                 "str": lambda x, p, f: self.str(x, p, _TUPLE_ID_CHOICES.get(f, ()))}
        tid = TupleId(**{f: check[kind](v[f], f"{path}.{f}", f) for f, kind in _TUPLE_ID_KINDS.items()})
        layout = None if v["layout"] is None else self.window(v["layout"], f"{path}.layout")
        if tid.collective and layout is None:
            raise self.fail(f"{path}.layout", f"is null, but a {tid.transport} tuple has a window")
        if not tid.collective and layout is not None:
            raise self.fail(f"{path}.layout", f"is not null, but a {tid.transport} tuple has no window")
        if layout is not None:
            for f in ("world", "n", "block_m", "gather_dtype", "gather_transport"):
                if getattr(layout, f) != getattr(tid, f):
                    raise self.fail(f"{path}.layout.{f}", f"is {getattr(layout, f)!r}, but the tuple's {f} is "
                                                          f"{getattr(tid, f)!r}")
            if layout.call is None or layout.call.m != tid.m:
                raise self.fail(f"{path}.layout.call", f"does not describe the tuple's M={tid.m}")
        ranks, seen = [], set()
        for j, r in enumerate(self.list(v["ranks"], f"{path}.ranks")):
            rp = f"{path}.ranks[{j}]"
            rank = self.int(r, rp)
            if rank >= tid.world or rank in seen or rank not in parts:
                raise self.fail(rp, f"is {rank}: " + (f"the world has {tid.world} ranks" if rank >= tid.world else
                                                      "a repeated rank" if rank in seen else
                                                      f"$.parts has no part for rank {rank}"))
            seen.add(rank)
            ranks.append(_validated(RankLaunches, {"rank": rank, "_pending": (parts[rank], ti)}))
        return LockTuple(id=tid, source=self.str(v["source"], f"{path}.source", empty=True), layout=layout,
                         ranks=tuple(ranks))

    def ep(self, v: Any, path: str, ti: int, parts: dict[int, _LockPart]) -> LockEp:
        """One ``[[ep]]`` entry of the lock; its ranks' kernels are the launch items ``ti``
        of their parts (every rank of its world, each once)."""
        from gemmar_aot.model.ep import EpConfig, arena_layout, config_problems

        self.obj(v, path, _EP_KEYS)
        kinds = {f.name: {"int": int, "str": str, "bool": bool}[f.type] for f in fields(EpConfig)}
        names = tuple(kinds)
        c = self.obj(v["config"], f"{path}.config", names)
        for f in names:
            if type(c[f]) is not kinds[f] or (kinds[f] is int and c[f] < 0):
                raise self.fail(f"{path}.config.{f}", f"is {show_value(c[f])}, expected {kinds[f].__name__}")
        try:
            config = EpConfig.from_json(c)
            bad = config_problems(config)
        except (KeyError, ZeroDivisionError) as e:
            raise self.fail(f"{path}.config", f"is not an EP configuration ({e!r})") from None
        if bad:
            raise self.fail(f"{path}.config.{bad[0][0]}", f"describes a configuration mori refuses: {bad[0][1]}")
        arena = arena_layout(config)
        if v["arena"] != arena.to_json():
            raise self.fail(f"{path}.arena", "is not the window layout of its configuration (mori's FlyDSL "
                                             "backend's regions)")
        ranks = [self.int(r, f"{path}.ranks[{j}]") for j, r in enumerate(self.list(v["ranks"], f"{path}.ranks"))]
        if ranks != list(range(config.world)) or not parts.keys() >= set(ranks):
            raise self.fail(f"{path}.ranks", f"is {show_value(ranks)}: every rank of the world of {config.world}, "
                                             "each with its part")
        for r in ranks:
            parts[r].tuples.add(ti)
        return LockEp(config=config, source=self.str(v["source"], f"{path}.source", empty=True), arena=arena,
                      ranks=tuple(_validated(RankLaunches, {"rank": r, "_pending": (parts[r], ti)}) for r in ranks))

    def refs(self, v: Any, path: str, kernels: "_KernelTable", table_path: str) -> tuple[str, ...]:
        """The action keys of a launch sequence, each checked to name a kernel of ``kernels``."""
        keys = tuple(self.list(v, path))
        try:
            if kernels.raw.keys() >= set(keys):
                return keys
        except TypeError:
            pass
        for n, key in enumerate(v):
            if type(key) is not str or key not in kernels.raw:
                raise self.fail(f"{path}[{n}]", f"is {show_value(key)}, which names no kernel in {table_path}")
        raise AssertionError("unreachable: a bad reference passed every check")

    def window(self, v: Any, path: str) -> WindowLayout:
        o = self.obj(v, path, _WINDOW_KEYS)
        self.ints([o[f] for f in _WINDOW_INT_FIELDS], lambda n: f"{path}.{_WINDOW_INT_FIELDS[n]}")
        vals: dict[str, Any] = {f: o[f] for f in _WINDOW_INT_FIELDS}
        for f in _WINDOW_STR_FIELDS:
            vals[f] = self.str(o[f], f"{path}.{f}")
        for f in _WINDOW_TUPLE_FIELDS:
            xs = self.list(o[f], f"{path}.{f}")
            self.ints(xs, lambda n, f=f: f"{path}.{f}[{n}]")
            vals[f] = tuple(xs)
        c = o["call"]
        if c is not None:
            self.obj(c, f"{path}.call", _CALL_FIELDS)
            cv = [c[f] for f in _CALL_FIELDS]
            self.ints(cv, lambda n: f"{path}.call.{_CALL_FIELDS[n]}")
            vals["call"] = CallLayout(*cv)
        return WindowLayout(**vals)
