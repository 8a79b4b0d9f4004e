"""The ops as ``torch.library`` custom ops: callable inside ``torch.compile(fullgraph=True)``.

An op instance (its window, its loaded kernels) cannot be a graph input, so it is registered
under an integer handle and the custom op takes the handle::

    from gemmar_aot.runtime.torch_op import as_torch_op
    f = as_torch_op(op)                     # f(a_fp8, b_preshuffled, a_scale, b_scale) -> [M, N] bf16
    compiled = torch.compile(lambda *t: f(*t), fullgraph=True)

Two custom ops under the namespace ``gemmar_aot``:

* ``gemm_all_reduce_out(handle, a, b, a_scale, b_scale, out)`` writes the result into ``out``
  (mutates it; allocates nothing): what a serving loop or a CUDA graph uses;
* ``gemm_all_reduce(handle, a, b, a_scale, b_scale) -> Tensor`` returns a new tensor (a copy
  of the window's output, which the next call overwrites; torch may not alias it).

Their fake (meta) implementations give the output's shape ``[M, N]`` and dtype bf16 from the
handle's op, so tracing never touches the GPU. The handle is dropped when the op is closed.

Runtime module: imports torch (the caller has it).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

_OPS: dict[int, Any] = {}
_NEXT = itertools.count(1)
_LOCK = threading.Lock()


def register(op: Any) -> int:
    """The handle the custom ops know ``op`` by (registered once; dropped at ``op.close()``)."""
    h = getattr(op, "_torch_handle", None)
    if h is not None and _OPS.get(h) is op:
        return h
    with _LOCK:
        h = next(_NEXT)
        _OPS[h] = op
    op._torch_handle = h
    return h


def unregister(op: Any) -> None:
    h = getattr(op, "_torch_handle", None)
    if h is not None:
        with _LOCK:
            if _OPS.get(h) is op:
                del _OPS[h]


def _op(handle: int) -> Any:
    try:
        return _OPS[handle]
    except KeyError:
        raise RuntimeError(f"no gemmar-aot op under handle {handle}: it was closed, or registered in another "
                           f"process (call as_torch_op(op) again)") from None


@torch.library.custom_op("gemmar_aot::gemm_all_reduce_out", mutates_args=("out",))
def gemm_all_reduce_out(handle: int, a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                        b_scale: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(_op(handle)(a, b, a_scale, b_scale))


@gemm_all_reduce_out.register_fake
def _(handle, a, b, a_scale, b_scale, out):
    return None


@torch.library.custom_op("gemmar_aot::gemm_all_reduce", mutates_args=())
def gemm_all_reduce(handle: int, a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                    b_scale: torch.Tensor) -> torch.Tensor:
    return _op(handle)(a, b, a_scale, b_scale).clone()


@gemm_all_reduce.register_fake
def _(handle, a, b, a_scale, b_scale):
    return a.new_empty((a.shape[0], _op(handle).n), dtype=torch.bfloat16)


def as_torch_op(op: Any):
    """``f(a, b, a_scale, b_scale, out=None)``: the op through the custom ops (``out`` given: the
    mutating one), traceable by ``torch.compile(fullgraph=True)``."""
    h = register(op)

    def f(a, b, a_scale, b_scale, out=None):
        if out is None:
            return torch.ops.gemmar_aot.gemm_all_reduce(h, a, b, a_scale, b_scale)
        torch.ops.gemmar_aot.gemm_all_reduce_out(h, a, b, a_scale, b_scale, out)
        return out

    return f
