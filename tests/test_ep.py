"""mori's EP dispatch/combine v2 built ahead of time: the ``[[ep]]`` manifest table, the plan, and
the recipe, held against mori's own op.

The oracle is mori 1.2.4's ``EpDispatchCombineOpFlyDSL`` itself, constructed on this host by
``tests/ep_oracle.py`` (test doubles for the device identity, the CPU allocation and the cco
window, each named there): what it resolves (geometry, schedule, variants, window offsets), the
keyword arguments it passes to each of its factories, and -- compiled through FlyDSL's own path
-- the code objects. Nothing of ours decides what is expected.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gemmar_aot.builder.manifest import parse_manifest
from gemmar_aot.builder.plan import make_plan
from gemmar_aot.util.errors import ManifestError
from gemmar_aot.model.ep import EpConfig, arena_layout, config_problems, pick, resolved, variants
from gemmar_aot_kernels import ep as recipe

ROOT = Path(__file__).resolve().parent.parent
EP_MANIFEST = ROOT / "manifests" / "dsv4-pro-ep.toml"
ORACLE = Path(__file__).resolve().parent / "ep_oracle.py"

ENTRY = """[[ep]]
world = 8
hidden = 7168
max_tokens = 4096
experts = 256
topk = 8
dispatch_dtype = "bf16"
device = "MI355X"
"""


def oracle(configs: list[dict], *, compile: bool = False, profile: str = "default") -> list[dict]:
    import os

    env = {**os.environ, "GEMMAR_AOT_TOOLCHAIN_PROFILE": profile}
    p = subprocess.run([sys.executable, str(ORACLE), json.dumps({"configs": configs, "compile": compile})],
                       capture_output=True, text=True, cwd=ROOT, timeout=1200, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def mori_fields(c: EpConfig, rank: int = 0) -> dict:
    """mori's config fields for ``c``."""
    a = {"rank": rank, "world_size": c.world, "hidden_dim": c.hidden, "max_num_inp_token_per_rank": c.max_tokens,
         "num_experts_per_rank": c.experts // c.world, "num_experts_per_token": c.topk,
         "data_type": c.dispatch_dtype, "combine_data_type": c.combine_dtype, "quant_type": c.quant_type,
         "combine_mode": c.combine_mode, "scale_dim": c.scale_dim, "scale_type_size": c.scale_type_size,
         "max_total_recv_tokens": c.max_total_recv_tokens, "enable_std_moe": c.std_moe, "replay": c.replay}
    return a


def _refused(text: str) -> list[str]:
    with pytest.raises(ManifestError) as e:
        parse_manifest(text, "m.toml")
    return e.value.problems


# ---- the manifest ----

def test_ep_entry_parses_with_moris_defaults():
    m = parse_manifest(ENTRY, "m.toml")
    (e,) = m.eps
    c = e.config
    assert (c.combine_dtype, c.combine_mode, c.quant_type, c.replay, c.std_moe) == ("bf16", "gather", "none", True,
                                                                                      False)
    assert c.experts_per_rank == 32 and c.recv_cap == 8 * 4096 and e.source == "m.toml:ep[0] (line 1)"
    assert m.workloads == ()


@pytest.mark.parametrize("edit, field, words", [
    ("gpu_per_node = 4", "gpu_per_node", "selects the internode path, which only the 'hip' backend implements"),
    ('quant_type = "fp4_blockwise"', "quant_type", "is the hip backend's gfx125x combine"),
    ('dispatch_dtype = "fp8_e4m3fn"\ncombine_mode = "scatter"', "combine_mode", "plain fp4/fp8 token dtype is "
                                                                                "gather-only"),
    ('combine_dtype = "fp4"', "combine_dtype", "asymmetric combine dtype does not support fp4"),
    ("hidden = 7164", "hidden", "per-token transport bytes must be 16 B aligned"),
    ('dispatch_dtype = "fp32"\nstd_moe = true', "std_moe", "StdMoE convert path is bf16-only"),
    ('device = "MI300X"', "device", "device must be one of"),
    ("experts = 250", "experts", "split evenly over the 8 ranks"),
    ("flavour = 1", "flavour", "unknown key flavour"),
], ids=["internode", "fp4-quant", "fp8-scatter", "fp4-combine", "hidden", "std-moe", "device", "experts", "key"])
def test_ep_entry_mori_refuses_is_refused_with_its_reason_line_and_fix(edit, field, words):
    lines = [ln for ln in ENTRY.splitlines() if not any(ln.startswith(e.split(" = ")[0] + " ")
                                                         for e in edit.splitlines())]
    problems = _refused("\n".join(lines + edit.splitlines()) + "\n")
    assert len(problems) == 1, problems
    assert problems[0].startswith("m.toml: ep[0] (line 1): ") and words in problems[0], problems
    assert (field + " = ") in problems[0] or "unknown key" in problems[0]


