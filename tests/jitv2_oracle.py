"""The oracle of the JIT v2 launch tests: mori's own EP v2 op (``dispatch_combine_v2``,
``kernel_backend="hip"``) on the HIP runtime test double, and every launch it makes.

Run as ``python tests/jitv2_oracle.py '<json>'`` (a process of its own: mori's JIT v2 resolves its
toolchain once per process and reads its wave size at import)::

    {"mori_dir": ".../mori-1.2.4", "hipstub": ".../libamdhip64.so.7",
     "configs": [{"name": "ep8", "device": "mi355x", "world_size": 8, "hidden_dim": 7168,
                  "max_num_inp_token_per_rank": 4096, "num_experts_per_rank": 32,
                  "num_experts_per_token": 8, "data_type": "bf16", "tokens": [1, 4096]}, ...]}

A config holds mori's ``EpDispatchCombineConfig`` fields (``rank`` 0 unless given, ``data_type`` and
``combine_data_type`` by name, :data:`DTYPES`), ``device`` (a key of :data:`DEVICES`; one per process),
optionally ``tokens``, the token counts to call with -- without it, every bucket edge of what mori
resolved (:func:`token_counts`) -- and ``combine_weights`` (combine asks for the weight fold). Each
token count is one round: ``dispatch(return_routing=True)`` of fresh inputs, then ``combine`` of the
expert output written in place (``combine_in_view()``) with that routing.

Prints one JSON line, a list with per config either ``{"refused": mori's message}`` or ``{"resolved",
"plans", "tokens", "calls", "problems"}``. ``plans``: every plan mori made, its cache entry (relative
to ``$MORI_JIT_CACHE_DIR``) and what mori resolved for it. ``calls``: per ``dispatch`` and ``combine``
(at a token count), its HIP launches as the double recorded them -- kernel, code object sha256, grid,
block, shared memory bytes, stream, the kernarg segment size and explicit arguments of the code
object, and the argument bytes decoded by mori's own schema (``mori_jit_plan_args_schema``) with every
pointer named by the allocation it points into (``<op.total_recv+0x0>``, ``<cco.mem0+0x205200>``,
``<round0.x+0x0>``), and as hex with those pointers zeroed. ``problems``: pointers into no allocation
the harness knows (a comparison should require none).

The environment mori's JIT reads is taken as given -- ``MORI_JIT_CACHE_DIR``, ``MORI_JIT_HIPCC``,
``MORI_JIT_ARCH``, ``MORI_DEVICE_NIC``, ``MORI_DEVICE_IONIC_CCQE`` -- so the same harness runs mori
compiling through its own JIT or mori served from a seeded cache, and cannot tell which. Every other
knob of mori's (:data:`CLEARED_ENV`) is cleared; ``MORI_WAVE_SIZE`` is the device's.

Nothing here reads what gemmar-aot built or recorded. mori's code runs as it is; what is changed,
and why (test doubles only):

1. The HIP runtime is the test double (``tests/hipstub``, ``HIPSTUB_ARCH`` the device's), loaded
   ``RTLD_GLOBAL`` before mori's libraries, which bind to it by soname (``libamdhip64.so.7``).
   ``mori`` and ``mori.ops`` are bare packages: their ``__init__`` loads ROCm's libraries.
2. ``mori.ops.utils.topology`` answers the device's KFD identity (MI355X: 256 CU, gfx950, DID
   0x75A3): mori picks its tuning tables by the device, and this host has none.
3. ``hip_backend``'s torch is CPU torch: ``torch.device("cuda", i)`` is the CPU, and ``torch.cuda``
   answers device 0, the device's properties (its ``gcnArchName`` and CU count), the null stream
   (torch's default stream; ``_raw_stream`` falls back to it, CPU torch has no raw-stream entry) and
   a synchronize with nothing to wait for. CPU torch has no CUDA device; tensor values are not what
   is compared.
4. The communicator is ``tests/fakes.FakeCommunicator`` (the cco double), and ``from_gpu_ptr``
   (in ``symm_arena``, ``hip_backend`` and the base op) is its ``tensor_at``: the symmetric window is
   host memory.
5. ``mori.cco`` is the cco double (``fakes.fake_cco_modules``): the internode op's
   ``_make_dev_comm`` -- mori's, with its world and LSA checks -- makes a ``FakeDevCommHandle``, whose
   host ``ccoDevComm`` the internode plans take by value. mori's cco is a native extension over
   RDMA NICs (and built for another Python).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The devices the harness can stand in for: KFD identity (``mori.ops.utils.topology``), the HIP
#: double's arch, ``gcnArchName`` and wave size.
DEVICES = {
    "mi355x": {"topology": (256, 90500, 0x75A3), "arch": "gfx950", "gcn": "gfx950:sramecc+:xnack-", "wave": 64},
    "mi300x": {"topology": (304, 90402, 0x74A1), "arch": "gfx942", "gcn": "gfx942:sramecc+:xnack-", "wave": 64},
    "mi308x": {"topology": (80, 90402, 0x74A2), "arch": "gfx942", "gcn": "gfx942:sramecc+:xnack-", "wave": 64},
}
#: What mori's JIT reads that the caller decides (taken as given; the first two must be set).
GIVEN_ENV = ("MORI_JIT_CACHE_DIR", "MORI_JIT_HIPCC", "MORI_JIT_ARCH", "MORI_DEVICE_NIC", "MORI_DEVICE_IONIC_CCQE")
#: mori's other knobs, cleared so nothing of the calling shell's reaches the op.
CLEARED_ENV = ("MORI_JIT_EXTRA_FLAGS", "MORI_SOURCE_ROOT", "MORI_V2_LIB_DIR", "MORI_GPU_ARCHS", "MORI_WAVE_SIZE",
               "MORI_V2_KERNEL_BACKEND", "MORI_EP_DISP_GEOM", "MORI_EP_COMB_GEOM", "MORI_EP_TOKOFF_EXT")
#: Dtypes by name (torch's attribute names).
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp8_e4m3fn": "float8_e4m3fn", "fp8_e4m3fnuz": "float8_e4m3fnuz",
          "fp4": "float4_e2m1fn_x2"}
#: Config keys that are the harness's, not mori's.
OWN_KEYS = ("name", "device", "tokens", "combine_weights", "data_type", "combine_data_type")


def _bare(name: str, path: Path) -> None:
    mod = types.ModuleType(name)
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(path)]
    mod.__spec__, mod.__path__, mod.__package__ = spec, [str(path)], name
    sys.modules[name] = mod
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, mod)


def load_mori(mori_dir: str, hipstub: str, device: dict, served: bool = False):
    """mori's EP v2 modules on the HIP double (shims 1 and 2); returns them and the double's reader.
    ``served``: mori's JIT cache and compiler are gemmar-aot's to set (the code under test)."""
    from hipstub import HipStub

    if "mori" in sys.modules:
        raise RuntimeError("mori is already imported in this process")
    unset = [k for k in GIVEN_ENV[:2] if not os.environ.get(k)]
    if unset and not served:
        raise RuntimeError(f"set {' and '.join(unset)}: mori's JIT cache and compiler are the caller's to give")
    for k in CLEARED_ENV:
        os.environ.pop(k, None)
    os.environ.update(HIPSTUB_ARCH=device["arch"], MORI_WAVE_SIZE=str(device["wave"]))
    ctypes.CDLL(hipstub, mode=ctypes.RTLD_GLOBAL)  # shim 1: before any library of mori's
    stub = HipStub(hipstub)
    pkg = Path(mori_dir) / "mori"
    _bare("mori", pkg)
    _bare("mori.ops", pkg / "ops")
    gpu_utils = importlib.import_module("mori.ops.utils")
    gpu_utils.topology = lambda: device["topology"]  # shim 2
    m = types.SimpleNamespace(stub=stub, plan_api=importlib.import_module("mori.jit.v2.plan_api"))
    for short, mod in (("dco", "dispatch_combine_op"), ("hb", "hip_backend"), ("sa", "symm_arena")):
        setattr(m, short, importlib.import_module(f"mori.ops.dispatch_combine_v2.{mod}"))
    return m


def cuda_on_cpu(torch, device: dict):
    """Shim 3: ``hip_backend``'s torch, with the CPU as its CUDA device."""
    cpu_torch = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    cpu_torch.device = lambda *args, **kw: torch.device("cpu")
    props = types.SimpleNamespace(name="hipstub test double", gcnArchName=device["gcn"],
                                  multi_processor_count=device["topology"][0])
    stream = types.SimpleNamespace(cuda_stream=0)  # torch's default stream is HIP's null stream
    cpu_torch.cuda = types.SimpleNamespace(current_device=lambda: 0, get_device_properties=lambda *a: props,
                                           synchronize=lambda *a: None, current_stream=lambda *a: stream)
    return cpu_torch


