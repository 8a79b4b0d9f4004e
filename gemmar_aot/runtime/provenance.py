"""Which toolchain the artifacts were built with, against the mori this pod runs.

Two rules, both checked when an op is constructed, before anything is acquired:

1. **The pod's mori must be the artifacts' mori.** The kernels inline cco device code
   built from one mori release and read the ``ccoDevComm`` that the *installed* mori's
   host library creates. When ``mori`` is importable here, its distribution version
   and its device-ABI digest (:mod:`gemmar_aot.model.device_abi`, computed from its files,
   without importing it) must equal what the lock recorded at build time
   (``toolchain.mori``). Otherwise :class:`~.artifact_errors.ArtifactMismatchError` names both
   and the fix. No mori installed (a communicator from elsewhere, tests) skips the rule.
2. **One profile per communicator.** Toolchain profiles differ in the SDMA doorbell
   protocol (mori nightly gives the top bit of a queue's committed write pointer a new
   meaning), so kernels of two profiles must never share a communicator's SDMA queues:
   every op on a communicator must come from locks of one device ABI.

A store may hold the locks of several profiles; :func:`select_profile` picks the one a pod serves
(``$GEMMAR_AOT_TOOLCHAIN_PROFILE``, else the one rule 1 accepts for the installed mori), and says
exactly why when none or several can be told apart.

``GEMMAR_AOT_MORI_CHECK=off`` skips rule 1 (logged at WARNING on every op), for a
pod whose mori is known to be ABI-equal but installed in a way this check cannot read.

Runtime module: standard library only.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import threading
import weakref
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

from gemmar_aot.model.device_abi import DeviceAbiUnknown, device_abi_digest

from .artifact_errors import ArtifactMismatchError, ArtifactNotFoundError

log = logging.getLogger("gemmar_aot.runtime")

CHECK_ENV = "GEMMAR_AOT_MORI_CHECK"
#: Which toolchain profile's locks to serve from a store that holds several (as the build side names it).
PROFILE_ENV = "GEMMAR_AOT_TOOLCHAIN_PROFILE"


@dataclass(frozen=True)
class MoriIdentity:
    """A mori as far as the kernels care: which release, and its device-ABI digest."""

    distribution: str | None  # "amd-mori", "amd-mori-nightly"; None when unknown
    version: str | None
    device_abi_digest: str | None
    profile: str | None = None  # the toolchain profile (locks only)

    @classmethod
    def from_lock(cls, toolchain: Mapping[str, Any] | None) -> "MoriIdentity | None":
        """From a lock's ``toolchain`` section: its key ingredients' ``generator`` (lock schema 2
        nests them under ``ingredients``). A lock written before profiles existed has only
        ``mori_version`` (its ABI digest is unknown, so only the version is checked)."""
        tc = toolchain or {}
        gen = (tc.get("ingredients") or tc).get("generator") or {}
        if gen.get("mori_version") is None:
            return None
        return cls(gen.get("mori_distribution"), gen["mori_version"], gen.get("mori_device_abi_digest"),
                   tc.get("profile"))

    @classmethod
    def from_toolchain(cls, info: Any) -> "MoriIdentity | None":
        """From a parsed lock's :class:`~gemmar_aot.model.types.ToolchainInfo`."""
        if info is None:
            return None
        return cls.from_lock({"ingredients": info.ingredients, "profile": info.profile})

    def describe(self) -> str:
        name = self.distribution or "mori"
        abi = f", device ABI {self.device_abi_digest[:12]}" if self.device_abi_digest else ""
        prof = f" (toolchain profile {self.profile!r})" if self.profile else ""
        return f"{name} {self.version or '(version unknown)'}{abi}{prof}"

    def abi_key(self) -> tuple:
        """What must be equal for two sets of kernels to share a communicator."""
        return (self.device_abi_digest, self.version) if self.device_abi_digest else (None, self.version)


@dataclass(frozen=True)
class InstalledMori:
    identity: MoriIdentity
    location: Path  # the directory that holds ``mori/``
    problem: str = ""  # why the device-ABI digest could not be computed


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution_of(parent: Path) -> tuple[str | None, str | None]:
    """(name, version) of the distribution that installed ``parent/mori``, from metadata only."""
    found = []
    for dist in metadata.distributions(path=[str(parent)]):
        name = dist.metadata.get("Name") or ""
        top = (dist.read_text("top_level.txt") or "").split()
        if "mori" in top or _normalise(name) in ("amd-mori", "amd-mori-nightly"):
            found.append((_normalise(name), dist.version))
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        names = ", ".join(f"{n} {v}" for n, v in sorted(found))
        raise ArtifactMismatchError(
            f"two distributions installed the mori package at {parent}: {names}; mori's files are a mix "
            f"of both. Uninstall both and install one (pip uninstall -y {' '.join(sorted(n for n, _ in found))})")
    return None, None


