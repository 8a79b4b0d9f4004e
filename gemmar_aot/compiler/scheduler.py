"""Compile many specs in parallel, longest expected first, with progress and per-spec failures.

The unit of work is a :class:`Task` (spec, action key, key ingredients). An executor
takes tasks and yields ``(spec, CompileResult)`` as they finish; :class:`LocalExecutor`
is the one here (worker processes on this machine), another (a cluster engine) only
has to do the same with ``worker.compile_kernel`` on its nodes.

LocalExecutor:

* Workers are ``spawn``ed (FlyDSL and MLIR hold state that does not survive fork),
  initialised once and reused. ``start()`` can be called before the task list is
  known, so their imports (seconds: FlyDSL, MLIR, torch) overlap planning and key look-ups.
* Dispatch is pull-based: an idle worker gets the most expensive batch left, by the
  per-kind costs recorded from earlier builds (:class:`CostModel`) -- list scheduling,
  longest first, so the tail of a build is short phase kernels, not a GEMM.
* A worker that dies outright (a native abort, the OOM killer) loses only its batch:
  each spec in it is retried alone in a replacement worker, so a spec that kills its
  worker twice is reported failed (by name) and everything else still builds.
* Workers die with the build: they end themselves when their parent process goes away
  (``worker.die_with_parent``), and ``close()`` -- run on every exit path, including
  Ctrl-C and SIGTERM -- ends the ones still running.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, Sequence

from gemmar_aot.compiler.trace import BuildTrace
from gemmar_aot.compiler.worker import CompileResult, serve
from gemmar_aot.model.spec import KernelSpec
from gemmar_aot_kernels import recipe_module


# ---- expected costs ----

#: CPU seconds per kernel by cost class, used until a build has recorded its own
#: (FlyDSL 0.4.2, locations off, this machine kind).
DEFAULT_COSTS = {"gemm": 1.2, "gemm:mxfp8": 2.4, "lsa_ar": 0.12, "*": 0.06,
                 # mori's hipcc-JIT sources (clang, gfx950, 2 loaded cores: shared/reference notes)
                 "ep_intranode": 130.0, "ep_async_ll": 60.0, "ep_internode_v1ll": 40.0, "ep_internode_v1": 31.0,
                 "ep_internode": 15.0, "ccl_kernels": 10.0, "shmem_kernels": 3.0, "scatter_gather": 3.0,
                 "fabric_copy": 3.0, "ep_local_expert_count": 1.5, "cast_kernel": 1.5}
COSTS_FILE = "compile-costs.json"
#: Version of COSTS_FILE; a file of another version is ignored (the timings are learnt again).
COSTS_SCHEMA = 1


def expected_cost(spec: KernelSpec) -> float:
    """The default expected CPU seconds of ``spec``: the same on every machine, so shards
    computed from it agree everywhere (recorded costs only order local work)."""
    return CostModel().expected(spec)


def cost_class(spec: KernelSpec) -> str:
    """What a kernel's compile time depends on, coarsely: recipe, kind, and the quant of a GEMM."""
    c = f"{spec.recipe}:{spec.kind}"
    if spec.kind == "gemm" and spec.param_dict().get("builder", {}).get("quant") == "mxfp8":
        c += ":mxfp8"
    return c


