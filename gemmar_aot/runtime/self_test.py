"""The collective op's two self-tests: the all-reduce alone, and one whole call with a known answer.

Both are collective, like every call: every rank must run them.
"""

from __future__ import annotations

from typing import Any, Sequence

from .artifact_errors import SelfTestError
from .launches import Launch


def all_reduce_moves_bytes(*, launches: Sequence[Launch], input: Any, output: Any, driver: Any, stream: int,
                           world: int, rank: int, m: int, transport: str) -> None:
    """Every rank writes rank+1 into its input region; after ``launches`` (the mode's recorded
    self-test) every output element must read sum(1..world). Raises SelfTestError.

    The failure this exists for is silent: a mori built without ``BUILD_CCO_SDMA=ON``, or run
    without ``MORI_ENABLE_SDMA=1``, launches every kernel and returns from every put, but the
    puts do nothing -- the model keeps answering, wrongly, and the fused path even measures faster.
    """
    want = world * (world + 1) / 2
    input.fill_(float(rank + 1))
    output.zero_()
    for p in launches:
        driver.launch(p.function, p.grid, p.block, p.args, stream)
    driver.synchronize(stream)
    got = output.float()
    worst = (got - want).abs().max().item() / want
    if worst <= 1e-2:
        return
    built = mori_build_cco_sdma()
    hint = (" The LSA all-reduce moves bytes with plain loads and stores, so check that every rank "
            "constructed this op on the same communicator and window size."
            if transport == "split-lsa" else
            " mori was built with BUILD_CCO_SDMA=OFF, so the SDMA puts are compiled out and do "
            "nothing; rebuild mori with BUILD_CCO_SDMA=ON."
            if built is False else
            " Check that mori was built with BUILD_CCO_SDMA=ON and that MORI_ENABLE_SDMA=1 is set: "
            "without either, every put silently does nothing.")
    raise SelfTestError(
        f"gemm_ar self-test failed: the all-reduce returned {got.flatten()[0].item():g} where "
        f"{want:g} was expected (worst relative error {worst:.3g} at M={m}, world_size={world}, "
        f"rank {rank}).{hint}")


def constant_problem(op: Any, m: int) -> None:
    """One ordinary call of ``op`` at ``m`` on a constant problem: every rank multiplies
    ``A = rank + 1`` by ``B = 1`` with unit scales (constant operands look the same in every
    layout: no preshuffling needed), so every output element must read ``K * sum(1..world)``.
    Covers what :func:`all_reduce_moves_bytes` does not: the GEMM's operand and scale addressing,
    its epilogue's puts and the counters that start the tail. Raises SelfTestError."""
    import torch

    n, k, dev = op.n, op.k, op.device
    fp8 = torch.float8_e4m3fn
    a = torch.full((m, k), float(op.rank + 1), device=dev).to(fp8)
    b = torch.ones((n, k), device=dev).to(fp8)
    if op.quant == "mxfp8":  # ue8m0 127 = 2**0, four packed per A-scale int32
        a_scale = torch.full((m * k // 128,), 0x7F7F7F7F, dtype=torch.int32, device=dev)
        b_scale = torch.full(((n // 32) * (k // 32),), 127, dtype=torch.int32, device=dev)
    else:
        a_scale = torch.ones((k // 128, m), device=dev)
        b_scale = torch.ones((n // 128, k // 128), device=dev)
    out = op(a, b, a_scale, b_scale)
    op.driver.synchronize(op.driver.current_stream(dev))
    want = float(k) * op.world_size * (op.world_size + 1) / 2
    got = out.float()
    worst = (got - want).abs().max().item() / want
    if worst > 1e-2:
        raise SelfTestError(
            f"gemm_ar GEMM self-test failed: a constant problem (A = rank + 1, B = 1, unit scales, K={k}) "
            f"returned {got.flatten()[0].item():g} where {want:g} was expected (worst relative error "
            f"{worst:.3g} at M={m}, world_size={op.world_size}, rank {op.rank}). The all-reduce "
            f"self-test checks the collective alone; this one also runs the GEMM, so a failure here "
            f"and not there points at the GEMM kernels or their artifacts: rebuild them (gemmar-aot "
            f"build) and check the toolchain (gemmar-aot doctor)")


def mori_build_cco_sdma() -> bool | None:
    """mori's BUILD_CCO_SDMA flag, read from its file without importing mori's device package."""
    try:
        import ast
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec("mori")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / "cco" / "device" / "_build_flags.py"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILD_CCO_SDMA"
                                                    for t in node.targets):
                return bool(ast.literal_eval(node.value))
    except Exception:  # noqa: BLE001 - only a hint
        return None
    return None
