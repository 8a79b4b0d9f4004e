"""Scheduling: expected costs, longest-first batches, and a worker killed mid-build."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gemmar_aot.compiler.scheduler import CostModel, LocalExecutor, Task, cost_class
from gemmar_aot.compiler.worker import CompileResult
from gemmar_aot.builder.manifest import load_manifest
from gemmar_aot.builder.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "smoke.toml"


def _tasks():
    """The smoke manifest's FlyDSL kernels (its hipcc and JIT v2 code objects never reach a FlyDSL worker)."""
    plan = make_plan(load_manifest(SMOKE))
    return [Task(s, f"{i:064x}", {}) for i, s in enumerate(plan.specs) if s.recipe not in ("hipcc", "jitv2")]


def test_cost_classes_separate_what_costs_differently():
    tasks = _tasks()
    classes = {cost_class(t.spec) for t in tasks}
    # one class per (recipe, kind), and an mxfp8 GEMM apart from a blockscale one
    assert len(classes) >= len({(t.spec.recipe, t.spec.kind) for t in tasks})
    gemm_recipes = {t.spec.recipe for t in tasks if t.spec.kind == "gemm"}
    assert {f"{r}:gemm" for r in gemm_recipes} & classes
    assert any(c.endswith(":gemm:mxfp8") for c in classes)


def test_recorded_costs_order_batches_longest_first(tmp_path):
    tasks = _tasks()
    costs = CostModel()
    # Pretend the last build measured drains as the slowest thing there is.
    drain = next(t.spec for t in tasks if t.spec.kind == "drain")
    costs.update([(drain, CompileResult(drain.spec_id, True, 50.0))])
    costs.save(tmp_path / "costs.json")
    loaded = CostModel.load(tmp_path / "costs.json")
    assert loaded.expected(drain) == 50.0
    ex = LocalExecutor(2, costs=loaded)
    batches = ex.batches(tasks)
    assert sorted(t.spec.spec_id for b in batches for t in b) == sorted(t.spec.spec_id for t in tasks)
    totals = [sum(loaded.expected(t.spec) for t in b) for b in batches]
    assert totals == sorted(totals, reverse=True)
    assert any(t.spec.kind == "drain" for t in batches[0])
    # With no record, GEMMs (mxfp8 the longest) lead.
    default = LocalExecutor(2).batches(tasks)
    assert default[0][0].spec.kind == "gemm" and cost_class(default[0][0].spec).endswith("mxfp8")


def test_costs_average_and_ignore_hits_and_failures():
    t = _tasks()[0].spec
    c = CostModel()
    c.update([(t, CompileResult(t.spec_id, True, 2.0)), (t, CompileResult(t.spec_id, True, 4.0)),
              (t, CompileResult(t.spec_id, True, 99.0, hit=True)), (t, CompileResult(t.spec_id, False, 99.0))])
    assert c.expected(t) == 3.0
    c.update([(t, CompileResult(t.spec_id, True, 6.0))])
    assert 3.0 < c.expected(t) < 6.0


def test_unreadable_cost_file_falls_back_to_defaults(tmp_path):
    p = tmp_path / "costs.json"
    p.write_text("{not json")
    t = _tasks()[0].spec
    assert CostModel.load(p).expected(t) == CostModel().expected(t)


@pytest.mark.compile
def test_a_killed_worker_loses_only_its_batch(tmp_path):
    """SIGKILL a busy worker: its specs are retried elsewhere and every spec still builds."""
    from gemmar_aot.compiler.keys import action_key, ingredients
    from gemmar_aot.toolchain import load_toolchain

    fp = load_toolchain().fingerprint
    plan = make_plan(load_manifest(SMOKE))
    phases = [s for s in plan.specs if s.kind != "gemm"][:12]
    tasks = [Task(s, action_key(ingredients(s, fp)), ingredients(s, fp)) for s in phases]
    killed = None
    results = {}
    with LocalExecutor(2) as ex:
        for spec, res in ex.run(tasks, str(tmp_path / "store")):
            results[spec.spec_id] = res
            if killed is None:
                busy = [w for w in ex._workers if w.batch]
                if busy:
                    killed = busy[0].proc.pid
                    os.kill(killed, signal.SIGKILL)
    assert killed is not None
    assert set(results) == {s.spec_id for s in phases}
    assert all(r.ok for r in results.values()), [r.error for r in results.values() if not r.ok]