def install_doubles(m, comm, device: dict) -> None:
    """Shims 3, 4 and 5 (the op's torch, the window, cco) for the op about to be built on ``comm``."""
    import torch
    from fakes import fake_cco_modules

    m.hb.torch = cuda_on_cpu(torch, device)
    for mod in (m.dco, m.hb, m.sa):
        mod.from_gpu_ptr = comm.tensor_at
    sys.modules.update(fake_cco_modules())


# ---------------------------------------------------------------- the op


def make_config(m, a: dict):
    """mori's ``EpDispatchCombineConfig`` for config ``a`` (the HIP backend)."""
    import torch

    def dt(name):
        return getattr(torch, DTYPES[name])

    fields = {k: v for k, v in a.items() if k not in OWN_KEYS}
    fields.setdefault("rank", 0)
    if a.get("combine_data_type", a["data_type"]) != a["data_type"]:
        fields.update(dispatch_data_type=dt(a["data_type"]), combine_data_type=dt(a["combine_data_type"]))
    return m.dco.EpDispatchCombineConfig(data_type=dt(a["data_type"]), kernel_backend="hip", **fields)


def construct(m, a: dict, device: dict, served: dict | None = None):
    """mori's op for config ``a``, built by its own constructor on the doubles; (op, comm, cfg). With
    ``served`` (the code under test, never the oracle's side): the op gemmar-aot's
    ``EpDispatchCombineOp`` returns for it from ``served["artifacts"]`` -- mori's own HIP op, its JIT
    v2 cache seeded by gemmar-aot (misses to ``served.get("miss_report")``)."""
    from fakes import FakeCommunicator

    cfg = make_config(m, a)
    comm = FakeCommunicator(rank=cfg.rank, nranks=cfg.world_size, lazy=True, lsa_size=cfg.gpu_per_node)
    install_doubles(m, comm, device)
    if served is not None:
        from gemmar_aot.runtime import EpDispatchCombineOp

        op = EpDispatchCombineOp(cfg, comm, artifacts=served["artifacts"], miss_report=served.get("miss_report"))
        assert isinstance(op, m.hb.EpDispatchCombineOpHip), type(op)
        return op, comm, cfg
    return m.hb.EpDispatchCombineOpHip(cfg, comm), comm, cfg