def test_ep_manifest_without_tuples_or_eps_is_refused():
    assert "there is no [[tuple]]" in _refused('[manifest]\nname = "x"\n')[0]


def test_ep_repeated_entry_is_built_once_and_warned():
    m = parse_manifest(ENTRY + "\n" + ENTRY, "m.toml")
    assert len(m.eps) == 1 and "repeats ep[0] (line 1); it is built once" in m.warnings[0]


def test_ep_entries_count_in_the_manifest_bound():
    text = "".join(ENTRY.replace("max_tokens = 4096", f"max_tokens = {64 * (i + 1)}") for i in range(80))
    problems = _refused(text)
    assert "kernel compiles" in problems[0] and "8192" in problems[0]


# ---- the plan ----

def test_ep_plan_of_the_shipped_manifest_is_every_rank_of_every_variant():
    plan = make_plan(parse_manifest(EP_MANIFEST.read_text(), str(EP_MANIFEST)))
    first = plan.eps[0]
    assert [len(r.launches) for r in first.ranks] == [13] * 8
    kinds = [s.kind for s in first.ranks[0].launches]
    assert kinds == ["dispatch"] * 4 + ["combine"] * 4 + ["dispatch_replay"] * 4 + ["local_expert_count"]
    # a rank's kernels differ from another's by the rank alone
    for a, b in zip(first.ranks[0].launches, first.ranks[3].launches):
        pa, pb = a.param_dict(), b.param_dict()
        assert pa["kwargs"].pop("rank") == 0 and pb["kwargs"].pop("rank") == 3 and pa == pb
    # the fp8 entry shares no kernel with the bf16 one but its local expert counts
    second = {s.spec_id for r in plan.eps[1].ranks for s in r.launches}
    shared = {s.kind for r in first.ranks for s in r.launches if s.spec_id in second}
    assert shared == {"local_expert_count"}
    assert len(plan.specs) == 104 + 88 - 8


def test_ep_pick_follows_the_schedule_and_clamps():
    c = resolved(EpConfig(8, 7168, 4096, 256, 8, "bf16", "bf16"))
    assert pick(c, 1) == ((128, 8), (32, 8))
    assert pick(c, 200) == ((96, 8), (64, 8))
    assert pick(c, 4096) == ((160, 8), (32, 16))
    assert pick(c, 5000) == ((128, 16), (48, 16))  # the open bucket
    s = resolved(EpConfig(8, 7168, 4096, 256, 8, "bf16", "bf16", quant_type="fp8_direct_cast"))
    assert variants(s)[1] == ((48, 16),) and pick(s, 1)[1] == (48, 16)  # scatter: one combine, clamped to it


#: Configurations held against mori's constructor: worlds 2/4/8, each dtype and mode mori's FlyDSL
#: backend serves, scales, capped receive slots, StdMoE, the topk-6 table row, and refusals.
CONFIGS = [
    EpConfig(8, 7168, 4096, 256, 8, "bf16", "bf16"),
    EpConfig(8, 7168, 256, 384, 6, "fp4", "bf16"),
    EpConfig(8, 7168, 128, 256, 8, "fp8_e4m3fn", "bf16", scale_dim=56, scale_type_size=4),
    EpConfig(8, 7168, 128, 256, 8, "fp4", "fp4"),
    EpConfig(2, 1024, 64, 8, 2, "bf16", "bf16", std_moe=True),
    EpConfig(4, 2048, 96, 16, 4, "fp32", "fp32", max_total_recv_tokens=200),
    EpConfig(4, 2048, 64, 16, 4, "bf16", "bf16", quant_type="fp8_direct_cast", combine_mode="scatter"),
    EpConfig(2, 2048, 64, 8, 2, "bf16", "bf16", quant_type="fp8_blockwise", combine_mode="scatter"),
    EpConfig(4, 1024, 64, 16, 4, "fp8_e4m3fnuz", "fp8_e4m3fnuz", replay=False),
    EpConfig(2, 1024, 64, 8, 2, "fp8_e4m3fn", "fp8_e4m3fn", combine_mode="scatter"),  # mori refuses
    EpConfig(2, 1024, 64, 8, 2, "fp4", "bf16", std_moe=True),  # mori refuses
]


