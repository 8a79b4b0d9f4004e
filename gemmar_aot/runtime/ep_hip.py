"""mori's EP dispatch/combine v2 with the HIP backend, served: mori's own op, its JIT v2 kernels prebuilt.

The HIP backend launches through mori's own libraries (``libmori_jit.so`` and ``libmori_ops_v2.so``:
mori's plans launch their kernels themselves), so the op a pod gets is mori's
``EpDispatchCombineOpHip``, constructed after :class:`~.jitv2_server.JitV2Server` has seeded mori's JIT
cache with the verified code objects of this pod's arch and NIC and pointed mori's hipcc at ours (which
compiles nothing). A plan the artifacts lack raises :class:`~.artifact_errors.ArtifactMissingError`
with the ``[[ep]]`` entry that builds it (:func:`manifest_lines`).

Runtime module: standard library only until the op is made (then mori's, as mori's own op would).
"""

from __future__ import annotations

from typing import Any

from . import jitv2_server

#: mori's device models (``mori.ops.utils.detect_model``) -> the manifest's device names.
_DEVICE_NAMES = {"mi355x": "MI355X", "mi350x": "MI350X", "mi300x": "MI300X", "mi325x": "MI325X", "mi308x": "MI308X"}


def hip_op(cfg: Any, comm: Any, *, artifacts: Any = None, driver: Any = None, trusted_keys: Any = None,
           miss_report: Any = None):
    """mori's HIP-backend op for ``cfg`` on ``comm``, every kernel from the artifacts (see the module).

    The first HIP-backend op of a process decides the artifacts its JIT v2 is served from (mori's JIT
    resolves its compiler and cache once per process)."""
    if jitv2_server._SERVER is None:
        jitv2_server.configure(artifacts, driver=driver, trusted_keys=trusted_keys, miss_report=miss_report)
    srv = jitv2_server.server()
    srv.install()
    from mori.ops.dispatch_combine_v2.hip_backend import EpDispatchCombineOpHip

    try:
        return EpDispatchCombineOpHip(cfg, comm)
    except RuntimeError as exc:
        if jitv2_server.is_miss(exc):
            raise jitv2_server.missing(srv, exc, describe(cfg), manifest_lines(cfg)) from None
        raise


def describe(cfg: Any) -> str:
    world, gpn = int(cfg.world_size), getattr(cfg, "gpu_per_node", None) or int(cfg.world_size)
    where = f"{world // gpn} nodes x {gpn}" if gpn < world else f"world {world}"
    return (f"EP v2 (HIP backend) {where}, hidden {cfg.hidden_dim}, max_tokens {cfg.max_num_inp_token_per_rank}, "
            f"{int(cfg.num_experts_per_rank) * world} experts, topk {cfg.num_experts_per_token}")


def _dtype(v: Any) -> str | None:
    from .ep_config import dtype_name

    return None if v is None else dtype_name(v)


def manifest_lines(cfg: Any) -> str:
    """The HIP-backend ``[[ep]]`` entry that builds ``cfg``'s kernels, for this pod's device."""
    world = int(cfg.world_size)
    disp = _dtype(getattr(cfg, "dispatch_data_type", None)) or _dtype(getattr(cfg, "data_type", None)) or "bf16"
    comb = _dtype(getattr(cfg, "combine_data_type", None)) or disp
    lines = ["[[ep]]", 'kernel_backend = "hip"', f"world = {world}"]
    gpn = getattr(cfg, "gpu_per_node", None)
    if gpn is not None and int(gpn) != world:
        lines.append(f"gpu_per_node = {int(gpn)}")
    lines += [f"hidden = {int(cfg.hidden_dim)}", f"max_tokens = {int(cfg.max_num_inp_token_per_rank)}",
              f"experts = {int(cfg.num_experts_per_rank) * world}", f"topk = {int(cfg.num_experts_per_token)}",
              f'dispatch_dtype = "{disp}"']
    if comb != disp:
        lines.append(f'combine_dtype = "{comb}"')
    for field, default in (("scale_dim", 0), ("scale_type_size", 0), ("max_total_recv_tokens", 0),
                           ("quant_type", "none"), ("internode_kernel", "auto"), ("num_qp_per_pe", 2)):
        v = getattr(cfg, field, default)
        if v is not None and v != default:
            lines.append(f"{field} = {v!r}".replace("'", '"'))
    lines.append(f'device = "{_device_name()}"')
    v = jitv2_server.server().variant()
    lines.append(f'nics = ["{v.nic}"]')
    return "\n".join(lines) + "\n"


def _device_name() -> str:
    """This pod's GPU as a manifest names it (mori's own detection), MI355X when mori cannot tell."""
    try:
        from mori.ops.utils import detect_model

        return _DEVICE_NAMES.get(str(detect_model()).lower(), "MI355X")
    except Exception:  # noqa: BLE001 - a name for a suggestion, never a reason to fail
        return "MI355X"
