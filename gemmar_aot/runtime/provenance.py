"""Which toolchain the artifacts were built with, against the mori this pod runs.

Two rules, both checked when an op is constructed, before anything is acquired:

1. **The pod's mori must be the artifacts' mori.** The kernels inline cco device code
   built from one mori release and read the ``ccoDevComm`` that the *installed* mori's
   host library creates. When ``mori`` is importable here, its distribution version
   and its device-ABI digest (:mod:`gemmar_aot.model.device_abi`, computed from its files,
   without importing it) must equal what the lock recorded at build time
   (``toolchain.mori``). Otherwise :class:`~.errors.ArtifactMismatchError` names both
   and the fix. No mori installed (a communicator from elsewhere, tests) skips the rule.
2. **One profile per communicator.** Toolchain profiles differ in the SDMA doorbell
   protocol (mori nightly gives the top bit of a queue's committed write pointer a new
   meaning), so kernels of two profiles must never share a communicator's SDMA queues:
   every op on a communicator must come from locks of one device ABI.

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

from .errors import ArtifactMismatchError

log = logging.getLogger("gemmar_aot.runtime")

CHECK_ENV = "GEMMAR_AOT_MORI_CHECK"


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
        why = []
        if want.version is not None and have.version is not None and want.version != have.version:
            why.append("the versions differ")
        if (want.distribution and have.distribution
                and _normalise(want.distribution) != _normalise(have.distribution)):
            why.append("the distributions differ")
        if want.device_abi_digest is not None:
            if have.device_abi_digest is None:
                why.append(f"the installed mori's device ABI cannot be read ({installed.problem})")
            elif want.device_abi_digest != have.device_abi_digest:
                why.append("the cco device ABIs differ")
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
