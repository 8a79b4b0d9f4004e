"""Where the toolchain lives, and the layout of its directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gemmar_aot.util.checkout import checkout_dir

from .profiles import DEFAULT_PROFILE, PROFILES, Profile

#: Environment variable that moves the toolchain away from ``<checkout>/.toolchain``.
ROOT_ENV = "GEMMAR_AOT_TOOLCHAIN"

#: How to (re)install the toolchain; every ToolchainError names it.
FIX = "run `make setup` (or `python -m gemmar_aot.toolchain setup`)"


def toolchain_root() -> Path:
    """``$GEMMAR_AOT_TOOLCHAIN`` if set, else ``<checkout>/.toolchain``. Absolute."""
    env = os.environ.get(ROOT_ENV, "").strip()
    if env:
        return Path(env).expanduser().resolve()
    return checkout_dir() / ".toolchain"


@dataclass(frozen=True)
class Layout:
    """Every path inside a toolchain root, for one profile. All relative names are
    fixed, so the cco bitcode (built with the root as working directory and
    relative paths) is the same wherever the root is.

    Shared by every profile: ``downloads``, ``hip``, ``clang-resource``,
    ``devicelibs``, ``rocm`` and the shared steps' stamps. Per profile: mori's
    sources, the cco bitcode, the profile's stamps and ``toolchain.json``, under
    ``profile_dir`` (the root itself for the default profile, as before profiles
    existed; ``profiles/<name>`` for the others)."""

    root: Path
    profile: Profile = PROFILES[DEFAULT_PROFILE]

    # Relative names, used verbatim on the clang command line.
    HIP_REL = "hip"
    RESOURCE_REL = "clang-resource"
    DEVICELIB_REL = "devicelibs"

    @property
    def profile_rel(self) -> str:
        return self.profile.rel_dir

    @property
    def profile_dir(self) -> Path:
        return self.root / self.profile_rel if self.profile_rel else self.root

    @property
    def mori_rel(self) -> str:
        """The directory holding ``mori/``, relative to the root (on clang's command line)."""
        name = f"mori-{self.profile.mori.version}"
        return f"{self.profile_rel}/{name}" if self.profile_rel else name

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    @property
    def stamps(self) -> Path:
        """Stamps of the shared steps."""
        return self.root / "stamps"

    @property
    def profile_stamps(self) -> Path:
        """Stamps of this profile's steps (mori, cco-bitcode)."""
        return self.profile_dir / "stamps"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def mori_dir(self) -> Path:
        """The directory that contains the ``mori/`` package (goes on sys.path)."""
        return self.root / self.mori_rel

    @property
    def mori_pkg(self) -> Path:
        return self.mori_dir / "mori"

    @property
    def hip_dir(self) -> Path:
        """HIP headers (``include/``) and ockl/ocml (``lib/``) from the triton wheel."""
        return self.root / self.HIP_REL

    @property
    def resource_dir(self) -> Path:
        """clang resource dir: zig's builtin headers + Debian's HIP/CUDA wrappers."""
        return self.root / self.RESOURCE_REL

    @property
    def devicelib_dir(self) -> Path:
        return self.root / self.DEVICELIB_REL

    @property
    def cco_bc(self) -> Path:
        return self.profile_dir / "cco" / "libmori_cco_device.bc"

    @property
    def rocm_path(self) -> Path:
        """What ROCM_PATH points at during a compile: holds ``llvm/bin/ld.lld``."""
        return self.root / "rocm"

    @property
    def ld_lld(self) -> Path:
        return self.rocm_path / "llvm" / "bin" / "ld.lld"

    @property
    def toolchain_json(self) -> Path:
        return self.profile_dir / "toolchain.json"