def token_counts(op, cfg) -> list[int]:
    """Every bucket edge of the geometry mori resolved, and one past it, with 1 and the capacity:
    intranode the schedule's ``max_tok`` values, internode the tuning buckets' and the "auto"
    family crossover (``internode_auto_ll_max_tokens``)."""
    cap = cfg.max_num_inp_token_per_rank
    if cfg.is_internode:
        edges = {b[0] for b in op._internode_buckets if b[0] is not None}
        if cfg.internode_kernel == "auto":
            edges.add(cfg.internode_auto_ll_max_tokens)
    else:
        edges = {b[0] for b in (cfg.schedule or ()) if b[0] is not None}
    wanted = {1, cap} | edges | {e + 1 for e in edges}
    return sorted(n for n in wanted if 1 <= n <= cap)


def resolved(op, cfg) -> dict:
    """What mori resolved for the config: geometry, schedule, internode buckets and family."""
    out = {"geometry": [cfg.dispatch_block_num, cfg.warp_num_per_block, cfg.combine_block_num,
                        cfg.combine_warp_num_per_block],
           "schedule": [list(b) for b in cfg.schedule] if cfg.schedule else None,
           "max_num_inp_token_per_rank": cfg.max_num_inp_token_per_rank, "internode": cfg.is_internode}
    if cfg.is_internode:
        out.update(buckets=[[b[0], list(b[1]), list(b[2])] for b in op._internode_buckets],
                   internode_kernel=cfg.internode_kernel, auto_ll_max_tokens=cfg.internode_auto_ll_max_tokens)
    else:
        out.update(dispatch_specs=[list(s) for s in op._dispatch_specs],
                   combine_specs=[list(s) for s in op._combine_specs])
    return out


def plans(op) -> list[dict]:
    """Every plan mori made: its kernel, cache entry (relative to ``$MORI_JIT_CACHE_DIR``) and geometry."""
    root = Path(os.environ.get("MORI_JIT_CACHE_DIR", "")).resolve()
    out = []
    for p in op._plans:
        info = p.info
        entry = Path(info.pop("cacheDir")).resolve()  # absolute: the cache root differs between runs
        out.append({"plan": p._kernel, "cache_entry": entry.relative_to(root).as_posix()
                    if entry.is_relative_to(root) else str(entry), "info": info})
    return out


