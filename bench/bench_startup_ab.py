"""Startup of one rank, measured the same way for several gemmar-aot checkouts, interleaved (A/B).

Usage::

    python bench/bench_startup_ab.py ARM [ARM ...] LOCK [--rounds 6] [--repeat 10] [--json-out FILE]

An ARM is a checkout directory, optionally ``CHECKOUT=OTHER_LOCK`` to measure it on another
lock (an old checkout needs a lock its own build wrote; the same checkout on a copy of the
store without its record index measures the index). Every round runs each arm once, in
turn, in a fresh interpreter that imports ``gemmar_aot`` (and the bench's driver and the
test doubles) from that checkout and measures ``--repeat`` times, after one warm-up:
``load_artifacts(LOCK)`` (the lock read and indexed); the same and rank 0's launch entries of
every tuple built (``lock_read_and_rank0``: what the lock costs one rank whatever the lock
schema; schema 3 reads a rank's part only when its entries are first used); and
constructing ``GemmAllReduceOp`` for rank 0 of the reference manifest up to ready, as
``bench_runtime.py`` does, with the benchmark driver's stand-in parse of every code object at
module load (``construct_to_ready``) and without it (``construct_to_ready_without_driver_parse``),
both timing the communicator's construction and the op's ``close()`` too, alternating; and
``ready_own_host_work``: the op's construction alone (the communicator made before it, the op
closed after it), less the time spent inside the test doubles (every method of the communicator
double and of the benchmark driver, outermost calls only) -- startup to ready, our own host
work. Arms are interleaved A B A B ..., so a machine whose load changes affects every arm alike.

``--paired N`` measures ``ready_own_host_work`` alone, the robust way on a host whose speed
swings within seconds: one live process per arm, each asked for one construction in turn, N
times, so the arms' samples of one round are taken moments apart; reported per arm are the CPU
medians and, for every arm after the first, the median of its per-round ratio to the first (the
anchor). An arm whose lock is an installed artifact wheel's ``lock.json.zst`` is given the
(lock, store) pair its package's ``locate()`` returns.

Reported per arm: process-CPU median and minimum, wall median, over every run of every
round, and the load average before and after. On a shared machine compare CPU medians of
arms measured in one invocation; never numbers from two invocations.

With one arm and no options it behaves as before (one checkout, ``--repeat`` runs).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _artifacts(lock: Path):
    """What ``artifacts=`` takes for ``lock``: the lock file, or for an installed artifact wheel's
    ``lock.json.zst`` the (lock, store) pair its package's ``locate()`` returns."""
    store = lock.parent / "store"
    return (str(lock), str(store)) if lock.name == "lock.json.zst" and store.is_dir() else lock


