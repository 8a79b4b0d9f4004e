"""Operand checks: reject what the launch boundary would otherwise reinterpret as bytes.

The same rules as ``mori.ops.gemm_ar`` 1.2.4 (see the spec, section 1), written
here so the runtime needs no mori kernel code. Every check is metadata only --
no device work, no host sync -- and raises ``ValueError`` like mori's, so
callers catch the same thing.

The GEMM takes A and B as raw bytes and the scales as raw dwords, so a tensor of
the right size and the wrong encoding runs and returns finite nonsense. Hence:

* A and B must be ``torch.float8_e4m3fn``. ``float8_e4m3fnuz`` is also one byte,
  but its exponent bias is 8 where OCP e4m3's is 7: the kernel's MMA reads OCP,
  so every element would read at 2x and the result come out 4x too large.
* blockscale scales are fp32 (A ``M*K/128``, B ``(N/128)*(K/128)``); mxfp8 scales
  are int32 (A ``M*K/128`` -- four ue8m0 bytes per element, B ``(N/32)*(K/32)``).
* The blockscale A scale is read at ``kb*M + row``. Accepted: flat 1-D, ``(K/128,
  M)``, and ``(M, K/128)`` column-major (stride ``(1, M)``). ``(M, K/128)``
  row-major is rejected as ambiguous: it is either a logical tensor that needs
  transposing or a ``kb``-major buffer wearing the wrong shape (what
  ``aiter_per1x128_quant(transpose_scale=True)`` returns), and guessing wrong took
  a model's perplexity from 3.26 to 862511.
* The mxfp8 A scale is only accepted flat: its packed layout permutes rows inside
  each 64-row group, which no 2-D shape describes.
* Every operand must be on the op's device.
"""

from __future__ import annotations

SCALE_BLOCK_K = 128
MXFP8_BLOCK = 32

FNUZ_REASON = (
    "float8_e4m3fnuz is rejected on purpose: its exponent bias is 8 where OCP e4m3's is 7, and the "
    "kernel's MMA reads OCP e4m3, so every element would read at 2x and the product come out 4x too "
    "large -- finite, plausible and wrong. Convert to torch.float8_e4m3fn")


_TORCH = None


def _torch():
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = torch
    return _TORCH


def _dense(t):
    return t if t.is_contiguous() else t.contiguous()


def flatten_a_scale(a_scale, m: int, kb: int):
    """The blockscale A scale whose storage is in the kernel's physical order (``kb*M + row``).

    Returns a tensor whose ``data_ptr()`` is that storage: the tensor itself when it
    already is (no view is made -- creating one costs more than every check here),
    a contiguous copy when it is a strided spelling of the right order.
    """
    if a_scale.dim() == 1:
        if a_scale.numel() != m * kb:
            raise ValueError(f"a_scale has {a_scale.numel()} elements, expected M*K/128 = {m * kb}")
        return _dense(a_scale)
    if a_scale.dim() != 2:
        raise ValueError(f"a_scale must be [K/128, M], [M, K/128] column-major, or flat; got shape "
                         f"{tuple(a_scale.shape)}")
    shape = a_scale.shape
    if shape == (kb, m):
        return _dense(a_scale)
    if shape == (m, kb):
        if a_scale.stride() == (1, m):
            # Column-major [M, K/128]: its storage is already kb-major (it is .t() of a [K/128, M]).
            return a_scale
        raise ValueError(
            f"a_scale is {tuple(shape)} row-major, which is ambiguous: a logical [M, K/128] needs "
            f"transposing, while a K/128-major buffer with this shape -- what "
            f"aiter_per1x128_quant(transpose_scale=True) returns -- must be read flat. Pass "
            f"a_scale.reshape(-1) for the second or a_scale.t() for the first.")
    raise ValueError(f"a_scale shape {tuple(shape)} matches neither [M, K/128] = {(m, kb)} nor its transpose")


