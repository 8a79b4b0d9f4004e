"""bench/report.py: BENCHMARKS.md's table is what the result files say, and a bad index is refused.

Reads JSON and Markdown only: no builds, no timing, so it is as fast on any machine."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "report.py"


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def copy(tmp_path) -> Path:
    """A checkout-shaped copy: BENCHMARKS.md and bench/results/."""
    shutil.copy(ROOT / "BENCHMARKS.md", tmp_path / "BENCHMARKS.md")
    shutil.copytree(ROOT / "bench" / "results", tmp_path / "bench" / "results")
    return tmp_path


def _replace_in_index(root: Path, old: str, new: str) -> None:
    index = root / "bench" / "results" / "index.toml"
    text = index.read_text()
    assert text.count(old) >= 1, old
    index.write_text(text.replace(old, new, 1))


def test_benchmarks_md_is_what_report_writes():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr


def test_a_path_that_does_not_resolve_is_refused_naming_entry_file_and_path(copy, capsys):
    _replace_in_index(copy, '"per_call_us.padded_3072"', '"per_call_us.padded_3073"')
    assert _report().main(["--check", "--root", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "a padded call, M=3072" in err
    assert "pad-2026-12-03-1ea4306.json" in err
    assert "per_call_us.padded_3073" in err and "padded_3072" in err  # the keys that are there
    assert "index.toml" in err


def test_a_missing_result_file_is_refused_naming_entry_and_file(copy, capsys):
    _replace_in_index(copy, 'file = "closure-2026-12-05-3d1f324.json"',
                      'file = "closure-2026-12-03-0000000.json"')
    assert _report().main(["--check", "--root", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "a fresh runner's build from the closure" in err
    assert "closure-2026-12-03-0000000.json" in err and "does not exist" in err


def test_a_stale_table_fails_check_and_is_rewritten(copy, capsys):
    report = _report()
    target = copy / "BENCHMARKS.md"
    before = target.read_text()
    target.write_text(before.replace("**423 us**", "**400 us**", 1))
    assert report.main(["--check", "--root", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "BENCHMARKS.md" in err and "run python bench/report.py" in err
    assert report.main(["--root", str(copy)]) == 0
    assert target.read_text() == before


def test_paths_address_keys_with_dots_and_slashes_and_list_indexes():
    report = _report()
    data = {"arms": {"/work/main": {"x": 1.5}, ".": {"y": [3, 4]}}}
    assert report.resolve(data, ["arms", "/work/main", "x"], "t") == 1.5
    assert report.resolve(data, ["arms", ".", "y", 1], "t") == 4
    assert report.resolve({"a": {"b": [5, 6]}}, "a.b.0", "t") == 5
    with pytest.raises(report.ReportError, match="not a number"):
        report.resolve(data, ["arms", "."], "t")
