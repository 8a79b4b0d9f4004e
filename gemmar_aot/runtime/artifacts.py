"""Finding compiled artifacts: lock files plus the stores that hold their blobs.

Where the runtime looks, first match wins:

1. ``artifacts=`` given to the op (or to :func:`load_artifacts`): a lock-file path,
   a store directory holding ``locks/*.lock.json``, a ``(lock, store_root)`` pair
   (the lock may be a path, a :class:`~gemmar_aot.model.lock.Lock` or its JSON data), a lock alone
   (its blobs are looked up in the default store: ``$GEMMAR_AOT_STORE`` or
   ``artifacts/``), an :class:`Artifacts`, or a list of any of these;
2. ``$GEMMAR_AOT_ARTIFACTS``: lock paths and/or store directories, separated by
   ``os.pathsep``;
3. installed artifact packages: every entry point in the group
   ``gemmar_aot.artifacts``. An entry point resolves to a callable that takes no
   arguments and returns a ``(lock_path, store_root)`` pair, a store directory,
   or a list of those. A wheel declares it like::

       [project.entry-points."gemmar_aot.artifacts"]
       dsv4-pro-wo_b = "gemmar_aot_artifacts_dsv4:locate"

**Authenticity.** With trusted public keys (``trusted_keys=`` or ``$GEMMAR_AOT_TRUSTED_KEYS``;
:mod:`gemmar_aot.trust`) every lock must carry a signature envelope beside it
(``locks/M.intoto.jsonl``, a wheel's ``lock.intoto.jsonl``) by a trusted, unrevoked key, over
exactly its bytes and not expired; else :class:`~.artifact_errors.ArtifactSignatureError`, before anything
of the lock is parsed. The lock names every record, code object and part by digest, and each is
checked against it, so the signature covers everything served. Without trusted keys locks load as
before, and the runtime says once, at INFO, that nothing was authenticated.

All sources are merged into one index keyed by :class:`TupleKey` -> padded M ->
rank. The same (tuple, M, rank) found twice is fine when both name the same
kernels (same action keys, in the same order); otherwise it is an
:class:`ArtifactConflictError` naming both sources, because picking one silently
would make which kernels run depend on install order.

For the bf16 wire the gather transport is irrelevant (only an fp8 gather has a
transport), so bf16 tuples are indexed with ``gather_transport=None`` and match
whatever the caller passes.

Locks are read by :mod:`gemmar_aot.model` (validated on read). Runtime module:
standard library plus ``gemmar_aot.store`` (zstandard).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gemmar_aot.model.layout import WindowLayout
from gemmar_aot.model.bundle import LOCK_SUFFIX, LockBundle
from gemmar_aot.model.lock import ENTRY_POINT_GROUP, Lock
from gemmar_aot.model.types import LaunchEntry, LockEp, LockTuple, RankLaunches, TupleKey
from gemmar_aot.store.record_index import RecordIndex, RecordIndexError
from gemmar_aot.store.blob_index import BlobIndex, BlobIndexError

from .artifact_errors import (ArtifactConflictError, ArtifactError, ArtifactMismatchError, ArtifactNotFoundError,
                     ArtifactSignatureError)
from .provenance import MoriIdentity, select_profile

if TYPE_CHECKING:  # a pod imports the store's code and the trust package only when it uses them
    from gemmar_aot.store import Store
    from gemmar_aot.trust.trust_set import TrustSet, Verified

__all__ = ["ENTRY_POINT_GROUP", "ENV_VAR", "Artifacts", "EpRankEntry", "LockInfo", "RankEntry", "Source",
           "TupleKey", "load_artifacts"]

ENV_VAR = "GEMMAR_AOT_ARTIFACTS"
LOCK_GLOB = "*" + LOCK_SUFFIX

log = logging.getLogger("gemmar_aot.runtime")
_said_unauthenticated = False


@dataclass(frozen=True)
class Source:
    """One lock file and the store its blobs live in."""

    lock_path: Path | None  # None for a lock handed over as a dict
    store_root: Path
    origin: str  # how it was found: "artifacts=", "$GEMMAR_AOT_ARTIFACTS", "entry point NAME"

    def __str__(self) -> str:
        where = str(self.lock_path) if self.lock_path is not None else f"<lock dict> (store {self.store_root})"
        return f"{where} [{self.origin}]"


@dataclass
class LockInfo:
    """The per-lock facts every entry of that lock shares."""

    source: Source
    arch: str
    code_object_version: int | None
    manifest: str
    toolchain_digest: str | None
    mori: MoriIdentity | None = None  # the mori (and toolchain profile) the lock was built with
    signed_by: Verified | None = None  # who vouched for it, when loaded with trusted keys


@dataclass
class RankEntry:
    """The kernels of one (tuple, padded M, rank): what the op loads and launches."""

    key: TupleKey
    m: int
    rank: int
    tuple: LockTuple
    kernels: RankLaunches  # resolved on first use: indexing a lock builds no launch entries
    lock: LockInfo

    @property
    def launches(self) -> Sequence[LaunchEntry]:
        return self.kernels.launches

    @property
    def self_test(self) -> Sequence[LaunchEntry]:
        return self.kernels.self_test

    @property
    def layout(self) -> WindowLayout | None:
        return self.tuple.layout

    @cached_property
    def where(self) -> str:
        """The lock and the manifest line this entry came from (made once: every message about the
        entry starts with it, and verification builds them as it goes)."""
        return f"{self.lock.source} ({self.tuple.source or '?'})"

    @cached_property
    def at(self) -> str:
        """:attr:`where` and the M: how a message names one of this entry's kernels' place."""
        return f"{self.where} M={self.m}"

    def identity(self) -> tuple:
        """What two entries must share to be the same kernels: every action key, in order."""
        return self.kernels.launch_keys()


@dataclass
class EpRankEntry:
    """The kernels of one rank of one built ``[[ep]]`` entry (mori's EP dispatch/combine v2): what
    :class:`~gemmar_aot.runtime.ep_op.EpDispatchCombineOp` loads and launches."""

    rank: int
    ep: LockEp
    kernels: RankLaunches
    lock: LockInfo

    @property
    def config(self):
        return self.ep.config

    @property
    def launches(self) -> Sequence[LaunchEntry]:
        return self.kernels.launches

    @property
    def self_test(self) -> Sequence[LaunchEntry]:
        return ()

    @cached_property
    def where(self) -> str:
        return f"{self.lock.source} ({self.ep.source or '?'})"

    @property
    def at(self) -> str:
        return f"{self.where} rank {self.rank}"

    def identity(self) -> tuple:
        return self.kernels.launch_keys()


@dataclass
class Artifacts:
    """Every tuple of every source, merged. Build with :func:`load_artifacts`."""

    sources: list[Source] = field(default_factory=list)
    locks: list[LockInfo] = field(default_factory=list)
    index: dict[TupleKey, dict[int, dict[int, RankEntry]]] = field(default_factory=dict)
    #: built EP entries: their configuration -> rank -> kernels
    ep_index: dict[Any, dict[int, EpRankEntry]] = field(default_factory=dict)
    #: mori's hipcc-JIT code objects: their variant (source, arch, NIC, proxy) -> (lock item, its lock)
    hipcc_index: dict[Any, tuple[Any, LockInfo]] = field(default_factory=dict)
    #: mori's JIT v2 code objects: where they serve (arch, NIC) -> mori's cache entry -> (lock item, its lock)
    jitv2_index: dict[Any, dict[str, tuple[Any, LockInfo]]] = field(default_factory=dict)
    _stores: dict[Path, Store] = field(default_factory=dict, repr=False)
    _indexes: dict[int, tuple[LockInfo, RecordIndex | None]] = field(default_factory=dict, repr=False)
    _blob_indexes: dict[int, tuple[LockInfo, BlobIndex | None]] = field(default_factory=dict, repr=False)
    trust: TrustSet | None = None  # the keys every lock here was checked against (None: unauthenticated)

    # ---- building ----

    def add_lock(self, lock: Lock, source: Source, signed_by: Verified | None = None) -> None:
        """Index every tuple of ``lock``; raises ArtifactConflictError on a conflicting duplicate."""
        if not isinstance(lock, Lock):
            raise TypeError(f"add_lock takes a Lock (gemmar_aot.model.lock), got {type(lock).__name__}")
        if self.trust is not None and signed_by is None:
            raise ArtifactSignatureError(
                f"the lock {source} cannot be authenticated: trusted keys are set ({self.trust.source}) and it "
                f"was given as data, not as a file with its signature envelope; pass the lock's path")
        info = LockInfo(source=source, arch=lock.arch, code_object_version=lock.code_object_version,
                        manifest=lock.manifest.name, toolchain_digest=lock.toolchain.digest,
                        mori=MoriIdentity.from_toolchain(lock.toolchain), signed_by=signed_by)
        self.sources.append(source)
        self.locks.append(info)
        for t in lock.tuples:
            key, m = t.id.key, t.id.m
            by_rank = self.index.setdefault(key, {}).setdefault(m, {})
            for r in t.ranks:
                self._place(by_rank, RankEntry(key, m, r.rank, t, r, info))
        for ep in lock.eps:
            for r in ep.ranks:
                self.add_ep_entry(EpRankEntry(r.rank, ep, r, info))
        for h in lock.hipcc:
            self.add_hipcc(h, info)
        for j in lock.jitv2:
            self.add_jitv2(j, info)

    def add_hipcc(self, item: Any, info: LockInfo) -> None:
        """Index one built hipcc code object (a ``LockHipcc``); a duplicate must be the same kernel."""
        old = self.hipcc_index.setdefault(item.variant, (item, info))
        if old[0].entry.key != item.entry.key:
            raise ArtifactConflictError(
                f"conflicting artifacts for mori's {item.variant.describe()}: {old[1].source} ({old[0].source}) and "
                f"{info.source} ({item.source}) name different kernels. Remove one of them, or point artifacts=/"
                f"${ENV_VAR} at exactly one")

    def add_jitv2(self, item: Any, info: LockInfo) -> None:
        """Index one built JIT v2 code object (a ``LockJitV2``); a duplicate must be the same kernel."""
        old = self.jitv2_index.setdefault(item.variant, {}).setdefault(item.cache_entry, (item, info))
        if old[0].entry.key != item.entry.key:
            raise ArtifactConflictError(
                f"conflicting artifacts for mori's JIT v2 cache entry {item.cache_entry}: {old[1].source} "
                f"({old[0].source}) and {info.source} ({item.source}) name different kernels. Remove one of them, "
                f"or point artifacts=/${ENV_VAR} at exactly one")

    def add_ep_entry(self, entry: EpRankEntry) -> None:
        """Index one rank of a built EP entry; a duplicate must name the same kernels."""
        by_rank = self.ep_index.setdefault(entry.config, {})
        old = by_rank.get(entry.rank)
        if old is None:
            by_rank[entry.rank] = entry
        elif old.identity() != entry.identity():
            raise ArtifactConflictError(
                f"conflicting artifacts for the EP entry {entry.config} rank {entry.rank}: {old.where} and "
                f"{entry.where} name different kernels. Remove one of them, or point artifacts=/${ENV_VAR} at "
                f"exactly one")

    def add_entry(self, entry: RankEntry) -> None:
        """Index one (tuple, M, rank); a duplicate must name the same kernels."""
        self._place(self.index.setdefault(entry.key, {}).setdefault(entry.m, {}), entry)

    @staticmethod
    def _place(by_rank: dict[int, RankEntry], entry: RankEntry) -> None:
        """Put ``entry`` in its (tuple, M)'s ranks; a duplicate must name the same kernels."""
        old = by_rank.get(entry.rank)
        if old is None:
            by_rank[entry.rank] = entry
        elif old.identity() != entry.identity():
            mo = None if old.layout is None else old.layout.m_max
            mn = None if entry.layout is None else entry.layout.m_max
            why = f"built for window m_max {mo} and {mn}" if mo != mn else "different action keys"
            raise ArtifactConflictError(
                f"conflicting artifacts for {entry.key.describe()} M={entry.m} rank {entry.rank}: "
                f"{old.where} and {entry.where} name different kernels ({why}). "
                f"Remove one of them, or point artifacts=/${ENV_VAR} at exactly one")

    def store(self, source: Source) -> Store:
        """The store of ``source``, opened when first asked for (a lock whose record and blob
        indexes serve every record and code object never opens one)."""
        st = self._stores.get(source.store_root)
        if st is None:
            from gemmar_aot.store import Store

            st = self._stores[source.store_root] = Store(source.store_root, readonly=True)
        return st

    @staticmethod
    def _beside_lock(cache: dict, info: LockInfo, read: Callable[[Path], Any]) -> Any:
        """What ``read(lock path)`` gives for ``info``'s lock, read once per lock (``cache``); None
        for a lock given as data."""
        got = cache.get(id(info))
        if got is not None and got[0] is info:
            return got[1]
        value = None if info.source.lock_path is None else read(info.source.lock_path)
        cache[id(info)] = (info, value)
        return value

    def record_index(self, info: LockInfo) -> RecordIndex | None:
        """The record index beside ``info``'s lock file (:mod:`gemmar_aot.store.record_index`), read
        once; None when the lock has none (an older store, a lock given as data): then its
        records are checked one by one. Raises ArtifactMismatchError when the index is damaged or
        was written for another lock."""
        def read(lock_path: Path) -> RecordIndex | None:
            try:
                return RecordIndex.read(LockBundle(lock_path).record_index)
            except RecordIndexError as exc:
                raise ArtifactMismatchError(f"{exc} (lock {info.source})") from None

        return self._beside_lock(self._indexes, info, read)

    def blob_index(self, info: LockInfo) -> BlobIndex | None:
        """The blob index beside ``info``'s lock file (:mod:`gemmar_aot.store.blob_index`), read once;
        None when the lock has none, or when it is damaged (said once, at WARNING: the store then
        serves every code object)."""
        def read(lock_path: Path) -> BlobIndex | None:
            path = LockBundle(lock_path).blob_index
            try:
                return BlobIndex.read(path)
            except BlobIndexError as exc:
                why = str(exc)
            except (OSError, RecursionError) as exc:  # unreadable, a directory, a header nested too deep
                why = f"{path}: cannot be read ({exc!r})"
            log.warning("gemmar-aot: %s; reading the code objects from the store instead", why)
            return None

        return self._beside_lock(self._blob_indexes, info, read)

    def load_blob(self, info: LockInfo, digest: str, size: int) -> bytes:
        """The verified code object ``digest`` of ``info``'s lock: from the lock's blob index when it
        holds it, else from the store (which raises its errors: missing, corrupt). An index found
        damaged, or holding other bytes, is said once and not used again."""
        index = self.blob_index(info)
        if index is not None:
            try:
                data = index.blob(digest, size)
            except BlobIndexError as exc:
                log.warning("gemmar-aot: %s; reading the code objects from the store instead", exc)
                self._blob_indexes[id(info)] = (info, None)
                data = None
            if data is not None:
                return data
        return self.store(info.source).load_blob(digest, size)

    # ---- queries ----

    def m_values(self, key: TupleKey, rank: int | None = None, world: int | None = None) -> tuple[int, ...]:
        """Padded M values held for ``key``: for ``rank``, or (rank None) for every rank of the world."""
        by_m = self.index.get(key, {})
        if rank is not None:
            return tuple(sorted(m for m, ranks in by_m.items() if rank in ranks))
        every = set(range(world if world is not None else key.world))
        return tuple(sorted(m for m, ranks in by_m.items() if ranks.keys() >= every))

    def entry(self, key: TupleKey, m: int, rank: int) -> RankEntry | None:
        return self.index.get(key, {}).get(m, {}).get(rank)

    def ep_entries(self, rank: int) -> list[EpRankEntry]:
        """Every built EP entry's kernels for ``rank``."""
        return [by_rank[rank] for by_rank in self.ep_index.values() if rank in by_rank]

    def describe_sources(self) -> str:
        return ", ".join(str(s) for s in self.sources) or "(none)"


# ---------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------


def _store_root_for_lock(lock_path: Path) -> Path:
    """``<root>/locks/NAME.lock.json`` -> ``<root>``; a lock elsewhere -> its directory."""
    parent = lock_path.parent
    return parent.parent if parent.name == "locks" else parent


def _check_store(root: Path, what: str) -> None:
    from gemmar_aot.store import read_store_format

    if read_store_format(root) is None:
        raise ArtifactNotFoundError(f"{what}: {root} is not an artifact store (no STORE_FORMAT file); "
                                    f"point at the store the lock was built into")


def _add_path(arts: Artifacts, path: Path, origin: str, store_root: Path | None = None) -> None:
    path = Path(path).expanduser()
    if path.is_dir():
        locks = sorted((path / "locks").glob(LOCK_GLOB)) if (path / "locks").is_dir() else []
        if not locks:
            raise ArtifactNotFoundError(
                f"{path} ({origin}) holds no lock files (expected {path}/locks/{LOCK_GLOB}); build a "
                f"manifest into it (gemmar-aot build MANIFEST --store {path}) or name a lock file")
        root = Path(store_root) if store_root is not None else path
        _check_store(root, str(path))
        read = {lp: _read_lock(arts, lp, origin) for lp in locks}
        for lp, lock in select_profile([(lp, read[lp][0]) for lp in locks], str(path)):
            arts.add_lock(lock, Source(lp, root, origin), read[lp][1])
        return
    if not path.exists():
        raise ArtifactNotFoundError(f"no artifacts at {path} ({origin}): neither a lock file nor a store directory")
    root = Path(store_root).expanduser() if store_root is not None else _store_root_for_lock(path)
    _check_store(root, f"lock {path}")
    arts.add_lock(*_read_lock(arts, path, origin, root))


def _read_lock(arts: Artifacts, path: Path, origin: str, root: Path | None = None):
    """The lock at ``path`` (its bundle read once), checked against ``arts.trust`` when there is
    one: (lock, who signed it) -- or, given ``root``, (lock, its Source, who signed it), add_lock's
    arguments."""
    src = Source(path, root or _store_root_for_lock(path), origin)
    bundle = LockBundle(path)
    trust = arts.trust
    try:
        lock, verified = bundle.read(None if trust is None else
                                     lambda env, plain: _vouched(trust, src, bundle.envelope, env, plain))
    except OSError as exc:
        if exc.filename != str(bundle.envelope):
            raise  # the lock's own read error, as the reader raises it
        # the envelope is there and cannot be read
        raise ArtifactSignatureError(f"cannot read the signature envelope {bundle.envelope} of the lock {src}: "
                                     f"{exc.strerror or exc}") from None
    if verified is not None:
        want = LockBundle.in_store("", lock.manifest.name, lock.toolchain.profile).lock.name
        if verified.envelope.subject[0] != want:
            raise ArtifactSignatureError(
                f"the lock {src} is signed as {verified.envelope.subject[0]!r}, but it is the lock of manifest "
                f"{lock.manifest.name!r} ({want}): the envelope was made for another lock; re-sign it")
        log.debug("lock %s vouched for by %s", path, verified.describe())
    return (lock, verified) if root is None else (lock, src, verified)


def _vouched(trust: TrustSet, src: Source, envelope_path: Path, envelope: bytes | None, plain: bytes):
    """Who vouches for the lock's ``plain`` bytes by ``envelope`` (read from ``envelope_path``), among
    the trusted keys."""
    from gemmar_aot.trust.signing_keys import SignatureError

    try:
        return trust.verify(envelope, plain, str(src), str(envelope_path))
    except SignatureError as exc:
        raise ArtifactSignatureError(str(exc)) from None


def _add_spec(arts: Artifacts, spec: Any, origin: str) -> None:
    if isinstance(spec, Artifacts):
        if arts.trust is not None and not _checked_against(spec, arts.trust):
            raise ArtifactSignatureError(
                f"Artifacts given in {origin} were loaded without the trusted keys now set ({arts.trust.source}); "
                f"load them with load_artifacts(..., trusted_keys=...) or pass their lock paths")
        for by_m in spec.index.values():
            for by_rank in by_m.values():
                for entry in by_rank.values():
                    arts.add_entry(entry)
        for by_rank in spec.ep_index.values():
            for entry in by_rank.values():
                arts.add_ep_entry(entry)
        for item, info in spec.hipcc_index.values():
            arts.add_hipcc(item, info)
        for by_entry in spec.jitv2_index.values():
            for item, info in by_entry.values():
                arts.add_jitv2(item, info)
        for s in spec.sources:
            if s not in arts.sources:
                arts.sources.append(s)
        arts.locks.extend(i for i in spec.locks if i not in arts.locks)
        arts._stores.update(spec._stores)
        return
    if isinstance(spec, (str, os.PathLike)):
        _add_path(arts, Path(spec), origin)
        return
    if _is_pair(spec):
        lock, root = spec
        root = Path(root).expanduser()
        if isinstance(lock, (Lock, Mapping)):
            _check_store(root, "lock dict")
            parsed = lock if isinstance(lock, Lock) else Lock.from_json(lock, "<lock dict>")
            arts.add_lock(parsed, Source(None, root, origin))
        else:
            _add_path(arts, Path(lock), origin, store_root=root)
        return
    if isinstance(spec, (Lock, Mapping)):  # a lock alone: its blobs are in the default store
        from gemmar_aot.store import default_store_root

        _add_spec(arts, (spec, default_store_root()), origin)
        return
    if isinstance(spec, (list, tuple)):
        for s in spec:
            _add_spec(arts, s, origin)
        return
    raise TypeError(f"artifacts= must be a lock path, a store directory, a (lock, store_root) pair, a lock "
                    f"dict, an Artifacts object or a list of these; got {type(spec).__name__}")


#: The pod's trusted public keys (``gemmar_aot.trust.signing_keys.TRUSTED_KEYS_ENV``), read here so that a
#: pod that sets none never imports the trust package.
TRUSTED_KEYS_ENV = "GEMMAR_AOT_TRUSTED_KEYS"


def _trust(trusted_keys: Any) -> TrustSet | None:
    """The trust set of ``trusted_keys`` (else ``$GEMMAR_AOT_TRUSTED_KEYS``), or None when neither
    names any; raises ArtifactSignatureError on keys that cannot be used."""
    if trusted_keys is None and not os.environ.get(TRUSTED_KEYS_ENV, "").strip():
        return None
    from gemmar_aot.trust.signing_keys import SignatureError
    from gemmar_aot.trust.trust_set import trust_from

    try:
        return trust_from(trusted_keys)
    except SignatureError as exc:
        raise ArtifactSignatureError(str(exc)) from None


def _checked_against(arts: Artifacts, trust: TrustSet) -> bool:
    """Whether every lock of ``arts`` was verified with keys ``trust`` holds (and does not revoke),
    by a signature that has not expired since."""
    from datetime import datetime, timezone

    ids = {k.keyid for k in trust.keys} - trust.revoked
    now = datetime.now(timezone.utc)
    return all(i.signed_by is not None and i.signed_by.keyid in ids
               and (i.signed_by.envelope.expires is None or now < i.signed_by.envelope.expires) for i in arts.locks)


def _is_pair(spec: Any) -> bool:
    """``(lock, store_root)``: a lock (dict or file) and a directory -- not two sources in a tuple."""
    if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], (str, os.PathLike))):
        return False
    if not Path(spec[1]).expanduser().is_dir():
        return False
    lock = spec[0]
    return isinstance(lock, (Lock, Mapping)) or (isinstance(lock, (str, os.PathLike))
                                                 and not Path(lock).expanduser().is_dir())


