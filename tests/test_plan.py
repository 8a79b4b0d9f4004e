"""Plan: exact kernel and distinct-spec counts, derived from the op's rules."""

from __future__ import annotations

import random
from pathlib import Path


from gemmar_aot import rules
from gemmar_aot.manifest import load_manifest, parse_manifest
from gemmar_aot.plan import make_plan

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests"

# Per-call sequences and self-test sequences of mori 1.2.4's fused op
# (kernels_sdma.py fused_order / order), by wire.
CALL = {
    ("bf16", "lsa"): ["gemm", "drain", "reduce", "gather"],
    ("fp8", "lsa"): ["gemm", "drain", "reduce", "quantize", "gather_barrier", "pull"],
    ("fp8", "sdma"): ["gemm", "drain", "reduce", "quantize", "gather", "dequantize"],
}
SELF_TEST = {
    ("bf16", "lsa"): ["scatter", "reduce", "gather"],
    ("fp8", "lsa"): ["scatter", "reduce", "quantize", "gather_barrier", "pull"],
    ("fp8", "sdma"): ["scatter", "reduce", "quantize", "gather", "dequantize"],
}


def test_reference_manifest_counts():
    plan = make_plan(load_manifest(MANIFESTS / "dsv4-pro-wo_b.toml"))
    ms = list(range(4096, 16384 + 1, 1024))
    world = 8
    assert [t.workload.m for t in plan.tuples] == ms
    per_rank = len(CALL[("bf16", "lsa")]) + len(SELF_TEST[("bf16", "lsa")])
    assert plan.instances == len(ms) * world * per_rank == 728
    # One GEMM, reduce, gather and scatter per (M, rank); drain depends on the rank only.
    by_kind = plan.distinct_by_kind()
    assert by_kind == {
        "fused-sdma:gemm": len(ms) * world,
        "fused-sdma:reduce": len(ms) * world,
        "fused-sdma:gather": len(ms) * world,
        "fused-sdma:scatter": len(ms) * world,
        "fused-sdma:drain": world,
    }
    assert len(plan.specs) == 4 * len(ms) * world + world == 424
    for t in plan.tuples:
        for r in t.ranks:
            assert [s.kind for s in r.launches] == CALL[("bf16", "lsa")]
            assert [s.kind for s in r.self_test] == SELF_TEST[("bf16", "lsa")]


def test_reference_layout_and_slots():
    plan = make_plan(load_manifest(MANIFESTS / "dsv4-pro-wo_b.toml"))
    for t in plan.tuples:
        assert t.layout.m_max == 16384
        assert t.layout.max_shapes == 16
        assert t.layout.slot == t.workload.m // 1024 - 1
        # Spec section 4, worked values at ws=8, N=7168, m_max=16384, 16 slots.
        assert t.layout.window["counter_off"] == 5504 + 256 * t.layout.slot
        assert t.layout.window["lock_off"] == 9600
        assert t.layout.window["input_off"] == 10240
        assert t.layout.window["output_off"] == 234_891_264
        assert t.layout.window["window_bytes"] == 734_013_440


def test_fp8_manifest_counts():
    plan = make_plan(load_manifest(MANIFESTS / "dsv4-pro-wo_b-fp8.toml"))
    ms, world = 13, 8
    per_rank = sum(len(CALL[w]) + len(SELF_TEST[w]) for w in (("fp8", "lsa"), ("fp8", "sdma")))
    assert plan.instances == ms * world * per_rank == 2288
    by_kind = plan.distinct_by_kind()
    # The two wires are two windows: everything M-dependent is per wire, the
    # control-only phases (drain, gather_barrier) per rank.
    assert by_kind["fused-sdma:gemm"] == 2 * ms * world
    assert by_kind["fused-sdma:quantize"] == 2 * ms * world
    assert by_kind["fused-sdma:pull"] == ms * world
    assert by_kind["fused-sdma:dequantize"] == ms * world
    assert by_kind["fused-sdma:drain"] == world
    assert by_kind["fused-sdma:gather_barrier"] == world
    assert len(plan.specs) == 1160


