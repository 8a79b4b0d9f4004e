"""How a build uses a remote cache: look up in parallel, upload as kernels finish, report once.

The local store stays in front: a local miss is read through from the remote -- every
byte verified by the backend before it is kept -- and what this build compiles, or had
locally and the remote lacks, is written through, blob before record.

- :meth:`RemoteSession.lookup` resolves the local misses against the remote: requests
  in parallel (a warm fresh checkout is two small GETs a kernel; one at a time they
  would dominate the build), each thread writing what it fetched into the local store. Fetched
  entries are written at zstd level 3 and without fsync: two fsyncs and a level-19
  compress per entry dominated a fresh checkout's build, and buy nothing
  here -- every local read verifies (a torn file is quarantined, not used) and the
  entry can be fetched again. ``gemmar-aot optimize`` (run by every build that compiles)
  re-encodes them with the store's level and dictionary.
- :meth:`RemoteSession.upload` sends each finished kernel from a small thread pool
  while the compiler keeps going; :meth:`backfill` uploads local hits the remote lacks
  (one batched existence check), so a developer's warm store seeds an empty cache.
- Failures never stop the build: the remote goes quiet after the first one (the HTTP
  client's down state), the build prints **one** warning, and the summary counts what
  happened. ``required=True`` (``--remote-required``) makes an unreachable remote, or
  one that failed during the build, an error instead.
- A blob or record the remote serves with the wrong bytes is refused (the Store treats
  it as a miss and the build compiles it), and the bad bytes are kept in the local
  store's ``quarantine/`` with the reason, for the operator to look at.

Credentials never appear here: the backend's ``name`` is the URL without them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.compiler.derive import DeriveError, is_current, whole_object_arch, with_derived
from gemmar_aot.compiler.derive_check import derivation_problems
from gemmar_aot.builder.compile_vouch import FIELD, vouch
from gemmar_aot.store.backend import record_blob, record_launcher
from gemmar_aot.store.store_errors import CorruptArtifactError, StoreError

#: Parallel requests for lookups and uploads (the server, not our CPU, is the limit).
REMOTE_JOBS = 8
#: zstd level for entries fetched from the remote (the store's default, 19, is for compiles).
FETCH_LEVEL = 3


class RemoteRequiredError(StoreError):
    """``--remote-required`` and the remote failed."""


class RemoteSession:
    """One build's traffic between the local ``store`` and ``backend`` (an
    :class:`~gemmar_aot.store.remote.HttpBackend`)."""

    def __init__(self, store, backend, *, required: bool = False, jobs: int = REMOTE_JOBS, stream=None,
                 vouch_check=None, signer=None):
        from gemmar_aot.store import Store

        self.store = store
        self.backend = backend
        #: Writes what the remote served (see the module docstring for level and durability).
        self.writer = Store(store.root, level=FETCH_LEVEL, durable=False, touch=False)
        #: One line per failure; the first is printed as the build's only remote warning.
        self.problems: list[str] = []
        self.required = required
        self.jobs = jobs
        self.stream = stream
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._uploads = ThreadPoolExecutor(max_workers=max(1, jobs // 2), thread_name_prefix="upload")
        self._pending: list = []
        #: launcher digest -> [done, bytes or None, exception]: one fetch per launcher (_launcher).
        self._launchers: dict[str, list] = {}
        self.backend.on_corrupt = self._quarantine
        #: Who must have vouched for a remote entry (``compile_vouch.VouchCheck``; None: anyone).
        self.vouch_check = vouch_check
        #: This build's compile key (``compile_vouch``): signs what it derives again for the remote.
        self.signer = signer

    # ---- reporting ----

    def problem(self, what: str, exc: BaseException) -> None:
        """Count a failure; the first one of the build (here or in the Store) prints the warning."""
        line = f"remote cache {self.backend.name}: {what} failed: {exc}"
        with self._lock:
            self.counts["remote_errors"] += 1
            first = not self.problems
            self.problems.append(line)
        if first:
            print(f"warning: {line}; going on with the local store", file=self.stream or sys.stderr, flush=True)

    def quarantine_bytes(self, where: str, data: bytes, reason: str) -> None:
        """Keep bytes the remote served that cannot be used (a refused closure pack) in the quarantine."""
        self._quarantine(where, data, reason)

    def _quarantine(self, where: str, data: bytes, reason: str) -> None:
        """Keep bytes the remote served wrong in the local quarantine (never in the store proper)."""
        with self._lock:
            self.counts["remote_corrupt"] += 1
        if self.store.readonly:
            return
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"{stamp}-{time.monotonic_ns() % 10**9:09d}-remote-{where.replace('/', '-')}"
        q = Path(self.store.quarantine_dir)
        try:
            atomic_write_bytes(q / name, data, durable=False)
            atomic_write_bytes(q / (name + ".reason"),
                               f"{self.backend.name}/{where}\n{reason}\n".encode(), durable=False)
        except OSError:
            pass

    # ---- phases of a build ----

    def probe(self) -> bool:
        """Whether the remote answers. With ``required`` an unreachable one raises."""
        return self.first_request(lambda: self.backend.ping() or True) is not None

    def first_request(self, fn):
        """``fn()``, the build's first request, as the probe: its result, or None when it failed
        (the build's one warning; the remote is left alone from then on). With ``required`` a
        failure raises. A build whose first request is useful by itself (the closure look-up)
        makes it through here instead of paying a round trip for :meth:`probe`."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any failure means: build without it
            if self.required:
                raise RemoteRequiredError(f"remote cache {self.backend.name} is required "
                                          f"(--remote-required) but failed: {e}") from None
            self.problem("the first request", e)
            return None

    def lookup(self, keys: list[str]) -> dict[str, dict]:
        """key -> record for the ``keys`` the remote has, each verified and now in the local store."""
        if not keys or self.backend.down:
            return {}
        local = self.writer.local

        def fetch(key):
            # Fetch, verify and write in the same thread: the local writes (two new files and
            # often a fan-out directory per entry) are the larger part of a hit, and their
            # syscalls overlap with the other threads' requests and writes.
            if self.backend.down:
                return key, None
            try:
                got = self.backend.get_record_json(key)
                if got is None:
                    return key, None
                if self.vouch_check is not None and self.vouch_check(key, got[0]) is None:
                    return key, None  # no trusted builder signed it: a miss, compiled here (counted by the check)
                code = self.backend.get_blob(record_blob(got[0]))  # verified, or raises
                if code is None:
                    with self._lock:
                        self.counts["record_without_blob"] += 1  # evicted: a miss, not an error
                    return key, None
                # The launcher comes with the entry: without it the local store could not derive
                # the entry again offline, and ``verify`` would call it degraded.
                ln = record_launcher(got[0])
                launcher = None if ln is None else self._launcher(ln)
                current = is_current(got[0])
                whole = whole_object_arch(got[0]) is not None  # mori loads it whole: no launcher to have
                if launcher is None and not whole and (ln is not None or not current):
                    with self._lock:
                        # Current: a hit all the same (degraded). Stale: a miss, compiled again.
                        self.counts["without_launcher" if current else "stale_without_launcher"] += 1
                    if not current:
                        return key, None
            except CorruptArtifactError as e:
                self.problem(f"entry {key}", e)  # refused; on_corrupt quarantined the bytes
                return key, None
            except Exception as e:  # noqa: BLE001 - a remote failure is a miss, never fatal here
                self.problem(f"lookup of {key}", e)
                return key, None
            if current:
                wrong = derivation_problems(got[0], code, launcher) if launcher is not None or whole else []
                if wrong:  # its own blobs contradict it: refused as a corrupt entry, compiled here
                    self._quarantine(f"ac/{key}", got[1], "the record contradicts its own blobs: " + "; ".join(wrong))
                    return key, None
                local.put_blob(code)  # blobs (the launcher in _launcher) before record
                return key, local.put_record_json(key, got[1])
            # Derived by other derive code: never trusted as is, never a miss. Derived again
            # here from its verified blobs.
            try:
                rec = with_derived(got[0], code, launcher)
            except DeriveError as e:
                self.problem(f"re-deriving {key}", e)  # this derive code refuses it: compile it
                return key, None
            local.put_blob(code)  # before the refreshed entry's upload reads it
            rec = self.refresh(key, rec)
            local.put_record(key, rec)
            with self._lock:
                self.counts["rederived"] += 1
            return key, rec

        found: dict[str, dict] = {}
        with ThreadPoolExecutor(max_workers=min(self.jobs, len(keys)), thread_name_prefix="lookup") as pool:
            for key, rec in pool.map(fetch, keys):
                if rec is not None:
                    found[key] = rec
        self.counts["remote_hits"] += len(found)
        return found

    def _launcher(self, ln) -> bytes | None:
        """The verified bytes of launcher ``ln``, now in the local store: from the local store when
        it has them, else fetched from the remote once per build (a launcher serves every kernel
        of its builder call: 58 of them serve the reference manifest's 424 kernels). None when
        the remote has none. Raises what the remote raises (a corrupt blob, a failure)."""
        with self._lock:
            slot = self._launchers.get(ln.hash)
            mine = slot is None
            if mine:
                slot = self._launchers[ln.hash] = [threading.Event(), None, None]
        if not mine:
            slot[0].wait()
            if slot[2] is not None:
                raise slot[2]
            return slot[1]
        try:
            local = self.writer.local
            data = None
            if local.contains_blob(ln.hash):
                try:
                    data = local.load_blob(ln.hash, ln.size)
                except StoreError:
                    data = None  # damaged here (quarantined by the read): fetched again
            if data is None:
                data = self.backend.get_blob(ln)  # verified, or raises
                if data is not None:
                    local.put_blob(data)
            slot[1] = data
            return data
        except BaseException as e:
            slot[2] = e
            raise
        finally:
            slot[0].set()

    def refresh(self, key: str, rec: dict) -> dict:
        """``rec``, derived again by this code from blobs already in the local store, its old
        signatures dropped (they were over the record it was), queued for the remote and returned: signed anew
        with this build's compile key when the build checks signatures (it took those blobs from
        a trusted builder, or from its own store); not uploaded when it checks them and holds no
        key (replacing the remote's signed entry with an unsigned one would cost every builder
        that checks signatures its hit)."""
        rec = {k: v for k, v in rec.items() if k != FIELD}  # its signatures were over the record it was
        if self.vouch_check is not None:
            if self.signer is None:
                return rec
            rec = vouch(key, rec, self.signer)
        self.upload(key, rec)
        return rec

    def upload(self, key: str, rec: dict) -> None:
        """Queue ``key`` (already in the local store) for upload; returns at once."""
        if self.backend.writable and not self.backend.down:
            self._pending.append(self._uploads.submit(self._upload, key, rec))

    def _upload(self, key: str, rec: dict) -> None:
        if self.backend.down:
            return
        try:
            ln = record_launcher(rec)
            if ln is not None and self.store.has_blob(ln.hash):  # else degraded here: the remote may have it
                self.backend.put_blob(self.store.load_blob(ln.hash, ln.size))
            blob = record_blob(rec)
            code = self.store.load_blob(blob.hash, blob.size)
            self.backend.put_blob(code)  # blobs before record
            self.backend.put_record(key, rec)
            with self._lock:
                self.counts["uploads"] += 1
                self.counts["bytes_uploaded_code"] += len(code)
        except Exception as e:  # noqa: BLE001 - a failed upload costs a future hit, not this build
            self.problem(f"upload of {key}", e)

    def backfill(self, records: dict[str, dict]) -> None:
        """Upload the local hits ``records`` (key -> record) that the remote has no entry for."""
        if not records or not self.backend.writable or self.backend.down:
            return
        try:
            missing = self.backend.find_missing_records(sorted(records))
        except Exception as e:  # noqa: BLE001
            self.problem("the existence check", e)
            return
        for key in sorted(missing):
            self.upload(key, records[key])

    def finish(self) -> dict:
        """Wait for uploads; the summary's ``remote`` section. Raises when required and it failed."""
        for f in self._pending:
            f.result()
        self._uploads.shutdown(wait=True)
        stats = self.backend.stats
        out = {
            "url": self.backend.name,
            "read_only": not self.backend.writable,
            "hits": self.counts["remote_hits"],
            "rederived": self.counts["rederived"],
            "uploads": self.counts["uploads"],
            "errors": self.counts["remote_errors"],
            "corrupt_refused": self.counts["remote_corrupt"],
            "down": self.backend.down,
            "requests": stats["requests"],
            "retries": stats["retries"],
            "bytes_down": stats["bytes_down"],
            "bytes_up": stats["bytes_up"],
            "first_problem": self.problems[0] if self.problems else None,
        }
        self.backend.close()
        if self.required and (self.backend.down or self.problems):
            raise RemoteRequiredError(f"remote cache {self.backend.name} failed during the build "
                                      f"(--remote-required): {out['first_problem'] or self.backend.down}; "
                                      f"every kernel that finished is in the local store")
        return out


def remote_stats(store, backend) -> dict:
    """``gemmar-aot stats --remote``: is the remote reachable, how much of this store and of
    each of its lock files it holds, and the last build's remote traffic.

    Bazel's HTTP protocol has no listing, so coverage is measured from our side: one
    HEAD ``/ac/<key>`` per local record (in parallel). Never writes to the remote.
    """
    from gemmar_aot.model.lock import read_lock

    t0 = time.perf_counter()
    out: dict = {"url": backend.name}
    try:
        backend.ping()
        out["reachable"] = True
        out["latency_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        out.update(reachable=False, error=str(e))
        return out
    local = sorted(k for k, _ in store.local.iter_record_files())
    locks = {}
    if store.lock_dir.is_dir():
        for p in sorted(store.lock_dir.glob("*.lock.json")):
            try:
                locks[p.name] = sorted(read_lock(p).check_parts().action_keys())
            except Exception as e:  # noqa: BLE001 - a bad lock is reported, not fatal
                locks[p.name] = str(e)
    wanted = sorted(set(local).union(*(v for v in locks.values() if isinstance(v, list))))
    try:
        missing = backend.find_missing_records(wanted)
    except Exception as e:  # noqa: BLE001
        out.update(reachable=False, error=str(e))
        return out
    out["local_entries"] = len(local)
    out["local_entries_on_remote"] = sum(1 for k in local if k not in missing)
    out["locks"] = {name: ({"keys": len(v), "on_remote": sum(1 for k in v if k not in missing)}
                           if isinstance(v, list) else {"error": v}) for name, v in locks.items()}
    last = store.last_build_stats() or {}
    out["last_build"] = {k: last.get(k) for k in ("manifest", "local_hits", "remote_hits", "uploads", "remote")}
    out["requests"] = backend.stats["requests"]
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out
