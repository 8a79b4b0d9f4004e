"""An EP parity scenario: one rank of one EP dispatch/combine configuration, and the calls both sides make.

The oracle is mori's own ``EpDispatchCombineOpFlyDSL`` (tests/parity/oracle.py ``_run_ep``), the
candidate ``gemmar_aot.runtime.EpDispatchCombineOp`` (tests/parity/candidate.py ``run_ep``). Both
get the operands made here, run :func:`run_steps` (the same host calls, in order) and name every
address a launch may carry with :func:`address_map`: the window, each per-rank tensor by the
attribute name both ops give it (the candidate's names are mori's, on purpose), each operand,
the window handle and the stream.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: The per-rank tensors mori's FlyDSL backend makes (flydsl_backend.py), by attribute name.
TENSORS = ("token_dest_map", "routing_dest_map", "dest_pe_counter", "dispatch_barrier", "total_recv",
           "combine_barrier", "cross_device_flag", "combine_out", "combine_out_weights", "_local_expert_count_buf",
           "packed_x", "packed_count", "packed_src", "slot_map")


@dataclass(frozen=True)
class EpScenario:
    name: str
    world: int
    rank: int
    hidden: int
    max_tokens: int
    experts: int  # in all
    topk: int
    dispatch_dtype: str = "bf16"
    combine_dtype: str | None = None
    quant_type: str = "none"
    combine_mode: str = "gather"
    scale_dim: int = 0
    scale_type_size: int = 0
    max_total_recv_tokens: int = 0
    std_moe: bool = False
    replay: bool = True
    #: ("dispatch", n) with return_routing | ("plain", n) without | ("replay", n) with routing= the
    #: handle of the last ("dispatch", n) | ("combine", n) with that handle | ("lec", 0) |
    #: ("convert_dispatch", 0) | ("convert_combine", n) | ("reset", 0)
    steps: tuple = ()
    op: str = "ep"

    def to_json(self) -> dict:
        d = asdict(self)
        d["steps"] = [list(s) for s in self.steps]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "EpScenario":
        return cls(**{**d, "steps": tuple(tuple(s) for s in d["steps"])})

    @property
    def recv_cap(self) -> int:
        per_rank = self.max_tokens
        if self.max_total_recv_tokens > 0:
            per_rank = min(-(-self.max_total_recv_tokens // self.world), self.max_tokens)
        return self.world * per_rank

    @property
    def combine(self) -> str:
        return self.combine_dtype or self.dispatch_dtype

    def mori_config(self, torch) -> dict:
        """mori's ``EpDispatchCombineConfig`` keywords (``kernel_backend`` flydsl: no native import)."""
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8_e4m3fn": torch.float8_e4m3fn,
              "fp8_e4m3fnuz": torch.float8_e4m3fnuz, "fp4": getattr(torch, "float4_e2m1fn_x2", None)}
        kw = dict(rank=self.rank, world_size=self.world, hidden_dim=self.hidden,
                  max_num_inp_token_per_rank=self.max_tokens, num_experts_per_rank=self.experts // self.world,
                  num_experts_per_token=self.topk, data_type=dt[self.dispatch_dtype], scale_dim=self.scale_dim,
                  scale_type_size=self.scale_type_size, combine_mode=self.combine_mode, quant_type=self.quant_type,
                  enable_std_moe=self.std_moe, max_total_recv_tokens=self.max_total_recv_tokens,
                  kernel_backend="flydsl")
        if self.combine != self.dispatch_dtype:
            kw.update(dispatch_data_type=dt[self.dispatch_dtype], combine_data_type=dt[self.combine])
        return kw

    def manifest_entry(self) -> str:
        lines = ["[[ep]]", f"world = {self.world}", f"hidden = {self.hidden}", f"max_tokens = {self.max_tokens}",
                 f"experts = {self.experts}", f"topk = {self.topk}", f'dispatch_dtype = "{self.dispatch_dtype}"',
                 'device = "MI355X"', f'combine_dtype = "{self.combine}"', f'quant_type = "{self.quant_type}"',
                 f'combine_mode = "{self.combine_mode}"', f"scale_dim = {self.scale_dim}",
                 f"scale_type_size = {self.scale_type_size}", f"max_total_recv_tokens = {self.max_total_recv_tokens}",
                 f"std_moe = {'true' if self.std_moe else 'false'}", f"replay = {'true' if self.replay else 'false'}"]
        return "\n".join(lines)