def installed_mori() -> InstalledMori | None:
    """The ``mori`` this interpreter would import, or None. Never imports it."""
    mod = __import__("sys").modules.get("mori")
    if mod is not None and getattr(mod, "__gemmar_aot_bare_package__", False):
        return None  # a build process's bare mori (gemmar_aot.toolchain.mori_import), not a pod's
    try:
        spec = importlib.util.find_spec("mori")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(next(iter(spec.submodule_search_locations)))
    parent = pkg.parent
    name, version = _distribution_of(parent)
    problem = ""
    try:
        digest = device_abi_digest(parent)
    except (DeviceAbiUnknown, OSError) as exc:
        digest, problem = None, str(exc)
    return InstalledMori(MoriIdentity(name, version, digest), parent, problem)


def _fix(built: MoriIdentity, have: MoriIdentity) -> str:
    dist = built.distribution or "amd-mori"
    return (f"install the mori the artifacts were built with (pip install {dist}=={built.version}), or "
            f"rebuild the manifest with the toolchain profile for {have.distribution or 'mori'} "
            f"{have.version or ''} (gemmar-aot build MANIFEST --toolchain PROFILE; `python -m "
            f"gemmar_aot.toolchain profiles` lists them) and install those artifacts")


def differences(want: MoriIdentity, installed: InstalledMori) -> list[str]:
    """Why the artifacts' mori ``want`` is not the ``installed`` one (empty: it is). What either side
    does not know (a version without metadata, a lock older than device-ABI digests) is not compared."""
    have, why = installed.identity, []
    if want.version is not None and have.version is not None and want.version != have.version:
        why.append("the versions differ")
    if want.distribution and have.distribution and _normalise(want.distribution) != _normalise(have.distribution):
        why.append("the distributions differ")
    if want.device_abi_digest is not None:
        if have.device_abi_digest is None:
            why.append(f"the installed mori's device ABI cannot be read ({installed.problem})")
        elif want.device_abi_digest != have.device_abi_digest:
            why.append("the cco device ABIs differ")
    return why


