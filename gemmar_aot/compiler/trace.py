"""A build's timeline as Chrome-trace / Perfetto JSON (``gemmar-aot build --trace FILE``).

Open the file in https://ui.perfetto.dev or chrome://tracing. One row (process) per
compile worker with its ``import`` span and, per spec, ``trace`` (builder call and
FlyDSL's Python tracing), ``compile`` (MLIR/LLVM pipeline, link, reading the code object
back) and ``store`` (blob and record written); one row for the build's main process
(plan, keys, store look-ups, waiting on workers, dictionary, lock file).

Times come from the machine's monotonic clock, which every process on it shares, so
spans from different workers line up without any clock exchange.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path


class BuildTrace:
    """Collects complete ("X") events; ``write`` emits the JSON object format."""

    def __init__(self, origin: float | None = None):
        self.origin = time.monotonic() if origin is None else origin
        self.events: list[dict] = []
        self.names: dict[int, str] = {os.getpid(): "gemmar-aot build (main)"}
        self.threads: dict[tuple[int, int], str] = {}

    def span(self, name: str, t0: float, t1: float, *, pid: int | None = None, args: dict | None = None) -> None:
        """A span of worker ``pid``, or (pid None) of the calling thread of this process."""
        if pid is None:
            pid = os.getpid()
            th = threading.current_thread()
            tid = pid if th is threading.main_thread() else threading.get_native_id()
            self.threads.setdefault((pid, tid), "main" if tid == pid else th.name)
        else:
            tid = pid
        self.names.setdefault(pid, f"compile worker {pid}")
        ev = {"name": name, "cat": "build", "ph": "X", "pid": pid, "tid": tid,
              "ts": round((t0 - self.origin) * 1e6, 1), "dur": round(max(0.0, t1 - t0) * 1e6, 1)}
        if args:
            ev["args"] = args
        self.events.append(ev)

    @contextmanager
    def phase(self, name: str, **args):
        """A span of this process's calling thread around the ``with`` body (with its CPU seconds)."""
        t0, c0 = time.monotonic(), time.thread_time()
        try:
            yield
        finally:
            self.span(name, t0, time.monotonic(), args={**args, "cpu_s": round(time.thread_time() - c0, 4)})

    def to_json(self, **meta) -> dict:
        ordered = sorted(self.names, key=lambda p: (p != os.getpid(), p))
        md = []
        for i, pid in enumerate(ordered):
            md.append({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": self.names[pid]}})
            md.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": pid, "args": {"sort_index": i}})
            md.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": self.names[pid]}})
        for (pid, tid), name in self.threads.items():
            if tid != pid:
                md.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        return {"traceEvents": md + sorted(self.events, key=lambda e: (e["ts"], e["pid"])),
                "displayTimeUnit": "ms", "otherData": {"tool": "gemmar-aot build", **meta}}

    def write(self, path: str | os.PathLike, **meta) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(**meta), indent=None, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
        return path


@contextmanager
def maybe_phase(trace: BuildTrace | None, name: str, **args):
    if trace is None:
        yield
    else:
        with trace.phase(name, **args):
            yield