def _setup(checkout: Path, lock: Path):
    """Import ``checkout``'s gemmar_aot (and its test doubles) and return what a worker measures:
    (construct, ready_own_work, lock_and_rank0, load_artifacts)."""
    root = checkout.resolve()
    sys.path[:0] = [str(root), str(root / "bench"), str(root / "tests")]
    import bench_runtime
    from bench_runtime import M_MAX, WORLD, BenchDriver, K, N
    from fakes import FakeCommunicator

    import gemmar_aot
    from gemmar_aot.runtime import GemmAllReduceOp, load_artifacts

    if not Path(gemmar_aot.__file__).resolve().is_relative_to(root):
        raise SystemExit(f"gemmar_aot was imported from {gemmar_aot.__file__}, not {root}")

    # a pod's first construction: no code-object note parsed before (older checkouts keep none)
    forget_parsed_notes = getattr(bench_runtime, "forget_parsed_notes", lambda: None)

    def construct(parse=True):
        forget_parsed_notes()  # inside the timing: ~1 us
        op = GemmAllReduceOp(FakeCommunicator(0, WORLD, lazy=True), n=N, k=K, m_max=M_MAX, artifacts=_artifacts(lock),
                             driver=BenchDriver(parse), self_test=False)
        op.close()

    # Time spent inside the test doubles (the communicator, the driver): not our host work. Only
    # the outermost call of a double is counted (a double's method may call another).
    in_doubles, depth = [0.0, 0.0], [0]

    def counted(f):
        def call(*args, **kw):
            if depth[0]:
                return f(*args, **kw)
            depth[0] += 1
            t, c = time.perf_counter(), time.process_time()
            try:
                return f(*args, **kw)
            finally:
                in_doubles[0] += time.process_time() - c
                in_doubles[1] += time.perf_counter() - t
                depth[0] -= 1
        return call

    plain = {cls: {name: f for name, f in vars(cls).items() if inspect.isfunction(f) and not name.startswith("__")}
             for cls in (FakeCommunicator, BenchDriver)}
    timed = {cls: {name: counted(f) for name, f in fs.items()} for cls, fs in plain.items()}

    def doubles(which: dict) -> None:
        """Put the doubles' plain or timed methods in place (timed only while ready_own_work runs)."""
        for cls, fs in which.items():
            for name, f in fs.items():
                setattr(cls, name, f)

    def ready_own_work() -> tuple[float, float]:
        """(CPU ms, wall ms) of the construction alone (the communicator made before it, the op
        closed after it), less the time spent inside the test doubles: startup to ready, our work."""
        forget_parsed_notes()
        comm = FakeCommunicator(0, WORLD, lazy=True)
        driver = BenchDriver(False)
        in_doubles[:] = [0.0, 0.0]
        doubles(timed)
        try:
            t, c = time.perf_counter(), time.process_time()
            op = GemmAllReduceOp(comm, n=N, k=K, m_max=M_MAX, artifacts=_artifacts(lock), driver=driver,
                                 self_test=False)
            cpu, wall = time.process_time() - c - in_doubles[0], time.perf_counter() - t - in_doubles[1]
        finally:
            doubles(plain)
        op.close()
        return cpu * 1e3, wall * 1e3

    def lock_and_rank0():
        arts = load_artifacts(_artifacts(lock))
        for by_m in arts.index.values():
            for by_rank in by_m.values():
                e = by_rank.get(0)
                if e is not None:
                    e.launches, e.self_test

    construct()  # imports, caches
    return construct, ready_own_work, lock_and_rank0, load_artifacts


def serve(checkout: Path, lock: Path) -> None:
    """``--serve``: one ``ready_own_host_work`` measurement per line read from stdin, printed as
    ``[cpu_ms, wall_ms]``; the paired mode alternates two or more of these processes."""
    _construct, ready_own_work, _rank0, _load = _setup(checkout, lock)
    print("ready", flush=True)
    for _line in sys.stdin:
        print(json.dumps(ready_own_work()), flush=True)


def worker(checkout: Path, lock: Path, repeat: int) -> dict:
    construct, ready_own_work, lock_and_rank0, load_artifacts = _setup(checkout, lock)

    def measure(fn, n):
        cpu, wall = [], []
        for _ in range(n):
            t, c = time.perf_counter(), time.process_time()
            fn()
            cpu.append((time.process_time() - c) * 1e3)
            wall.append((time.perf_counter() - t) * 1e3)
        return {"cpu_ms": cpu, "wall_ms": wall}

    out = {"lock_read_and_index": measure(lambda: load_artifacts(_artifacts(lock)), repeat),
           "lock_read_and_rank0": measure(lock_and_rank0, repeat)}
    both = {"construct_to_ready": {"cpu_ms": [], "wall_ms": []},
            "construct_to_ready_without_driver_parse": {"cpu_ms": [], "wall_ms": []},
            "ready_own_host_work": {"cpu_ms": [], "wall_ms": []}}
    for _ in range(repeat):
        for name, parse in (("construct_to_ready", True), ("construct_to_ready_without_driver_parse", False)):
            r = measure(lambda: construct(parse), 1)
            both[name]["cpu_ms"] += r["cpu_ms"]
            both[name]["wall_ms"] += r["wall_ms"]
        cpu, wall = ready_own_work()
        both["ready_own_host_work"]["cpu_ms"].append(cpu)
        both["ready_own_host_work"]["wall_ms"].append(wall)
    return {**out, **both}


