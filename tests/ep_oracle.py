"""The oracle for EP code objects: mori's own ``EpDispatchCombineOpFlyDSL``, constructed on this
CPU-only host, and every kernel it makes compiled through FlyDSL's own path.

Run as ``python tests/ep_oracle.py '{"configs": [...], "compile": true}'`` (a process of its own:
mori reads its wave size at import). Each config names mori's config fields (``rank``,
``world_size``, ``hidden_dim``, ``max_num_inp_token_per_rank``, ``num_experts_per_rank``,
``num_experts_per_token``, ``data_type``, optional ``combine_data_type``, ``quant_type``,
``combine_mode``, ``scale_dim``, ``scale_type_size``, ``max_total_recv_tokens``,
``enable_std_moe``) and ``replay``. Prints a JSON list, one object per config: mori's refusal, or
its resolved geometry and schedule, variants, arena offsets, and per kernel the factory and the
keyword arguments mori passed (with ``compile``, also the sha256 and size of the code object).

Nothing here reads what gemmar-aot built or recorded. What is changed, and why (test doubles
only; mori's code runs as it is):

1. ``mori.ops.utils.topology`` answers MI355X's KFD identity (256 CU, gfx950, DID 0x75A3):
   the tuning table is chosen by the device, and this host has none.
2. ``flydsl_backend``'s torch allocates on the CPU (``torch.device("cuda")`` -> cpu): CPU torch
   has no CUDA device; mori's tensor values are not what is compared.
3. The communicator is ``tests/fakes.FakeCommunicator`` (the cco double), and ``symm_arena``'s
   ``from_gpu_ptr`` is its ``tensor_at``: the window is host memory.
4. The replay dispatch variants mori makes lazily on a replay call are made the way that call
   makes them (``make_dispatch(replay=True, block_num, warp_num_per_block, **_dispatch_kwargs)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MI355X_TOPOLOGY = (256, 90500, 0x75A3)
FACTORIES = ("make_dispatch", "make_combine", "make_combine_scatter", "make_local_expert_count",
             "make_convert_dispatch_output", "make_convert_combine_input")
NARGS = {"make_dispatch": 11, "make_combine": 9, "make_combine_scatter": 9, "make_local_expert_count": 3,
         "make_convert_dispatch_output": 8, "make_convert_combine_input": 5}


def _setup():
    """Import mori's EP backend as a compile worker would, with the shims above; returns the
    modules and helpers :func:`construct` uses."""
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain

    tc = load_toolchain()
    os.environ.update(compile_env(tc))
    os.environ.update({"MORI_WAVE_SIZE": "64", "MORI_GPU_ARCHS": "gfx950"})
    import_mori_device(tc)
    import torch

    import mori.ops.utils as gpu_utils

    gpu_utils.topology = lambda: MI355X_TOPOLOGY  # shim 1
    from mori.ops.dispatch_combine_v2 import flydsl_backend as fb
    from mori.ops.dispatch_combine_v2 import symm_arena

    cpu_torch = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    cpu_torch.device = lambda *args, **kw: torch.device("cpu")  # shim 2
    cpu_torch.cuda = types.SimpleNamespace(current_device=lambda: 0)
    fb.torch = cpu_torch
    made: list[tuple[str, dict, object]] = []

    def recording(name):
        real = getattr(fb, name)

        def factory(**kw):
            fn = real(**kw)
            made.append((name, kw, fn))
            return fn
        return factory

    for name in FACTORIES:
        if hasattr(fb, name):
            setattr(fb, name, recording(name))
    return torch, fb, symm_arena, made


def construct(mods, a: dict) -> dict:
    """mori's op for config ``a`` (see the module docstring): what it resolved and every factory
    call it made, or {"refused": mori's message}."""
    from mori.ops.dispatch_combine_v2.dispatch_combine_op import EpDispatchCombineConfig

    from fakes import FakeCommunicator

    torch, fb, symm_arena, made = mods
    made.clear()
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8_e4m3fn": torch.float8_e4m3fn,
          "fp8_e4m3fnuz": torch.float8_e4m3fnuz, "fp4": getattr(torch, "float4_e2m1fn_x2", None)}
    fields = {k: v for k, v in a.items() if k not in ("replay", "data_type", "combine_data_type")}
    if a.get("combine_data_type") and a["combine_data_type"] != a["data_type"]:
        fields.update(dispatch_data_type=dt[a["data_type"]], combine_data_type=dt[a["combine_data_type"]])
    try:
        cfg = EpDispatchCombineConfig(data_type=dt[a["data_type"]], kernel_backend="flydsl", **fields)
        comm = FakeCommunicator(rank=a["rank"], nranks=a["world_size"], lazy=True)
        symm_arena.from_gpu_ptr = comm.tensor_at  # shim 3
        op = fb.EpDispatchCombineOpFlyDSL(cfg, comm)
    except (ValueError, AssertionError) as e:
        return {"refused": str(e)}
    if a.get("replay"):
        for b, w in op._dispatch_specs:  # shim 4: what a replay call makes
            fb.make_dispatch(replay=True, block_num=b, warp_num_per_block=w, **op._dispatch_kwargs)
    out = {"geometry": [cfg.dispatch_block_num, cfg.warp_num_per_block, cfg.combine_block_num,
                        cfg.combine_warp_num_per_block],
           "schedule": [list(b) for b in cfg.schedule] if cfg.schedule else None,
           "dispatch_specs": [list(s) for s in op._dispatch_specs],
           "combine_specs": [list(s) for s in op._combine_specs],
           "offsets": dict(op.arena._offsets), "total": op.arena.total_bytes,
           "recv_cap": cfg.effective_max_recv, "combine_mode": cfg.combine_mode,
           "kernels": [{"factory": n, "kwargs": kw, "fn": fn} for n, kw, fn in made]}
    op.arena.close()
    return out


def compile_all(built: dict) -> None:
    """Compile every kernel of a :func:`construct` result through FlyDSL's own path; each gets
    the sha256 and size of its code object and the CPU seconds its compile took (and loses its
    function)."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    from gemmar_aot.compiler.worker import _code_object_bytes

    import time

    for k in built["kernels"]:
        fn = k.pop("fn")
        t0 = time.process_time()
        flyc.compile(fn, *([0] * NARGS[k["factory"]]), stream=fx.Stream(None))
        code = _code_object_bytes(fn._last_compiled[1]._ir_text)
        k.update(sha256=hashlib.sha256(code).hexdigest(), size=len(code), compile_cpu_s=time.process_time() - t0)


def main(args: dict) -> list[dict]:
    """``{"configs": [...], "compile": bool}`` -> one :func:`construct` result per config."""
    mods = _setup()
    out = []
    for a in args["configs"]:
        built = construct(mods, a)
        if "kernels" in built:
            if args.get("compile"):
                compile_all(built)
            else:
                for k in built["kernels"]:
                    k.pop("fn")
        out.append(built)
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
