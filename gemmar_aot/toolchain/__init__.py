"""The build toolchain, CPU only, installed from PyPI and Debian by ``make setup`` (see ``install``):

* for mori's FlyDSL ops (GEMM + all-reduce, EP v2's FlyDSL backend; gfx950): FlyDSL, mori's
  pure-Python generators, the cco device bitcode and an ld.lld;
* for mori's hipcc-JIT and JIT v2 kernels (gfx950 and gfx942): Debian's HIP 7.2.4 SDK and device
  libraries, driven by zig's clang (``rocm_sdk``), and the stand-in HIP runtime mori's JIT v2
  libraries load at plan time (``hip_standin``).

The compiler side imports this package; the runtime side must not.

    tc = load_toolchain()             # verified, or ToolchainError naming the fix
    tc = load_toolchain(profile="nightly")   # another profile (see profiles.py)
    os.environ.update(compile_env(tc))
    import_mori_device(tc)            # mori's generator modules (mori.ops.gemm_ar.*, ...) importable without ROCm
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
