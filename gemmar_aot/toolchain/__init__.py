"""The build toolchain: FlyDSL + mori's generators + the cco device bitcode +
an ld.lld, installed from PyPI and Debian by ``make setup`` (see ``install``).

The compiler side imports this package; the runtime side must not.

    tc = load_toolchain()             # verified, or ToolchainError naming the fix
    tc = load_toolchain(profile="nightly")   # another profile (see profiles.py)
    os.environ.update(compile_env(tc))
    import_mori_device(tc)            # mori.ops.gemm_ar.* importable without ROCm
    tc.fingerprint["digest"]          # identifies every input; for cache keys
"""

from __future__ import annotations

from .diagnose import Check, doctor
from .load import Toolchain, compile_env, load_toolchain
from .mori_import import import_mori_device
from .paths import toolchain_root
from .profiles import DEFAULT_PROFILE, PROFILE_ENV, PROFILES, Profile, get_profile

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "PROFILE_ENV",
    "Profile",
    "get_profile",
    "Check",
    "Toolchain",
    "compile_env",
    "doctor",
    "import_mori_device",
    "load_toolchain",
    "setup",
    "toolchain_root",
]


def setup(root=None, log=print, profiles: str | None = None) -> dict:
    """Install or verify the toolchain (``python -m gemmar_aot.toolchain setup [--profile P]``).
    Returns {profile name: fingerprint}."""
    from .install import setup as _setup

    return _setup(root, log, profiles)
