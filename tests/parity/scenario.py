"""A parity scenario: one op (shape, world, rank, mode) and the steps both sides run on it.

Shared by the oracle (mori's op, in its own process) and the candidate (our
runtime, in the test process): the operands are made here, the same way for
both, and every address a launch may carry is named here (window, dev comm,
window handle, stream, each operand), so two runs in two processes compare
equal when, and only when, they launch the same kernels with the same
arguments relative to their own bases.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scenario:
    name: str
    world: int
    rank: int
    n: int
    k: int
    m_max: int
    quant: str = "blockscale"
    gather_dtype: str = "bf16"
    gather_transport: str = "lsa"
    #: ("self_test", m or None) | ("call", m), in order.
    steps: tuple = ()
    #: "rule": mori's slots replaced by ours (shim 5); "first-seen": mori's own (the negative control).
    slots: str = "rule"
    transport: str = "fused-sdma"

    def to_json(self) -> dict:
        d = asdict(self)
        d["steps"] = [list(s) for s in self.steps]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Scenario":
        return cls(**{**d, "steps": tuple(tuple(s) for s in d["steps"])})

    @property
    def block_m(self) -> int:
        return 256 if self.quant == "mxfp8" else 128

    def op_kwargs(self) -> dict:
        return dict(n=self.n, k=self.k, m_max=self.m_max, quant=self.quant, gather_dtype=self.gather_dtype,
                    gather_transport=self.gather_transport)

    @property
    def call_ms(self) -> list[int]:
        return sorted({m for kind, m in self.steps if kind == "call"})


@dataclass
class Operands:
    """Per M: the operand tensors (and gemm-only's output), in the forms both ops accept without copying."""

    by_m: dict = field(default_factory=dict)

    def get(self, sc: Scenario, m: int):
        if m not in self.by_m:
            self.by_m[m] = make_operands(sc, m)
        return self.by_m[m]

    def regions(self) -> dict[str, tuple[int, int]]:
        out = {}
        for m, ts in self.by_m.items():
            for name, t in zip(("a", "b", "a_scale", "b_scale", "out"), ts):
                out[f"{name}@{m}"] = (t.data_ptr(), t.numel() * t.element_size())
        return out


def make_operands(sc: Scenario, m: int):
    import torch

    fp8 = torch.float8_e4m3fn
    if sc.transport == "gemv":  # mori's Mxfp8GemvOp: row-major ue8m0 bytes, no preshuffled scales
        return (torch.zeros(m, sc.k, dtype=fp8), torch.zeros(sc.n, sc.k, dtype=fp8),
                torch.zeros(m, sc.k // 32, dtype=torch.uint8), torch.zeros(sc.n // 32, sc.k // 32, dtype=torch.uint8),
                torch.empty(m, sc.n, dtype=torch.bfloat16))
    a = torch.zeros(m, sc.k, dtype=fp8)
    b = torch.zeros(sc.n, sc.k, dtype=fp8)
    if sc.quant == "mxfp8":
        a_scale = torch.zeros(m * sc.k // 128, dtype=torch.int32)
        b_scale = torch.zeros((sc.n // 32) * (sc.k // 32), dtype=torch.int32)
    else:
        kb = sc.k // 128
        a_scale = torch.ones(kb, m)  # the physical [K/128, M] form: a view for both ops
        b_scale = torch.ones(sc.n // 128, kb)
    if sc.transport == "gemm-only":  # no window: the output is the caller's tensor
        return a, b, a_scale, b_scale, torch.empty(m, sc.n, dtype=torch.bfloat16)
    return a, b, a_scale, b_scale


def address_map(*, window: tuple[int, int], dev_comm: int, win: int, stream: int,
                operands: Operands) -> dict[str, Any]:
    """Every named base a launch argument may point into or equal."""
    return {"regions": {"window": list(window), **{k: list(v) for k, v in operands.regions().items()}},
            "handles": {"dev_comm": dev_comm, "win": win, "stream": stream}}


# ---------------------------------------------------------------------------
# The CI tier's table: small shapes, every mode the runtime serves
# ---------------------------------------------------------------------------

N, K = 1024, 256  # the smallest N the fp8 gather takes (N % 1024); K >= 256


def _ranks(world: int) -> tuple[int, ...]:
    return (0, world - 1)  # rank 0 and the last, at least


def _up_down(granule: int) -> tuple:
    """self_test at m_max first (what the constructor does), then M down, up and down again."""
    lo, hi = granule, 2 * granule
    return (("self_test", None), ("call", lo), ("call", hi), ("call", lo), ("self_test", lo))


#: (name prefix, world, quant, gather_dtype, gather_transport); m_max is two granules.
MODES = (
    ("w2-bf16", 2, "blockscale", "bf16", "lsa"),
    ("w2-fp8-lsa", 2, "blockscale", "fp8", "lsa"),
    ("w2-fp8-sdma", 2, "blockscale", "fp8", "sdma"),
    ("w2-mxfp8", 2, "mxfp8", "bf16", "lsa"),
    ("w4-bf16", 4, "blockscale", "bf16", "lsa"),
    ("w8-bf16", 8, "blockscale", "bf16", "lsa"),
)

#: gemm-only (mori's Mxfp8GemmOp): 256 runs the narrow tile, 9216 the wide one.
GEMM_ONLY_MS = (256, 9216)


def fused_scenarios() -> list[Scenario]:
    out = []
    for name, world, quant, gdt, gtr in MODES:
        granule = world * (256 if quant == "mxfp8" else 128)
        for rank in _ranks(world):
            out.append(Scenario(name=f"{name}-r{rank}", world=world, rank=rank, n=N, k=K, m_max=2 * granule,
                                quant=quant, gather_dtype=gdt, gather_transport=gtr, steps=_up_down(granule)))
    return out


def gemm_only_scenario() -> Scenario:
    lo, hi = GEMM_ONLY_MS
    return Scenario(name="gemm-only-mxfp8", world=2, rank=0, n=N, k=K, m_max=hi, quant="mxfp8",
                    steps=(("call", lo), ("call", hi), ("call", lo)), transport="gemm-only")


#: gemv (mori's Mxfp8GemvOp): M in 1..32, one kernel per bucket; 3 and 4 share bucket 4.
GEMV_MS = (1, 8, 3, 4, 1)


def gemv_scenario() -> Scenario:
    return Scenario(name="gemv-mxfp8", world=2, rank=0, n=N, k=K, m_max=max(GEMV_MS), quant="mxfp8",
                    steps=tuple(("call", m) for m in GEMV_MS), transport="gemv")


#: The modes mori has no op class for (its builders + repository benchmark are the oracle:
#: tests/parity/oracle.py BENCHMARK), at manifests/smoke.toml's shapes: world 2, N 1024,
#: K 256, blockscale, bf16 wire, m_max 512; self_test at m_max (what our constructor runs),
#: M down, up and down (256 and 512), then self_test at 256. The self-test's oracle is
#: mori's GemmAllReduceOp.self_test, or for split-lsa the benchmark's all-reduce launch.
BENCHMARK_MODES = ("split-sdma", "split-lsa", "fused-lsa")


def benchmark_mode_scenarios() -> list[Scenario]:
    out = []
    for transport in BENCHMARK_MODES:
        granule = 2 * 128
        for rank in _ranks(2):
            out.append(Scenario(name=f"{transport}-w2-r{rank}", world=2, rank=rank, n=N, k=K, m_max=2 * granule,
                                steps=_up_down(granule), transport=transport))
    return out


def negative_control() -> Scenario:
    """mori's own first-seen slots: the self-test takes m_max first, so it gets set 0 (ours: 1)."""
    base = fused_scenarios()[0]
    return Scenario(**{**base.to_json(), "name": "w2-bf16-r0-first-seen", "slots": "first-seen",
                       "steps": base.steps})


def manifest_toml(scenarios: list[Scenario], name: str = "parity") -> str:
    """The manifest our build compiles for these scenarios (every rank of each world: the runtime needs all)."""
    groups: dict[tuple, set] = {}
    for sc in scenarios:
        key = (sc.transport, sc.world, sc.quant, sc.gather_dtype, sc.gather_transport, sc.m_max)
        groups.setdefault(key, set()).update(sc.call_ms + ([sc.m_max] if sc.transport == "fused-sdma" else []))
    lines = ["[manifest]", f'name = "{name}"', 'arch = "gfx950"', ""]
    for (transport, world, quant, gdt, gtr, m_max), ms in sorted(groups.items()):
        lines += ["[[tuple]]", f'transport = "{transport}"', f"m = {sorted(ms)}", f"n = {N}", f"k = {K}",
                  f"world = {world}", f'quant = "{quant}"']
        if transport == "fused-sdma":
            lines += [f'gather_dtype = "{gdt}"', f'gather_transport = "{gtr}"', f"m_max = {m_max}"]
        lines.append("")
    return "\n".join(lines)
