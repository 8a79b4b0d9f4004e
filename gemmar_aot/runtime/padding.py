"""``on_miss="pad"``: a call at an M without kernels, served at the smallest built M above it.

Why the result is mori's for M: a GEMM row depends only on its own A row and A-scale row,
and the all-reduce and the gather are elementwise over rows (the fp8 gather's scales take an
absolute maximum, which zero rows never raise). So rows M..bucket-1 of A and of the A scale
are zeroed, rows below M copied from the caller's (whose shapes the op checks at the caller's
M, as mori checks them), and the first M rows of the bucket's output are what mori's op
computes for M.

Both A scales are K-block major, each block's M rows together: blockscale's one fp32 per row
at ``kb * M + row``; mxfp8's one ue8m0 byte per row at ``kb * M + p(row)``
(``preshuffle_a_scale``), where ``p`` permutes rows within each 64-row group -- and M is a
multiple of world * 256, so rows below M stay below M. Either way the bucket's scale is the
caller's blocks, each followed by zeros (a zero A row's product is zero, whatever its scale).
"""

from __future__ import annotations

from typing import Any


class PadBuffers:
    """The zero-extended A and A scale of a padded call, sized for the largest bucket once, at
    construction: a padded call allocates nothing."""

    __slots__ = ("k", "a", "scale", "scale_bytes")

    def __init__(self, top: int, k: int, quant: str, device: Any):
        import torch

        self.k = k
        self.a = torch.zeros((top, k), dtype=torch.float8_e4m3fn, device=device)
        # M*K/128 elements either way: blockscale's fp32 per 128-wide K block, mxfp8's int32 of four ue8m0 bytes
        dtype = torch.int32 if quant == "mxfp8" else torch.float32
        self.scale = torch.zeros(top * k // 128, dtype=dtype, device=device)
        # mxfp8's scale is laid out by byte (one ue8m0 per row and 32-wide K block): its byte view, once
        self.scale_bytes = self.scale.view(torch.uint8) if quant == "mxfp8" else None

    def fill(self, m: int, bucket: int, a: Any, a_scale: Any) -> tuple[Any, Any]:
        """The bucket's A and A scale (views of these buffers): the caller's ``m`` rows of each
        (already checked at ``m``), then zeros."""
        pa = self.a[:bucket]
        pa[:m].copy_(a)
        pa[m:].zero_()
        flat = self.scale[:bucket * self.k // 128]
        if self.scale_bytes is not None:  # mxfp8
            blocks = self.k // 32  # one byte per row and 32-wide K block
            ps = self.scale_bytes[:blocks * bucket].view(blocks, bucket)
            src = a_scale.view(self.scale_bytes.dtype).view(blocks, m)
        else:
            blocks = self.k // 128
            ps, src = flat.view(blocks, bucket), a_scale.view(blocks, m)
        ps[:, :m].copy_(src)
        ps[:, m:].zero_()
        return pa, flat