class CostModel:
    """Expected compile seconds per spec, from the per-class means earlier builds recorded.

    Kept next to the store's build stats (``stats/compile-costs.json``): the store is what
    builds of the same toolchain share, and a wrong estimate only changes the order of work,
    never a byte."""

    def __init__(self, costs: dict[str, dict] | None = None):
        self.costs: dict[str, dict] = dict(costs or {})

    @classmethod
    def load(cls, path: Path) -> "CostModel":
        try:
            data = json.loads(Path(path).read_text())
            if data.get("schema") != COSTS_SCHEMA:
                return cls()
            return cls({k: v for k, v in data.get("classes", {}).items()
                        if isinstance(v, dict) and v.get("seconds", 0) > 0})
        except (OSError, ValueError, AttributeError):
            return cls()

    def expected(self, spec: KernelSpec) -> float:
        c = cost_class(spec)
        if c in self.costs:
            return float(self.costs[c]["seconds"])
        kind = c.split(":", 1)[1]
        return DEFAULT_COSTS.get(kind, DEFAULT_COSTS["*"])

    def update(self, results: Iterable[tuple[KernelSpec, CompileResult]]) -> None:
        """Fold in this build's measured wall seconds per spec (mean per class, recent builds weigh more)."""
        sums: dict[str, list[float]] = {}
        for spec, res in results:
            if res.ok and not res.hit and res.seconds > 0:
                sums.setdefault(cost_class(spec), []).append(res.seconds)
        for c, xs in sums.items():
            mean = sum(xs) / len(xs)
            old = self.costs.get(c)
            n_old = min(int(old.get("samples", 0)), 4 * len(xs)) if old else 0
            mean = (old["seconds"] * n_old + mean * len(xs)) / (n_old + len(xs)) if old else mean
            self.costs[c] = {"seconds": round(mean, 4), "samples": n_old + len(xs)}

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"schema": COSTS_SCHEMA, "classes": self.costs}, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)


# ---- progress ----

@dataclass
class Progress:
    """A one-line progress display with ETA on a TTY, periodic lines otherwise."""

    total: int
    stream: object = sys.stderr
    enabled: bool = True
    done: int = 0
    failed: int = 0
    started: float = 0.0
    _last_print: float = 0.0

    def __post_init__(self):
        self.started = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, result: CompileResult, label: str, cost_done: float, cost_total: float) -> None:
        self.done += 1
        self.failed += 0 if result.ok else 1
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.started
        frac = cost_done / cost_total if cost_total else 1.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        width = 28
        bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
        line = (f"[{bar}] {self.done}/{self.total} kernels, {self.failed} failed, "
                f"{elapsed:5.1f}s elapsed, ETA {eta:5.1f}s  {label}")
        if self.tty:
            print("\r" + line[:150].ljust(150), end="", file=self.stream, flush=True)
            if self.done == self.total:
                print(file=self.stream)
        elif now - self._last_print > 5 or self.done == self.total or not result.ok:
            print(line, file=self.stream, flush=True)
            self._last_print = now


# ---- tasks and executors ----

@dataclass(frozen=True)
class Task:
    """One spec to compile into the store under its action key."""

    spec: KernelSpec
    key: str
    ingredients: dict


def make_batches(tasks: Iterable[Task], costs: CostModel) -> list[list[Task]]:
    """Units of work, most expensive first. Specs the recipe builds from one builder call
    (the SDMA phases of one config and rank) travel together, so the worker makes that
    call once; everything else is a batch of one."""
    groups: dict[str, list[Task]] = {}
    for t in sorted(tasks, key=lambda t: t.spec.spec_id):
        groups.setdefault(recipe_module(t.spec.recipe).build_group(t.spec) or t.spec.spec_id, []).append(t)
    return sorted(groups.values(), key=lambda b: (-sum(costs.expected(t.spec) for t in b), b[0].spec.spec_id))


class Executor(Protocol):
    """Runs compile tasks somewhere; yields each result as it finishes (any order).

    Every task yields exactly one result; a failure is a result with ``ok=False``, not an
    exception. ``close()`` releases everything the executor started, and is safe to call
    more than once and from a ``finally`` after an interrupt."""

    def run(self, tasks: Sequence[Task], store_root: str) -> Iterator[tuple[KernelSpec, CompileResult]]: ...

    def close(self) -> None: ...


class WorkerInitError(RuntimeError):
    """A compile worker could not even start (toolchain or import failure)."""


@dataclass
class _Worker:
    proc: object
    conn: object
    batch: list | None = None
    ready: bool = False
    started: float = 0.0


