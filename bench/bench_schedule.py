"""The scheduling model: predict a build's wall time at N workers from a recorded build.

Input: one or more ``gemmar-aot build --trace FILE`` timelines. From each it takes

* the per-spec compile times (trace + compile + store of every spec, wall; and each
  spec's CPU seconds as the worker measured it),
* worker start-up (the ``import`` span: wall, and CPU),
* the main process's serial time before the first worker starts (manifest, plan,
  toolchain, keys; the look-ups after the first miss overlap start-up) and after the last
  kernel (dictionary repack, lock file): wall, and the main thread's CPU.

and predicts, for N workers, what the build does: every worker starts at once and takes
``startup``; then list scheduling in the executor's order (batches by expected cost,
longest first: the class means of the same build), each task going to the worker that
frees first; then the serial tail:

    T(N) = pre + startup + makespan_LPT(tasks, N) + post

The ``wall`` basis uses the recorded wall times (what this machine did, load included),
the ``cpu`` basis the CPU seconds (what an idle core would take; the right basis on a shared
machine, and for predicting other worker counts). Efficiency at N is speedup over one
worker divided by N: T(1) / (N * T(N)). Each input trace's own measured wall time is
printed next to the prediction for its worker count, and every trace predicts the others'.

    .venv/bin/python bench/bench_schedule.py --trace j1.json --trace j2.json \\
        --workers 1,2,8,16,64 --json-out bench/results/schedule-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json
"""

from __future__ import annotations

import argparse
import heapq
import json
from collections import defaultdict
from pathlib import Path


def load_trace(path: str) -> dict:
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    main_pid = next(e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
                    and "main" in e["args"]["name"])
    imports = [e for e in spans if e["name"] == "import"]
    per_spec: dict[str, dict] = {}
    for e in spans:
        if e["pid"] == main_pid or e["name"] == "import":
            continue
        a = e["args"]
        s = per_spec.setdefault(a["spec_id"], {"wall": 0.0, "cpu": a.get("spec_cpu_s", 0.0),
                                               "cls": a.get("cost_class", "?"), "start": e["ts"]})
        s["wall"] += e["dur"] / 1e6
        s["start"] = min(s["start"], e["ts"])
    worker_spans = [e for e in spans if e["pid"] != main_pid]
    first_worker = min(e["ts"] for e in imports) / 1e6
    last_worker = max(e["ts"] + e["dur"] for e in worker_spans) / 1e6
    main_spans = [e for e in spans if e["pid"] == main_pid and e["tid"] == main_pid]
    main_end = max(e["ts"] + e["dur"] for e in main_spans) / 1e6

    def cpu(e):  # the main thread's CPU in a phase (older traces: its wall time)
        return e.get("args", {}).get("cpu_s", e["dur"] / 1e6)

    pre_cpu = sum(cpu(e) for e in main_spans if (e["ts"] + e["dur"]) / 1e6 <= first_worker + 1e-6)
    post_cpu = sum(cpu(e) for e in main_spans if e["ts"] / 1e6 >= last_worker - 1e-6)
    return {
        "path": path,
        "jobs": doc["otherData"].get("jobs"),
        "measured_wall": doc["otherData"].get("wall_seconds"),
        "tasks": per_spec,
        "startup_wall": sum(e["dur"] for e in imports) / len(imports) / 1e6,
        "startup_cpu": sum(e["args"].get("cpu_s", 0.0) for e in imports) / len(imports),
        "pre": first_worker,
        "post": max(0.0, main_end - last_worker),
        "pre_cpu": pre_cpu,
        "post_cpu": post_cpu,
        "workers_seen": len(imports),
    }


def makespan(tasks: list[tuple[float, float]], n: int) -> float:
    """List scheduling: tasks (priority, duration) in descending priority, each to the first free worker."""
    free = [0.0] * n
    heapq.heapify(free)
    end = 0.0
    for _prio, dur in sorted(tasks, key=lambda t: -t[0]):
        t = heapq.heappop(free) + dur
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def predict(tr: dict, n: int, basis: str) -> dict:
    by_cls: dict[str, list[float]] = defaultdict(list)
    for s in tr["tasks"].values():
        by_cls[s["cls"]].append(s[basis])
    mean = {c: sum(v) / len(v) for c, v in by_cls.items()}
    tasks = [(mean[s["cls"]], s[basis]) for s in tr["tasks"].values()]
    startup = tr["startup_cpu"] if basis == "cpu" else tr["startup_wall"]
    pre, post = (tr["pre_cpu"], tr["post_cpu"]) if basis == "cpu" else (tr["pre"], tr["post"])
    span = makespan(tasks, n)
    work = sum(d for _, d in tasks)
    total = pre + startup + span + post
    return {"workers": n, "predicted_wall": round(total, 2), "makespan": round(span, 2),
            "startup": round(startup, 2), "work": round(work, 2),
            "utilisation": round(work / (n * (startup + span)), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", required=True, help="a build --trace file; repeatable")
    ap.add_argument("--workers", default="1,2,8,16,64")
    ap.add_argument("--post-cpu", type=float, default=None,
                    help="what-if: the main process's serial CPU seconds after the last kernel "
                         "(e.g. for a trace recorded before that tail was shortened)")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    ns = sorted({int(x) for x in a.workers.split(",")})
    out = {"traces": []}
    for path in a.trace:
        tr = load_trace(path)
        if a.post_cpu is not None:
            tr["post_cpu"] = a.post_cpu
        row = {"trace": path, "jobs": tr["jobs"], "measured_wall": tr["measured_wall"],
               "tasks": len(tr["tasks"]), "pre": round(tr["pre"], 2), "post": round(tr["post"], 2),
               "pre_cpu": round(tr["pre_cpu"], 2), "post_cpu": round(tr["post_cpu"], 2),
               "startup_wall": round(tr["startup_wall"], 2), "startup_cpu": round(tr["startup_cpu"], 2),
               "work_wall": round(sum(s["wall"] for s in tr["tasks"].values()), 2),
               "work_cpu": round(sum(s["cpu"] for s in tr["tasks"].values()), 2)}
        for basis in ("wall", "cpu"):
            preds = [predict(tr, n, basis) for n in sorted(set(ns) | {1})]
            t1 = preds[0]["predicted_wall"]
            for p in preds:
                p["speedup"] = round(t1 / p["predicted_wall"], 2)
                p["efficiency"] = round(t1 / (p["workers"] * p["predicted_wall"]), 3)
            row[f"predicted_{basis}"] = [p for p in preds if p["workers"] in ns]
        out["traces"].append(row)
        print(f"{path}: -j {tr['jobs']}, {len(tr['tasks'])} specs, measured {tr['measured_wall']} s; "
              f"pre {row['pre']} s, start-up {row['startup_wall']} s wall / {row['startup_cpu']} s CPU, "
              f"post {row['post']} s; work {row['work_wall']} s wall / {row['work_cpu']} s CPU")
        for basis in ("wall", "cpu"):
            for p in row[f"predicted_{basis}"]:
                mark = "   <- measured %.1f s" % tr["measured_wall"] if p["workers"] == tr["jobs"] else ""
                print(f"  {basis:>4} basis, {p['workers']:3d} workers: {p['predicted_wall']:8.2f} s "
                      f"(speedup {p['speedup']:5.2f}, efficiency {p['efficiency']:.2f}){mark}")
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
