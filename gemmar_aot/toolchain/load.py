"""Loading an installed toolchain (cheap checks), and the compile environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.model.device_abi import DeviceAbiUnknown, device_abi_digest
from gemmar_aot.util.filedigest import sha256_file
from .fingerprint import dist_version, mori_ep_sources_digest, mori_sources_digest, python_version, read_fingerprint
from .paths import FIX, Layout, toolchain_root
from .profiles import DEFAULT_PROFILE, Profile, get_profile


@dataclass(frozen=True)
class Toolchain:
    """An installed, verified toolchain. ``fingerprint`` is the parsed ``toolchain.json``
    (treat it as read-only; ``fingerprint["digest"]`` identifies it)."""

    root: Path
    mori_dir: Path  # the directory containing the ``mori/`` package
    cco_bc: Path
    rocm_path: Path  # holds llvm/bin/ld.lld
    fingerprint: dict = field(hash=False, repr=False)
    profile: Profile = field(default_factory=lambda: get_profile(DEFAULT_PROFILE))

    @property
    def digest(self) -> str:
        return self.fingerprint["digest"]

    def mori_identity(self) -> dict:
        """What a pod's installed mori must match: distribution, version, device-ABI digest."""
        m = self.fingerprint["mori"]
        return {"distribution": m["distribution"], "version": m["version"],
                "device_abi_digest": m["device_abi_digest"]}

    @property
    def arch(self) -> str:
        return self.fingerprint["target"]["arch"]


def load_toolchain(root: Path | None = None, profile: str | None = None) -> Toolchain:
    """Read the profile's ``toolchain.json`` and verify (cheaply) that what it
    describes is in place: the profile's pins, the cco bitcode's digest, the mori
    generator sources' digest, the ld.lld wrapper, and the installed
    FlyDSL/torch/Python versions. ``profile`` None means
    ``$GEMMAR_AOT_TOOLCHAIN_PROFILE``, else ``default``.

    Raises ToolchainError naming what is missing or wrong and the fix.
    """
    prof = get_profile(profile)
    layout = Layout(Path(root).resolve() if root is not None else toolchain_root(), prof)
    fix = FIX if prof.is_default else f"run `make setup TOOLCHAIN={prof.name}` (or `python -m gemmar_aot.toolchain setup --profile {prof.name}`)"
    if not layout.toolchain_json.is_file():
        raise ToolchainError(f"no toolchain for profile {prof.name!r} at {layout.profile_dir} "
                             f"({layout.toolchain_json.name} is missing)\n  fix: {fix}")
    try:
        fp = read_fingerprint(layout.toolchain_json)
    except ToolchainError as e:
        raise ToolchainError(f"{e}\n  fix: {fix}") from e

    problems = _problems(layout, prof, fp)
    if problems:
        raise ToolchainError(
            f"the toolchain at {layout.profile_dir} (profile {prof.name!r}) is not usable:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + f"\n  fix: {fix}"
        )
    if "device_abi_digest" not in fp["mori"] or "distribution" not in fp["mori"]:
        # Written by a gemmar-aot from before profiles (its mori is the default's): fill in, in
        # memory, what this one records, so keys do not depend on which version ran setup.
        try:
            abi = device_abi_digest(layout.mori_dir)
        except DeviceAbiUnknown as e:
            raise ToolchainError(f"{e}\n  fix: {fix}") from None
        fp = {**fp, "mori": {**fp["mori"], "distribution": prof.mori.project, "device_abi_digest": abi}}
    return Toolchain(
        root=layout.root,
        mori_dir=layout.mori_dir,
        cco_bc=layout.cco_bc,
        rocm_path=layout.rocm_path,
        fingerprint=fp,
        profile=prof,
    )


def _problems(layout: Layout, prof: Profile, fp: dict) -> list[str]:
    """What differs between ``fp`` (the profile's toolchain.json) and what is in place: the
    profile's pins, the cco bitcode's digest, the mori generator sources' digests, the ld.lld
    wrapper, the installed FlyDSL/torch/Python versions."""
    problems: list[str] = []
    # A fingerprint written before profiles existed has no "profile": it is the default's.
    if fp.get("profile", DEFAULT_PROFILE) != prof.name or fp["mori"].get("wheel_sha256") != prof.mori.sha256:
        problems.append(f"{layout.toolchain_json} describes profile {fp.get('profile', DEFAULT_PROFILE)!r} with "
                        f"{fp['mori'].get('wheel')} (sha256 {fp['mori'].get('wheel_sha256')}), not profile "
                        f"{prof.name!r} with {prof.mori.filename} (sha256 {prof.mori.sha256})")
    want_bc = fp["cco_bitcode"]["sha256"]
    if not layout.cco_bc.is_file():
        problems.append(f"the cco bitcode {layout.cco_bc} is missing")
    else:
        have_bc = sha256_file(layout.cco_bc)
        if have_bc != want_bc:
            problems.append(f"the cco bitcode {layout.cco_bc} has sha256 {have_bc}, toolchain.json says {want_bc}")

    if not (layout.mori_pkg / "ops" / "gemm_ar" / "op.py").is_file():
        problems.append(f"mori's sources are missing from {layout.mori_dir}")
    else:
        try:
            have_src = mori_sources_digest(layout.mori_dir)
        except ToolchainError as e:
            have_src = str(e)
        if have_src != fp["mori"]["sources_digest"]:
            problems.append(f"mori's generator sources under {layout.mori_pkg} changed since setup")
        want_ep = fp["mori"].get("ep_sources_digest")  # absent: a setup before EP (keys.ingredients says so)
        if want_ep is not None:
            try:
                have_ep = mori_ep_sources_digest(layout.mori_dir)
            except ToolchainError as e:
                have_ep = str(e)
            if have_ep != want_ep:
                problems.append(f"mori's EP generator sources under {layout.mori_pkg} changed since setup")

    if not (layout.ld_lld.is_file() and os.access(layout.ld_lld, os.X_OK)):
        problems.append(f"the linker wrapper {layout.ld_lld} is missing or not executable")

    for dist, key in (("flydsl", "flydsl"), ("torch", "torch")):
        have = dist_version(dist)
        want = fp[key]["version"]
        if have != want:
            problems.append(f"{dist} {have or '(not installed)'} is installed, the toolchain was set up with {want}")
    if python_version() != fp["python"]:
        problems.append(f"this is Python {python_version()}, the toolchain was set up with {fp['python']}")

    return problems


def compile_env(tc: Toolchain) -> dict[str, str]:
    """Environment variables a compile worker sets before importing FlyDSL/mori."""
    return {
        "COMPILE_ONLY": "1",  # FlyDSL: compile, never launch (no GPU here)
        "ARCH": tc.arch,  # FlyDSL's target override (not FLYDSL_-prefixed)
        # FlyDSL's own disk cache stays off: 0.5.0 caches even extern-linked kernels, and a
        # worker must compile what its key says, never reuse an entry keyed by FlyDSL's rules.
        "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
        "FLYDSL_COMPILE_OPT_LEVEL": str(tc.fingerprint["flydsl_opt_level"]),  # as fingerprinted
        "ROCM_PATH": str(tc.rocm_path),  # the ROCDL serializer runs $ROCM_PATH/llvm/bin/ld.lld
        "MORI_CCO_BC": str(tc.cco_bc),  # mori links this bitcode ...
        "MORI_DISABLE_JIT": "1",  # ... and never tries hipcc
    }
