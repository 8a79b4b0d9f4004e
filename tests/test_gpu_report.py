"""`make gpu-report` (bench/gpu_report.py): on a machine without GPUs it still writes both reports,
saying which tests were skipped and why; the comparison table renders the PR's numbers beside
a run's (checked with a result in bench_modes.py's own shape)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_report_of_a_machine_without_gpus_says_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the report would run the tier for real")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_report.py"), "--out", str(tmp_path), "--skip-bench"],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads((tmp_path / "gpu-report.json").read_text())
    assert r["counts"]["passed"] == r["counts"]["failed"] == 0 and r["counts"]["skipped"] >= 6
    assert any("test_pad_equals_mori_at_the_missing_m" in t["test"] for t in r["tests"])
    ep = [t for t in r["tests"] if "test_gpu_ep" in t["test"]]  # the EP8 round trips: eager, bitwise, graph
    assert len(ep) == 3 and any("cuda_graph" in t["test"] for t in ep)
    assert all("no GPU" in t["detail"] for t in r["tests"]) and "no GPU" in r["summary"]
    md = (tmp_path / "gpu-report.md").read_text()
    assert "| skipped |" in md and "Not run: --skip-bench" in md


def test_the_comparison_table_puts_the_pr_beside_ours():
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_modes import PUBLISHED_GEMV_US, PUBLISHED_US
    from gpu_report import markdown

    us = {m: v * 0.98 for m, v in PUBLISHED_US.items()}
    bench = json.loads(json.dumps({"us": us, "rel_l2_vs_split_lsa": {"fused-sdma": 1.5e-3},
                                   "gemv_us": {1: 4.0}, "published_us": PUBLISHED_US,
                                   "published_gemv_us": PUBLISHED_GEMV_US}))  # as read back from its JSON
    md = markdown({"when": "w", "commit": "c", "host": "h", "summary": "s", "tests": [], "bench": bench})
    assert f"| fused-sdma | {PUBLISHED_US['fused-sdma']} | {us['fused-sdma']:.1f} | 0.980 | 1.50e-03 |" in md
    assert f"| 1 | {PUBLISHED_GEMV_US[1]} | 4.00 |" in md
