"""mori's EP configuration and routing handle, as the served op reads and returns them.

A pod constructs :class:`~gemmar_aot.runtime.ep_op.EpDispatchCombineOp` with the same config
object it would hand mori's op: mori's own ``EpDispatchCombineConfig`` (duck-typed: this
module never imports ``mori.ops``) or, in a pod without mori's Python package, the mirror
here with the same field names. :func:`read_config` turns either into what the artifacts are
looked up by.

* mori's config resolves its geometry in ``__post_init__``, from the pod's sysfs (its device
  table) or from fields the caller pinned; the op serves it only when that is the geometry
  the artifacts were built with (the ``device`` of their ``[[ep]]`` entry).
* The mirror resolves nothing: fields left ``None`` take the artifacts' device table, which
  is what mori resolves on the device the manifest names.

Dtypes are matched by name (``torch.bfloat16`` or ``"bf16"``), so nothing here imports torch.

Runtime module: standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gemmar_aot.model.ep import DTYPES, EpConfig, resolved

#: mori's backend choice when the config names none (``dispatch_combine_op.py``).
BACKEND_ENV = "MORI_V2_KERNEL_BACKEND"
#: mori's kernel backends (``_BACKEND_MODULES``); the artifacts are the FlyDSL backend's kernels.
BACKENDS = ("flydsl", "hip")
#: torch's names of the token dtypes -> the manifest's.
_TORCH_NAMES = {"bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "fp8_e4m3fn",
                "float8_e4m3fnuz": "fp8_e4m3fnuz", "float4_e2m1fn_x2": "fp4"}
#: The manifest's names -> torch's attribute (fp4 exists in recent torch only).
TORCH_DTYPES = {v: k for k, v in _TORCH_NAMES.items()}


def dtype_name(dt: Any) -> str:
    """``dt`` (a torch dtype, its name, or the manifest's name) as the manifest names it."""
    text = str(dt)
    name = text if text in DTYPES else _TORCH_NAMES.get(text.removeprefix("torch."))
    if name is None:
        raise ValueError(f"data type {dt!r}: mori's EP FlyDSL backend moves "
                         f"{', '.join('torch.' + t for t in _TORCH_NAMES)}")
    return name


def torch_dtype(name: str):
    """The torch dtype of a manifest dtype name (torch imported here, when an op needs it)."""
    import torch

    got = getattr(torch, TORCH_DTYPES[name], None)
    if got is None:
        raise ValueError(f"{name}: this torch ({torch.__version__}) has no torch.{TORCH_DTYPES[name]}; "
                         f"fp4 EP needs a torch that has it")
    return got


@dataclass
class EpDispatchCombineConfig:
    """mori's ``EpDispatchCombineConfig`` fields (amd-mori 1.2.4), for pods without mori's package.

    Nothing is resolved or looked up: geometry fields left ``None`` take the device table the
    artifacts were built with. Dtype fields take torch dtypes or names (``"bf16"``)."""

    rank: int
    world_size: int
    hidden_dim: int
    max_num_inp_token_per_rank: int
    num_experts_per_rank: int
    num_experts_per_token: int
    data_type: Any = "bf16"
    dispatch_data_type: Any = None
    combine_data_type: Any = None
    scale_dim: int = 0
    scale_type_size: int = 0
    combine_mode: str = "gather"
    quant_type: str = "none"
    dispatch_block_num: int | None = None
    combine_block_num: int | None = None
    warp_num_per_block: int | None = None
    combine_warp_num_per_block: int | None = None
    schedule: tuple | None = None
    enable_std_moe: bool = False
    max_total_recv_tokens: int = 0
    gpu_per_node: int | None = None
    kernel_backend: str | None = None


@dataclass(frozen=True)
class Requested:
    """What a pod's config asks for: the configuration (``replay`` and ``device`` are the
    artifacts' to say), its rank, and the geometry it resolved (None: the artifacts' table)."""

    config: EpConfig
    rank: int
    gpu_per_node: int
    geometry: tuple[int, int, int, int] | None
    schedule: tuple | None
    #: the kernel backend it selects, as mori selects it (``cfg.kernel_backend``, else
    #: ``$MORI_V2_KERNEL_BACKEND``), and which of the two said so; None: mori's default (FlyDSL here)
    backend: str | None = None
    backend_from: str = ""

    def geometry_problem(self, built: EpConfig) -> str | None:
        """Why the artifacts' variants are not the ones this config resolved, or None."""
        if self.geometry is None:
            return None
        sched = tuple(tuple(b) for b in self.schedule) if self.schedule else None
        if self.geometry == built.geometry and sched == (built.schedule or None):
            return None
        return (f"the config resolved geometry {list(self.geometry)} and schedule "
                f"{[list(b) for b in sched] if sched else None} (its pinned fields, or the table of the device "
                f"this pod's sysfs reports), the artifacts hold {built.device}'s table: geometry "
                f"{list(built.geometry)}, schedule {[list(b) for b in built.schedule]}")


def selected_backend(cfg: Any) -> tuple[str | None, str]:
    """The kernel backend a config selects, as mori selects it (``cfg.kernel_backend``, else
    ``$MORI_V2_KERNEL_BACKEND``), and which of the two said so; (None, ""): mori's default."""
    backend = getattr(cfg, "kernel_backend", None)
    if backend:
        return backend, "the config's kernel_backend"
    backend = os.environ.get(BACKEND_ENV) or None
    return backend, f"${BACKEND_ENV}" if backend else ""


def read_config(cfg: Any) -> Requested:
    """mori's config (or the mirror) as the artifacts are looked up by. Raises ValueError on a
    dtype mori's FlyDSL backend does not move."""
    world = int(cfg.world_size)
    base = getattr(cfg, "data_type", None) or "bf16"
    disp = dtype_name(getattr(cfg, "dispatch_data_type", None) or base)
    comb = dtype_name(getattr(cfg, "combine_data_type", None) or disp)
    c = resolved(EpConfig(
        world=world, hidden=int(cfg.hidden_dim), max_tokens=int(cfg.max_num_inp_token_per_rank),
        experts=int(cfg.num_experts_per_rank) * world, topk=int(cfg.num_experts_per_token), dispatch_dtype=disp,
        combine_dtype=comb, quant_type=str(getattr(cfg, "quant_type", "none")),
        combine_mode=str(getattr(cfg, "combine_mode", "gather")), scale_dim=int(getattr(cfg, "scale_dim", 0)),
        scale_type_size=int(getattr(cfg, "scale_type_size", 0)),
        max_total_recv_tokens=int(getattr(cfg, "max_total_recv_tokens", 0) or 0),
        std_moe=bool(getattr(cfg, "enable_std_moe", False))))
    geo = tuple(getattr(cfg, f, None) for f in ("dispatch_block_num", "warp_num_per_block", "combine_block_num",
                                                "combine_warp_num_per_block"))
    schedule = getattr(cfg, "schedule", None)
    pinned = schedule is not None or any(g is not None for g in geo)
    if pinned and any(g is None for g in geo):  # mori's single-shot defaults for the fields left unset
        geo = tuple(d if g is None else g for g, d in zip(geo, (64, 16, 80, 4)))
    gpn = getattr(cfg, "gpu_per_node", None)
    backend, backend_from = selected_backend(cfg)
    return Requested(config=c, rank=int(cfg.rank), gpu_per_node=world if gpn is None else int(gpn),
                     geometry=tuple(int(g) for g in geo) if pinned else None, schedule=schedule,
                     backend=backend, backend_from=backend_from if backend else "")


class EpDispatchRoutingHandle:
    """One dispatch's routing, as mori's ``EpDispatchRoutingHandle`` (same fields, ``tensors()``,
    ``from_tensors``): the forward map, mori's two empty inter-node placeholders, the received
    count, and the reverse map, cloned off the window on first access (after the caller's
    post-dispatch barrier, as mori's is). By default it aliases the op's routing buffers."""

    def __init__(self, disp_dest_tok_id_map, inter_node_disp_dest_tok_id_map, inter_node_disp_send_map,
                 total_recv_token_num, disp_tok_id_to_src_tok_id_local=None, cur_rank_num_token=0, *,
                 reverse_src_view=None):
        self.disp_dest_tok_id_map = disp_dest_tok_id_map
        self.inter_node_disp_dest_tok_id_map = inter_node_disp_dest_tok_id_map
        self.inter_node_disp_send_map = inter_node_disp_send_map
        self.total_recv_token_num = total_recv_token_num
        self.cur_rank_num_token = cur_rank_num_token
        self._reverse_cache = disp_tok_id_to_src_tok_id_local
        self._reverse_src_view = reverse_src_view

    @property
    def disp_tok_id_to_src_tok_id_local(self):
        if self._reverse_cache is None:
            self._reverse_cache = self._reverse_src_view.clone()
        return self._reverse_cache

    def tensors(self):
        return (self.disp_dest_tok_id_map, self.inter_node_disp_dest_tok_id_map, self.inter_node_disp_send_map,
                self.total_recv_token_num, self.disp_tok_id_to_src_tok_id_local)

    @classmethod
    def from_tensors(cls, tensors, cur_rank_num_token=0):
        return cls(*tensors, cur_rank_num_token=cur_rank_num_token)
