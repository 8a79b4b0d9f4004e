"""Miss reports: what a pod was asked for and did not have, for CI to build next.

With ``$GEMMAR_AOT_MISS_REPORT=PATH`` (or ``miss_report=PATH`` on the op) every distinct miss
-- a call at an M whose kernels were not built, or an op constructed for a tuple none were
built for -- is appended once per process to PATH as one JSON line::

    {"schema": 1, "op": "GemmAllReduceOp", "tuple": {"transport": ..., "n": ..., "k": ...,
     "world": ..., "quant": ..., "gather_dtype": ..., "gather_transport": ..., "block_m": ...,
     "sdma_queues": ..., "m_max": ...}, "m": 768, "served": null, "error": "ArtifactMissingError",
     "count": 1, "rank": 0, "profile": "default", "locks": ["<sha256 of each lock file>"],
     "time": "2026-12-03T16:00:00Z", "host": "...", "pid": 1234}

An :class:`~gemmar_aot.runtime.ep_op.EpDispatchCombineOp` writes ``"ep": {world, hidden, max_tokens,
experts, topk, dispatch_dtype, combine_dtype, quant_type, combine_mode, scale_dim, scale_type_size,
max_total_recv_tokens, std_moe}`` (the ``[[ep]]`` fields) and ``"tuple": null``; its ``m`` is the
token count of a dispatch above the capacity (None: no entry for the config at all).

``served`` is the bucket that served the call (None: the call raised, and ``error`` says
what). ``count`` is 1: the line is written at the first miss, before the process can die of
it; ``gemmar-aot suggest`` counts lines, i.e. processes and ranks. PATH may be a directory:
then each process writes its own ``misses-<host>-<pid>.jsonl`` in it. Many processes can
append to one file: each line is one ``write`` under an exclusive ``flock``, so lines never
interleave and none is lost. A report that cannot be written is logged once at WARNING and
never fails the call it reports.

Runtime module: standard library only.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterable
from gemmar_aot.util.filedigest import sha256_hex

log = logging.getLogger("gemmar_aot.runtime")

ENV_VAR = "GEMMAR_AOT_MISS_REPORT"
#: What a miss line may describe: a GEMM tuple, an EP v2 entry, a hipcc code object, a JIT v2 plan.
SUBJECTS = ("tuple", "ep", "hipcc", "jitv2")
ON_MISS_ENV = "GEMMAR_AOT_ON_MISS"
SCHEMA = 1

_reporters: dict[str, "MissReporter"] = {}
_reporters_lock = threading.Lock()


class MissReporter:
    """Appends each distinct miss of this process to one report (a file, or a file in a directory)."""

    def __init__(self, target: Path):
        self.target = target
        self._seen: set[tuple] = set()
        self._lock = threading.Lock()
        self._warned = False

    def path(self) -> Path:
        if self.target.is_dir():
            return self.target / f"misses-{socket.gethostname()}-{os.getpid()}.jsonl"
        return self.target

    def report(self, *, op: str, tuple_id: dict, m: int | None, served: int | None, error: str | None,
               rank: int | None, profile: str | None, locks: Iterable[str], subject: str = "tuple") -> bool:
        """Append the miss unless this process reported it already. Returns whether a line was written.
        ``subject``: what ``tuple_id`` describes, one of :data:`SUBJECTS` (but for ``"tuple"``, the line's
        ``tuple`` is null)."""
        ident = (op, subject, tuple(sorted(tuple_id.items())), m, served)
        with self._lock:
            if ident in self._seen:
                return False
            self._seen.add(ident)
        what = {"tuple": tuple_id} if subject == "tuple" else {"tuple": None, subject: tuple_id}
        line = json.dumps({"schema": SCHEMA, "op": op, **what, "m": m, "served": served,
                           "error": error, "count": 1, "rank": rank, "profile": profile,
                           "locks": sorted(set(locks)), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "host": socket.gethostname(), "pid": os.getpid()}, sort_keys=True) + "\n"
        try:
            append_line(self.path(), line.encode())
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("gemmar-aot: cannot write the miss report %s (%s); misses are not reported",
                            self.path(), exc)
            return False
        return True


def append_line(path: Path, data: bytes) -> None:
    """``data`` appended to ``path`` in one write under an exclusive lock (many writers, no tearing)."""
    import fcntl

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def reporter(miss_report: Any = None) -> MissReporter | None:
    """The process's reporter for ``miss_report`` (else ``$GEMMAR_AOT_MISS_REPORT``), or None."""
    target = miss_report if miss_report is not None else os.environ.get(ENV_VAR, "").strip() or None
    if target is None or target is False:
        return None
    key = str(Path(target).expanduser().resolve())
    with _reporters_lock:
        got = _reporters.get(key)
        if got is None:
            got = _reporters[key] = MissReporter(Path(key))
        return got