# ---------------------------------------------------------------- pointers and arguments


class Allocations:
    """Named address ranges the harness knows (the window, the op's tensors, the call inputs, the
    device communicator), to name a pointer by what it points into."""

    def __init__(self):
        self.ranges: list[tuple[str, int, int]] = []

    def add(self, name: str, start: int, nbytes: int) -> None:
        if nbytes > 0 and self.find(start) is None:
            self.ranges.append((name, start, start + nbytes))

    def add_tensor(self, name: str, t) -> None:
        s = t.untyped_storage()
        self.add(name, s.data_ptr(), s.nbytes())

    def find(self, value: int) -> tuple[str, int] | None:
        for name, start, end in self.ranges:
            if start <= value < end:
                return name, value - start
        return None

    def name(self, value: int) -> str | int:
        """``value`` as ``<allocation+offset>`` when it points into one, else the value itself."""
        hit = self.find(value) if value else None
        return f"<{hit[0]}+{hit[1]:#x}>" if hit else value


def known_allocations(op, comm) -> Allocations:
    """The communicator's memory and device communicators first (the window's views resolve to it),
    then every tensor the op holds, by attribute."""
    import torch
    from fakes import FakeDevComm, FakeMemory

    allocs = Allocations()
    mems = [h for h in comm.live if isinstance(h, FakeMemory)]
    for i, h in enumerate(mems):
        allocs.add(f"cco.mem{i}", h.ptr, h.size)
    for i, h in enumerate(h for h in comm.live if isinstance(h, FakeDevComm)):
        allocs.add(f"cco.dev_comm{i}", h.host_ptr, len(h.host))
    for attr, value in sorted(vars(op).items()):
        if isinstance(value, torch.Tensor):
            allocs.add_tensor(f"op.{attr}", value)
    return allocs


def arg_schemas(m, op) -> dict[str, list[tuple[str, str, int, int]]]:
    """mori's launch argument layout per plan family ("intranode", "internode"): (name, type tag,
    offset, size) per field, from ``mori_jit_plan_args_schema`` and the ctypes struct mori builds
    from it; every plan of a family must share one."""
    lib = m.plan_api._load()
    out: dict[str, list] = {}
    for p in op._plans:
        tags = dict(item.split(":") for item in lib.mori_jit_plan_args_schema(p._kernel.encode()).decode()
                    .split(",") if item)
        layout = [(n, tags[n], getattr(p._args_t, n).offset, getattr(p._args_t, n).size) for n in p._arg_names]
        family = "internode" if p._kernel.startswith("ep_internode_") else "intranode"
        if out.setdefault(family, layout) != layout:
            raise RuntimeError(f"{p._kernel}'s argument schema differs from its family's: {layout}")
    return out


def decode_args(raw: bytes, layout, allocs: Allocations, problems: list, where: str) -> tuple[list, str]:
    """Arguments by mori's schema, pointers named; and the bytes with those pointers zeroed."""
    import struct

    buf, args = bytearray(raw[:layout[-1][2] + layout[-1][3]]), []
    for name, tag, off, size in layout:
        if tag.startswith("b"):  # a struct by value: name the 8-byte words that point somewhere known
            words = []
            for w in range(off, off + size - size % 8, 8):
                v = struct.unpack_from("<Q", buf, w)[0]
                if allocs.find(v) is not None:
                    words.append([w - off, allocs.name(v)])
                    buf[w:w + 8] = bytes(8)
            args.append([name, tag, {"bytes": bytes(buf[off:off + size]).hex(), "pointers": words}])
            continue
        fmt = {"i32": "<i", "f32": "<f", "i64": "<q"}.get(tag, "<Q")
        v = struct.unpack_from(fmt, buf, off)[0]
        named = allocs.name(v) if fmt == "<Q" else v
        if tag == "p" and isinstance(named, int) and named:
            problems.append(f"{where}: {name} = {v:#x} points into no allocation the harness knows")
            named = "<unknown>"
        if isinstance(named, str):
            buf[off:off + size] = bytes(size)
        args.append([name, tag, named])
    return args, bytes(buf).hex()


