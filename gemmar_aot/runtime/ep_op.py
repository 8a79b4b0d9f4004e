"""``EpDispatchCombineOp``: mori's EP dispatch/combine v2 (FlyDSL, intranode), served from precompiled kernels.

    from gemmar_aot.runtime import EpDispatchCombineOp

    op = EpDispatchCombineOp(cfg, comm)         # cfg: mori's EpDispatchCombineConfig (or ours)
    out, w, scales, idx, total_recv, handle = op.dispatch(x, weights, None, indices, return_routing=True)
    y, _ = op.combine(expert_out, routing=handle)

A drop-in for ``mori.ops.dispatch_combine_v2.EpDispatchCombineOp`` on its FlyDSL backend
(amd-mori 1.2.4): the same constructor over a cco Communicator, the same ``dispatch`` /
``combine`` signatures, return values and views, routing handle, ``local_expert_count``,
StdMoE converts and ``reset()``; the window carved and the per-rank tensors made exactly as
mori's backend makes them (``flydsl_backend.py``), and each call's variant chosen by mori's
``_pick`` (:func:`gemmar_aot.model.ep.pick`). What differs, on purpose:

* **Nothing compiles.** Every kernel of the rank -- each (block, warp) variant of the
  schedule, the replay variants mori makes lazily on a first replay call, the local expert
  count, the converts -- is loaded, verified and resolved at construction. A config the
  artifacts do not hold raises :class:`~.artifact_errors.ArtifactMissingError` with the ``[[ep]]``
  block that builds it (and is reported to the miss report for ``gemmar-aot suggest``).
* **The variants never depend on the pod's sysfs.** They are the manifest's device table;
  mori's config, which resolves its geometry from the pod's device, must agree with them or
  the op refuses (naming both).
* **The window is zeroed, then every rank waits for every other** (``comm.barrier()``) before
  the op is ready: a peer's first dispatch writes into this rank's window.
* **No per-call allocation or sync** in ``dispatch``/``combine`` (``snapshot=True`` aside, which
  allocates as mori's does): the views are made once; a call packs its pointers and queues one
  launch.

``snapshot=`` (mori 1.2.5's dispatch keyword) is served on artifacts of either mori: the handle
gets its own dest map and receive count. mori 1.2.4's combine writes 0 at the receive count it is
passed (its ``reset_total_recv``; 1.2.5's does not), so on 1.2.4 artifacts a snapshot handle's
combine is passed a copy of the handle's count (one 4-byte device copy on the stream), and the
handle keeps saying what its dispatch received. Contract (mori's): every rank constructs the op
and calls it in the same order.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gemmar_aot.model.ep import (XDB_FLAG_SLOTS, EpConfig, combine_zeroes_total_recv, config_problems, kernel_roles,
                                 manifest_entry, pick_from, pick_table, served_key, variants)

from . import misses
from .artifacts import Artifacts, EpRankEntry, load_artifacts
from .driver import Driver
from .ep_config import BACKENDS, EpDispatchRoutingHandle, Requested, read_config, torch_dtype
from .artifact_errors import ArtifactMismatchError, ArtifactMissingError
from .gc_pause import gc_paused
from .launches import Launch, prepare_launch
from .loading import Kernels, LoadedOp
from .memory import communicator_device, tensor_at
from .kernel_checks import EpPosition

log = logging.getLogger("gemmar_aot.runtime")

#: Each kind's launcher arguments (mori's ``run`` parameters) and which of them come per call.
_ARGS = {
    "dispatch": (("arena", "addr_inp_tok", "addr_inp_idx", "addr_inp_wts", "addr_tok_map", "addr_dest_pe_ctr",
                  "addr_disp_bar", "addr_total_recv", "addr_inp_scales", "my_lsa_rank", "inp_cur_tok", "stream"),
                 ("addr_inp_tok", "addr_inp_idx", "addr_inp_wts", "addr_tok_map", "addr_inp_scales", "inp_cur_tok")),
    "combine": (("arena", "addr_tok_map", "addr_comb_bar", "addr_xdb_flag", "addr_total_recv", "addr_out",
                 "addr_out_wts", "my_lsa_rank", "cur_rank_num_token", "stream"),
                ("addr_tok_map", "addr_total_recv", "cur_rank_num_token")),
    "local_expert_count": (("addr_out_idx", "addr_total_recv", "addr_count", "stream"), ()),
    "convert_dispatch": (("addr_out_tok", "addr_out_idx", "addr_tis", "addr_total_recv", "addr_packed_x",
                          "addr_packed_cnt", "addr_packed_src", "addr_slot_map", "stream"), ()),
    "convert_combine": (("addr_out_tok", "addr_out_wts", "addr_total_recv", "addr_packed_x", "addr_slot_map",
                         "stream"), ("addr_total_recv",)),
}
_ARGS["dispatch_replay"] = _ARGS["dispatch"]
#: mori's FlyDSL backend's capabilities (``KernelSet.capabilities``).
CAPABILITIES = frozenset({"gather", "scatter", "quant", "std_moe", "scales", "replay", "local_expert_count",
                          "asymmetric_dtype", "recv_cap"})


def _backend_refusal(req: Requested) -> str:
    """Why a config that selects an unknown kernel backend is not served."""
    return f"unknown kernel backend {req.backend!r} ({req.backend_from}); known: {sorted(BACKENDS)}"


class EpDispatchCombineOp(LoadedOp):
    """mori's EP dispatch/combine from ahead-of-time compiled kernels. With the FlyDSL backend (mori's
    default on gfx942/gfx950): this op, which owns the symmetric window (the arena), the per-rank
    tensors mori's backend makes, and one resolved launch per kernel of this rank. With the HIP
    backend (``kernel_backend="hip"`` or ``$MORI_V2_KERNEL_BACKEND=hip``; every internode config):
    mori's own HIP op, its JIT v2 kernels served prebuilt (:mod:`.ep_hip`)."""

    backend_name = "flydsl"

    def __new__(cls, cfg, comm, *, artifacts: Any = None, driver: Driver | None = None, trusted_keys: Any = None,
                miss_report: Any = None):
        from .ep_config import selected_backend

        if selected_backend(cfg)[0] == "hip":
            from .ep_hip import hip_op

            return hip_op(cfg, comm, artifacts=artifacts, driver=driver, trusted_keys=trusted_keys,
                          miss_report=miss_report)
        return super().__new__(cls)

    @property
    def dev(self):
        """The op's device, by the name mori's backends give it."""
        return self.device

    @gc_paused()
    def __init__(self, cfg, comm, *, artifacts: Any = None, driver: Driver | None = None,
                 trusted_keys: Any = None, miss_report: Any = None):
        t_start = time.perf_counter()
        self._init_loaded()  # cleanup state first: a failure below rolls back through close()
        self.mem = self.win = None
        self._launch: dict[tuple[str, int, int], Launch] = {}
        self._startup_seconds: float | None = None
        self.cfg, self.comm = cfg, comm
        req = read_config(cfg)
        self._check_request(req, comm)
        self.rank, self.world_size = req.rank, req.config.world
        self._requested = req
        self._misses = misses.OpMisses(type(self).__name__, miss_report, self._miss_identity, rank=req.rank,
                                       subject="ep")
        self.artifacts: Artifacts = load_artifacts(artifacts, trusted_keys=trusted_keys)
        entry = self._entry = self._find_entry(req)
        c = self.config = entry.config
        self._roles = kernel_roles(c)
        #: the kernels of one variant only (the local expert count, the converts), by kind
        self._lone = {kind: (kind, b, w) for kind, b, w in self._roles if not kind.startswith(("dispatch", "combine"))}
        # mori's _pick, resolved once per bucket: a call scans this table
        self._picks = pick_table(c)
        self._dispatch_specs, self._combine_specs = variants(c)
        positions = self._positions(entry)

        def acquire(kernels: Kernels) -> None:
            #: the combines write 0 at the count they are passed: a snapshot's own count goes through a copy
            self._combine_zeroes = combine_zeroes_total_recv(self._mori.version if self._mori else None)
            self._acquire_window()
            self._make_tensors(c)
            self._prepare_launches(entry, kernels)
            comm.barrier()  # every rank's window zeroed before any rank's first dispatch writes into it

        self._load(self.artifacts, [entry], driver=driver, device=lambda: communicator_device(comm), comm=comm,
                   launches=lambda e: e.launches, position=lambda e, le: positions[le.key],
                   sequences=self._check_sequence, acquire=acquire)
        self._startup_seconds = time.perf_counter() - t_start

    # ------------------------------------------------------------------
    # construction
    # ------------------------------------------------------------------

    @staticmethod
    def _check_request(req: Requested, comm) -> None:
        """mori's own refusals of the config (its words), and a communicator of another world or rank."""
        c = req.config
        if req.backend is not None and req.backend != "flydsl":
            raise ValueError(_backend_refusal(req))
        if req.gpu_per_node < c.world:
            raise ValueError(f"flydsl backend cannot serve this config:\n  gpu_per_node={req.gpu_per_node} < "
                             f"world_size={c.world} selects the internode path, which only the 'hip' backend "
                             f"implements; pass kernel_backend='hip' (mori's HIP backend: gemmar-aot serves its "
                             f"JIT v2 kernels prebuilt, from [[ep]] entries with kernel_backend = \"hip\")")
        reasons = [why for _field, why in config_problems(c)]
        if reasons:
            raise ValueError("flydsl backend cannot serve this config:\n  " + "\n  ".join(reasons))
        if (int(comm.nranks), int(comm.rank)) != (c.world, req.rank):
            raise ValueError(f"the config is rank {req.rank} of world {c.world}, the communicator rank "
                             f"{comm.rank} of {comm.nranks}: construct the op with this rank's config")

    def _find_entry(self, req: Requested) -> EpRankEntry:
        """The built entry for this config and rank: same served fields, replay variants built when
        there is a choice, the device table the config resolved (when it resolved one)."""
        want = served_key(req.config)
        found = sorted((e for e in self.artifacts.ep_entries(req.rank) if served_key(e.config) == want),
                       key=lambda e: not e.config.replay)
        for e in found:
            if req.geometry_problem(e.config) is None:
                return e
        if found:
            why = req.geometry_problem(found[0].config)
            err = ArtifactMismatchError(
                f"the artifacts hold this EP config ({found[0].where}), but {why}. Construct the config without "
                f"pinning block/warp fields on a {found[0].config.device}, or build the manifest for this device's "
                f"table (device = in its [[ep]] entry)")
        else:
            err = self._missing_error(req.config)
        self._misses.miss(None, type(err).__name__)
        raise err

    def _missing_error(self, c: EpConfig) -> ArtifactMissingError:
        held = sorted({(e.config.world, e.config.hidden, e.config.max_tokens, e.config.experts, e.config.topk,
                        e.config.dispatch_dtype, e.config.combine_dtype, e.config.quant_type)
                       for by_rank in self.artifacts.ep_index.values() for e in by_rank.values()})
        snippet = manifest_entry(c.__class__(**{**c.to_json(), "replay": True, "device": "MI355X"}))
        return ArtifactMissingError(
            f"no precompiled EP kernels for {self._describe(c)} rank {self.rank} (sources: "
            f"{self.artifacts.describe_sources()}); nothing is compiled at run time. EP entries present (world, "
            f"hidden, max_tokens, experts, topk, dispatch, combine, quant): {held or 'none'}. Add to the manifest "
            f"and rebuild (gemmar-aot build):\n{snippet}", m=c.max_tokens, manifest_lines=snippet)

    @staticmethod
    def _describe(c: EpConfig) -> str:
        comb = "" if c.combine_dtype == c.dispatch_dtype else f"->{c.combine_dtype}"
        quant = "" if c.quant_type == "none" else f" {c.quant_type}"
        return (f"EP world {c.world} hidden {c.hidden} max_tokens {c.max_tokens} experts {c.experts} topk {c.topk} "
                f"{c.dispatch_dtype}{comb} {c.combine_mode}{quant}" + (" std_moe" if c.std_moe else ""))

    def _positions(self, entry: EpRankEntry) -> dict[str, EpPosition]:
        """Each launch entry's place: its role in the recipe's order (the sequence check runs first)."""
        c, arena = entry.config, entry.ep.arena
        return {le.key: EpPosition(kind, entry.rank, b, w, c, arena)
                for le, (kind, b, w) in zip(entry.launches, self._roles)}

    def _check_sequence(self, entries) -> None:
        for e in entries:
            got = [le.kind for le in e.launches]
            want = [kind for kind, _b, _w in self._roles]
            if got != want or len({le.key for le in e.launches}) != len(got):
                raise ArtifactMismatchError(
                    f"{e.at}: the lock lists the kernels {got}, its EP configuration makes {want}, each once. The "
                    f"lock was edited or made by another gemmar-aot: rebuild the manifest (gemmar-aot build) and "
                    f"use the lock it writes")

    def _acquire_window(self) -> None:
        """The arena: one symmetric window of the layout compiled into every kernel, zeroed."""
        total = self._entry.ep.arena.total
        self.mem = self.comm.alloc_mem(total)
        self.win = self.comm.register_window(self.mem.ptr, total)
        self._driver.memset(self.mem.ptr, 0, total)
        self._base = int(getattr(self.win, "local_ptr", self.mem.ptr))
        self.window_bytes = total

    def local_ptr(self, region: str) -> int:
        """This rank's address of an arena region (mori's ``arena.local_ptr``)."""
        return self._base + self._entry.ep.arena.offset(region)

    def _view(self, region: str, shape: tuple, dtype):
        return tensor_at(self.comm, self.local_ptr(region), shape, dtype, self.device)

    def _make_tensors(self, c: EpConfig) -> None:
        """The per-rank tensors and window views, as mori's FlyDSL backend makes them."""
        import torch

        dev, m, k, h, cap = self.device, c.max_tokens, c.topk, c.hidden, c.recv_cap
        i32 = torch.int32
        self.token_dest_map = torch.full((m * k,), -1, dtype=i32, device=dev)
        self._null_flat = c.world * cap
        self.routing_dest_map = torch.full_like(self.token_dest_map, self._null_flat)
        self.dest_pe_counter = torch.zeros(c.world, dtype=i32, device=dev)
        self.dispatch_barrier = torch.zeros(1, dtype=i32, device=dev)
        self.total_recv = torch.zeros(1, dtype=i32, device=dev)
        self._combine_count = torch.zeros(1, dtype=i32, device=dev)  # what a snapshot's combine reads (and zeroes)
        self.combine_barrier = torch.zeros(1, dtype=i32, device=dev)
        self.cross_device_flag = torch.ones(XDB_FLAG_SLOTS, dtype=torch.int64, device=dev)
        if c.combine_dtype == "fp4":
            out_len, out_dt = m * (h // 2), torch.int8
        elif c.combine_elem_size == 1:
            out_len, out_dt = m * h, torch.int8
        else:
            out_len, out_dt = m * h, torch.int16 if c.combine_elem_size == 2 else i32
        self.combine_out = torch.zeros(out_len, dtype=out_dt, device=dev)
        self.combine_out_weights = torch.zeros(m * k, dtype=torch.float32, device=dev)
        self._local_expert_count_buf = torch.zeros(c.experts_per_rank, dtype=i32, device=dev)
        if c.std_moe:
            per_expert = self._max_tok_per_expert = c.world * m
            self.packed_x = torch.zeros(c.experts_per_rank * per_expert * h, dtype=torch.int16, device=dev)
            self.packed_count = torch.zeros(c.experts_per_rank, dtype=i32, device=dev)
            self.packed_src = torch.zeros(c.experts_per_rank * per_expert, dtype=i32, device=dev)
            self.slot_map = torch.full((cap * k,), -1, dtype=torch.int64, device=dev)
        self._dispatch_dt, self._combine_dt = torch_dtype(c.dispatch_dtype), torch_dtype(c.combine_dtype)
        self._empty_i32 = torch.empty(0, dtype=i32, device=dev)
        cols = h // 2 if c.is_fp4 else h
        scale_b = c.scale_dim * c.scale_type_size
        self._scale_num_i32 = (scale_b + 3) // 4
        self._views = {
            "recv_tokens": self._view("disp_out", (cap, cols), self._dispatch_dt),
            "recv_weights": self._view("out_wts", (cap, k), torch.float32),
            "recv_indices": self._view("out_idx", (cap, k), i32),
            "recv_scales": self._view("out_scales", (cap, self._scale_num_i32), i32) if scale_b else None,
            "combine_in": self._view("out_tok", (cap, h // 2 if c.combine_dtype == "fp4" else h), self._combine_dt),
            "reverse": self._view("recv_to_src_token", (cap,), i32),
        }
        self._out_tok_ptr = self.local_ptr("out_tok")

    def _fixed_values(self, kind: str) -> dict[str, int]:
        """Each kind's launcher arguments that are the same at every call."""
        ptr = {name: t.data_ptr() for name, t in (("tpc", self.dest_pe_counter), ("db", self.dispatch_barrier),
                                                   ("tr", self.total_recv), ("cb", self.combine_barrier),
                                                   ("xdb", self.cross_device_flag), ("out", self.combine_out),
                                                   ("outw", self.combine_out_weights),
                                                   ("lec", self._local_expert_count_buf))}
        if kind in ("dispatch", "dispatch_replay"):
            return {"arena": int(self.win.handle), "addr_dest_pe_ctr": ptr["tpc"], "addr_disp_bar": ptr["db"],
                    "addr_total_recv": ptr["tr"], "my_lsa_rank": self.rank}
        if kind == "combine":
            return {"arena": int(self.win.handle), "addr_comb_bar": ptr["cb"], "addr_xdb_flag": ptr["xdb"],
                    "addr_out": ptr["out"], "addr_out_wts": ptr["outw"], "my_lsa_rank": self.rank}
        if kind == "local_expert_count":
            return {"addr_out_idx": self.local_ptr("out_idx"), "addr_total_recv": ptr["tr"], "addr_count": ptr["lec"]}
        std = {"addr_packed_x": self.packed_x.data_ptr(), "addr_slot_map": self.slot_map.data_ptr()}
        if kind == "convert_dispatch":
            return {**std, "addr_out_tok": self.local_ptr("disp_out"), "addr_out_idx": self.local_ptr("out_idx"),
                    "addr_tis": self.local_ptr("recv_to_src_token"), "addr_total_recv": ptr["tr"],
                    "addr_packed_cnt": self.packed_count.data_ptr(), "addr_packed_src": self.packed_src.data_ptr()}
        return {**std, "addr_out_tok": self.local_ptr("out_tok"), "addr_out_wts": self.local_ptr("out_wts")}

    def _prepare_launches(self, entry: EpRankEntry, kernels: Kernels) -> None:
        """One resolved launch per kernel, keyed by its role (kind, block, warp); grid and block
        checked against the variant (the block is ``warp * 64`` threads)."""
        shared: dict = {}
        for le, role in zip(entry.launches, self._roles):
            kind, b, w = role
            rec, names = le.launch, _ARGS[kind]
            got = tuple(a.name for a in rec.args)
            if got != names[0] or any(len(a.params) != 1 for a in rec.args):
                raise ArtifactMismatchError(f"{entry.at} {kind}: the launcher takes {got}, this op passes "
                                            f"{names[0]}; rebuild it")
            fixed_by_name = self._fixed_values(kind)
            param = {a.name: a.params[0] for a in rec.args}
            fixed = {param[n]: v for n, v in fixed_by_name.items()}
            d = le.blob.hash
            launch = prepare_launch(kind=kind, digest=d, record=rec, kernel=kernels.kernel[d],
                                    function=kernels.function[d], where=f"{entry.at} {kind}", fixed=fixed,
                                    per_call=tuple(param[n] for n in names[1]), cache=shared)
            if launch.grid != (b, 1, 1) or launch.block != (w * 64, 1, 1):
                raise ArtifactMismatchError(f"{entry.at} {kind}: the record launches grid {launch.grid} block "
                                            f"{launch.block}, the variant is {b} blocks of {w} warps; rebuild it")
            self._launch[role] = launch

    # ------------------------------------------------------------------
    # the ops
    # ------------------------------------------------------------------

    def _pick(self, num_tokens: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """mori's ``_pick``: the (dispatch, combine) variants for ``num_tokens``, clamped to those built."""
        return pick_from(self._picks, num_tokens)

    def _go(self, role: tuple, values: tuple = ()) -> None:
        launch = self._launch[role]
        if values:
            launch.pack(values)
        self._driver.launch(launch.function, launch.grid, launch.block, launch.args,
                            self._driver.current_stream(self.device))

    def dispatch(self, input, weights, scales, indices, *, routing=None, return_routing=False, snapshot=False):
        """mori's dispatch: ``(recv_tokens, recv_weights, recv_scales, recv_indices, total_recv[, routing])``.

        ``routing=``: replay a handle's routing (the replay variants are built in); ``return_routing=``:
        also return the handle; ``snapshot=`` (with ``return_routing``): the handle gets its own dest
        map and count, as mori 1.2.5's does, which its combine leaves as they are on artifacts of
        either mori. The outputs alias the window (see mori)."""
        if self._closed:
            raise RuntimeError("this EpDispatchCombineOp has been closed")
        if routing is not None and return_routing:
            raise ValueError("pass either routing= (replay) or return_routing=True, not both")
        if snapshot and not return_routing:
            raise ValueError("snapshot=True applies to the handle return_routing=True returns")
        c = self.config
        if snapshot and (c.is_scatter or c.std_moe):
            raise ValueError("snapshot=True is intranode gather without StdMoE only: the internode and scatter "
                             "combines and StdMoE's convert also read state the op keeps in the arena")
        n = int(input.shape[0])
        if n > c.max_tokens:
            raise self._over_capacity(n)
        (b, w), _ = self._pick(n)
        if routing is not None:
            if not c.replay:
                raise self._no_replay()
            kind, dest_map = "dispatch_replay", routing.disp_dest_tok_id_map
        elif snapshot:
            import torch

            kind, dest_map = "dispatch", torch.empty_like(self.routing_dest_map)
        else:
            kind, dest_map = "dispatch", self.routing_dest_map if return_routing else self.token_dest_map
        scale_ptr = scales.data_ptr() if (scales is not None and self._scale_num_i32) else 0
        self._go((kind, b, w), (input.data_ptr(), indices.data_ptr(), weights.data_ptr() if weights is not None
                                else 0, dest_map.data_ptr(), scale_ptr, n))
        v = self._views
        base = (v["recv_tokens"], v["recv_weights"], v["recv_scales"], v["recv_indices"], self.total_recv)
        if not return_routing:
            return base
        handle = EpDispatchRoutingHandle(
            disp_dest_tok_id_map=dest_map, inter_node_disp_dest_tok_id_map=self._empty_i32,
            inter_node_disp_send_map=self._empty_i32,
            total_recv_token_num=self.total_recv.clone() if snapshot else self.total_recv,
            cur_rank_num_token=n, reverse_src_view=v["reverse"])
        return base + (handle,)

    def combine(self, input, weights=None, indices=None, *, routing):
        """mori's combine: ``(out [ct, hidden], out_weights [ct, topk] or None)``; ``weights`` asks for the
        weight fold's result (its values are the forwarded ones), ``indices`` is unused, as in mori."""
        if self._closed:
            raise RuntimeError("this EpDispatchCombineOp has been closed")
        c = self.config
        ct = int(routing.cur_rank_num_token)
        _, (b, w) = self._pick(ct)
        if not c.std_moe and input.data_ptr() != self._out_tok_ptr:
            self._views["combine_in"].view(-1)[:input.numel()].copy_(input.reshape(-1))
        count = routing.total_recv_token_num
        if self._combine_zeroes and count.data_ptr() != self.total_recv.data_ptr():
            self._combine_count.copy_(count)  # a snapshot's count: the combine zeroes its copy, not it
            count = self._combine_count
        self._go(("combine", b, w), (routing.disp_dest_tok_id_map.data_ptr(), count.data_ptr(), ct))
        cols = c.hidden // 2 if c.combine_dtype == "fp4" else c.hidden
        out = self.combine_out[:ct * cols].view(self._combine_dt).view(ct, cols)
        outw = self.combine_out_weights[:ct * c.topk].view(ct, c.topk) if weights is not None else None
        return out, outw

    def local_expert_count(self):
        """``[experts_per_rank]`` i32: received tokens per local expert (call after dispatch)."""
        self._check_open()
        self._local_expert_count_buf.zero_()
        self._go(self._lone["local_expert_count"])
        return self._local_expert_count_buf

    def convert_dispatch_output(self):
        """mori's ConvertDispatchOutput (StdMoE): ``(packed_x [epr, world*M, hidden], packed_count, packed_src)``."""
        self._check_std_moe()
        self.packed_count.zero_()
        self.slot_map.fill_(-1)
        self._go(self._lone["convert_dispatch"])
        c = self.config
        x = self.packed_x.view(self._dispatch_dt).view(c.experts_per_rank, self._max_tok_per_expert, c.hidden)
        return x, self.packed_count, self.packed_src

    def convert_combine_input(self, routing):
        """mori's ConvertCombineInput (StdMoE): the expert outputs reduced back into the window."""
        self._check_std_moe()
        self._go(self._lone["convert_combine"], (routing.total_recv_token_num.data_ptr(),))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this EpDispatchCombineOp has been closed")

    def _check_std_moe(self) -> None:
        self._check_open()
        if not self.config.std_moe:
            raise AssertionError("op built without enable_std_moe")

    def _over_capacity(self, n: int) -> ValueError:
        """mori's error for a dispatch above the capacity, with the entry that would serve it."""
        c = self.config
        bigger = manifest_entry(c.__class__(**{**c.to_json(), "max_tokens": n}))
        self._misses.miss(n, "ValueError")
        return ValueError(f"{n} tokens exceeds max_num_inp_token_per_rank={c.max_tokens}. The capacity is compiled "
                          f"into every kernel and sizes the window: a larger one is another op built from another "
                          f"[[ep]] entry (max_num_inp_token_per_rank={n} in the config), e.g.:\n{bigger}")

    def _no_replay(self) -> ArtifactMissingError:
        c = self.config
        snippet = manifest_entry(c.__class__(**{**c.to_json(), "replay": True}))
        self._misses.miss(None, "ArtifactMissingError")
        return ArtifactMissingError(f"dispatch(routing=...) replays a routing, and {self._entry.where} was built "
                                    f"with replay = false: no replay variants exist. Build the entry with replay "
                                    f"(the default):\n{snippet}", m=c.max_tokens, manifest_lines=snippet)

    # ------------------------------------------------------------------
    # views, state, lifecycle (mori's names)
    # ------------------------------------------------------------------

    def recv_tokens(self):
        return self._views["recv_tokens"]

    def recv_weights(self):
        return self._views["recv_weights"]

    def recv_indices(self):
        return self._views["recv_indices"]

    def recv_scales(self):
        return self._views["recv_scales"]

    def combine_in_view(self):
        return self._views["combine_in"]

    def scale_stride_bytes(self) -> int:
        n = self.config.scale_dim * self.config.scale_type_size
        return ((n + 3) // 4) * 4 if n else 0

    @property
    def capabilities(self) -> frozenset:
        return CAPABILITIES

    def reset(self) -> None:
        """mori's reset (collective): the window and every counter back to their initial values,
        then a device sync and a barrier."""
        self._check_open()
        self._driver.memset(self.mem.ptr, 0, self.window_bytes)
        self.token_dest_map.fill_(-1)
        self.routing_dest_map.fill_(self._null_flat)
        for t in (self.dest_pe_counter, self.dispatch_barrier, self.combine_barrier, self.total_recv):
            t.zero_()
        self.cross_device_flag.fill_(1)
        self._driver.synchronize(self._driver.current_stream(self.device))
        self.comm.barrier()

    def stats(self) -> dict:
        return {"misses": dict(self._misses.counts), "startup_seconds": self._startup_seconds, "rank": self.rank,
                "kernels": len(self._launch)}

    def _miss_identity(self) -> tuple[dict, str | None, list[str]]:
        c = getattr(self, "config", None) or self._requested.config
        return ({k: v for k, v in c.to_json().items() if k not in ("replay", "device")},
                misses.profile_of(self.artifacts), misses.lock_digests(self.artifacts))

    def close(self) -> None:
        """Release the window, its memory and the loaded modules. Idempotent; synchronise first if
        work may be in flight."""
        if self._closed:
            return
        self._closed = True
        self._launch.clear()
        errors: list = []
        self._release_loaded((self.win, self.mem), errors)  # deregister before free
        self.win = self.mem = None
        if errors:
            raise errors[0]

    def __enter__(self) -> "EpDispatchCombineOp":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._launch)} kernels"
        return (f"<gemmar_aot EpDispatchCombineOp(backend=flydsl, rank={self.rank}/{self.world_size}, "
                f"{self._describe(self.config) if hasattr(self, 'config') else '?'}): {state}>")