def test_ep_model_and_recipe_equal_moris_constructor():
    """For each configuration: mori refuses exactly what we refuse; otherwise its geometry, schedule,
    variants, window offsets and receive slots are ours, and every factory call it makes (replay's
    included) has exactly the keyword arguments of one of our specs, one for one."""
    theirs = oracle([mori_fields(c) for c in CONFIGS])
    for c, t in zip(CONFIGS, theirs):
        c = resolved(c)
        ours = config_problems(c)
        if "refused" in t:
            assert ours, (c, t["refused"])
            continue
        assert not ours, (c, ours)
        disp, comb = variants(c)
        a = arena_layout(c)
        assert t["geometry"] == list(c.geometry) and t["schedule"] == [list(b) for b in c.schedule], c
        assert t["dispatch_specs"] == [list(v) for v in disp] and t["combine_specs"] == [list(v) for v in comb], c
        assert t["offsets"] == {n: off for n, off, _ in a.regions} and t["total"] == a.total, c
        assert t["recv_cap"] == c.recv_cap and t["combine_mode"] == c.combine_mode, c
        specs = recipe.specs(c, 0)
        ours_calls = sorted(json.dumps([s.param_dict()["factory"], s.param_dict()["kwargs"]], sort_keys=True)
                            for s in specs)
        their_calls = sorted(json.dumps([k["factory"], k["kwargs"]], sort_keys=True) for k in t["kernels"])
        assert ours_calls == their_calls, c


# ---- the code objects ----

@pytest.fixture(scope="module")
def ep_build(tmp_path_factory):
    """The shipped EP manifest's first entry built by our build into a store of its own."""
    from gemmar_aot.builder.pipeline import run_build

    tmp = tmp_path_factory.mktemp("ep")
    text = EP_MANIFEST.read_text()
    first = text[: text.index("[[ep]]", text.index("[[ep]]") + 1)]
    manifest = tmp / "dsv4-pro-ep-first.toml"
    manifest.write_text(first)
    summary = run_build(manifest, store=tmp / "store", jobs=2, progress=False)
    return summary, tmp / "store", make_plan(parse_manifest(first, str(manifest)))


@pytest.mark.compile
def test_ep_bytes_equal_moris_own_path_for_every_rank_and_variant(ep_build):
    from gemmar_aot.compiler.keys import action_key, ingredients
    from gemmar_aot.store import Store
    from gemmar_aot.toolchain import load_toolchain

    summary, store, plan = ep_build
    assert summary["failed"] == 0 and summary["compiled"] == summary["distinct_specs"] == 104
    st = Store(store, readonly=True)
    fp = load_toolchain().fingerprint
    (e,) = plan.eps
    theirs = oracle([mori_fields(e.entry.config, rank) for rank in range(8)], compile=True)
    compared = 0
    for r, t in zip(e.ranks, theirs):
        by_call = {json.dumps([k["factory"], k["kwargs"]], sort_keys=True): k for k in t["kernels"]}
        assert len(by_call) == len(r.launches) == 13
        for s in r.launches:
            p = s.param_dict()
            k = by_call[json.dumps([p["factory"], p["kwargs"]], sort_keys=True)]
            rec, code = st.load(action_key(ingredients(s, fp)))
            assert (rec["blob"]["hash"], len(code)) == (k["sha256"], k["size"]), s.label()
            launch = rec["launch"]
            # the launch geometry derived from the code object is the variant's
            assert launch["grid"] == [p["kwargs"]["block_num"], 1, 1], s.label()
            assert launch["block"] == [p["kwargs"]["warp_num_per_block"] * 64, 1, 1], s.label()
            compared += 1
    assert compared == 104
    # the rank is compiled in, the symbol is not: identity must come from the record
    d0, d3 = (st.load(action_key(ingredients(e.ranks[r].launches[0], fp))) for r in (0, 3))
    assert d0[1] != d3[1] and d0[0]["launch"]["kernel"] == d3[0]["launch"]["kernel"] == "ep_dispatch_0"


