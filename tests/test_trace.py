"""``gemmar-aot build --trace``: a valid Chrome-trace/Perfetto file with every worker's phases."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent

SMALL = """
[manifest]
name = "traced"

[[tuple]]
transport = "fused-sdma"
m = [256, 512]
n = 1024
k = 256
world = 2
quant = "blockscale"
m_max = 512
"""


def test_trace_file_has_every_workers_phases(tmp_path):
    manifest = tmp_path / "traced.toml"
    manifest.write_text(SMALL)
    trace = tmp_path / "out" / "build.trace.json"
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(manifest), "--store",
                        str(tmp_path / "store"), "-j", "2", "--json", "-q", "--trace", str(trace)],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout)
    assert summary["trace"] == str(trace)
    doc = json.loads(trace.read_text())

    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["ph"] for e in events} <= {"X", "M"}
    for e in spans:
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
    named = {e["pid"] for e in meta if e["name"] == "process_name"}
    assert {e["pid"] for e in spans} <= named

    by_pid: dict[int, list[dict]] = defaultdict(list)
    for e in spans:
        by_pid[e["pid"]].append(e)
    workers = {pid: evs for pid, evs in by_pid.items() if any(e["name"] == "import" for e in evs)}
    assert 1 <= len(workers) <= 2
    per_phase = defaultdict(int)
    for pid, evs in workers.items():
        evs.sort(key=lambda e: e["ts"])
        assert [e["name"] for e in evs].count("import") == 1 and evs[0]["name"] == "import"
        # One worker does one thing at a time, and each spec goes trace -> compile -> store.
        for a, b in zip(evs, evs[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1.0, (a, b)
        names = [e["name"] for e in evs[1:]]
        assert names == ["trace", "compile", "store"] * (len(names) // 3), names
        for n in names:
            per_phase[n] += 1
        for e in evs[1:]:
            assert e["args"]["spec"]
    assert per_phase == {"trace": summary["compiled"], "compile": summary["compiled"],
                         "store": summary["compiled"]}
    main = [pid for pid in by_pid if pid not in workers]
    assert len(main) == 1
    assert {"plan", "keys", "store look-ups", "compile (waiting on workers)", "lock file"} <= {
        e["name"] for e in by_pid[main[0]]}