def flatten_mxfp8_a_scale(a_scale, m: int, k: int):
    """The mxfp8 A scale as ``preshuffle_a_scale`` emits it: flat int32 only."""
    want = m * k // (4 * MXFP8_BLOCK)
    if a_scale.dim() != 1:
        raise ValueError(
            f"a_scale must be the flat buffer preshuffle_a_scale returns; got shape "
            f"{tuple(a_scale.shape)}. The packed layout is a permutation within each 64-row group, "
            f"so no 2-D shape describes it.")
    if a_scale.numel() != want:
        raise ValueError(f"a_scale has {a_scale.numel()} elements, expected M*K/128 = {want} "
                         f"(M*K/32 ue8m0 bytes, four to an int32)")
    return _dense(a_scale)


def _scale_sizes(m: int, n: int, k: int, quant: str):
    if quant == "mxfp8":
        return m * k // (4 * MXFP8_BLOCK), (n // MXFP8_BLOCK) * (k // MXFP8_BLOCK)
    kb = k // SCALE_BLOCK_K
    return m * kb, (n // SCALE_BLOCK_K) * kb


def check_operands(a_fp8, b_preshuffled, a_scale, b_scale, *, m: int, n: int, k: int, quant: str, device):
    """Validate the four operands; return (A, B, A scale, B scale) whose ``data_ptr()`` the kernel reads.

    Non-contiguous operands are made contiguous (a copy), as mori's op does; an
    operand already in the kernel's order is returned as is. The common case is
    one straight run of cheap metadata checks; anything off goes to
    :func:`_first_problem`, which names exactly what is wrong.
    """
    torch = _TORCH or _torch()
    fp8 = torch.float8_e4m3fn
    want = torch.int32 if quant == "mxfp8" else torch.float32
    a_numel, b_numel = _scale_sizes(m, n, k, quant)
    if not (a_fp8.dtype is fp8 and b_preshuffled.dtype is fp8 and a_scale.dtype is want
            and b_scale.dtype is want and a_fp8.shape == (m, k) and b_preshuffled.shape == (n, k)
            and a_fp8.device == device and b_preshuffled.device == device and a_scale.device == device
            and b_scale.device == device and a_scale.numel() == a_numel and b_scale.numel() == b_numel):
        _first_problem(a_fp8, b_preshuffled, a_scale, b_scale, m=m, n=n, k=k, quant=quant, device=device)
    if quant == "mxfp8":
        a_flat = flatten_mxfp8_a_scale(a_scale, m, k)
    else:
        a_flat = flatten_a_scale(a_scale, m, k // SCALE_BLOCK_K)
    return _dense(a_fp8), _dense(b_preshuffled), a_flat, _dense(b_scale)


def _first_problem(a_fp8, b_preshuffled, a_scale, b_scale, *, m, n, k, quant, device) -> None:
    """Raise ValueError for the first rule the operands break, in mori's order."""
    torch = _torch()
    fp8 = torch.float8_e4m3fn
    for name, t, shape in (("a_fp8", a_fp8, (m, k)), ("b_preshuffled", b_preshuffled, (n, k))):
        if t.dim() != 2 or tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {shape}, got {tuple(t.shape)}")
        if t.dtype is not fp8:
            if t.dtype == getattr(torch, "float8_e4m3fnuz", None):
                raise ValueError(f"{name} is torch.float8_e4m3fnuz; {FNUZ_REASON}")
            raise ValueError(f"{name} must be torch.float8_e4m3fn, got {t.dtype}; the launch reinterprets "
                             f"it as raw bytes, so a wider dtype runs and returns nonsense rather than failing")
        if t.device != device:
            raise ValueError(f"{name} must be on the op's device {device}, got {t.device}")
    want_dtype = torch.int32 if quant == "mxfp8" else torch.float32
    a_numel, b_numel = _scale_sizes(m, n, k, quant)
    for name, t, numel in (("a_scale", a_scale, a_numel), ("b_scale", b_scale, b_numel)):
        if t.dtype != want_dtype:
            raise ValueError(f"{name} must be {want_dtype} for quant={quant!r}, got {t.dtype}")
        if t.numel() != numel:
            raise ValueError(f"{name} must have {numel} elements, got {t.numel()}")
        if t.device != device:
            raise ValueError(f"{name} must be on the op's device {device}, got {t.device}")
    raise AssertionError("check_operands' fast path and _first_problem disagree")  # pragma: no cover
