"""Manifest -> plan: every tuple expanded into per-rank kernel specs, deduplicated.

Tuples that share a window (same mode, N, K, world, quant, wire, tile, queues and
m_max) form one group. The group's ``m_max`` is its largest padded M unless the
manifest gives one; every M in it then gets the counter set
``m_pad // (world*block_m) - 1`` -- a rule, not first-seen order, so the runtime
can derive the same slot for any M without knowing which others were built.

Nothing here imports FlyDSL, torch or mori: planning is instant, but for HIP-backend ``[[ep]]``
entries, whose translation units mori's own code finds in a process of its own (a few seconds per
arch and NIC variant: :mod:`.plan_jitv2`).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping

from gemmar_aot.model.layout import window_layout
from gemmar_aot.model import rules
from gemmar_aot.builder.manifest import Manifest
from gemmar_aot.builder.manifest_ep import EpEntry
from gemmar_aot.builder.workload import Workload, dedup_workloads
from gemmar_aot.model.ep import Arena, arena_layout, factory_kwargs, variants
from gemmar_aot.model.layout import WindowLayout
from gemmar_aot.model.spec import KernelSpec
from gemmar_aot.builder.manifest_hipcc import HipccEntry
from gemmar_aot.builder.plan_jitv2 import JitV2Plan, plan_jitv2
from gemmar_aot_kernels import ep as ep_recipe, hipcc as hipcc_recipe, recipe_module
from gemmar_aot_kernels._common import RankKernels

#: Environment variables that change generated code, read at plan time and
#: recorded in the specs that read them.
CODE_ENV = ("MORI_GEMM_AR_PULL_BLOCKS",)


@dataclass(frozen=True)
class TupleLayout:
    """Where one tuple's M sits in its group's window."""

    m_max: int  # padded capacity M of the window
    max_shapes: int  # counter sets the window holds
    slot: int  # this M's counter set
    window: WindowLayout | None = field(default=None, compare=False, hash=False)  # window_layout(m_pad=M)


@dataclass(frozen=True)
class TuplePlan:
    workload: Workload
    layout: TupleLayout | None  # None for gemm-only (no window)
    ranks: tuple[RankKernels, ...]

    @property
    def kernel_count(self) -> int:
        return sum(len(r.launches) + len(r.self_test) for r in self.ranks)


@dataclass(frozen=True)
class EpPlan:
    """One ``[[ep]]`` entry planned: its configuration, window layout and every rank's kernels
    (in the order of ``gemmar_aot_kernels.ep.specs``)."""

    entry: EpEntry
    arena: Arena
    ranks: tuple[RankKernels, ...]

    @property
    def kernel_count(self) -> int:
        return sum(len(r.launches) for r in self.ranks)

    def to_json(self) -> dict:
        disp, comb = variants(self.entry.config)
        return {**self.entry.config.to_json(), "source": self.entry.source,
                "schedule": [list(b) for b in self.entry.config.schedule],
                "variants": {"dispatch": [list(v) for v in disp], "combine": [list(v) for v in comb]},
                "arena": self.arena.to_json(),
                "ranks": [{"rank": r.rank, "launches": [{"kind": s.kind, "spec_id": s.spec_id} for s in r.launches]}
                          for r in self.ranks]}


@dataclass(frozen=True)
class HipccPlan:
    """One ``[[hipcc]]`` entry planned: a spec per code object it asks for (``gemmar_aot_kernels.hipcc``)."""

    entry: HipccEntry
    specs: tuple[KernelSpec, ...]

    def to_json(self) -> dict:
        return {"source": self.entry.source,
                "code_objects": [{**v.to_json(), "spec_id": s.spec_id} for v, s in zip(self.entry.variants, self.specs)]}


@dataclass(frozen=True)
class Plan:
    manifest: str
    arch: str
    tuples: tuple[TuplePlan, ...]
    specs: tuple[KernelSpec, ...]  # distinct, sorted by (recipe, kind, rank, spec_id)
    env: tuple[tuple[str, str | None], ...]
    warnings: tuple[str, ...] = ()  # the manifest's (merged duplicates, off-grid range stops)
    eps: tuple[EpPlan, ...] = ()
    mori: str = ""  # the mori whose EP factory keywords the EP specs carry
    hipcc: tuple[HipccPlan, ...] = ()
    jitv2: tuple[JitV2Plan, ...] = ()  # the HIP-backend [[ep]] entries (mori's JIT v2)

    @property
    def instances(self) -> int:
        return (sum(t.kernel_count for t in self.tuples) + sum(e.kernel_count for e in self.eps)
                + sum(len(h.specs) for h in self.hipcc) + sum(len(j.specs) for j in self.jitv2))

    @property
    def dedup_ratio(self) -> float:
        return self.instances / len(self.specs) if self.specs else 1.0

    def distinct_by_kind(self) -> dict[str, int]:
        c = Counter(f"{s.recipe}:{s.kind}" for s in self.specs)
        return dict(sorted(c.items()))

    def to_json(self) -> dict:
        return {
            "manifest": self.manifest,
            "arch": self.arch,
            "warnings": list(self.warnings),
            "env": dict(self.env),
            "tuples": [
                {
                    **t.workload.identity().to_json(),
                    "m_requested": t.workload.m_requested,
                    "source": t.workload.source,
                    "layout": None if t.layout is None else t.layout.window.to_json(),
                    "ranks": [
                        {"rank": r.rank,
                         "launches": [{"kind": s.kind, "spec_id": s.spec_id} for s in r.launches],
                         "self_test": [{"kind": s.kind, "spec_id": s.spec_id} for s in r.self_test]}
                        for r in t.ranks
                    ],
                }
                for t in self.tuples
            ],
            **({"ep": [e.to_json() for e in self.eps], "ep_mori": self.mori} if self.eps else {}),
            **({"hipcc": [h.to_json() for h in self.hipcc]} if self.hipcc else {}),
            **({"ep_hip": [j.to_json() for j in self.jitv2]} if self.jitv2 else {}),
            "kernel_instances": self.instances,
            "distinct_specs": len(self.specs),
            "dedup_ratio": round(self.dedup_ratio, 3),
            "distinct_by_kind": self.distinct_by_kind(),
        }


def make_plan(manifest: Manifest, env: Mapping[str, str] | None = None, *, mori_version: str | None = None,
              profile: str | None = None, toolchain=None, work_root=None) -> Plan:
    """The plan of ``manifest``; its EP kernels made for mori ``mori_version``'s factories (their
    keywords as that mori's backend passes them: ``model.ep.factory_kwargs``), by default the
    mori of the toolchain profile ``profile`` (else ``$GEMMAR_AOT_TOOLCHAIN_PROFILE``, else
    ``default``) pins. HIP-backend ``[[ep]]`` entries are planned by that profile's mori itself
    (``toolchain``, else the installed one: :mod:`.plan_jitv2`; scratch under ``work_root``)."""
    env = os.environ if env is None else env
    if mori_version is None:
        from gemmar_aot.toolchain.profiles import get_profile

        mori_version = get_profile(profile).mori.version
    jitv2 = ()
    if manifest.ep_hip:
        if toolchain is None:
            from gemmar_aot.toolchain import load_toolchain

            toolchain = load_toolchain(profile=profile)
        jitv2 = plan_jitv2(manifest.ep_hip, toolchain, work_root)
    code_env = {k: env.get(k) for k in CODE_ENV}

    # Deduplicate tuples (two written M that pad to the same M are one build).
    workloads, _repeats = dedup_workloads(manifest.workloads)

    # Groups share a window: their m_max is the largest padded M unless given.
    group_max: dict[tuple, int] = {}
    for w in workloads:
        if w.collective:
            key = w.group_key()
            group_max[key] = max(group_max.get(key, 0), w.m_max or w.m)

    tuples = []
    for w in workloads:
        layout = None
        if w.collective:
            m_max = group_max[w.group_key()]
            max_shapes = rules.default_max_shapes(m_max, w.world, w.block_m)
            slot = rules.counter_slot(w.m, w.world, w.block_m)
            window = window_layout(
                w.world, w.n, m_max, w.block_m, w.gather_dtype, w.gather_transport,
                max_shapes, m_pad=w.m,
            )
            layout = TupleLayout(m_max=m_max, max_shapes=max_shapes, slot=slot, window=window)
        ranks = recipe_module(w.transport).specs(w, layout, code_env)
        tuples.append(TuplePlan(workload=w, layout=layout, ranks=ranks))

    eps = tuple(EpPlan(entry=e, arena=arena_layout(e.config),
                       ranks=tuple(replace(r, launches=tuple(_for_mori(s, mori_version) for s in r.launches))
                                   for r in ep_recipe.rank_kernels(e.config)))
                for e in manifest.eps)
    hipcc = tuple(HipccPlan(h, tuple(hipcc_recipe.spec(v) for v in h.variants)) for h in manifest.hipcc)
    distinct: dict[str, KernelSpec] = {}
    for t in (*tuples, *eps):
        for r in t.ranks:
            for s in r.launches + r.self_test:
                distinct.setdefault(s.spec_id, s)
    for h in (*hipcc, *jitv2):
        for s in h.specs:
            distinct.setdefault(s.spec_id, s)
    specs = tuple(sorted(distinct.values(), key=lambda s: (s.recipe, s.kind, s.rank, s.spec_id)))
    return Plan(
        manifest=manifest.name,
        arch=manifest.arch,
        tuples=tuple(tuples),
        specs=specs,
        env=tuple(sorted(code_env.items())),
        warnings=tuple(manifest.warnings),
        eps=eps,
        mori=mori_version,
        hipcc=hipcc,
        jitv2=jitv2,
    )


def _for_mori(spec: KernelSpec, mori_version: str) -> KernelSpec:
    """An EP recipe spec with its factory keywords as mori ``mori_version``'s backend passes them."""
    p = spec.param_dict()
    kw = factory_kwargs(p["kwargs"], mori_version)
    return spec if kw == p["kwargs"] else KernelSpec.make(spec.recipe, spec.kind, spec.rank, {**p, "kwargs": kw})


def plan_order(plan: Plan):
    """Every kernel of ``plan`` in the plan's own order (tuples, then EP entries; ranks; launches,
    then self-tests), repeats included: two plans of one manifest pair up position by position."""
    for t in (*plan.tuples, *plan.eps):
        for r in t.ranks:
            yield from r.launches
            yield from r.self_test
    for h in (*plan.hipcc, *plan.jitv2):
        yield from h.specs
