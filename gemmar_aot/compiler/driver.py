"""Compile many specs in parallel worker processes, with progress and per-spec failures.

Workers are ``spawn``ed (FlyDSL and MLIR hold state that does not survive fork),
initialised once, and reused for many specs. The longest compiles (GEMMs) are
submitted first so the tail of the run is short phase kernels. A spec that fails
is reported with the builder's error and the rest continue. A worker that dies
outright (an abort inside native code) breaks the pool: the specs that were in
flight are retried one at a time in fresh single-use workers so the culprit is
named and everything else still builds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Iterable

from gemmar_aot.compiler.worker import CompileResult, compile_batch, compile_spec, init
from gemmar_aot.spec import KernelSpec
from gemmar_aot_kernels import recipe_module

#: Relative cost used to order submissions and estimate ETA before timings arrive.
COST_HINT = {"gemm": 20.0, "lsa_ar": 1.5}


def expected_cost(spec: KernelSpec) -> float:
    """Relative compile cost of ``spec`` (a phase kernel is 1); orders work, ETAs and shards."""
    c = COST_HINT.get(spec.kind, 1.0)
    if spec.kind == "gemm" and spec.param_dict().get("builder", {}).get("quant") == "mxfp8":
        c *= 2
    return c


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


@dataclass(frozen=True)
class Task:
    """One spec to compile into the store under its action key."""

    spec: KernelSpec
    key: str
    ingredients: dict


def compile_all(
    tasks: Iterable[Task],
    store_root: str,
    *,
    jobs: int | None = None,
    toolchain_root: str | None = None,
    debug_locations: bool = False,
    progress: bool = True,
) -> list[tuple[KernelSpec, CompileResult]]:
    """Compile ``tasks`` into the store; returns (spec, result) for each, in completion order."""
    by_spec = {t.spec: t for t in tasks}
    if not by_spec:
        return []
    batches = _batches(by_spec.values())
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(batches)))
    cost_total = sum(expected_cost(s) for s in by_spec)
    cost_done = 0.0
    bar = Progress(total=len(by_spec), enabled=progress)
    results: list[tuple[KernelSpec, CompileResult]] = []

    def record(spec: KernelSpec, res: CompileResult) -> None:
        nonlocal cost_done
        cost_done += expected_cost(spec)
        results.append((spec, res))
        bar.update(res, spec.label(), cost_done, cost_total)

    ctx = mp.get_context("spawn")
    pending = list(batches)
    suspects: list[Task] = []
    while pending:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=init,
                                   initargs=(toolchain_root, debug_locations))
        futures: dict[Future, list[Task]] = {}
        broken = False
        try:
            # Keep a bounded window in flight so a broken pool loses little work.
            queue = list(pending)
            pending = []
            while queue or futures:
                while queue and len(futures) < jobs * 2:
                    batch = queue.pop(0)
                    items = [(t.spec.to_json(), t.key, t.ingredients) for t in batch]
                    futures[pool.submit(compile_batch, items, store_root)] = batch
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for f in done:
                    batch = futures.pop(f)
                    try:
                        for t, res in zip(batch, f.result()):
                            record(t.spec, res)
                    except BrokenProcessPool:
                        broken = True
                        suspects.extend(batch)
                if broken:
                    for batch in futures.values():
                        suspects.extend(batch)
                    pending = queue
                    futures.clear()
                    break
        finally:
            pool.shutdown(wait=not broken, cancel_futures=True)
        # Retry suspects alone, each in its own worker, so a crash names its spec.
        for t in suspects:
            record(t.spec, _isolated(t, store_root, toolchain_root, debug_locations, ctx))
        suspects = []
    return results


def _batches(tasks: Iterable[Task]) -> list[list[Task]]:
    """Units of work, most expensive first. Specs the recipe builds from one builder call
    (the SDMA phases of one config and rank) travel together, so the worker makes that
    call once; everything else is a batch of one."""
    groups: dict[str, list[Task]] = {}
    for t in sorted(tasks, key=lambda t: t.spec.spec_id):
        groups.setdefault(recipe_module(t.spec.recipe).build_group(t.spec) or t.spec.spec_id, []).append(t)
    return sorted(groups.values(), key=lambda b: (-sum(expected_cost(t.spec) for t in b), b[0].spec.spec_id))


def _isolated(task: Task, store_root, toolchain_root, debug_locations, ctx) -> CompileResult:
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=init,
                             initargs=(toolchain_root, debug_locations)) as pool:
        try:
            return pool.submit(compile_spec, task.spec.to_json(), store_root, task.key,
                               task.ingredients).result()
        except BrokenProcessPool:
            return CompileResult(task.spec.spec_id, False, 0.0,
                                 error="the compile worker died (native abort or out of memory) "
                                       "while compiling this spec")
