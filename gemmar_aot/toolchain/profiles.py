"""Toolchain profiles: which FlyDSL and which mori a build uses.

A profile is a named, pinned combination. Its ingredients (mori's wheel digest,
generator sources, the cco bitcode built from that mori, FlyDSL's version and
content) go into every action key, so one store holds the artifacts of every
profile side by side; the *name* is only a label (in the lock and in messages),
never a key ingredient: two names for the same pins give the same keys.

Profiles share what does not depend on mori (HIP headers, clang resource dir,
device libraries, ld.lld, the download cache) and have their own mori sources,
cco bitcode and ``toolchain.json``. Layout (``paths.Layout``)::

    <root>/                    shared pieces + the ``default`` profile (the layout
                               gemmar-aot 0.1 wrote, unchanged: old checkouts keep working)
    <root>/profiles/<name>/    every other profile: mori-<version>/, cco/, stamps/, toolchain.json

Choosing FlyDSL per profile: both profiles run the venv's FlyDSL 0.4.2. FlyDSL 0.5.0
gives byte-identical code objects for these kernels (measured, anchors 2026-12-01),
so it would add a second 270 MB install and a second venv-like target dir for no
change in output; and mori 1.2.4 loses its launch pinning on it. A profile records
the FlyDSL it was set up with (version and content digest) in its fingerprint, so
a venv with another FlyDSL refuses to build with it rather than mislabel keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gemmar_aot.util.errors import ToolchainError
from .pins import FLYDSL_VERSION, MORI, MORI_NIGHTLY, WheelPin

#: Environment variable naming the profile when no ``--toolchain`` / ``profile=`` is given.
PROFILE_ENV = "GEMMAR_AOT_TOOLCHAIN_PROFILE"
DEFAULT_PROFILE = "default"


@dataclass(frozen=True)
class Profile:
    name: str
    mori: WheelPin
    flydsl_version: str  # the FlyDSL the build venv must hold
    summary: str

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_PROFILE

    @property
    def rel_dir(self) -> str:
        """The profile's directory relative to the toolchain root ('' for the default)."""
        return "" if self.is_default else f"profiles/{self.name}"

    def describe(self) -> str:
        return f"{self.name}: {self.mori.project} {self.mori.version} + FlyDSL {self.flydsl_version}"


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name=DEFAULT_PROFILE,
            mori=MORI,
            flydsl_version=FLYDSL_VERSION,
            summary="the pinned release: what amd-mori 1.2.4 clusters run",
        ),
        Profile(
            name="nightly",
            mori=MORI_NIGHTLY,
            flydsl_version=FLYDSL_VERSION,
            summary="mori's nightly: the K=256 main-loop barrier fix, the new cco device API "
            "(own cco bitcode); for clusters that run amd-mori-nightly 1.2.5.dev20261026",
        ),
    )
}


def profile_names() -> list[str]:
    return list(PROFILES)


def get_profile(name: str | None = None) -> Profile:
    """The named profile; ``None`` means ``$GEMMAR_AOT_TOOLCHAIN_PROFILE``, else ``default``."""
    if name is None:
        name = os.environ.get(PROFILE_ENV, "").strip() or DEFAULT_PROFILE
    try:
        return PROFILES[name]
    except KeyError:
        raise ToolchainError(
            f"unknown toolchain profile {name!r}; the profiles are: "
            + "; ".join(p.describe() for p in PROFILES.values())
            + f"\n  fix: pick one of {', '.join(PROFILES)} (--toolchain NAME, TOOLCHAIN=NAME for make, "
            f"or ${PROFILE_ENV})"
        ) from None


def resolve_profiles(spec: str | None) -> list[Profile]:
    """``make setup TOOLCHAIN=...``: one name, a comma-separated list, or ``all``."""
    if spec is None or not spec.strip():
        return [get_profile(None)]
    if spec.strip() == "all":
        return list(PROFILES.values())
    out = []
    for part in spec.split(","):
        p = get_profile(part.strip())
        if p not in out:
            out.append(p)
    return out
