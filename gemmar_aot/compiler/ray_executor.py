"""Compile on a Ray cluster: the same tasks as the local pool, one writer for the store.

``gemmar-aot build --executor ray [--ray-address ADDR]`` sends the batches the local
executor would run (``driver.make_batches``: most expensive first by recorded costs, the
SDMA phases of one config together) as Ray tasks, one CPU each, spread over the
cluster. On a node a task

* checks that the node's own toolchain (``toolchain.json`` of its installed toolchain,
  plus the digest of our compiler sources) equals the driver's, and refuses to compile
  otherwise, naming the ingredient that differs;
* compiles each spec with the worker's own per-task function
  (:func:`gemmar_aot.compiler.worker.compile_detached`), or, for mori's hipcc and JIT v2 kernels,
  a clang process of its own (:func:`gemmar_aot.compiler.hipcc_executor.compile_detached`): no
  store access on the node;
* returns the code bytes, the record fields and the sha256 it computed.

The driver checks each returned code object against the sha256 the node reported
(and that the record fields describe the spec it asked for) and is the only process
that writes the store (from a few writer threads, so storing keeps up with a large
cluster; under the same per-key claim as local builders, so a concurrent local build of
the same key is not duplicated in the store).

Failures: a builder error is data, reported exactly as the local executor reports it.
A node or worker that dies loses only the tasks it was running: Ray re-runs them
(``max_retries``) on the nodes that are left. A group that dies on every attempt is
split and its specs retried alone, so the one that kills workers is named and fails
like a local spec whose worker died; the others still build.

A node with a different toolchain never compiles. Every node with CPUs is asked before
the build starts, and a node that joins later refuses its first task. Each refusal is
printed as a warning, naming the node and every ingredient that differs. The node is
then left out: the refused task and every later task carry a Ray label selector that
excludes it, and the build goes on on the nodes that match. A cluster with no such node
at the start stops the build at once; one that loses its last such node mid-build (dead,
or refused) gets ``no_cpu_timeout`` seconds for one to join, then the build stops with an
error naming the refusals and the fix. A build never waits forever on a cluster that
cannot run it.

Ray is optional (``pip install 'gemmar-aot[ray]'``): only this module imports it, and
only inside functions, so the base install, the local build and the runtime never do.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

from gemmar_aot.compiler.scheduler import Task
from gemmar_aot.compiler.worker import CompileResult
from gemmar_aot.util.errors import GemmarError
from gemmar_aot.compiler.keys import diff_ingredients, toolchain_ingredients
from gemmar_aot.model.spec import KernelSpec
from gemmar_aot.util.filedigest import sha256_hex

#: Ray re-runs a task whose worker or node died this many times (then we split or fail it).
MAX_RETRIES = 3
#: Seconds to wait for every node's answer to the toolchain check before compiling.
PROBE_TIMEOUT_S = 180.0
#: Seconds without any usable node (alive, with CPUs, toolchain not refused) before the build stops.
NO_CPU_TIMEOUT_S = 120.0
#: The compile tasks' workers: Ray ends a worker's child processes with SIGKILL when the worker exits (a
#: driver that died, a cancelled job), which would leave a compile's directory in the node's ``work/``;
#: a hipcc compile process ends with its worker anyway and removes its directory as it goes
#: (:mod:`.hipcc_process`), so it is left to do that.
RUNTIME_ENV = {"env_vars": {"RAY_kill_child_processes_on_worker_exit": "false"}}

#: Threads that write verified results into the store. The driver is the only writer process;
#: a few threads keep its per-kernel write (zstd -19, two fsyncs) off the critical path of a
#: cluster that returns results faster than one thread can store them.
STORE_WRITERS = 4
#: How often the driver looks for finished store writes while it waits on the cluster.
WRITE_POLL_S = 0.05
#: Ray's built-in label that every node carries: its node id (for the label selector).
NODE_ID_LABEL = "ray.io/node-id"
#: How many times a result that does not match its reported digest is compiled again.
MAX_CORRUPT_RESULTS = 2

RAY_MISSING = ("--executor ray needs Ray, which is an optional extra\n"
               "  fix: pip install 'gemmar-aot[ray]' (the same Ray version on every node of the cluster)")


class RayExecutorError(GemmarError):
    """The Ray cluster cannot run this build (not reachable, no CPUs, a node that differs)."""


# ------------------------------------------------------------------ what a node must match


def toolchain_identity(fp: dict) -> dict:
    """Everything a node's compile depends on besides the spec: the toolchain fingerprint
    (``toolchain.json``, without its digest) and the digest of our own compiler code."""
    return {"fingerprint": {k: v for k, v in fp.items() if k != "digest"},
            "compiler": toolchain_ingredients(fp)["compiler"]}


def describe_mismatch(expected: dict, actual: dict) -> str:
    """Why a node refuses: every ingredient that differs, with the driver's and the node's value."""
    diffs = diff_ingredients(expected, actual)
    lines = [f"its toolchain differs from the driver's in {len(diffs)} ingredient(s):"]
    for path, want, have in diffs:
        lines.append(f"  - {path}: driver {_short(want)}, node {_short(have)}")
    return "\n".join(lines)


def refusal_message(node: str, why: str) -> str:
    return (f"{node} refuses to compile: {why}\n  fix: install the same gemmar-aot commit and run "
            f"`make setup` on that node (or take it out of the cluster)")


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 100 else s[:97] + "..."


# ------------------------------------------------------------------ on the node

_NODE: dict[str, Any] = {}


def _node_refusal(expected: dict) -> str | None:
    """None when this node's toolchain equals ``expected``; else why not. Cached per process."""
    ck = hashlib.sha256(repr(sorted(expected.items())).encode()).hexdigest()
    if ck not in _NODE:
        from gemmar_aot.toolchain import load_toolchain

        try:  # the driver's toolchain profile (a fingerprint from before profiles is the default's)
            mine = toolchain_identity(load_toolchain(profile=_profile_of(expected)).fingerprint)
        except GemmarError as e:
            _NODE[ck] = f"its toolchain does not load:\n{e}"
        else:
            _NODE[ck] = None if mine == expected else describe_mismatch(expected, mine)
    return _NODE[ck]