def _entry_point_specs() -> list[tuple[Any, str]]:
    from importlib.metadata import entry_points

    out = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        origin = f"entry point {ep.name} = {ep.value}"
        try:
            fn = ep.load()
            spec = fn() if callable(fn) else fn
        except Exception as exc:  # noqa: BLE001 - report which package is broken
            raise ArtifactError(f"artifact package {origin} failed to load: {exc!r}") from exc
        out.append((spec, origin))
    return out


def load_artifacts(artifacts: Any = None, *, trusted_keys: Any = None) -> Artifacts:
    """The merged artifacts: ``artifacts`` if given, else ``$GEMMAR_AOT_ARTIFACTS``, else packages.

    ``trusted_keys`` (else ``$GEMMAR_AOT_TRUSTED_KEYS``): the public keys every lock must be signed
    by (:func:`gemmar_aot.trust.trust_set.load_trust`); none: locks are not authenticated.

    Raises ArtifactNotFoundError when none of the three yields a lock file,
    ArtifactConflictError when two sources disagree about one (tuple, M, rank), and
    ArtifactSignatureError when trusted keys are set and a lock is not vouched for by one.
    """
    trust = _trust(trusted_keys)
    if isinstance(artifacts, Artifacts):
        if trust is not None and not _checked_against(artifacts, trust):
            raise ArtifactSignatureError(
                f"these Artifacts were loaded without the trusted keys now set ({trust.source}); load them "
                f"with load_artifacts(..., trusted_keys=...) or pass their lock paths")
        return artifacts
    if trust is None:
        global _said_unauthenticated
        if not _said_unauthenticated:
            _said_unauthenticated = True
            log.info("no trusted keys set ($GEMMAR_AOT_TRUSTED_KEYS, trusted_keys=): the artifacts' locks are "
                     "checked for integrity but nothing was authenticated")
    arts = Artifacts(trust=trust)
    if artifacts is not None:
        _add_spec(arts, artifacts, "artifacts=")
        return arts
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        for part in env.split(os.pathsep):
            if part.strip():
                _add_path(arts, Path(part.strip()), f"${ENV_VAR}")
        return arts
    for spec, origin in _entry_point_specs():
        _add_spec(arts, spec, origin)
    if not arts.sources:
        raise ArtifactNotFoundError(
            f"no gemmar-aot artifacts found: pass artifacts= (a lock file or a store directory), set "
            f"${ENV_VAR}, or install an artifact package (entry-point group {ENTRY_POINT_GROUP!r})")
    return arts