def policy(on_miss: str | None, *, cannot_pad: str | None = None) -> str:
    """The miss policy an op runs: ``on_miss``, else ``$GEMMAR_AOT_ON_MISS``, else ``"raise"``.

    ``cannot_pad``: why this op has no exact padding. Then ``on_miss="pad"`` passed to the op
    is refused with that reason, and ``pad`` from the environment (set for a whole pod) means
    ``raise`` for this op, said once at INFO."""
    explicit = on_miss is not None
    if on_miss is None:
        on_miss = os.environ.get(ON_MISS_ENV, "").strip() or "raise"
    if on_miss not in ("raise", "pad"):
        raise ValueError(f"on_miss={on_miss!r} (or ${ON_MISS_ENV}): use 'raise' or 'pad'")
    if on_miss == "pad" and cannot_pad is not None:
        if explicit:
            raise ValueError(f"on_miss='pad': {cannot_pad}")
        if cannot_pad not in _said:
            _said.add(cannot_pad)
            log.info("gemmar-aot: $%s=pad does not apply here (%s); a miss raises", ON_MISS_ENV, cannot_pad)
        return "raise"
    return on_miss


_said: set[str] = set()


class OpMisses:
    """One op's misses: counted per M (``counts``, what ``op.stats()`` shows), and each distinct
    (M, bucket served) handed once to the process's report, if one is set.

    ``identity()`` gives what every report line of the op says -- (tuple, profile, lock
    digests) -- and is called once, at the first report: hashing the lock files is left out of
    construction and of every call after the first."""

    def __init__(self, op: str, miss_report: Any, identity, *, rank: int | None, subject: str = "tuple"):
        self.op, self.rank, self.subject = op, rank, subject
        self.counts: dict[int | None, int] = {}
        self._reporter = reporter(miss_report)
        self._identity = identity
        self._made: tuple[dict, str | None, list[str]] | None = None
        self._reported: set[tuple] = set()

    def miss(self, m: int | None, error: str | None, served: int | None = None) -> None:
        """Count a miss at ``m`` (None: no kernels for the op's tuple at all) and report it once;
        ``served``: the bucket a padded call ran at (then ``error`` is None). Never raises."""
        self.counts[m] = self.counts.get(m, 0) + 1
        if self._reporter is None or (m, served) in self._reported:
            return  # a padded call repeats often: after its first report it costs the count alone
        self._reported.add((m, served))
        try:
            if self._made is None:
                self._made = self._identity()
            tuple_id, profile, locks = self._made
            self._reporter.report(op=self.op, tuple_id=tuple_id, m=m, served=served, error=error, rank=self.rank,
                                  profile=profile, locks=locks, subject=self.subject)
        except Exception:  # noqa: BLE001 - a report never fails the call it reports
            log.exception("gemmar-aot: writing the miss report failed")


def tuple_identity(key: Any, m_max: int | None) -> dict:
    """A report line's ``tuple``: the op's TupleKey fields and its window cap (None without a window)."""
    return {"transport": key.transport, "n": key.n, "k": key.k, "world": key.world, "quant": key.quant,
            "gather_dtype": key.gather_dtype, "gather_transport": key.gather_transport, "block_m": key.block_m,
            "sdma_queues": key.sdma_queues, "m_max": m_max}


def profile_of(artifacts: Any) -> str | None:
    """The toolchain profile the artifacts were built with (the first lock that names one)."""
    return next((i.mori.profile for i in getattr(artifacts, "locks", ()) if i.mori is not None), None)


def lock_digests(artifacts: Any) -> list[str]:
    """The sha256 of every lock file the artifacts were read from (a lock given as data: none)."""
    out = []
    for info in getattr(artifacts, "locks", ()):
        p = info.source.lock_path
        if p is not None:
            try:
                out.append(sha256_hex(Path(p).read_bytes()))
            except OSError:
                continue
    return out


def read_reports(paths: Iterable[str | os.PathLike]) -> tuple[list[dict], list[str]]:
    """Every miss line of the report files (a directory: its ``*.jsonl``): (lines, problems). A line
    that is not a miss of this schema is a problem, not an error: reports come from many pods."""
    lines, problems = [], []
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        files += sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as exc:
            problems.append(f"{f}: {exc.strerror or exc}")
            continue
        for n, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                d = json.loads(raw)
                if d.get("schema") != SCHEMA or not any(isinstance(d.get(k), dict) for k in SUBJECTS):
                    raise ValueError(f"not a schema-{SCHEMA} miss line")
                lines.append(d)
            except ValueError as exc:
                problems.append(f"{f}:{n}: {exc}")
    return lines, problems