def _profile_of(expected: dict) -> str:
    return expected["fingerprint"].get("profile", "default")


def probe_node(expected: dict) -> dict:
    """The toolchain check alone (the driver asks every node before compiling)."""
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "refused": _node_refusal(expected)}


def compile_on_node(items: list[tuple[dict, str, dict]], expected: dict, debug_locations: bool) -> dict:
    """One Ray task: check the toolchain, then compile each (spec, key, ingredients) without a store.

    Returns ``{"node_id", "refused", "results": [(CompileResult, code | None, sha256 | None)]}``.
    """
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    refused = _node_refusal(expected)
    if refused:
        return {"node_id": node_id, "refused": refused, "results": []}
    import os

    from gemmar_aot.compiler import worker
    from gemmar_aot.compiler.keys import OWN_COMPILE
    from gemmar_aot.compiler.worker import compile_detached, init
    from gemmar_aot.toolchain import PROFILE_ENV

    os.environ[PROFILE_ENV] = _profile_of(expected)
    if all(spec_json["recipe"] in OWN_COMPILE for spec_json, _k, _i in items):
        return {"node_id": node_id, "refused": None, "results": _compile_whole(items, expected)}
    init(None, debug_locations)  # this node's own toolchain, verified equal above
    if toolchain_identity(worker._STATE["toolchain"].fingerprint) != expected:
        # init() is once per process: a Ray worker that compiled for another profile keeps it.
        return {"node_id": node_id, "refused": f"this Ray worker process compiles with toolchain profile "
                f"{worker._STATE['toolchain'].profile.name!r}, not {_profile_of(expected)!r}", "results": []}
    out = []
    for spec_json, _key, ingr in items:
        res, outputs = compile_detached(spec_json, ingr)
        out.append((res, outputs, None if outputs is None else tuple(sha256_hex(b) for b in outputs)))
    return {"node_id": node_id, "refused": None, "results": out}


