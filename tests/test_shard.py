"""--shard I/N: disjoint, covering, deterministic, cost-balanced shares of the distinct specs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gemmar_aot.compiler.scheduler import expected_cost
from gemmar_aot.builder.manifest import load_manifest
from gemmar_aot.builder.plan import make_plan
from gemmar_aot.builder.shard import ShardError, parse_shard, partition, select
from gemmar_aot_kernels import recipe_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", params=["smoke.toml", "dsv4-pro-wo_b.toml"])
def specs(request):
    return make_plan(load_manifest(ROOT / "manifests" / request.param)).specs


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_shares_are_disjoint_cover_the_plan_and_keep_build_groups_together(specs, n):
    shares = partition(specs, n)
    ids = [s.spec_id for sh in shares for s in sh]
    assert sorted(ids) == sorted(s.spec_id for s in specs) and len(set(ids)) == len(ids)
    where = {}
    for i, sh in enumerate(shares):
        for s in sh:
            g = recipe_module(s.recipe).build_group(s)
            if g:
                assert where.setdefault(g, i) == i, f"build group {g} split across shares"
    assert [s.spec_id for s in select(specs, 1, n)] == [s.spec_id for s in specs if s in set(shares[0])]


def test_the_split_ignores_order_and_balances_cost(specs):
    shuffled = list(specs)
    random.Random(7).shuffle(shuffled)
    assert partition(shuffled, 4) == partition(specs, 4)
    loads = [sum(expected_cost(s) for s in sh) for sh in partition(specs, 4)]
    heaviest_unit = max(expected_cost(s) for s in specs) * 4  # a build group is at most a few phases
    assert max(loads) - min(loads) <= heaviest_unit
    gemms = [sum(s.kind == "gemm" for s in sh) for sh in partition(specs, 4)]
    assert max(gemms) - min(gemms) <= 1 + max(gemms) // 4


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "a/b", "2", "", "-1/4"])
def test_bad_shard_values_say_what_is_expected(text):
    with pytest.raises(ShardError, match="1/4"):
        parse_shard(text)


def test_parse_shard():
    assert parse_shard("3/4") == (3, 4) and parse_shard(" 1 / 1 ") == (1, 1)