def paired(parsed: list, rounds: int, json_out: Path | None) -> int:
    """One serving process per arm; each round asks every arm for one measurement, in turn (the
    order rotating). Reports per arm the CPU and wall medians, and per arm after the first the
    median of its per-round CPU ratio to the first arm (the anchor)."""
    procs = []
    for arm, checkout, lock in parsed:
        p = subprocess.Popen([sys.executable, __file__, str(checkout), str(lock), "--serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, bufsize=1)
        if p.stdout.readline().strip() != "ready":
            print(f"{arm}: the serving process did not start", file=sys.stderr)
            return 2
        procs.append(p)
    speed = [python_speed_ms()]
    load_before = os.getloadavg()
    got: list[list[tuple[float, float]]] = [[] for _ in parsed]
    try:
        for r in range(rounds):
            order = list(range(len(parsed)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                procs[i].stdin.write("go\n")
                got[i].append(tuple(json.loads(procs[i].stdout.readline())))
            if (r + 1) % max(1, rounds // 4) == 0:
                speed.append(python_speed_ms())
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "paired_rounds": rounds,
           "metric": "ready_own_host_work", "python_loop_1e6_ms_during": speed,
           "load_average_before_after": [round(x, 2) for x in load_before + os.getloadavg()], "arms": {}}
    anchor = [c for c, _w in got[0]]
    for (arm, checkout, lock), runs in zip(parsed, got):
        cpu, wall = [c for c, _w in runs], [w for _c, w in runs]
        res["arms"][arm] = {"checkout": str(checkout.resolve()), "lock": str(lock), "n": len(cpu),
                            "cpu_median_ms": round(statistics.median(cpu), 3), "cpu_min_ms": round(min(cpu), 3),
                            "wall_median_ms": round(statistics.median(wall), 3),
                            "cpu_ratio_to_first_median": round(statistics.median(
                                [c / a for c, a in zip(cpu, anchor)]), 4)}
    text = json.dumps(res, indent=1, sort_keys=True)
    if json_out:
        json_out.write_text(text + "\n")
    print(text)
    return 0


def python_speed_ms() -> float:
    """The machine-speed reference of ``bench_runtime.py`` (the best of five 10^6-step loops)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_runtime import python_speed_ms as speed

    return speed()


def _summary(runs: dict) -> dict:
    cpu, wall = runs["cpu_ms"], runs["wall_ms"]
    return {"cpu_median_ms": round(statistics.median(cpu), 2), "cpu_min_ms": round(min(cpu), 2),
            "wall_median_ms": round(statistics.median(wall), 2), "n": len(cpu)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arms", nargs="+", help="CHECKOUT or CHECKOUT=LOCK, ..., then the default LOCK")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=30, help="constructions per arm and round")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--paired", type=int, default=0, metavar="N",
                    help="instead: N rounds in which one live process per arm measures ready_own_host_work "
                         "once each, in turn (pairs taken moments apart: the robust A/B on a noisy host)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if len(a.arms) < 2:
        ap.error("give at least one checkout and the lock")
    *arms, default_lock = a.arms
    if a.worker:
        print(json.dumps(worker(Path(arms[0]), Path(default_lock), a.repeat)))
        return 0
    if a.serve:
        serve(Path(arms[0]), Path(default_lock))
        return 0
    parsed = []
    for arm in arms:
        checkout, _, lock = arm.partition("=")
        parsed.append((arm, Path(checkout), Path(lock or default_lock)))
    if a.paired:
        return paired(parsed, a.paired, a.json_out)
    runs: dict[str, dict[str, dict[str, list]]] = {
        arm: {m: {"cpu_ms": [], "wall_ms": []} for m in ("lock_read_and_index", "lock_read_and_rank0",
                                                         "construct_to_ready",
                                                         "construct_to_ready_without_driver_parse",
                                                         "ready_own_host_work")}
        for arm, _c, _l in parsed}
    load_before = os.getloadavg()
    speed_before = python_speed_ms()
    loads = []
    for _ in range(a.rounds):
        for arm, checkout, lock in parsed:
            out = subprocess.run([sys.executable, __file__, str(checkout), str(lock), "--worker", "--repeat",
                                  str(a.repeat)], capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{arm}: {out.stderr.strip()}", file=sys.stderr)
                return 2
            got = json.loads(out.stdout.strip().splitlines()[-1])
            for m, r in got.items():
                for k in ("cpu_ms", "wall_ms"):
                    runs[arm][m][k].extend(r[k])
        loads.append(round(os.getloadavg()[0], 2))
    res = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rounds": a.rounds, "repeat_per_round": a.repeat,
        "load_average_before_after": [round(x, 2) for x in load_before + os.getloadavg()],
        "load_1min_after_each_round": loads,
        "python_loop_1e6_ms_before_after": [speed_before, python_speed_ms()],
        "arms": {arm: {"checkout": str(checkout.resolve()), "lock": str(lock),
                       "lock_bytes": lock.stat().st_size,
                       **{m: _summary(r) for m, r in runs[arm].items()}}
                 for arm, checkout, lock in parsed},
    }
    text = json.dumps(res, indent=1, sort_keys=True)
    if a.json_out:
        a.json_out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