def _compile_whole(items: list[tuple[dict, str, dict]], expected: dict) -> list:
    """mori's hipcc and JIT v2 kernels on this node: each a clang process of its own, with this
    node's toolchain (checked equal to the driver's, the HIP SDK's digest included), working under
    the toolchain's ``work/`` (removed as each compile ends; what a compile killed with its whole
    machine left there an hour ago or more is removed first). No FlyDSL is imported."""
    from pathlib import Path

    from gemmar_aot.compiler.hipcc_executor import compile_detached as compile_whole
    from gemmar_aot.toolchain import load_toolchain
    from gemmar_aot.util.lifecycle import STALE_WORK_S, remove_stale_work

    tc = load_toolchain(profile=_profile_of(expected))
    work = Path(tc.root) / "work"
    remove_stale_work(work, time.time() - STALE_WORK_S)
    out = []
    for spec_json, _key, ingr in items:
        res, outputs = compile_whole(spec_json, ingr, tc, work)
        out.append((res, outputs, None if outputs is None else (sha256_hex(outputs[0]), None)))
    return out


# ------------------------------------------------------------------ on the driver


def verify_result(task: Task, res: CompileResult, outputs: tuple[bytes, bytes] | None,
                  reported: tuple[str, str] | None) -> str | None:
    """None when a node's answer for ``task`` can be stored; else what is wrong with it."""
    if res.spec_id != task.spec.spec_id:
        return f"the node answered for spec {res.spec_id[:12]}, not {task.spec.spec_id[:12]}"
    if not res.ok:
        return None
    if outputs is None or reported is None or len(outputs) != 2 or len(reported) != 2:
        return "the node reported success but sent no code object and launcher"
    from gemmar_aot.compiler.keys import OWN_COMPILE

    whole = task.spec.recipe in OWN_COMPILE  # a code object mori loads whole: no launcher
    if whole != (outputs[1] is None) or whole != (reported[1] is None):
        return "the node sent a launcher for a code object mori loads whole" if whole else \
            "the node sent no launcher for a kernel we launch"
    for what, data, want in zip(("code object", "launcher"), outputs, reported):
        if data is None:
            continue
        have = sha256_hex(data)
        if have != want:
            return f"the {what} arrived with sha256 {have}, the node computed {want}"
    fields = res.record or {}
    if fields.get("spec") != task.spec.to_json() or fields.get("ingredients") != task.ingredients:
        return "the node's record fields do not describe this spec and its ingredients"
    return None


@dataclass
class _Flight:
    """One submitted group and how many times it came back unverifiable."""

    batch: list[Task]
    corrupt: int = 0


