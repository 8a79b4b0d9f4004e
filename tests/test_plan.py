"""Plan: exact kernel and distinct-spec counts, derived from the op's rules."""

from __future__ import annotations

import random
from pathlib import Path


from gemmar_aot.model import rules
from gemmar_aot.builder.manifest import load_manifest, parse_manifest
from gemmar_aot.builder.plan import make_plan

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
        "sdma-phases:reduce": len(ms) * world,
        "sdma-phases:gather": len(ms) * world,
        "sdma-phases:scatter": len(ms) * world,
        "sdma-phases:drain": world,
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
        assert t.layout.window.call.counter_off == 5504 + 256 * t.layout.slot
        assert t.layout.window.lock_off == 9600
        assert t.layout.window.input_off == 10240
        assert t.layout.window.output_off == 234_891_264
        assert t.layout.window.window_bytes == 734_013_440


def test_fp8_manifest_counts():
    plan = make_plan(load_manifest(MANIFESTS / "dsv4-pro-wo_b-fp8.toml"))
    ms, world = 13, 8
    per_rank = sum(len(CALL[w]) + len(SELF_TEST[w]) for w in (("fp8", "lsa"), ("fp8", "sdma")))
    assert plan.instances == ms * world * per_rank == 2288
    by_kind = plan.distinct_by_kind()
    # The two wires are two windows: everything M-dependent is per wire, the
    # control-only phases (drain, gather_barrier) per rank.
    assert by_kind["fused-sdma:gemm"] == 2 * ms * world
    assert by_kind["sdma-phases:quantize"] == 2 * ms * world
    assert by_kind["sdma-phases:pull"] == ms * world
    assert by_kind["sdma-phases:dequantize"] == ms * world
    assert by_kind["sdma-phases:drain"] == world
    assert by_kind["sdma-phases:gather_barrier"] == world
    assert len(plan.specs) == 1160


def test_smoke_manifest_counts():
    plan = make_plan(load_manifest(MANIFESTS / "smoke.toml"))
    by_kind = plan.distinct_by_kind()
    # Windows at world 2 (N 1024): bf16 blockscale (M 256, 512; K 256 and 512 share it), fp8/lsa,
    # fp8/sdma and mxfp8 bf16 at M 512; (N 2048) mxfp8 bf16 at M 1024; world 4: bf16 at M 512.
    # fused GEMMs: one per (M, K, window, rank).
    assert by_kind["fused-sdma:gemm"] == (4 + 1 + 1 + 1 + 1) * 2 + 4
    assert by_kind["fused-lsa:gemm"] == 2
    # Phases do not depend on K; split-sdma and fused-lsa sit in the first window at M 512, so
    # they share its scatter and gather (fused-lsa's reduce reads its own slice from the recv slot).
    assert by_kind["sdma-phases:reduce"] == (2 + 1 + 1 + 1 + 1) * 2 + 4 + 2
    assert by_kind["sdma-phases:gather"] == (2 + 1 + 1 + 1) * 2 + 4
    assert by_kind["sdma-phases:scatter"] == (2 + 1 + 1 + 1 + 1) * 2 + 4
    assert by_kind["sdma-phases:drain"] == 2 + 4  # (world, rank, queues) alone: every window's
    assert by_kind["sdma-phases:gather_barrier"] == 2
    assert by_kind["sdma-phases:pull"] == 2
    assert by_kind["sdma-phases:dequantize"] == 2
    # One unfused GEMM per rank shared by split-sdma and split-lsa (mori's benchmark builds it per
    # rank), plus Mxfp8GemmOp's narrow (M=256) and wide (M=9216) tiles; one all-reduce per rank;
    # one skinny GEMM per bucket (1 and 32).
    assert by_kind["gemm-only:gemm"] == 2 + 2
    assert by_kind["split-lsa:lsa_ar"] == 2
    assert by_kind["gemv:gemv"] == 2


#: Per-call and self-test sequences of every mode on the bf16 wire (the PR's modes, section 2 of the spec).
MODE_SEQUENCES = {
    "fused-sdma": (["gemm", "drain", "reduce", "gather"], ["scatter", "reduce", "gather"]),
    "split-sdma": (["gemm", "scatter", "reduce", "gather"], ["scatter", "reduce", "gather"]),
    "fused-lsa": (["gemm", "drain", "reduce", "gather"], ["scatter", "reduce", "gather"]),
    "split-lsa": (["gemm", "lsa_ar"], ["lsa_ar"]),
    "gemm-only": (["gemm"], []),
    "gemv": (["gemv"], []),
}