class EpOperands:
    """Per token count: (input, weights, scales or None, indices), and per combine the expert output."""

    def __init__(self, sc: EpScenario):
        self.sc = sc
        self.by_n: dict[int, tuple] = {}
        self.expert_out: dict[int, Any] = {}

    def dispatch(self, n: int):
        if n not in self.by_n:
            import torch

            sc = self.sc
            cols = sc.hidden // 2 if sc.dispatch_dtype == "fp4" else sc.hidden
            x = _zeros(torch, (n, cols), sc.dispatch_dtype)
            w = torch.zeros(n, sc.topk, dtype=torch.float32)
            idx = torch.zeros(n, sc.topk, dtype=torch.int32)
            nbytes = sc.scale_dim * sc.scale_type_size
            scales = torch.zeros(n, (nbytes + 3) // 4, dtype=torch.int32) if nbytes else None
            self.by_n[n] = (x, w, scales, idx)
        return self.by_n[n]

    def combine_input(self, op, n: int):
        """The expert output: a tensor of its own (combine copies it in), or for an fp4 combine
        (CPU torch copies no fp4) the op's own staging view, which combine then leaves alone."""
        sc = self.sc
        rows = min(n * sc.topk, sc.recv_cap)  # what the experts produce, at most the receive slots
        if sc.combine == "fp4":
            return op.combine_in_view()[:rows]
        if n not in self.expert_out:
            import torch

            self.expert_out[n] = _zeros(torch, (rows, sc.hidden), sc.combine)
        return self.expert_out[n]

    def regions(self) -> dict[str, tuple[int, int]]:
        out = {}
        for n, ts in self.by_n.items():
            for name, t in zip(("input", "weights", "scales", "indices"), ts):
                if t is not None:
                    out[f"{name}@{n}"] = (t.data_ptr(), t.numel() * t.element_size())
        for n, t in self.expert_out.items():
            out[f"expert_out@{n}"] = (t.data_ptr(), t.numel() * t.element_size())
        return out


def _zeros(torch, shape: tuple, dtype: str):
    names = {"bf16": "bfloat16", "fp32": "float32", "fp8_e4m3fn": "float8_e4m3fn", "fp8_e4m3fnuz": "float8_e4m3fnuz",
             "fp4": "float4_e2m1fn_x2"}
    size = {"bf16": 2, "fp32": 4}.get(dtype, 1)
    n = 1
    for s in shape:
        n *= s
    return torch.zeros(n * size, dtype=torch.uint8).view(getattr(torch, names[dtype])).view(shape)


def run_steps(op, sc: EpScenario, ops: EpOperands) -> list[str]:
    """The scenario's calls on ``op`` (mori's or ours); returns what each returned, in short."""
    handles: dict[int, Any] = {}
    said = []
    for kind, n in sc.steps:
        if kind in ("dispatch", "plain", "replay"):
            x, w, s, idx = ops.dispatch(n)
            kw = {"return_routing": True} if kind == "dispatch" else {"routing": handles[n]} if kind == "replay" else {}
            got = op.dispatch(x, w, s, idx, **kw)
            if kind == "dispatch":
                handles[n] = got[-1]
            said.append(f"{kind} {n}: {[tuple(t.shape) if t is not None else None for t in got[:5]]}")
        elif kind == "combine":
            out, outw = op.combine(ops.combine_input(op, n), ops.dispatch(n)[1], routing=handles[n])
            said.append(f"combine {n}: {tuple(out.shape)} {tuple(outw.shape)}")
        elif kind == "lec":
            said.append(f"lec: {tuple(op.local_expert_count().shape)}")
        elif kind == "convert_dispatch":
            x, cnt, src = op.convert_dispatch_output()
            said.append(f"convert_dispatch: {tuple(x.shape)} {tuple(cnt.shape)} {tuple(src.shape)}")
        elif kind == "convert_combine":
            op.convert_combine_input(handles[n])
            said.append("convert_combine")
        elif kind == "reset":
            op.reset()
            said.append("reset")
        else:
            raise ValueError(f"{sc.name}: unknown step {kind!r}")
    return said


def address_map(op, *, window: tuple[int, int], win: int, stream: int, operands: EpOperands) -> dict:
    """Every named base an EP launch argument may point into or equal."""
    regions = {"window": list(window)}
    for name in TENSORS:
        t = getattr(op, name, None)
        if t is not None:
            regions[name] = [t.data_ptr(), t.numel() * t.element_size()]
    regions.update({k: list(v) for k, v in operands.regions().items()})
    return {"regions": regions, "handles": {"win": win, "stream": stream}}


# ---------------------------------------------------------------------------
# The CI tier's table
# ---------------------------------------------------------------------------

#: A token count in each bucket of MI355X's default schedule (128, 256, 1024, 4096, above).
BUCKET_NS = (64, 200, 1000, 3000, 4200)


def _round_trip(ns) -> tuple:
    """Each n: dispatch (returning the routing), the local expert count, combine; then a replay of
    the first, a plain dispatch, and a reset."""
    steps = []
    for n in ns:
        steps += [("dispatch", n), ("lec", 0), ("combine", n)]
    return (*steps, ("replay", ns[0]), ("combine", ns[0]), ("plain", ns[-1]), ("reset", 0), ("dispatch", ns[0]))


def ep_scenarios() -> list[EpScenario]:
    """Worlds 2, 4 and 8, every dtype mori's FlyDSL backend serves, both combine modes, StdMoE."""
    every_bucket = _round_trip(BUCKET_NS)
    small = _round_trip((32, 100))
    std = (("dispatch", 100), ("convert_dispatch", 0), ("convert_combine", 100), ("combine", 100), ("lec", 0))
    return [
        EpScenario("ep-w2-bf16-buckets-r0", 2, 0, 1024, 4200, 8, 2, steps=every_bucket),
        EpScenario("ep-w2-bf16-buckets-r1", 2, 1, 1024, 4200, 8, 2, steps=every_bucket),
        EpScenario("ep-w2-fp32-r1", 2, 1, 512, 128, 8, 2, "fp32", replay=False, steps=_no_replay(small)),
        EpScenario("ep-w2-fp8-scales-r0", 2, 0, 1024, 128, 8, 2, "fp8_e4m3fn", scale_dim=8, scale_type_size=4,
                   steps=small),
        EpScenario("ep-w4-fp8fnuz-to-bf16-r3", 4, 3, 1024, 128, 16, 4, "fp8_e4m3fnuz", "bf16", replay=False,
                   max_total_recv_tokens=256, steps=_no_replay(small)),
        EpScenario("ep-w2-fp4-r1", 2, 1, 1024, 128, 8, 2, "fp4", replay=False, steps=_no_replay(small)),
        EpScenario("ep-w2-fp4-to-bf16-r0", 2, 0, 1024, 128, 8, 2, "fp4", "bf16", replay=False,
                   steps=_no_replay(small)),
        EpScenario("ep-w2-scatter-fp8-direct-cast-r1", 2, 1, 1024, 128, 8, 2, quant_type="fp8_direct_cast",
                   combine_mode="scatter", replay=False, steps=_no_replay(small)),
        EpScenario("ep-w2-scatter-fp8-blockwise-r0", 2, 0, 1024, 128, 8, 2, quant_type="fp8_blockwise",
                   combine_mode="scatter", replay=False, steps=_no_replay(small)),
        EpScenario("ep-w2-stdmoe-r0", 2, 0, 1024, 128, 8, 2, std_moe=True, replay=False, steps=std),
        EpScenario("ep-w8-bf16-r7", 8, 7, 1024, 128, 16, 2, replay=False, steps=_no_replay(small)),
    ]


def _no_replay(steps: tuple) -> tuple:
    """``steps`` without the replay and the combine that follows it (an entry built without replay)."""
    out, skip = [], False
    for s in steps:
        if s[0] == "replay":
            skip = True
            continue
        if skip and s[0] == "combine":
            skip = False
            continue
        out.append(s)
    return tuple(out)


def ep_manifest_toml(scenarios: list[EpScenario], name: str = "parity-ep") -> str:
    """The manifest our build compiles for these scenarios: one [[ep]] per configuration (all ranks)."""
    entries = sorted({sc.manifest_entry() for sc in scenarios})
    return "\n\n".join(["[manifest]\n" + f'name = "{name}"\narch = "gfx950"', *entries]) + "\n"