def test_smoke_manifest_counts():
    plan = make_plan(load_manifest(MANIFESTS / "smoke.toml"))
    by_kind = plan.distinct_by_kind()
    world = 2
    # bf16 window: M 256, 512 at K 256 and 512 -> 4 GEMMs per rank; the phases
    # do not depend on K, so reduce/gather/scatter are 2 M x 2 ranks.
    # fp8/lsa window: M 512 -> 1 GEMM, reduce, quantize, pull, scatter per rank.
    assert by_kind["fused-sdma:gemm"] == (4 + 1) * world
    assert by_kind["fused-sdma:reduce"] == (2 + 1) * world
    assert by_kind["fused-sdma:gather"] == 2 * world
    assert by_kind["fused-sdma:scatter"] == (2 + 1) * world
    assert by_kind["fused-sdma:drain"] == world
    assert by_kind["fused-sdma:gather_barrier"] == world
    assert by_kind["fused-sdma:pull"] == world
    # split-lsa: one M-independent GEMM shared by both ranks, one all-reduce per rank.
    assert by_kind["split-lsa:gemm"] == 1
    assert by_kind["split-lsa:lsa_ar"] == world
    # gemm-only: the narrow tile for M=256, the wide one for M=9216.
    assert by_kind["gemm-only:gemm"] == 2


def test_slots_do_not_depend_on_manifest_order():
    text = (MANIFESTS / "dsv4-pro-wo_b.toml").read_text()
    ms = list(range(4096, 16384 + 1, 1024))
    shuffled = ms[:]
    random.Random(7).shuffle(shuffled)
    text2 = text.replace("m = { start = 4096, stop = 16384, step = 1024 }", f"m = {shuffled}")
    assert text2 != text
    a = make_plan(parse_manifest(text, "a.toml"))
    b = make_plan(parse_manifest(text2, "b.toml"))
    assert {s.spec_id for s in a.specs} == {s.spec_id for s in b.specs}
    slots = {t.workload.m: t.layout.slot for t in b.tuples}
    assert slots == {m: rules.counter_slot(m, 8, 128) for m in ms}


def test_subset_manifest_keeps_slots_but_not_m_max():
    """A manifest with fewer M values keeps each M's slot; m_max follows the group."""
    text = (MANIFESTS / "dsv4-pro-wo_b.toml").read_text()
    small = make_plan(parse_manifest(text.replace(
        "m = { start = 4096, stop = 16384, step = 1024 }", "m = [4096, 8192]"), "s.toml"))
    assert [t.layout.slot for t in small.tuples] == [3, 7]
    assert {t.layout.m_max for t in small.tuples} == {8192}
    pinned = make_plan(parse_manifest(text.replace(
        "m = { start = 4096, stop = 16384, step = 1024 }", "m = [4096, 8192]\nm_max = 16384"), "p.toml"))
    full = make_plan(load_manifest(MANIFESTS / "dsv4-pro-wo_b.toml"))
    full_ids = {s.spec_id for s in full.specs}
    # With m_max pinned to the full window, the subset's kernels are the full build's.
    assert {s.spec_id for s in pinned.specs} <= full_ids


def test_padded_duplicates_are_one_build():
    text = (MANIFESTS / "dsv4-pro-wo_b.toml").read_text().replace(
        "m = { start = 4096, stop = 16384, step = 1024 }", "m = [4000, 4096]")
    plan = make_plan(parse_manifest(text, "d.toml"))
    assert len(plan.tuples) == 1 and plan.tuples[0].workload.m == 4096


def test_code_env_is_part_of_pull_specs():
    text = (MANIFESTS / "dsv4-pro-wo_b-fp8.toml").read_text()
    a = make_plan(parse_manifest(text, "a.toml"), env={})
    b = make_plan(parse_manifest(text, "a.toml"), env={"MORI_GEMM_AR_PULL_BLOCKS": "32"})
    changed = {s.kind for s in set(a.specs) ^ set(b.specs)}
    assert changed == {"pull"}