COMPARISON = """
[[tuple]]
transport = "{mode}"
m = {m}
n = 1024
k = 256
world = 2
quant = "{quant}"
"""


def _one_mode(mode: str, m: int = 512, quant: str = "blockscale"):
    quant = "mxfp8" if mode in ("gemm-only", "gemv") else quant
    return make_plan(parse_manifest(COMPARISON.format(mode=mode, m=m, quant=quant), "c.toml"))


def test_every_mode_plans_its_sequence():
    for mode, (call, self_test) in MODE_SEQUENCES.items():
        plan = _one_mode(mode, m=16 if mode == "gemv" else 512)
        for r in plan.tuples[0].ranks:
            assert [s.kind for s in r.launches] == call, mode
            assert [s.kind for s in r.self_test] == self_test, mode


def test_modes_share_what_is_the_same_kernel():
    one = {mode: {s.spec_id: s for s in _one_mode(mode).specs} for mode in ("fused-sdma", "split-sdma",
                                                                             "fused-lsa", "split-lsa")}
    mxfp8_wide = {s.spec_id for s in _one_mode("gemm-only", m=9216).specs}
    # split-sdma's per-call kernels are fused-sdma's self-test plus the unfused GEMM.
    assert set(one["split-sdma"]) - set(one["fused-sdma"]) == {
        i for i, s in one["split-sdma"].items() if s.kind == "gemm"}
    # Both split modes run the same unfused GEMMs: one per rank with the tuple's queue count (1),
    # as mori's benchmark builds them (rank and queues are in the kernel's name).
    gemm = lambda mode: {i for i, s in one[mode].items() if s.kind == "gemm"}  # noqa: E731
    assert gemm("split-sdma") == gemm("split-lsa") and len(gemm("split-lsa")) == 2
    split = sorted((s for s in one["split-lsa"].values() if s.kind == "gemm"), key=lambda s: s.rank)
    assert [(s.rank, s.param_dict()["builder"]["sdma_queues"]) for s in split] == [(0, 1), (1, 1)]
    # At mxfp8 rank 0's differs from Mxfp8GemmOp's wide tile in the queue count alone (its 8).
    split_mx = [s for s in _one_mode("split-sdma", quant="mxfp8").specs if s.kind == "gemm" and s.rank == 0][0]
    wide = [s for s in _one_mode("gemm-only", m=9216).specs if s.spec_id in mxfp8_wide][0]
    b_split, b_wide = split_mx.param_dict()["builder"], wide.param_dict()["builder"]
    assert {k for k in b_wide if b_wide[k] != b_split[k]} == {"sdma_queues"} and b_wide["sdma_queues"] == 8
    assert split_mx.param_dict()["cfg"] == wide.param_dict()["cfg"]
    # fused-lsa differs from fused-sdma in its GEMMs (transport lsa) and its reduce only.
    diff = {(s.kind, s.rank) for i, s in one["fused-lsa"].items() if i not in one["fused-sdma"]}
    assert diff == {("gemm", 0), ("gemm", 1), ("reduce", 0), ("reduce", 1)}
    lsa_gemm = [s for s in one["fused-lsa"].values() if s.kind == "gemm"][0].param_dict()["builder"]
    assert (lsa_gemm["fuse"], lsa_gemm["transport"]) == (True, "lsa")
    lsa_reduce = [s for s in one["fused-lsa"].values() if s.kind == "reduce"][0].param_dict()["builder"]
    assert lsa_reduce["reduce_self_from_recv"] is True


def test_gemv_buckets_and_configs():
    text = COMPARISON.format(mode="gemv", m="[1, 2, 3, 4, 5, 8, 9, 16, 17, 32]", quant="mxfp8")
    plan = make_plan(parse_manifest(text.replace("n = 1024", "n = 5120").replace("k = 256", "k = 2048"), "g.toml"))
    assert [t.workload.m for t in plan.tuples] == [1, 2, 4, 8, 16, 32]
    cfgs = {t.workload.m: t.ranks[0].launches[0].param_dict()["config"] for t in plan.tuples}
    # mori 1.2.4's tuned wo_b table (N 5120, K 2048); bucket 32 carries 32 tokens.
    assert cfgs[1] == {"waves": 16, "steps": 1, "rows": 32, "tokens": 16, "ksplit": True}
    assert cfgs[32]["tokens"] == 32
    # An untuned shape runs the heuristic, widened to 32 tokens above 16.
    untuned = make_plan(parse_manifest(COMPARISON.format(mode="gemv", m="[16, 32]", quant="mxfp8"), "u.toml"))
    got = [t.ranks[0].launches[0].param_dict()["config"] for t in untuned.tuples]
    assert got == [{"waves": 4, "steps": 2, "rows": 16, "tokens": 16, "ksplit": True},
                   {"waves": 4, "steps": 2, "rows": 16, "tokens": 32, "ksplit": True}]