def launch_records(stub, schemas, allocs: Allocations, problems: list, where: str) -> list[dict]:
    """What the double recorded since it was last cleared, normalised."""
    out = []
    for i, l in enumerate(stub.launches()):
        family = "internode" if l.kernel.startswith("mori_ep_internode_") else "intranode"
        args, raw = decode_args(l.kernarg, schemas[family], allocs, problems, f"{where} launch {i} ({l.kernel})")
        out.append({"kernel": l.kernel, "code_object": l.digest, "grid": list(l.grid), "block": list(l.block),
                    "shared_mem": l.shared_mem, "stream": l.stream, "via_extra": l.via_extra,
                    "kernarg_size": len(l.kernarg), "explicit": [list(a) for a in l.args if a[2] != "hidden"],
                    "args": args, "arg_bytes": raw})
    return out


# ---------------------------------------------------------------- the calls


def round_inputs(cfg, n: int) -> dict:
    """A caller's dispatch inputs for ``n`` tokens: tokens, weights, expert indices (round-robin over
    every expert) and, when the config forwards scales, scale rows."""
    import torch

    topk, experts = cfg.num_experts_per_token, cfg.world_size * cfg.num_experts_per_rank
    cols = cfg.hidden_dim // 2 if cfg.is_fp4 else cfg.hidden_dim
    out = {"x": torch.zeros(n, cols, dtype=cfg.dispatch_dtype),
           "weights": torch.ones(n, topk, dtype=torch.float32),
           "indices": (torch.arange(n * topk, dtype=torch.int32) % experts).view(n, topk)}
    if cfg.scale_dim:
        out["scales"] = torch.zeros(n, cfg.scale_dim, dtype=torch.float32 if cfg.scale_type_size == 4 else torch.uint8)
    return out


def run_rounds(m, op, cfg, tokens: list[int], allocs: Allocations, combine_weights: bool) -> tuple[list, list]:
    """One ``dispatch`` (returning the routing) and one ``combine`` of mori's op per token count, the
    expert output written in place (``combine_in_view``), the weight fold asked for when
    ``combine_weights``; each call's launches, and the problems."""
    calls, problems, keep = [], [], []
    schemas = arg_schemas(m, op)
    for i, n in enumerate(tokens):
        inp = round_inputs(cfg, n)
        keep.append(inp)  # alive for the run: the internode combine reads the dispatch's indices
        for name, t in inp.items():
            allocs.add_tensor(f"round{i}.{name}", t)
        m.stub.clear()
        routing = op.dispatch(inp["x"], inp["weights"], inp.get("scales"), inp["indices"], return_routing=True)[-1]
        calls.append({"call": "dispatch", "tokens": n,
                      "launches": launch_records(m.stub, schemas, allocs, problems, f"dispatch({n})")})
        m.stub.clear()
        op.combine(op.combine_in_view(), inp["weights"] if combine_weights else None, routing=routing)
        calls.append({"call": "combine", "tokens": n,
                      "launches": launch_records(m.stub, schemas, allocs, problems, f"combine({n})")})
    return calls, problems


def run_config(m, a: dict, device: dict, served: dict | None = None) -> dict:
    """One config: mori's refusal (or gemmar-aot's, served), or what it resolved, its plans and every
    launch of its rounds."""
    try:
        op, comm, cfg = construct(m, a, device, served)
    except ValueError as e:
        return {"refused": str(e)}
    except Exception as e:  # noqa: BLE001 - gemmar-aot's refusal of a served config: the test reads it
        if served is None or type(e).__module__.split(".")[0] != "gemmar_aot":
            raise
        return {"refused": f"{type(e).__name__}: {e}"}
    try:
        allocs = known_allocations(op, comm)
        tokens = list(a.get("tokens") or token_counts(op, cfg))
        calls, problems = run_rounds(m, op, cfg, tokens, allocs, bool(a.get("combine_weights")))
        return {"resolved": resolved(op, cfg), "plans": plans(op), "tokens": tokens, "calls": calls,
                "problems": problems}
    finally:
        op.close()


def main(args: dict) -> list[dict]:
    """``{"mori_dir", "hipstub", "configs": [...], "served": {...} (optional)}`` -> one :func:`run_config`
    result per config (one device per process: mori resolves its toolchain once)."""
    devices = {a.get("device", "mi355x") for a in args["configs"]}
    if len(devices) != 1:
        raise ValueError(f"one device per process, got {sorted(devices)}")
    device = DEVICES[devices.pop()]
    m = load_mori(args["mori_dir"], args["hipstub"], device, served=args.get("served") is not None)
    return [run_config(m, a, device, args.get("served")) for a in args["configs"]]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
