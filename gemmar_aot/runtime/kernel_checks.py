"""What every op checks before it loads a kernel: the lock entries, their records, their code objects.

Nothing here acquires anything; a bad artifact is refused before a module is loaded
(:mod:`.loading` is the step after, :mod:`.launches` the one after that).

* :func:`check_sequences` -- each rank's launches and self-test are its mode's sequence
  (:mod:`gemmar_aot.model.launch_sequence`), and no slot holds another rank's kernel.
* :class:`~.record_binding.RecordBinding` -- each lock entry is the action-cache record it names
  (from the lock's record index, else the store), and that record's spec describes the kernel
  the lock launches where the entry sits.
* :func:`verify_code_object` -- the code object's own metadata note (parsed by
  :func:`gemmar_aot.model.codeobject.parse_code_object`, the independent oracle) must agree with the
  launch record FlyDSL produced: target arch, exactly one kernel, its name, every explicit
  argument at the offset and size the record's types give at natural alignment *and of the
  kind they give* (a pointer is a ``global_buffer``, a length or scalar ``by_value``: a record
  that feeds a pointer slot an integer, or the reverse, is refused even when the sizes agree),
  the kernarg segment exactly that long, the block the record launches with the workgroup size
  the kernel was compiled for (``reqd_workgroup_size``, else at most
  ``max_flat_workgroup_size``), and its static LDS within the device's. A wrong block on a GPU
  is not an error HIP always reports: it is a kernel whose barriers and tile indexing assume
  threads that do not exist.

:func:`verify_entries` runs all three for every op, in one place.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple, Sequence

from gemmar_aot.model.codeobject import CodeObject, CodeObjectError, KernelMetadata, parse_code_object
from gemmar_aot.model.launch import PARAM_SIZES, LaunchRecord
from gemmar_aot.model.launch_sequence import sequence_problems

from .artifact_errors import ArtifactMismatchError
from .record_binding import RecordBinding, record_key

#: The metadata note's value kind for each host-parameter type.
_VALUE_KINDS = {"ptr": "global_buffer", "len32": "by_value", "i32": "by_value", "i64": "by_value"}
#: LDS per workgroup on the targets we build for (gfx950: 160 KiB).
MAX_LDS_BYTES = {"gfx950": 160 * 1024}


def natural_offsets(types: Sequence[str]) -> list[int]:
    """Offset of each explicit argument at natural alignment (the AMDGPU kernarg ABI)."""
    out, off = [], 0
    for t in types:
        size = PARAM_SIZES[t]
        off = (off + size - 1) // size * size
        out.append(off)
        off += size
    return out


def explicit_args(kernel: KernelMetadata):
    return [a for a in kernel.args if not a.value_kind.startswith("hidden_")]


def verify_code_object(code: CodeObject, record: LaunchRecord, *, arch: str, where: str,
                       cache: dict | None = None) -> KernelMetadata:
    """The kernel's metadata, after checking it against the launch record. Raises ArtifactMismatchError.

    ``cache`` (a dict kept for one construction) remembers what passed: the outcome depends on
    the code object's arch, kernels and undefined symbols and on the record alone, and the
    phases of every M repeat them (equal metadata notes parse to one kernels tuple)."""
    if cache is not None:
        key = (code.arch, id(code.kernels), code.undefined_symbols, record_key(record, cache), record.kernel, arch)
        got = cache.get(key)
        if got is not None and got[0] is code.kernels:
            return got[1]
        kern = verify_code_object(code, record, arch=arch, where=where)
        cache[key] = (code.kernels, kern)
        return kern

    def bad(why: str) -> ArtifactMismatchError:
        return ArtifactMismatchError(f"{where}: {why}; the artifact does not match its launch record "
                                     f"-- rebuild it (gemmar-aot build)")

    if code.arch != arch:
        raise bad(f"code object is for {code.arch}, the artifacts say {arch}")
    if len(code.kernels) != 1:
        raise bad(f"code object holds {len(code.kernels)} kernels, expected exactly one")
    if code.undefined_symbols:
        raise bad(f"code object has undefined symbols {list(code.undefined_symbols)} (cco bitcode not linked?)")
    kern = code.kernels[0]
    if kern.name != record.kernel:
        raise bad(f"kernel is {kern.name!r}, the launch record names {record.kernel!r}")
    args = explicit_args(kern)
    types = record.kernel_arg_types
    if len(args) != len(types):
        raise bad(f"kernel has {len(args)} explicit arguments, the launch record {len(types)}")
    for i, (a, t, off) in enumerate(zip(args, types, natural_offsets(types))):
        if a.size != PARAM_SIZES[t] or a.offset != off:
            raise bad(f"argument {i} is {a.size} bytes at offset {a.offset}, the record's {t} needs "
                      f"{PARAM_SIZES[t]} bytes at {off}")
        if a.value_kind != _VALUE_KINDS[t]:
            raise bad(f"argument {i} is a {a.value_kind} in the code object, the record passes a {t} "
                      f"({_VALUE_KINDS[t]})")
    if kern.kernarg_size != record.packed_size():
        raise bad(f"kernarg segment is {kern.kernarg_size} bytes, the record packs {record.packed_size()}")
    limit = MAX_LDS_BYTES.get(arch)
    if limit is not None and kern.lds_bytes > limit:
        raise bad(f"kernel needs {kern.lds_bytes} bytes of LDS, {arch} has {limit}")
    if all(isinstance(b, int) for b in record.block):
        why = block_mismatch(kern, tuple(record.block))
        if why:
            raise bad(why)
    return kern


def block_mismatch(kernel: KernelMetadata, block: tuple[int, ...]) -> str | None:
    """Why ``block`` is not a workgroup ``kernel`` was compiled for, or None."""
    if len(block) != 3 or any(int(b) < 1 for b in block):
        return f"block {list(block)} is not three positive sizes"
    reqd = kernel.reqd_workgroup_size
    if reqd and tuple(reqd) != tuple(block):
        return (f"the record launches block {list(block)}, the kernel was compiled for exactly "
                f"{list(reqd)} (reqd_workgroup_size)")
    flat = block[0] * block[1] * block[2]
    if flat > kernel.max_flat_workgroup_size:
        return (f"the record launches block {list(block)} ({flat} threads), the kernel was compiled for at most "
                f"{kernel.max_flat_workgroup_size} (max_flat_workgroup_size)")
    return None


# ---------------------------------------------------------------------------
# A lock entry and the action-cache record it names
# ---------------------------------------------------------------------------


class EntryPosition(NamedTuple):
    """Where a lock entry sits: the tuple, M and rank it is launched for, and its role there.
    (A named tuple: an op makes one per launch entry, tens at every construction.)"""

    transport: str
    kind: str
    rank: int
    world: int
    m: int
    slot: int
    m_max: int
    n: int
    k: int
    quant: str
    gather_dtype: str
    gather_transport: str | None
    block_m: int

    @property
    def label(self) -> str:
        return f"{self.kind} for M={self.m} rank {self.rank}"

    def problems(self, spec: Any) -> list[str]:
        return binding_problems(spec, self)


class EpPosition(NamedTuple):
    """Where an EP lock entry sits: its rank's kernel of this role (kind, block, warp) for this
    configuration (``gemmar_aot.model.ep.EpConfig``) and window layout (``Arena``)."""

    kind: str
    rank: int
    block: int
    warp: int
    config: Any
    arena: Any

    @property
    def label(self) -> str:
        return f"EP {self.kind} ({self.block} blocks x {self.warp} warps) rank {self.rank}"

    def problems(self, spec: Any) -> list[str]:
        return ep_binding_problems(spec, self)


#: What an EP kernel's offsets are, by keyword and factory: the region each one must be.
_EP_OFFSETS = {"off_tok_off": "tok_off", "off_recv_num": "recv_num", "off_tis": "recv_to_src_token",
               "off_out_idx": "out_idx", "off_out_wts": "out_wts", "off_out_scales": "out_scales",
               "off_xdb_mem": "cross_device_barrier", "off_comb_inp": "comb_inp", "off_comb_wts": "comb_wts",
               "off_comb_scales": "comb_scales"}


def ep_binding_problems(spec: Any, pos: EpPosition) -> list[str]:
    """How an EP record's spec disagrees with where its lock entry sits (empty: it agrees): the
    role, the rank, the world and shape compiled in, the variant's block and warp, and every
    window offset against the layout the op carves (``off_out_tok`` is the dispatch's
    ``disp_out`` and the combine's ``out_tok``, as mori's backend passes it)."""
    if not isinstance(spec, dict):
        return ["the record has no spec"]
    params = spec.get("params") if isinstance(spec.get("params"), dict) else {}
    kw = params.get("kwargs") if isinstance(params.get("kwargs"), dict) else {}
    c, a = pos.config, pos.arena
    pairs = [("kind", spec.get("kind"), pos.kind), ("rank", spec.get("rank"), pos.rank),
             ("rank compiled in", kw.get("rank"), pos.rank), ("block_num", kw.get("block_num"), pos.block),
             ("warp_num_per_block", kw.get("warp_num_per_block"), pos.warp),
             ("experts_per_token", kw.get("experts_per_token"), c.topk)]
    if pos.kind in ("dispatch", "dispatch_replay", "combine"):
        pairs += [("npes", kw.get("npes"), c.world), ("hidden_dim", kw.get("hidden_dim"), c.hidden),
                  ("max_tok_per_rank", kw.get("max_tok_per_rank"), c.max_tokens),
                  ("max_recv", kw.get("max_recv"), c.recv_cap)]
    if pos.kind in ("dispatch", "dispatch_replay"):
        pairs += [("replay", bool(kw.get("replay", False)), pos.kind == "dispatch_replay"),
                  ("off_out_tok", kw.get("off_out_tok"), a.offset("disp_out"))]
    elif pos.kind == "combine":
        pairs.append(("off_out_tok", kw.get("off_out_tok"), a.offset("out_tok")))
    for name, region in _EP_OFFSETS.items():
        if name in kw and (kw[name] or a.has(region)):  # 0: a region the kernel does not use
            pairs.append((name, kw[name], a.offset(region) if a.has(region) else None))
    if pos.kind != "combine" and "experts_per_rank" in kw:
        pairs.append(("experts_per_rank", kw.get("experts_per_rank"), c.experts_per_rank))
    return [f"{what} {got!r} (the lock launches it as {want!r})" for what, got, want in pairs if got != want]


def binding_problems(spec: Any, pos: EntryPosition) -> list[str]:
    """How the record's spec disagrees with where its lock entry sits (empty: it agrees).

    ``spec`` is the record's ``spec`` (the build's KernelSpec JSON). Only what the
    spec carries is compared (never the recipe's name: several modes share one phase
    recipe), and only where the kernel depends on it: a GEMM built with ``fuse=False``
    is window-free (its config is a placeholder; its rank is in its symbol, so it is
    compared like every other kernel's), and a phase built from a shape-free config
    (``capacity_m`` 0: drain, gather_barrier) has no M.
    """
    if not isinstance(spec, dict):
        return ["the record has no spec"]
    params = spec.get("params")
    params = params if isinstance(params, dict) else {}
    builder = params.get("builder")
    builder = builder if isinstance(builder, dict) else {}
    # (what, the record's value, where the lock launches it), compared in this order
    pairs = [("kind", spec.get("kind"), pos.kind), ("rank", spec.get("rank"), pos.rank)]
    if pos.kind == "gemm" and "fuse" in builder:  # the mode is in the GEMM: fused (and over what), or not
        fused = pos.transport.startswith("fused-")
        pairs.append(("fused GEMM", builder.get("fuse"), fused))
        if fused:
            pairs.append(("GEMM transport", builder.get("transport"), pos.transport.split("-", 1)[1]))
    cfg = params.get("cfg")
    if not isinstance(cfg, dict) or builder.get("fuse", True) is False:
        cfg = {}  # an unfused GEMM never touches the window: its config is a placeholder
    if "world_size" in cfg:
        pairs.append(("world", cfg.get("world_size"), pos.world))
    if cfg.get("capacity_m"):  # a config with a shape: the window map and this M's counter set
        pairs += [("M", cfg.get("m_pad"), pos.m), ("counter slot", cfg.get("shape_index"), pos.slot),
                  ("window m_max", cfg.get("capacity_m"), pos.m_max), ("N", cfg.get("n"), pos.n),
                  ("block_m", cfg.get("block_m"), pos.block_m),
                  ("gather dtype", cfg.get("gather_dtype"), pos.gather_dtype)]
        if pos.gather_dtype != "bf16":
            pairs.append(("gather transport", cfg.get("gather_transport"), pos.gather_transport))
    if pos.kind == "gemm":
        pairs += [("K", builder.get("K"), pos.k), ("quant", builder.get("quant"), pos.quant),
                  ("BLOCK_M", builder.get("BLOCK_M"), pos.block_m)]
    return [f"{what} {got!r} (the lock launches it as {want!r})" for what, got, want in pairs if got != want]


def check_sequences(rank_entries: Iterable[Any]) -> None:
    """Refuse a (tuple, M, rank) whose launches or self-test are not its mode's sequence
    (:mod:`gemmar_aot.model.launch_sequence`), or that holds another rank's kernel: a lock-only edit
    that reorders, drops or duplicates launches, or moves a kernel between ranks' slots,
    keeps every digest consistent, and only the mode's own sequence tells."""
    for e in rank_entries:
        i = e.tuple.id
        problems = sequence_problems(i.transport, i.gather_dtype, i.gather_transport, e.rank,
                                     e.launches, e.self_test)
        if problems:
            raise ArtifactMismatchError(
                f"{e.where}: M={e.m} rank {e.rank} " + "; ".join(problems) + ". The lock was edited or "
                "made by another gemmar-aot: rebuild the manifest (gemmar-aot build) and use the lock it writes")


class StoreOnDemand:
    """A lock's store (``open(source)``), opened when first used: a lock whose record and blob
    indexes serve every record and code object never opens it (a stat and a file read)."""

    __slots__ = ("_open", "_source", "_store")

    def __init__(self, open: Callable[[Any], Any], source: Any):
        self._open, self._source, self._store = open, source, None

    def __getattr__(self, name: str) -> Any:
        if self._store is None:
            self._store = self._open(self._source)
        return getattr(self._store, name)


def verify_entries(artifacts: Any, entries: Sequence[Any], *, launches, position,
                   sequences: Callable[[Sequence[Any]], None] = check_sequences) -> dict[str, tuple[bytes, Any]]:
    """What every op verifies before it loads anything, in one place: for each lock entry (a
    ``RankEntry`` or ``EpRankEntry``) its launch sequence (``sequences``: the GEMM modes'
    :func:`check_sequences` unless told), then for each of its launch entries ``launches(e)``:
    the action-cache record it names, from the lock's record index or else the store, bound to
    the entry where it sits (``position(e, launch entry)``, an :class:`EntryPosition` or
    :class:`EpPosition`; :class:`RecordBinding`); the blob read and verified by digest; and
    its code object parsed and checked against the launch record (:func:`verify_code_object`).

    Returns blob digest -> (verified bytes, kernel metadata), each blob read and parsed once.
    Raises ArtifactMismatchError (or the store's errors for a missing or damaged blob)."""
    sequences(entries)
    binding = RecordBinding()
    binding.use_indexes(artifacts, entries)
    images: dict[str, tuple[bytes, Any]] = {}
    codes: dict[str, CodeObject] = {}
    verified: set[str] = set()  # action keys: one key is one (code object, launch record) pair
    checked: dict = {}  # what verify_code_object found, by what it depends on
    stores: dict = {}  # store root -> its store, opened when first used
    for e in entries:
        store = stores.get(e.lock.source.store_root)
        if store is None:
            store = stores[e.lock.source.store_root] = StoreOnDemand(artifacts.store, e.lock.source)
        placed: set[str] = set()  # keys checked at this entry: a self-test repeats launches at their position
        for le in launches(e):
            # every position: one key may sit at several (M, role), and each must be its record's
            if le.key not in placed:
                placed.add(le.key)
                binding.check(store, le, position(e, le), lock_where=f"{e.at} {le.kind}")
            if le.key in verified:
                continue
            verified.add(le.key)
            digest = le.blob.hash
            code = codes.get(digest)
            if code is None:
                data = artifacts.load_blob(e.lock, digest, le.blob.size)
                try:
                    code = codes[digest] = parse_code_object(data)
                except CodeObjectError as exc:
                    raise ArtifactMismatchError(f"{store.describe_blob(digest)}: not a loadable code object: "
                                                f"{exc}") from None
                images[digest] = (data, None)
            kern = verify_code_object(code, le.launch, arch=e.lock.arch, cache=checked,
                                      where=f"{e.at} {le.kind} (blob {digest[:12]})")
            images[digest] = (images[digest][0], kern)
    return images


def verify_whole_object(artifacts: Any, info: Any, item: Any) -> bytes:
    """What the pod checks of a code object mori loads whole (a lock's ``hipcc`` item, for
    :mod:`.hipcc_server`, or ``jitv2`` item, for :mod:`.jitv2_server`) before it hands it over: the
    record the lock names, from the lock's record index or else the store, bound to the item (a
    record that compiled another source, plan, arch, NIC or proxy, or that mori published under
    another cache entry, is refused); the blob read and verified by digest; the object's own
    metadata note: the item's arch, defining exactly the kernels the lock lists (a non-empty set).
    Returns the verified bytes; raises ArtifactMismatchError (or the store's errors for a missing
    or damaged blob)."""
    where, e = f"{info.source} ({item.source})", item.entry
    index = artifacts.record_index(info)
    if index is None:
        rec = artifacts.store(info.source).read_record_named(e.key, e.record)
    else:
        rec = index.records([(e.key, e.record, e.blob.hash)]).get(e.key)
    if not isinstance(rec, dict):
        raise ArtifactMismatchError(f"{where}: the record the lock names for {item.variant.describe()} is not there "
                                    f"or is another record ({rec}); rebuild the manifest")
    compiled = _record_compiled(item, rec)
    if compiled is not None or rec.get("blob") != e.blob.to_json():
        raise ArtifactMismatchError(f"{where}: the lock serves {_serves(item)} with a record that compiled "
                                    f"{compiled or 'another code object'}; the lock was edited or made by another "
                                    f"gemmar-aot: rebuild the manifest")
    data = artifacts.load_blob(info, e.blob.hash, e.blob.size)
    try:
        co = parse_code_object(data)
    except CodeObjectError as exc:
        raise ArtifactMismatchError(f"{where}: {_serves(item)} is not a code object: {exc}") from None
    if co.arch != item.variant.arch:
        raise ArtifactMismatchError(f"{where}: the code object of {_serves(item)} is for {co.arch}, the "
                                    f"lock serves it for {item.variant.arch}; rebuild the manifest")
    listed, defined = set(e.symbols), {k.name for k in co.kernels}
    if not listed or listed != defined:
        raise ArtifactMismatchError(
            f"{where}: the lock lists {len(listed)} kernel(s) for {_serves(item)} and its code object "
            f"defines {len(defined)}: " + "; ".join(part for part in (
                f"listed, not defined: {sorted(listed - defined)}" if listed - defined else "",
                f"defined, not listed: {sorted(defined - listed)}" if defined - listed else "",
                "the list is empty" if not listed else "") if part)
            + "; a lock item names exactly its code object's kernels: the lock was edited or made by another "
              "gemmar-aot, rebuild the manifest")
    return data


def _serves(item: Any) -> str:
    """What a whole-object lock item serves, in words."""
    plan = getattr(item, "plan", None)
    return f"mori's JIT v2 {plan} for {item.variant.describe()}" if plan else item.variant.describe()


def _record_compiled(item: Any, rec: dict) -> str | None:
    """None when ``rec`` compiled exactly what ``item`` serves; else what it compiled, in words."""
    from gemmar_aot.model.hipcc import HipccVariant

    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    p = spec.get("params") if isinstance(spec.get("params"), dict) else {}
    if getattr(item, "plan", None) is not None:  # a jitv2 item
        got = (spec.get("recipe"), p.get("plan"), p.get("arch"), p.get("nic"), rec.get("mori_cache_entry"))
        want = ("jitv2", item.plan, item.variant.arch, item.variant.nic, item.cache_entry)
        return None if got == want else f"{got[0]} {got[1]} for {got[2]}, NIC {got[3]} at {got[4]}"
    got = HipccVariant(p.get("source"), p.get("arch"), p.get("nic"), p.get("host_proxy")) \
        if spec.get("recipe") == "hipcc" else None
    if got == item.variant and p.get("profiler") is False:
        return None
    return got.describe() if got else str(spec)
