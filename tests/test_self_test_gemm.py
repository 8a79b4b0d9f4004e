"""The optional construction-time GEMM self-test, on the real HipDriver and the HIP test double.

The double executes nothing, so the check's verdict is tested with a driver that,
when synchronised, writes a chosen value into the op's output (what a GPU would
have computed); its launches are the ordinary call's, at the smallest M built.
"""

from __future__ import annotations

import pytest

from fakes import FakeCommunicator
from gemmar_aot.runtime import GemmAllReduceOp, SelfTestError
from gemmar_aot.runtime.hip import HipDriver
from parity import shims

N, K, WORLD = 1024, 256, 2


@pytest.fixture()
def stream(hip_stub, monkeypatch):
    return shims.install_stream_shim(hip_stub, monkeypatch)


class ComputingDriver(HipDriver):
    """The real driver; ``synchronize`` also writes ``value`` over the op's output, as if the GPU had run."""

    op = None
    value = 0.0

    def synchronize(self, stream):
        super().synchronize(stream)
        if self.op is not None:
            for plan in self.op._plans.values():
                plan.output.fill_(self.value)


def _op(smoke_store, hipstub_lib, rank=0, **kw):
    comm = FakeCommunicator(rank=rank, nranks=WORLD)
    return GemmAllReduceOp(comm, n=N, k=K, m_max=512, artifacts=smoke_store, self_test=False, **kw), comm


def test_gemm_self_test_launches_one_call_at_the_smallest_m(smoke_store, hipstub_lib, hip_stub, stream):
    op, _comm = _op(smoke_store, hipstub_lib, driver=HipDriver(str(hipstub_lib)))
    try:
        hip_stub.clear()
        syncs = hip_stub.counter("stream_synchronize")
        with pytest.raises(SelfTestError, match=r"GEMM self-test failed: .* returned 0 where 768 was expected .*"
                                                r"M=256, world_size=2, rank 0"):
            op.self_test_gemm()
        launches = hip_stub.launches()
        assert [x.kernel.startswith("mori_fused") for x in launches] == [True, False, False, False]
        gemm = launches[0]
        assert gemm.grid == (8, 1, 1) and gemm.block == (512, 1, 1) and gemm.stream == stream.cuda_stream
        # c_m and c_n (explicit arguments 10 and 11, where the note puts them) are the smallest M and N
        (cm_off, cm_size, _), (cn_off, cn_size, _) = gemm.args[10:12]
        assert int.from_bytes(gemm.kernarg[cm_off:cm_off + cm_size], "little") == 256
        assert int.from_bytes(gemm.kernarg[cn_off:cn_off + cn_size], "little") == N
        assert hip_stub.counter("stream_synchronize") == syncs + 1
    finally:
        op.close()


@pytest.mark.parametrize("rank", [0, 1])
def test_gemm_self_test_verdict(smoke_store, hipstub_lib, stream, rank):
    drv = ComputingDriver(str(hipstub_lib))
    op, _comm = _op(smoke_store, hipstub_lib, rank=rank, driver=drv)
    try:
        drv.op = op
        drv.value = K * WORLD * (WORLD + 1) / 2  # what every rank must read: K * (1 + 2)
        op.self_test_gemm()
        op.self_test_gemm(512)
        drv.value = K * 2.0  # as if one rank's contribution were missing
        with pytest.raises(SelfTestError, match="returned 512 where 768 was expected"):
            op.self_test_gemm()
    finally:
        op.close()


def test_constructor_runs_it_when_asked_and_rolls_back(smoke_store, hipstub_lib, hip_stub, stream):
    modules = hip_stub.loaded_modules()
    comm = FakeCommunicator(rank=0, nranks=WORLD)
    with pytest.raises(SelfTestError, match="GEMM self-test"):
        GemmAllReduceOp(comm, n=N, k=K, m_max=512, artifacts=smoke_store, self_test=False, self_test_gemm=True,
                        driver=HipDriver(str(hipstub_lib)))
    assert dict(comm.live_counts) == {"dev_comm": 1} and hip_stub.loaded_modules() == modules