class LocalExecutor:
    """Compile worker processes on this machine (see the module docstring)."""

    def __init__(self, jobs: int | None = None, *, toolchain_root: str | None = None,
                 debug_locations: bool = False, costs: CostModel | None = None,
                 trace: BuildTrace | None = None):
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.toolchain_root = toolchain_root
        self.debug_locations = debug_locations
        self.costs = costs or CostModel()
        self.trace = trace
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._closed = False

    # -- lifecycle --

    def start(self, n: int | None = None) -> "LocalExecutor":
        """Spawn up to ``n`` (default ``jobs``) workers now; they import while the caller plans."""
        want = min(self.jobs, n if n is not None else self.jobs)
        while len(self._workers) < want:
            self._spawn()
        return self

    def _spawn(self) -> _Worker:
        if self._closed:
            raise RuntimeError("executor is closed")
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=serve, name="gemmar-aot-compile",
                                 args=(child, os.getpid(), self.toolchain_root, self.debug_locations),
                                 daemon=True)
        proc.start()
        child.close()
        w = _Worker(proc, parent, started=time.monotonic())
        self._workers.append(w)
        return w

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    def close(self) -> None:
        """End every worker: ask politely, then SIGTERM, then SIGKILL. Never waits long."""
        if self._closed:
            return
        self._closed = True
        workers, self._workers = self._workers, []
        for w in workers:
            if w.batch is None and w.ready:
                try:
                    w.conn.send(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 1.0
        for w in workers:
            if w.batch is not None or not w.ready:
                w.proc.terminate()  # busy or still importing: nothing to finish
        for w in workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join(0.5)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(0.5)
            w.conn.close()

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- work --

    def batches(self, tasks: Iterable[Task]) -> list[list[Task]]:
        return make_batches(tasks, self.costs)

    def run(self, tasks: Sequence[Task], store_root: str) -> Iterator[tuple[KernelSpec, CompileResult]]:
        queue = self.batches(tasks)
        if not queue:
            return
        self.start(len(queue))
        strikes: dict[str, int] = {}
        remaining = sum(len(b) for b in queue)
        init_failures: list[str] = []
        while remaining:
            for w in list(self._workers):
                if w.ready and w.batch is None and queue:
                    w.batch = queue.pop(0)
                    items = [(t.spec.to_json(), t.key, t.ingredients) for t in w.batch]
                    try:
                        w.conn.send((store_root, items))
                    except (OSError, ValueError):
                        pass  # it died; its sentinel says so below
            if not self._workers:
                self._spawn()
            ready = wait_ready([w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers])
            for w in list(self._workers):
                gone = False
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = ("eof",)
                    if msg[0] == "ready":
                        w.ready = True
                        if self.trace is not None:
                            self.trace.span("import", min(w.started, msg[2][0]), msg[2][1], pid=msg[1],
                                            args={"what": "interpreter start, FlyDSL, torch, mori device "
                                                          "modules, toolchain (from spawn)",
                                                  "cpu_s": round(msg[2][2], 4)})
                    elif msg[0] == "done":
                        batch, w.batch = w.batch, None
                        for t, res in zip(batch, msg[1]):
                            remaining -= 1
                            if self.trace is not None:
                                for name, t0, t1 in res.phases:
                                    self.trace.span(name, t0, t1, pid=res.pid,
                                                    args={"spec": t.spec.label(), "spec_id": t.spec.spec_id,
                                                          "cost_class": cost_class(t.spec),
                                                          "spec_cpu_s": round(res.cpu_seconds, 4)})
                            yield t.spec, res
                    else:
                        gone = True
                        if msg[0] == "init-failed":
                            init_failures.append(f"worker {msg[1]}: {msg[2]}")
                elif w.proc.sentinel in ready and not w.conn.poll():
                    gone = True  # ended with nothing left to read
                if not gone:
                    continue
                self._drop(w)
                for t in w.batch or ():
                    sid = t.spec.spec_id
                    strikes[sid] = strikes.get(sid, 0) + 1
                    if len(w.batch) == 1 and strikes[sid] >= 2:
                        remaining -= 1
                        yield t.spec, CompileResult(
                            sid, False, 0.0,
                            error="the compile worker died (native abort or out of memory) while compiling "
                                  "this spec, twice; it was alone in its worker the second time")
                    else:
                        queue.insert(0, [t])  # alone, so a second death names it
                if len(init_failures) >= self.jobs and not any(x.ready for x in self._workers):
                    raise WorkerInitError("compile workers failed to start:\n" + "\n".join(init_failures[-3:]))
                if remaining and len(self._workers) < min(self.jobs, len(queue) + self._busy()):
                    self._spawn()

    def _busy(self) -> int:
        return sum(1 for w in self._workers if w.batch is not None)

    def _drop(self, w: _Worker) -> None:
        self._workers.remove(w)
        w.proc.join(0.5)
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(0.5)
        w.conn.close()


@contextmanager
def terminate_as_interrupt():
    """While active (main thread only), SIGTERM raises KeyboardInterrupt, so a killed build
    runs the same clean-up as Ctrl-C: workers ended, finished kernels kept, exit reported."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def compile_all(
    tasks: Iterable[Task],
    store_root: str,
    *,
    jobs: int | None = None,
    toolchain_root: str | None = None,
    debug_locations: bool = False,
    progress: bool = True,
    executor: Executor | None = None,
    costs: CostModel | None = None,
    on_result: Callable[[KernelSpec, CompileResult], None] | None = None,
    on_tail: Callable[[], None] | None = None,
    tail_fraction: float = 0.6,
    toolchain=None,
) -> list[tuple[KernelSpec, CompileResult]]:
    """Compile ``tasks`` into the store; returns (spec, result) for each, in completion order.

    Tasks of a recipe no FlyDSL worker compiles (``keys.OWN_COMPILE``: mori's hipcc and JIT v2
    kernels) run first -- on the executor when it compiles them on its nodes
    (``compiles_whole_objects``: the Ray executor), else here -- a clang process each (:class:`~gemmar_aot.compiler.hipcc_executor.HipccExecutor`, as many at a
    time as the executor has workers, with ``toolchain``: the build's, else the one of
    ``toolchain_root`` and ``$GEMMAR_AOT_TOOLCHAIN_PROFILE``); the rest on ``executor``.

    ``executor``: where to run them (default: a LocalExecutor of ``jobs`` workers, closed
    here). An executor passed in is used but not closed. ``on_result(spec, result)`` is
    called here as each result arrives (the build uploads finished kernels to a remote
    cache while the rest compile). ``on_tail`` is called once, when
    ``tail_fraction`` of the tasks are done (in a longest-first schedule, what is left is
    short kernels), so the caller can start serial work that would otherwise follow the
    last kernel."""
    from gemmar_aot.compiler.keys import OWN_COMPILE

    tasks = list({t.spec: t for t in tasks}.values())
    costs = costs or CostModel()
    whole = [t for t in tasks if t.spec.recipe in OWN_COMPILE]
    results: list[tuple[KernelSpec, CompileResult]] = []
    if whole and getattr(executor, "compiles_whole_objects", False):
        whole = []  # a cluster compiles them on its nodes, with the rest
    if whole:
        from gemmar_aot.compiler.hipcc_executor import HipccExecutor

        if toolchain is None:
            from gemmar_aot.toolchain import load_toolchain

            toolchain = load_toolchain(toolchain_root)
        hip = HipccExecutor(toolchain, getattr(executor, "jobs", None) or jobs, costs)
        results = _run(hip, whole, store_root, costs, progress, on_result)
        tasks = [t for t in tasks if t.spec.recipe not in OWN_COMPILE]
    if not tasks:
        return results
    own = executor is None
    if own:
        executor = LocalExecutor(jobs, toolchain_root=toolchain_root, debug_locations=debug_locations, costs=costs)
    try:
        return results + _run(executor, tasks, store_root, costs, progress, on_result, on_tail, tail_fraction)
    finally:
        if own:
            executor.close()


def _run(executor, tasks: list[Task], store_root: str, costs: CostModel, progress: bool, on_result,
         on_tail=None, tail_fraction: float = 0.6) -> list[tuple[KernelSpec, CompileResult]]:
    """``tasks`` on ``executor``, with the progress bar, ``on_result`` and ``on_tail``."""
    cost_total = sum(costs.expected(t.spec) for t in tasks)
    cost_done = 0.0
    bar = Progress(total=len(tasks), enabled=progress)
    results: list[tuple[KernelSpec, CompileResult]] = []
    with terminate_as_interrupt():
        for spec, res in executor.run(tasks, store_root):
            cost_done += costs.expected(spec)
            results.append((spec, res))
            if on_result is not None:
                on_result(spec, res)
            bar.update(res, spec.label(), cost_done, cost_total)
            if on_tail is not None and len(results) >= tail_fraction * len(tasks):
                on_tail()
                on_tail = None
    return results