def check_installed_mori(built: Iterable[tuple[MoriIdentity | None, str]],
                         installed: InstalledMori | None = None, *, probe: bool = True) -> None:
    """Rule 1. ``built``: (identity, where) per lock the op uses. Raises ArtifactMismatchError."""
    if os.environ.get(CHECK_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        log.warning("gemmar-aot: %s=off: not checking the installed mori against the artifacts' mori",
                    CHECK_ENV)
        return
    if installed is None and probe:
        installed = installed_mori()
    if installed is None:
        return
    have = installed.identity
    for want, where in built:
        if want is None:
            continue
        why = differences(want, installed)
        if why:
            raise ArtifactMismatchError(
                f"the artifacts in {where} were built with {want.describe()}, but this pod has "
                f"{have.describe()} installed at {installed.location} ({'; '.join(why)}). Kernels and the "
                f"dev comm mori creates must come from one mori release: the cco device API and the SDMA "
                f"doorbell protocol changed between them.\n  fix: {_fix(want, have)}.\n  "
                f"(Set {CHECK_ENV}=off only if the two are known to be ABI-equal.)")


def one_profile(built: Iterable[tuple[MoriIdentity | None, str]]) -> MoriIdentity | None:
    """The single device ABI of ``built``; ArtifactMismatchError when they mix profiles."""
    seen: dict[tuple, tuple[MoriIdentity, str]] = {}
    for ident, where in built:
        if ident is not None:
            seen.setdefault(ident.abi_key(), (ident, where))
    if len(seen) > 1:
        (a, wa), (b, wb) = list(seen.values())[:2]
        raise ArtifactMismatchError(
            f"this op's artifacts mix two toolchain profiles: {wa} was built with {a.describe()} and {wb} with "
            f"{b.describe()}. Their SDMA protocols differ, so one op cannot run both.\n  fix: point artifacts= "
            f"(or $GEMMAR_AOT_ARTIFACTS) at the artifacts of one profile")
    return next(iter(seen.values()))[0] if seen else None


def select_profile(locks: list[tuple[Path, Any]], where: str) -> list[tuple[Path, Any]]:
    """One store may hold the locks of several toolchain profiles (``<manifest>.lock.json``,
    ``<manifest>.<profile>.lock.json``); a pod serves one. Chosen, in order, by
    ``$GEMMAR_AOT_TOOLCHAIN_PROFILE``, else by the installed mori (the profile built with it),
    else refused naming the profiles. A store of one profile is taken whole."""
    groups: dict[str, list[tuple[Path, Any]]] = {}
    for lp, lock in locks:
        groups.setdefault(lock.toolchain.profile or "default", []).append((lp, lock))
    if len(groups) <= 1:
        return locks
    wanted = os.environ.get(PROFILE_ENV, "").strip()
    if wanted:
        if wanted not in groups:
            raise ArtifactNotFoundError(
                f"{where} holds locks of toolchain profiles {sorted(groups)}, none of profile {wanted!r} "
                f"(${PROFILE_ENV}); build the manifest with --toolchain {wanted} or unset it")
        return groups[wanted]
    fix = f"set ${PROFILE_ENV}=<profile> (or point artifacts= at one lock file)"
    inst = installed_mori()
    if inst is None:
        raise ArtifactNotFoundError(f"{where} holds locks of several toolchain profiles ({', '.join(sorted(groups))}) "
                                    f"and no mori is installed to choose by; a pod serves one: {fix}")
    # the installed-mori check's own comparison: what it would refuse, per profile
    why = {name: sorted({d for _, lk in g for d in differences(MoriIdentity.from_toolchain(lk.toolchain) or
                                                                 inst.identity, inst)}) for name, g in groups.items()}
    match = [name for name, d in why.items() if not d]
    have = inst.identity
    unknown = ([] if have.version else ["its version (no distribution metadata)"]) + \
        ([] if have.device_abi_digest else [f"its device ABI ({inst.problem})"])
    if len(match) == 1:
        if unknown:
            log.warning("gemmar-aot: the installed %s at %s: %s unknown; serving profile %r, the one it matches",
                        have.describe(), inst.location, " and ".join(unknown), match[0])
        return groups[match[0]]
    each = "; ".join(f"{name} ({_lock_mori(groups[name])}): {', '.join(why[name]) or 'matches'}" for name in sorted(groups))
    if match:
        raise ArtifactNotFoundError(
            f"{where} holds locks of toolchain profiles {sorted(groups)}, and the installed {have.describe()} at "
            f"{inst.location} matches {len(match)} of them equally ({each}): "
            + (f"{' and '.join(unknown)} cannot be read, so " if unknown else "")
            + f"nothing tells them apart. Fix: {fix}"
            + (", or install mori with pip so its version metadata is there" if not have.version else ""))
    raise ArtifactNotFoundError(
        f"{where} holds locks of toolchain profiles {sorted(groups)}, and the installed {have.describe()} at "
        f"{inst.location} is the mori of none of them ({each}). Fix: install the mori of the profile this pod "
        f"serves, or build the manifest with the profile of the installed mori; or {fix}")


def _lock_mori(group: list) -> str:
    ident = MoriIdentity.from_toolchain(group[0][1].toolchain)
    return ident.describe() if ident is not None else "mori unknown"


class CommunicatorProfiles:
    """Rule 2: which device ABI each live communicator's ops use, counted per op."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._weak: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()
        self._by_id: dict[int, tuple[Any, list]] = {}  # communicators that cannot be weakly referenced

    def _slot(self, comm: Any, create: bool) -> list | None:
        try:
            slot = self._weak.get(comm)
            if slot is None and create:
                slot = self._weak[comm] = [None, 0]
            return slot
        except TypeError:
            entry = self._by_id.get(id(comm))
            if entry is None or entry[0] is not comm:
                if not create:
                    return None
                entry = self._by_id[id(comm)] = (comm, [None, 0])
            return entry[1]

    def acquire(self, comm: Any, ident: MoriIdentity | None, where: str, *, check_only: bool = False) -> None:
        """Count one op of ``ident`` on ``comm``; refuse a second profile. ``check_only``: refuse, count nothing."""
        if ident is None:
            return
        with self._lock:
            slot = self._slot(comm, create=not check_only)
            held = slot[0] if slot is not None else None
            if slot is not None and slot[1] > 0 and held is not None and held[0].abi_key() != ident.abi_key():
                raise ArtifactMismatchError(
                    f"this communicator already serves ops built with {held[0].describe()} ({held[1]}); "
                    f"the artifacts in {where} were built with {ident.describe()}. Kernels of two toolchain "
                    f"profiles must never share a communicator's SDMA queues (their doorbell protocols "
                    f"differ).\n  fix: build every manifest this process serves with one profile, or close "
                    f"the other profile's ops first")
            if check_only:
                return
            if slot[1] == 0:
                slot[0] = (ident, where)
            slot[1] += 1

    def release(self, comm: Any, ident: MoriIdentity | None) -> None:
        if ident is None:
            return
        with self._lock:
            slot = self._slot(comm, create=False)
            if slot is not None and slot[1] > 0:
                slot[1] -= 1
                if slot[1] == 0:
                    slot[0] = None


#: The process-wide registry the ops use.
COMMUNICATORS = CommunicatorProfiles()