def test_plan_carries_the_manifest_warnings():
    plan = make_plan(parse_manifest(COMPARISON.format(mode="fused-sdma", m="[300, 512]", quant="blockscale"),
                                    "w.toml"))
    assert len(plan.warnings) == 1 and "both pad to 512" in plan.warnings[0]
    assert plan.to_json()["warnings"] == list(plan.warnings)


def test_mode_comparison_manifest_counts():
    plan = make_plan(load_manifest(MANIFESTS / "dsv4-pro-wo_b-modes.toml"))
    assert {t.workload.transport for t in plan.tuples} == {"fused-sdma", "split-sdma", "split-lsa", "fused-lsa",
                                                           "gemv"}
    assert plan.distinct_by_kind() == {
        "fused-sdma:gemm": 8, "fused-lsa:gemm": 8, "gemm-only:gemm": 8, "gemv:gemv": 6,
        "sdma-phases:drain": 8, "sdma-phases:gather": 8, "sdma-phases:scatter": 8,
        "sdma-phases:reduce": 16,  # fused-lsa's reads its own slice from its recv slot
        "split-lsa:lsa_ar": 8,
    }
    assert plan.warnings == ()


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


def test_plan_cli_prints_the_warnings(tmp_path):
    from click.testing import CliRunner

    from gemmar_aot.cli import main

    path = tmp_path / "w.toml"
    path.write_text(COMPARISON.format(mode="fused-sdma", m="{ start = 300, stop = 1000, step = 212 }",
                                      quant="blockscale"))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    assert f"warning: {path}: tuple[0] (line 2): m = {{ start = 300, stop = 1000, step = 212 }}: stop 1000 " \
           "is not start + a multiple of step; the last M is 936" in result.stderr
    assert f"warning: {path}: tuple[0] (line 2): m = 300 and m = 512 both pad to 512" in result.stderr
    as_json = CliRunner().invoke(main, ["plan", str(path), "--json"])
    import json

    assert len(json.loads(as_json.stdout)["warnings"]) == 2


def test_build_cli_prints_the_warnings_before_it_starts(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from gemmar_aot.cli import main

    path = tmp_path / "w.toml"
    path.write_text(COMPARISON.format(mode="fused-sdma", m="[300, 512]", quant="blockscale"))
    # No toolchain: the build stops at its first step, after the warnings were shown.
    monkeypatch.setenv("GEMMAR_AOT_TOOLCHAIN", str(tmp_path / "no-toolchain"))
    result = CliRunner().invoke(main, ["build", str(path), "--store", str(tmp_path / "store"), "-q"])
    assert result.exit_code != 0
    assert result.stderr.startswith(f"warning: {path}: tuple[0] (line 2): m = 300 and m = 512 both pad to 512")


def test_every_planned_tuple_is_the_sequence_the_runtime_checks_locks_against():
    """launch_sequence is the runtime's table: every tuple of every shipped manifest, each rank,
    plans exactly it (the recipes and the table cannot drift apart)."""
    from gemmar_aot.model import launch_sequence

    seen = set()
    for path in sorted((Path(__file__).resolve().parent.parent / "manifests").glob("*.toml")):
        for t in make_plan(load_manifest(path)).tuples:
            w = t.workload
            for r in t.ranks:
                assert launch_sequence.sequence_problems(
                    w.transport, w.gather_dtype, w.gather_transport, r.rank,
                    [_Planned(s) for s in r.launches], [_Planned(s) for s in r.self_test]) == [], (path, w)
            seen.add((w.transport, w.gather_dtype, w.gather_transport))
    assert {m for m, _, _ in seen} == set(MODE_SEQUENCES)


class _Planned:
    """A planned spec seen as a lock entry is (kind, launch.kernel): a plan has no symbols yet."""

    def __init__(self, spec):
        self.kind = spec.kind
        self.launch = type("L", (), {"kernel": ""})()