class RayExecutor:
    """Runs compile tasks on the Ray cluster at ``address`` (a ``driver.Executor``).

    ``run`` yields (spec, CompileResult) as results arrive; a successful result's
    ``record`` is the full store record, written by this process. ``close`` cancels
    what is still running and disconnects (the cluster ends the job's workers).
    """

    #: mori's hipcc and JIT v2 kernels compile on the nodes too (``scheduler.compile_all``).
    compiles_whole_objects = True

    def __init__(self, address: str | None = None, *, toolchain_root: str | None = None,
                 debug_locations: bool = False, toolchain_profile: str | None = None,
                 no_cpu_timeout: float = NO_CPU_TIMEOUT_S):
        from gemmar_aot.toolchain import load_toolchain

        self.address = address
        self.no_cpu_timeout = no_cpu_timeout
        self.debug_locations = debug_locations
        # the driver's (profile's) toolchain: every node must match
        self.fingerprint = load_toolchain(toolchain_root, toolchain_profile).fingerprint
        self.jobs = 0  # the cluster's CPUs, once connected
        self.specs_by_node: dict[str, int] = {}
        self.resubmitted = 0
        #: node id -> why it refuses (its toolchain differs): it gets no more tasks.
        self.refused: dict[str, str] = {}
        #: Where the driver's own time goes (the overhead Ray adds on this side).
        self.seconds = {"connect": 0.0, "toolchain_check": 0.0, "store_writes": 0.0}
        self._ray = None
        self._inflight: dict[Any, _Flight] = {}
        self._names: dict[str, str] = {}
        self._writer: ThreadPoolExecutor | None = None  # the store writes, while a build runs
        self._lock = threading.Lock()  # the counters the writer threads update

    def info(self) -> dict:
        return {"name": "ray", "address": self.address, "cluster_cpus": self.jobs,
                "specs_by_node": dict(sorted(self.specs_by_node.items())), "resubmitted": self.resubmitted,
                "refused_nodes": {self._names.get(n, n): why for n, why in sorted(self.refused.items())},
                "driver_seconds": {k: round(v, 3) for k, v in self.seconds.items()}}

    def close(self) -> None:
        ray, self._ray = self._ray, None
        if ray is None:
            return
        for ref in self._inflight:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort; the job's end stops its workers anyway
                pass
        self._inflight.clear()
        with contextlib.redirect_stdout(sys.stderr):
            ray.shutdown()

    def run(self, tasks: Sequence[Task], store_root: str) -> Iterator[tuple[KernelSpec, CompileResult]]:
        if not tasks:
            return
        from gemmar_aot.compiler.scheduler import COSTS_FILE, CostModel
        from gemmar_aot.store import Store

        store = Store(store_root)
        costs = CostModel.load(store.stats_dir / COSTS_FILE)
        # Ray's driver prints cluster messages ("task failed, will be retried") on stdout from
        # a thread; they go to stderr so stdout stays the caller's (--json).
        with contextlib.redirect_stdout(sys.stderr):
            if self._ray is None:
                self._connect()
            yield from self._run(self._ray, tasks, store, costs)

    # ---- connection and the toolchain check

    def _connect(self) -> None:
        ray = _import_ray()
        addr = self.address or "auto"
        t0 = time.perf_counter()
        try:
            ray.init(address=addr, logging_level=logging.WARNING, log_to_driver=False, namespace="gemmar-aot")
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayExecutorError(
                f"cannot connect to a Ray cluster at {addr!r}: {e}\n  fix: pass --ray-address HOST:PORT "
                f"of a running cluster (run the build on one of its nodes), set RAY_ADDRESS, or start "
                f"one with `ray start --head`") from None
        self._ray = ray
        self.address = ray.get_runtime_context().gcs_address
        self.seconds["connect"] += time.perf_counter() - t0

    def _name(self, ray, node_id: str) -> str:
        """How messages name a node: Ray's node name, id, host and address."""
        if node_id not in self._names:
            for n in ray.nodes():
                self._names[n["NodeID"]] = (f"node '{n.get('NodeName', '?')}' (id {n['NodeID'][:12]}, host "
                                            f"{n.get('NodeManagerHostname', '?')}, {n.get('NodeManagerAddress', '?')})")
        return self._names.get(node_id, f"node {node_id[:12]}")

    def _usable_cpus(self, ray) -> float:
        """CPUs of the alive nodes whose toolchain was not refused (the ones our tasks can use)."""
        return sum(n.get("Resources", {}).get("CPU", 0) for n in ray.nodes()
                   if n.get("Alive") and n["NodeID"] not in self.refused)

    def _no_usable_node(self, why: str) -> RayExecutorError:
        refusals = "".join(f"\n{refusal_message(self._names.get(n, f'node {n[:12]}'), r)}"
                           for n, r in sorted(self.refused.items()))
        return RayExecutorError(
            f"the Ray cluster at {self.address} {why}{refusals}\n  fix: add worker nodes with CPUs and this "
            f"toolchain (on each: `make setup` of the same gemmar-aot commit, then `ray start --address "
            f"{self.address}`), or build here with the local executor (drop --executor ray)")

    def _refuse(self, ray, node_id: str, why: str) -> None:
        """Leave ``node_id`` out of the build from now on, and say so once."""
        if node_id in self.refused:
            return
        self.refused[node_id] = why
        self._names.pop(node_id, None)  # a node that joined late: look its name up again
        print(f"warning: {refusal_message(self._name(ray, node_id), why)}\n  (the build goes on without it)",
              file=sys.stderr, flush=True)

    def _options(self) -> dict:
        """Where a compile task may run: anywhere but on the nodes that refused."""
        if not self.refused:
            return {}
        ids = sorted(self.refused)
        return {"label_selector": {NODE_ID_LABEL: f"!{ids[0]}" if len(ids) == 1 else f"!in({','.join(ids)})"}}

    def _preflight(self, ray, expected: dict) -> None:
        """Ask every node with CPUs for its toolchain check before anything compiles."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        if not nodes:
            raise self._no_usable_node("has no node with CPUs to compile on")
        probe = ray.remote(probe_node)
        refs = [probe.options(num_cpus=0, max_retries=0, runtime_env=RUNTIME_ENV,
                              scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(expected)
                for n in nodes]  # the compile tasks' runtime environment: the same workers serve both
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        for ref in ready:
            try:
                ans = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # a node that died while answering; its tasks go elsewhere
            if ans["refused"]:
                self._refuse(ray, ans["node_id"], ans["refused"])
        # A node that did not answer in time is still checked by each task it runs.
        good = [n for n in nodes if n["NodeID"] not in self.refused]
        if not good:
            raise self._no_usable_node("has no node with the driver's toolchain to compile on")
        self.jobs = int(sum(n["Resources"]["CPU"] for n in good))

    # ---- the build

    def _run(self, ray, tasks: Sequence[Task], store, costs) -> Iterator[tuple[KernelSpec, CompileResult]]:
        from gemmar_aot.compiler.scheduler import make_batches

        expected = toolchain_identity(self.fingerprint)
        t0 = time.perf_counter()
        self._preflight(ray, expected)
        self.seconds["toolchain_check"] += time.perf_counter() - t0
        remote = ray.remote(compile_on_node)
        base = {"num_cpus": 1, "max_retries": MAX_RETRIES, "scheduling_strategy": "SPREAD",
                "runtime_env": RUNTIME_ENV}
        inflight = self._inflight

        def submit(flight: _Flight) -> None:
            items = [(t.spec.to_json(), t.key, t.ingredients) for t in flight.batch]
            ref = remote.options(**base, **self._options()).remote(items, expected, self.debug_locations)
            inflight[ref] = flight

        for b in make_batches(tasks, costs):  # most expensive first: Ray dispatches in order
            submit(_Flight(b))
        no_cpu_since: float | None = None
        writes: deque[tuple[Task, Future]] = deque()  # verified results being stored, in arrival order
        # Leaving this block (done, an error, or the caller closing the generator) waits for the
        # writes in flight, so every verified result that arrived is in the store.
        with ThreadPoolExecutor(max_workers=STORE_WRITERS, thread_name_prefix="ray-store") as self._writer:
            while inflight:
                wait = WRITE_POLL_S if writes else min(5.0, self.no_cpu_timeout / 2)
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=wait)
                while writes and writes[0][1].done():
                    t, f = writes.popleft()
                    yield t.spec, f.result()
                if not ready:
                    if writes:
                        continue  # waiting on our own writes, not on the cluster
                    no_cpu_since = self._check_cpus(ray, inflight, no_cpu_since)
                    continue
                no_cpu_since = None
                flight = inflight.pop(ready[0])
                for t, res in self._settle(ray, ready[0], flight, submit, store):
                    if isinstance(res, Future):
                        writes.append((t, res))
                    else:
                        yield t.spec, res
            for t, f in writes:
                yield t.spec, f.result()
        self._writer = None

    def _check_cpus(self, ray, inflight, no_cpu_since: float | None) -> float | None:
        """After a wait with no result: raise when the cluster has had no usable CPU for too long;
        returns since when it has had none (None: it has some)."""
        if self._usable_cpus(ray) > 0:
            return None
        if no_cpu_since is None:
            return time.monotonic()
        if time.monotonic() - no_cpu_since > self.no_cpu_timeout:
            # close() cancels what is still in flight; every result that arrived is stored.
            which = "with CPUs and the driver's toolchain" if self.refused else "with CPUs"
            left = sum(len(f.batch) for f in inflight.values())
            raise self._no_usable_node(
                f"has had no node {which} for {self.no_cpu_timeout:.0f} s; {left} spec(s) were not "
                f"compiled (every kernel that finished is in the store)")
        return no_cpu_since

    def _settle(self, ray, ref, flight: _Flight, submit, store) -> list[tuple[Task, CompileResult | Future]]:
        """The results one finished Ray task gives; resubmits what must run again. A verified
        compiled result comes back as the Future of its store write (see :meth:`_store`)."""
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            # Our task function itself raised (a builder error is data, not this): report it.
            return [(t, CompileResult(t.spec.spec_id, False, 0.0, error=f"the Ray task failed: {e}"))
                    for t in flight.batch]
        except ray.exceptions.RayError as e:
            # The worker or node died on every attempt Ray allowed.
            if len(flight.batch) > 1:  # retry each spec alone, so the culprit is named
                self.resubmitted += len(flight.batch)
                for t in flight.batch:
                    submit(_Flight([t]))
                return []
            first = (str(e).strip().splitlines() or [""])[0]
            return [(flight.batch[0], CompileResult(
                flight.batch[0].spec.spec_id, False, 0.0,
                error=f"the compile worker died (native abort, out of memory or a lost node) while "
                      f"compiling this spec, on each of {MAX_RETRIES + 1} attempts on Ray "
                      f"({type(e).__name__}: {first})"))]
        node = self._name(ray, answer["node_id"])
        if answer["refused"]:  # a node that joined after the check: never again, the task elsewhere
            # (if no usable node is left, the wait for one is bounded by no_cpu_timeout)
            self._refuse(ray, answer["node_id"], answer["refused"])
            self.resubmitted += len(flight.batch)
            submit(flight)
            return []
        out: list[tuple[Task, CompileResult]] = []
        problems: list[str] = []
        if len(answer["results"]) != len(flight.batch):
            problems.append(f"the node returned {len(answer['results'])} results for {len(flight.batch)} specs")
        else:
            for t, (res, outputs, digests) in zip(flight.batch, answer["results"]):
                bad = verify_result(t, res, outputs, digests)
                if bad:
                    problems.append(bad)
                elif res.ok:
                    self.specs_by_node[node] = self.specs_by_node.get(node, 0) + 1
                    out.append((t, self._writer.submit(self._store, store, t, res, outputs)))
                else:
                    out.append((t, res))
        if problems:
            done = {t.spec for t, _ in out}
            again = [t for t in flight.batch if t.spec not in done]
            if flight.corrupt < MAX_CORRUPT_RESULTS:
                self.resubmitted += len(again)
                submit(_Flight(again, flight.corrupt + 1))
            else:
                out += [(t, CompileResult(t.spec.spec_id, False, 0.0, error=(
                    f"{node}: the result could not be verified after {MAX_CORRUPT_RESULTS + 1} attempts: "
                    f"{'; '.join(problems)}"))) for t in again]
        return out

    def _store(self, store, task: Task, res: CompileResult, outputs: tuple[bytes, bytes | None]) -> CompileResult:
        """Put a verified result in the store under the task's key (in a writer thread of the
        driver, the one process that writes the store). The record's derived fields are made
        here, from the verified bytes, by the driver's derive code: a node's are not trusted."""
        from gemmar_aot.compiler.derive import is_current, with_derived

        code, launcher = outputs
        t0 = time.perf_counter()
        try:
            with store.claim(task.key) as claim:
                if claim.hit is not None and is_current(claim.hit):  # a concurrent builder stored it
                    return replace(res, record=claim.hit, hit=True)
                return replace(res, record=claim.put(code, with_derived(res.record, code, launcher),
                                                     launcher=launcher))
        finally:
            with self._lock:  # summed over the writer threads: CPU-ish time, not wall time
                self.seconds["store_writes"] += time.perf_counter() - t0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RayExecutorError(RAY_MISSING) from None
    return ray
