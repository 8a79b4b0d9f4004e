"""``doctor``: what of the build toolchain is present, at which version, and how to fix what is not."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import sha256_file
from .fingerprint import dist_version, mori_sources_digest, read_fingerprint
from .paths import FIX, Layout, toolchain_root
from .pins import TORCH_VERSION, ZIGLANG_VERSION
from .profiles import get_profile
from .tools import clang_version, lld_identity

_PIP_FIX = "run `make setup` (or `.venv/bin/pip install -e '.[build,test]'`)"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # version / digest, or what is wrong
    fix: str  # empty when ok

    def to_dict(self) -> dict:
        return asdict(self)


def _check(name: str, fix: str, probe: Callable[[], str]) -> Check:
    """Run ``probe``: its return value is the detail; an exception is a failed check."""
    try:
        return Check(name, True, probe(), "")
    except Exception as e:  # noqa: BLE001 - a doctor reports, it does not raise
        msg = str(e).split("\n  fix:")[0].strip() or type(e).__name__
        return Check(name, False, msg, fix)


def _fail(msg: str) -> None:
    raise ToolchainError(msg)


def doctor(root: Path | None = None, profile: str | None = None) -> list[Check]:
    prof = get_profile(profile)
    layout = Layout(Path(root).resolve() if root is not None else toolchain_root(), prof)
    fp: dict | None = None
    fp_error = ""
    try:
        fp = read_fingerprint(layout.toolchain_json)
    except FileNotFoundError:
        fp_error = f"{layout.toolchain_json} is missing"
    except ToolchainError as e:
        fp_error = str(e)

    def python() -> str:
        if sys.version_info < (3, 10):
            _fail(f"Python {platform.python_version()} is too old (needs >= 3.10)")
        return f"{platform.python_version()} ({sys.executable})"

    def versioned(dist: str, want: str) -> Callable[[], str]:
        def probe() -> str:
            have = dist_version(dist)
            if have is None:
                _fail(f"{dist} is not installed (pin {want})")
            if have.split("+")[0] != want:
                _fail(f"{dist} {have} is installed, the pin is {want}")
            return have

        return probe

    def torch() -> str:
        import torch as _torch  # noqa: PLC0415 - the point is to import it

        return f"{_torch.__version__} (cuda: {_torch.version.cuda or 'none'})"

    def clang() -> str:
        versioned("ziglang", ZIGLANG_VERSION)()
        return f"{clang_version()} (ziglang {ZIGLANG_VERSION})"

    def mori_sources() -> str:
        if not (layout.mori_pkg / "ops" / "gemm_ar" / "op.py").is_file():
            _fail(f"not unpacked at {layout.mori_dir}")
        digest = mori_sources_digest(layout.mori_dir)
        if fp is not None and digest != fp["mori"]["sources_digest"]:
            _fail(f"generator sources digest {digest[:16]} != toolchain.json's {fp['mori']['sources_digest'][:16]}")
        return f"{prof.mori.project} {prof.mori.version} sources {digest[:16]}"

    def cco() -> str:
        if not layout.cco_bc.is_file():
            _fail(f"{layout.cco_bc} is missing")
        digest = sha256_file(layout.cco_bc)
        if fp is not None and digest != fp["cco_bitcode"]["sha256"]:
            _fail(f"sha256 {digest[:16]} != toolchain.json's {fp['cco_bitcode']['sha256'][:16]}")
        source = fp["cco_bitcode"]["source"] if fp else "?"
        return f"sha256 {digest} ({source})"

    def lld() -> str:
        if not (layout.ld_lld.is_file() and os.access(layout.ld_lld, os.X_OK)):
            _fail(f"{layout.ld_lld} is missing or not executable")
        identity = lld_identity([str(layout.ld_lld)])
        if fp is not None and identity != fp["linker"]["identity"]:
            _fail(f"{identity} != toolchain.json's {fp['linker']['identity']}")
        return identity

    def fingerprint() -> str:
        if fp is None:
            _fail(fp_error)
        return (f"digest {fp['digest'][:16]} (profile {fp.get('profile', 'default')}, "
                f"FlyDSL {fp['flydsl']['version']}, {fp['target']['arch']})")

    return [
        _check("python", "use Python >= 3.10 (the venv is made by `make setup`)", python),
        _check("flydsl", _PIP_FIX, versioned("flydsl", prof.flydsl_version)),
        _check("torch", _PIP_FIX, lambda: (versioned("torch", TORCH_VERSION)(), torch())[1]),
        _check("clang", _PIP_FIX, clang),
        _check("mori sources", FIX, mori_sources),
        _check("cco bitcode", FIX, cco),
        _check("ld.lld", FIX, lld),
        _check("hip sdk (hipcc)", FIX, lambda: _hip_sdk(layout, fp)),
        _check("debian rocm (oracle)", FIX, lambda: _debian_rocm(layout)),
        _check("toolchain.json", FIX, fingerprint),
    ]


def _hip_sdk(layout: Layout, fp: dict | None) -> str:
    from . import rocm_sdk  # only doctor reads it: a compile worker imports this module, not that one

    return rocm_sdk.describe(layout.root, fp)


def _debian_rocm(layout: Layout) -> str:
    from . import debian_rocm  # only setup, doctor and the oracle's tests read it

    return debian_rocm.describe(layout.root)


def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{'ok ' if c.ok else 'BAD'}  {c.name:<{width}}  {c.detail}")
        if not c.ok:
            lines.append(f"     {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)
