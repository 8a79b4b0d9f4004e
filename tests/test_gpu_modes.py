"""GPU tier: the PR's five-mode comparison from our artifacts only (bench/bench_modes.py).

Needs 8 gfx950 GPUs and mori's communicator; skips elsewhere with its reason. Artifacts:
``$GEMMAR_AOT_MODES_ARTIFACTS`` (a store or lock holding manifests/dsv4-pro-wo_b-modes.toml)
if set, else that manifest is built into a temporary store first. Prints the table of our
numbers beside the PR's; asserts that every mode ran, passed its self-test and agrees with
the others, not a speed (speeds live in BENCHMARKS.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_modes", ROOT / "bench" / "bench_modes.py")
bench_modes = importlib.util.module_from_spec(_spec)
sys.modules["bench_modes"] = bench_modes  # spawned ranks unpickle _rank_main from here
_spec.loader.exec_module(bench_modes)

SKIP_REASON = bench_modes.skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(SKIP_REASON is not None, reason=f"GPU benchmark skipped: {SKIP_REASON}"),
]


@pytest.fixture(scope="module")
def modes_artifacts(tmp_path_factory) -> str:
    env = os.environ.get("GEMMAR_AOT_MODES_ARTIFACTS")
    if env:
        return env
    from gemmar_aot.builder.pipeline import run_build

    out = tmp_path_factory.mktemp("modes-store")
    summary = run_build(bench_modes.MANIFEST, store=out, progress=False)
    assert summary["failed"] == 0, summary["failures"]
    return str(out)


def test_pr_mode_comparison_from_our_artifacts(modes_artifacts, tmp_path, capsys):
    res = bench_modes.run(modes_artifacts, out_dir=tmp_path,
                          timeout_s=float(os.environ.get("GEMMAR_AOT_GPU_TIMEOUT", "1800")))
    with capsys.disabled():
        print("\n" + bench_modes.format_table(res))
    assert set(res["us"]) == set(bench_modes.PUBLISHED_US)
    assert all(us > 0 for us in res["us"].values())
    for mode, rel in res["rel_l2_vs_split_lsa"].items():
        assert rel <= bench_modes.AGREE_REL_L2, f"{mode} disagrees with split-lsa: relL2 {rel:.3g}"
    assert sorted(res["gemv_us"]) == [1, 2, 4, 8, 16, 32]