@pytest.mark.compile
def test_ep_bytes_equal_moris_own_path_under_the_nightly_profile(ep_build, tmp_path):
    """mori's nightly drops ``reset_total_recv`` from both combines (its combine no longer zeroes
    the receive count, so its bytes differ): the plan for the nightly profile calls each factory
    exactly as that mori's own backend does, every record states that call and nothing else, and
    every kernel of rank 0 equals mori's own compile there too."""
    from test_profiles import _installed

    from gemmar_aot.builder.pipeline import run_build
    from gemmar_aot.compiler.keys import action_key, ingredients
    from gemmar_aot.store import Store
    from gemmar_aot.toolchain import load_toolchain

    _installed("nightly")
    summary, _store, plan = ep_build
    manifest = Path(summary["lock_file"]).parents[2] / "dsv4-pro-ep-first.toml"
    s = run_build(manifest, store=tmp_path / "nightly", jobs=2, progress=False, toolchain_profile="nightly")
    assert s["failed"] == 0 and s["compiled"] == 104
    tc = load_toolchain(profile="nightly")
    (e,) = make_plan(parse_manifest(manifest.read_text(), str(manifest)), mori_version=tc.profile.mori.version).eps
    (t,) = oracle([mori_fields(e.entry.config, 0)], compile=True, profile="nightly")
    st, fp = Store(tmp_path / "nightly", readonly=True), tc.fingerprint
    default_fp = load_toolchain().fingerprint
    theirs = {json.dumps([k["factory"], k["kwargs"]], sort_keys=True): k for k in t["kernels"]}
    changed = set()
    for spec, default_spec in zip(e.ranks[0].launches, plan.eps[0].ranks[0].launches, strict=True):
        p = spec.param_dict()
        k = theirs[json.dumps([p["factory"], p["kwargs"]], sort_keys=True)]  # exactly mori's own call
        rec, code = st.load(action_key(ingredients(spec, fp)))
        assert rec["spec"]["params"]["kwargs"] == k["kwargs"], spec.label()  # the record says that call
        assert rec["blob"]["hash"] == k["sha256"], spec.label()
        if Store(_store, readonly=True).load(action_key(ingredients(default_spec, default_fp)))[1] != code:
            changed.add(spec.kind)
        if spec.kind == "combine":  # 1.2.4's call, with the keyword its combine zeroes by
            assert default_spec.param_dict()["kwargs"] == {**p["kwargs"], "reset_total_recv": True}
    assert changed == {"combine"}  # the combine kernels are the ones the nightly changed


@pytest.mark.parametrize("profile", ["default", "nightly"])
def test_ep_specs_carry_exactly_the_keywords_the_profiles_mori_factories_take(profile):
    """Every EP spec planned for a profile names only keywords its mori's factory takes (read from
    that mori's own source, not from our table), so a record states the call its build made; the
    two pinned moris differ in the combine's ``reset_total_recv``, which only 1.2.4 takes."""
    import ast

    from test_profiles import _installed

    from gemmar_aot.model.ep import combine_zeroes_total_recv
    from gemmar_aot.toolchain.profiles import get_profile

    src = _installed(profile).mori_pkg / "ops" / "dispatch_combine_v2" / "intranode_kernels.py"
    takes = {f.name: {a.arg for a in f.args.args + f.args.kwonlyargs}
             for f in ast.parse(src.read_text()).body if isinstance(f, ast.FunctionDef) and f.name.startswith("make_")}
    version = get_profile(profile).mori.version
    mixed = ENTRY + 'combine_mode = "scatter"\nquant_type = "fp8_direct_cast"\n'  # make_combine_scatter too
    specs = [s for text in (ENTRY, mixed) for s in make_plan(parse_manifest(text, "m.toml"), mori_version=version).specs]
    factories = {s.param_dict()["factory"] for s in specs}
    assert factories >= {"make_dispatch", "make_combine", "make_combine_scatter", "make_local_expert_count"}
    for s in specs:
        p = s.param_dict()
        assert set(p["kwargs"]) <= takes[p["factory"]], (s.label(), sorted(set(p["kwargs"]) - takes[p["factory"]]))
    resets = {s.param_dict()["kwargs"].get("reset_total_recv") for s in specs if s.kind == "combine"}
    assert resets == ({True, False} if combine_zeroes_total_recv(version) else {None})
    assert ("reset_total_recv" in takes["make_combine"]) == combine_zeroes_total_recv(version)


