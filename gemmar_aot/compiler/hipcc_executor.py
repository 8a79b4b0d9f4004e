"""Where mori's hipcc-JIT and JIT v2 kernels compile: a process each, ``jobs`` at a time, into the store.

A hipcc or JIT v2 spec needs no FlyDSL worker: its compile is one clang run (seconds to minutes),
driven by its recipe (``gemmar_aot_kernels.hipcc``, ``gemmar_aot_kernels.jitv2``) in a process of its own (:mod:`.hipcc_process`; mori's
JIT driver is imported there, bare), in a work directory of its own under the store's ``work/``.
:class:`HipccExecutor` is a compile executor (``scheduler.Executor``): threads
start those processes, longest first by the cost model, each under its key's claim in the store
(a concurrent builder compiles a key once, as for every kernel), and the record is the spec, the
derived fields of the code object (its target and kernels: ``derive.derive_object``), the key's
ingredients, the compile time and the clang command that made it (relative paths).

A failure is a result (``ok=False``) naming the command and clang's last lines, never an
exception; an interrupt ends the clang processes still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

from gemmar_aot.compiler.worker import CompileResult
from gemmar_aot.model.spec import KernelSpec
from gemmar_aot.compiler.hipcc_process import BUILD_PID_ENV, OUT_NAME
from gemmar_aot.util.lifecycle import kill_process_group

#: Seconds an interrupted compile process gets to end its group and remove its directory (it takes
#: well under one) before the build kills the group outright.
STOP_GRACE_S = 5.0


class HipccExecutor:
    """Compiles hipcc specs with the toolchain ``tc`` (its root, its profile's mori)."""

    def __init__(self, tc, jobs: int | None = None, costs=None):
        self.tc = tc
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.costs = costs
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False

    def info(self) -> dict:
        return {"name": "hipcc", "jobs": self.jobs}

    def run(self, tasks: Sequence, store_root: str) -> Iterator[tuple[KernelSpec, CompileResult]]:
        todo: queue.Queue = queue.Queue()
        order = sorted(tasks, key=lambda t: -(self.costs.expected(t.spec) if self.costs else 0))
        for t in order:
            todo.put(t)
        done: queue.Queue = queue.Queue()

        def work() -> None:
            while not self._closed:
                try:
                    t = todo.get_nowait()
                except queue.Empty:
                    return
                done.put((t.spec, self._compile(t, store_root)))

        threads = [threading.Thread(target=work, name="gemmar-hipcc", daemon=True)
                   for _ in range(min(self.jobs, len(order)))]
        for th in threads:
            th.start()
        try:
            for _ in order:
                yield done.get()
        finally:
            self.close()
            for th in threads:
                th.join()

    def _compile(self, t, store_root: str) -> CompileResult:
        from gemmar_aot.compiler.derive import derived_fields, is_current
        from gemmar_aot.store import Store

        spec, t0, c0 = t.spec, time.perf_counter(), _children_cpu()
        try:
            store = Store(store_root)
            with store.claim(t.key) as claim:
                if claim.hit is not None and is_current(claim.hit):
                    return CompileResult(spec.spec_id, True, time.perf_counter() - t0, claim.hit, hit=True)
                t_run = time.monotonic()
                code, made = self._clang(spec, store.work_dir)
                seconds = time.perf_counter() - t0
                fields = {"spec": spec.to_json(), **derived_fields(code, None, spec.param_dict()["arch"]),
                          "ingredients": t.ingredients, "compile_seconds": round(seconds, 3), **_made(made)}
                t_store = time.monotonic()
                rec = claim.put(code, fields)
            return CompileResult(spec.spec_id, True, seconds, rec, cpu_seconds=_children_cpu() - c0,
                                 phases=(("compile", t_run, t_store), ("store", t_store, time.monotonic())),
                                 pid=os.getpid())
        except BaseException as exc:  # noqa: BLE001 - every failure is a result
            if isinstance(exc, KeyboardInterrupt):
                raise
            return CompileResult(spec.spec_id, False, time.perf_counter() - t0, error=str(exc),
                                 cpu_seconds=_children_cpu() - c0, pid=os.getpid())

    def _clang(self, spec: KernelSpec, work_root: Path) -> tuple[bytes, list | dict]:
        """The code object of ``spec`` and what its compile process printed (:func:`compile_in_process`)."""

        def started(proc: subprocess.Popen) -> None:
            with self._lock:
                self._procs.add(proc)

        def ended(proc: subprocess.Popen) -> None:
            with self._lock:
                self._procs.discard(proc)

        return compile_in_process(spec, self.tc, work_root, started=started, ended=ended)

    def close(self) -> None:
        """End the clang processes still running (an interrupt); safe to call again."""
        self._closed = True
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except OSError:
                    pass


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def compile_in_process(spec: KernelSpec, tc, work_root: Path, *, started=None, ended=None) -> tuple[bytes, list | dict]:
    """The code object of ``spec`` and what its compile process printed of how it made it (the
    clang command; see :func:`_made`), from a process of its own, with the toolchain ``tc``.

    The compile works in a directory of its own under ``work_root`` (a store's ``work/``, or a
    node's; never the system temp directory) and leads a process group of its own, which holds
    clang's driver, ``-cc1`` and the linker: it ends them and removes its directory when it is
    stopped or the process that started it dies (:mod:`.hipcc_process`); the group is swept here
    too once it exits, so a compile killed outright leaves nothing running either. ``started`` and
    ``ended`` see the process (an executor ends the ones running when it is interrupted)."""
    work_root = Path(work_root).resolve()  # absolute: it is the compile's TMPDIR, and clang runs elsewhere
    work_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{spec.recipe}-{spec.kind}-", dir=work_root))
    try:
        cmd = [sys.executable, "-m", "gemmar_aot.compiler.hipcc_process", json.dumps(spec.to_json()),
               str(tc.root), str(tc.mori_dir), str(work)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env={**os.environ, BUILD_PID_ENV: str(os.getpid())})
        if started is not None:
            started(proc)
        try:
            stdout, stderr = proc.communicate()
        except BaseException:
            # interrupted (a Ray worker told to exit gets SystemExit here, and may be killed at any
            # moment after): the compile process ends its group and removes its directory on
            # SIGTERM, whatever becomes of us; a SIGKILL from us would leave the directory behind
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE_S)
            raise
        finally:
            # whatever of its group is still there, gone before the directory is removed: a clang
            # still writing would leave it behind
            kill_process_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
            if ended is not None:
                ended(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"{spec.label()}: compile failed ({_exit_status(proc.returncode)}):\n"
                               f"{stderr[-4000:]}")
        return (work / OUT_NAME).read_bytes(), json.loads(stdout.splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compile_detached(spec_json: dict, ingredients: dict, tc, work_root: Path) -> tuple[CompileResult, tuple | None]:
    """Compile one hipcc or JIT v2 spec without a store (a Ray node): (the result, whose ``record``
    holds the record's fields, and ``(code, None)``: no launcher, mori launches it; or None when it
    failed). The one writer derives the record's fields from the bytes and stores them."""
    spec = KernelSpec.from_json(spec_json)
    t0, c0 = time.perf_counter(), _children_cpu()
    try:
        code, made = compile_in_process(spec, tc, work_root)
    except Exception as exc:  # noqa: BLE001 - every failure is a result
        return CompileResult(spec.spec_id, False, time.perf_counter() - t0, error=str(exc),
                             cpu_seconds=_children_cpu() - c0, pid=os.getpid()), None
    seconds = time.perf_counter() - t0
    fields = {"spec": spec.to_json(), "ingredients": ingredients, "compile_seconds": round(seconds, 3), **_made(made)}
    return CompileResult(spec.spec_id, True, seconds, fields, cpu_seconds=_children_cpu() - c0,
                         pid=os.getpid()), (code, None)


def _made(printed) -> dict:
    """A compile process's account of what it ran, as record fields: the clang command (the hipcc
    recipe prints it alone); a JIT v2 compile adds mori's cache entry (``mori_cache_entry``: where
    mori's cache holds it, relative to its root)."""
    if isinstance(printed, list):
        return {"command": ["clang", *printed]}
    return {"command": printed["command"], "mori_cache_entry": printed["cache_entry"]}


def _exit_status(code: int) -> str:
    """A compile process's exit, in words: a signal it died of or stopped on (128 + n) is named."""
    n = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        return f"exit {code}: stopped by {signal.Signals(n).name}" if n else f"exit {code}"
    except ValueError:
        return f"exit {code}"
