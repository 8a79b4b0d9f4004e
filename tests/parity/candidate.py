"""The candidate: our runtime, with the REAL ctypes HipDriver loading the HIP double, on a scenario.

Runs in the test process (the double is loaded there once, RTLD_GLOBAL, and its
launch log is read back through tests/hipstub). Same communicator double class,
same operand construction and same address-map naming as the oracle
(tests/parity/scenario.py), so the two results compare field by field.
"""

from __future__ import annotations

import time
from typing import Any

from .compare import launch_json
from .scenario import Operands, Scenario, address_map


def runtime_class(transport: str):
    """Our runtime class serving ``transport``, or None while the runtime has none.

    The hook for every further class: a transport maps to the class by name, so a
    class that appears in ``gemmar_aot.runtime`` joins the parity tier without
    touching it (the scenario table names the transports to cover).
    """
    import gemmar_aot.runtime as rt

    return getattr(rt, RUNTIME_CLASSES.get(transport, ""), None)


#: transport -> the runtime class serving it. mori's GemmAllReduceOp is fused-sdma only;
#: gemm-only and gemv are its Mxfp8GemmOp and Mxfp8GemvOp; split-sdma, split-lsa and
#: fused-lsa are ours (``GemmAllReduceOp(transport=...)``) against mori's builders in its
#: benchmark's order (tests/parity/oracle.py BENCHMARK).
RUNTIME_CLASSES = {"fused-sdma": "GemmAllReduceOp", "gemm-only": "Mxfp8GemmOp", "gemv": "Mxfp8GemvOp",
                   "split-sdma": "GemmAllReduceOp", "split-lsa": "GemmAllReduceOp", "fused-lsa": "GemmAllReduceOp"}


def run(sc: Scenario, *, artifacts: Any, stub, stub_path: str, stream, construct_self_test: bool = False) -> dict:
    """Construct our op on a fresh communicator double, run the steps, return the double's record.

    ``construct_self_test``: run the first ``("self_test", None)`` step through the
    constructor (``self_test=True``) instead of explicitly. On the double the
    self-test's numerical check fails (nothing executes), so the constructor
    raises after launching; the record up to there is returned with the error.
    """
    from fakes import FakeCommunicator

    from gemmar_aot.runtime import SelfTestError
    from gemmar_aot.runtime.hip import HipDriver

    cls = runtime_class(sc.transport)
    if cls is None:
        raise LookupError(f"the runtime has no class for transport {sc.transport!r} yet")
    driver = HipDriver(stub_path)
    stub.clear()
    t0 = time.perf_counter()
    if sc.transport in STANDALONE:
        return _run_standalone(sc, cls, artifacts, driver, stub, stream, t0)
    comm = FakeCommunicator(rank=sc.rank, nranks=sc.world)
    kwargs = {**sc.op_kwargs(), **({"transport": sc.transport} if sc.transport != "fused-sdma" else {})}
    steps = list(sc.steps)
    verdicts: list[str] = []
    ops = Operands()
    if construct_self_test:
        assert steps and steps[0] == ("self_test", None), "construct_self_test needs a leading self_test step"
        try:
            cls(comm, **kwargs, artifacts=artifacts, driver=driver, self_test=True)
        except SelfTestError as exc:
            return {"scenario": sc.to_json(), "launches": _launches(stub), "constructor_error": str(exc),
                    "comm": comm}
        raise AssertionError("the self-test passed on a double that executes nothing")
    op = cls(comm, **kwargs, artifacts=artifacts, driver=driver, self_test=False)
    try:
        for kind, m in steps:
            if kind == "self_test":
                try:
                    op.self_test(m)
                    verdicts.append("passed")
                except SelfTestError as exc:
                    verdicts.append(f"failed: {exc}")
            else:
                op(*ops.get(sc, m))
        amap = address_map(window=(op.mem.ptr, op.window_bytes), dev_comm=int(op.dev_comm.ptr),
                           win=int(op.win.handle), stream=stream.cuda_stream, operands=ops)
        return {"scenario": sc.to_json(), "launches": _launches(stub), "address_map": amap, "self_test": verdicts,
                "seconds": round(time.perf_counter() - t0, 3), "op": op, "comm": comm}
    except BaseException:
        op.close()
        raise


#: Ops without a communicator or window: the output is the caller's tensor.
STANDALONE = ("gemm-only", "gemv")


def _run_standalone(sc: Scenario, cls, artifacts, driver, stub, stream, t0) -> dict:
    op = cls(n=sc.n, k=sc.k, artifacts=artifacts, driver=driver, device="cpu")
    ops = Operands()
    try:
        for _kind, m in sc.steps:
            *operands, out = ops.get(sc, m)
            op(*operands, out=out)
    except BaseException:
        op.close()
        raise
    amap = address_map(window=(0, 0), dev_comm=0, win=0, stream=stream.cuda_stream, operands=ops)
    return {"scenario": sc.to_json(), "launches": _launches(stub), "address_map": amap, "self_test": [],
            "seconds": round(time.perf_counter() - t0, 3), "op": op}


def _launches(stub) -> list[dict]:
    return [launch_json(r) for r in stub.launches()]


def run_ep(sc, *, artifacts: Any, stub, stub_path: str, stream) -> dict:
    """Our EpDispatchCombineOp on a fresh communicator double, through the real ctypes HipDriver,
    the scenario's calls (tests/parity/ep_scenario.py), the double's record."""
    import torch
    from fakes import FakeCommunicator

    from gemmar_aot.runtime import EpDispatchCombineConfig, EpDispatchCombineOp
    from gemmar_aot.runtime.hip import HipDriver

    from .ep_scenario import EpOperands, address_map, run_steps

    driver = HipDriver(stub_path)
    stub.clear()
    t0 = time.perf_counter()
    comm = FakeCommunicator(rank=sc.rank, nranks=sc.world)
    cfg = EpDispatchCombineConfig(**{k: v for k, v in sc.mori_config(torch).items() if k != "kernel_backend"})
    op = EpDispatchCombineOp(cfg, comm, artifacts=artifacts, driver=driver)
    try:
        ops = EpOperands(sc)
        said = run_steps(op, sc, ops)
        amap = address_map(op, window=(op.mem.ptr, op.window_bytes), win=int(op.win.handle),
                           stream=stream.cuda_stream, operands=ops)
    except BaseException:
        op.close()
        raise
    return {"scenario": sc.to_json(), "launches": _launches(stub), "address_map": amap, "said": said,
            "seconds": round(time.perf_counter() - t0, 3), "op": op, "comm": comm}