# ---- the lock ----

@pytest.mark.compile
def test_ep_lock_names_every_rank_and_variant_in_the_recipes_order(ep_build):
    import dataclasses

    from gemmar_aot.compiler.keys import action_key, ingredients
    from gemmar_aot.model.lock import Lock, read_lock
    from gemmar_aot.store.record_index import lock_rank_groups
    from gemmar_aot.toolchain import load_toolchain

    summary, store, plan = ep_build
    path = Path(summary["lock_file"])
    data = path.read_bytes()
    lock = read_lock(path).check_parts()
    assert json.loads(data.split(b"\n")[0])["schema"] == 7 and lock.tuples == ()
    (le,), (pe,) = lock.eps, plan.eps
    assert le.config == pe.entry.config and le.arena == pe.arena and le.source.endswith(":ep[0] (line 17)")
    fp = load_toolchain().fingerprint
    for lr, pr in zip(le.ranks, pe.ranks, strict=True):
        assert [e.key for e in lr.launches] == [action_key(ingredients(s, fp)) for s in pr.launches]
        assert [e.kind for e in lr.launches] == [s.kind for s in pr.launches] and lr.self_test == ()
    assert len(lock.kernels()) == 104 and [len(g) for g in lock_rank_groups(lock)] == [13] * 8
    from gemmar_aot.package.wheel_layout import coverage

    assert coverage(lock) == [{"transport": "ep", **pe.entry.config.to_json(), "ranks": list(range(8))}]
    assert Lock.from_bytes(data).to_bytes() == data  # canonical: read back, written again, the same bytes
    # one schema, [[ep]] entries or not: a lock without them has an empty ep list
    assert {k: v for k, v in dataclasses.replace(lock, eps=()).to_json().items() if k in ("schema", "ep")} == \
        {"schema": 7, "ep": []}


@pytest.mark.compile
@pytest.mark.parametrize("edit, where", [
    (lambda h: h["ep"][0]["arena"].update(total=h["ep"][0]["arena"]["total"] + 256), "$.ep[0].arena"),
    (lambda h: h["ep"][0]["config"].update(hidden=7164), "$.ep[0].config.hidden"),
    (lambda h: h["ep"][0].update(ranks=list(range(7))), "$.ep[0].ranks"),
    (lambda h: h.pop("ep"), "$"),
], ids=["arena", "config", "ranks", "no ep"])
def test_ep_lock_whose_head_was_edited_is_refused_naming_the_place(ep_build, edit, where):
    from gemmar_aot.model.lock import Lock
    from gemmar_aot.model.schema import LockFileError

    summary, _store, _plan = ep_build
    head, rest = Path(summary["lock_file"]).read_bytes().split(b"\n", 1)
    h = json.loads(head)
    edit(h)
    with pytest.raises(LockFileError) as e:
        Lock.from_bytes(json.dumps(h, sort_keys=True, separators=(",", ":")).encode() + b"\n" + rest, "x.lock.json")
    assert f"x.lock.json: {where}" in str(e.value), str(e.value)


@pytest.mark.compile
def test_ep_closure_serves_a_fresh_runner_the_same_lock_in_two_requests(ep_build, nginx, tmp_path):
    """The remote cache covers EP with no special case: a seed build uploads the kernels and the
    closure, a fresh store gets every EP kernel (and its launcher) from one pack and writes the
    same lock bytes, and verifies clean."""
    from store_health import assert_verifies_clean
    from test_remote_build import _copy_store

    from gemmar_aot.builder.pipeline import run_build

    summary, store, _plan = ep_build
    manifest = Path(summary["lock_file"]).parents[2] / "dsv4-pro-ep-first.toml"
    seed = run_build(manifest, store=_copy_store(store, tmp_path / "seed"), jobs=2, progress=False, remote=nginx.url)
    assert seed["compiled"] == 0 and seed["uploads"] == 104 and seed["closure"]["uploaded"]
    fresh = run_build(manifest, store=tmp_path / "fresh", jobs=2, progress=False, remote=nginx.url)
    assert fresh["closure"]["status"] == "hit" and fresh["remote"]["requests"] == 2 and fresh["compiled"] == 0
    name = Path(summary["lock_file"]).name
    assert (tmp_path / "fresh" / "locks" / name).read_bytes() == Path(summary["lock_file"]).read_bytes()
    assert_verifies_clean(tmp_path / "fresh")
