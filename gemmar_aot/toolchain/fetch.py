"""Download pinned artifacts into ``<root>/downloads`` and verify their sha256.

A verified file already in the download cache is used as is, so a file placed
there by hand (same name, same digest) works on a host without network.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import sha256_file

from .digest import verify_sha256
from .pins import DebPin, WheelPin
from .tools import run


def _cached(downloads: Path, filename: str, sha256: str) -> Path | None:
    p = downloads / filename
    if p.is_file() and sha256_file(p) == sha256:
        return p
    return None


def _adopt(tmp_file: Path, downloads: Path, filename: str, sha256: str, source: str) -> Path:
    """Verify a fresh download, then move it into the cache. A bad file is deleted."""
    try:
        verify_sha256(
            tmp_file,
            sha256,
            fix=f"the {source} artifact differs from the pin in gemmar_aot/toolchain/pins.py; "
            "if the upstream file really changed, review it and update the pin",
        )
    except ToolchainError:
        tmp_file.unlink(missing_ok=True)
        raise
    dest = downloads / filename
    os.replace(tmp_file, dest)
    return dest


def fetch_wheel(pin: WheelPin, downloads: Path) -> Path:
    """``pip download`` the pinned wheel (no deps, exact tags); return its verified path."""
    downloads.mkdir(parents=True, exist_ok=True)
    hit = _cached(downloads, pin.filename, pin.sha256)
    if hit:
        return hit
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads) as td:
        run(
            [sys.executable, "-m", "pip"] + pin.pip_download_args(td),
            what=f"pip download {pin.project}=={pin.version}",
            fix=f"check network access to PyPI, or place {pin.filename} "
            f"(sha256 {pin.sha256}) in {downloads}",
        )
        got = Path(td) / pin.filename
        if not got.is_file():
            names = sorted(os.listdir(td))
            raise ToolchainError(
                f"pip download {pin.project}=={pin.version} did not produce {pin.filename} (got {names})\n"
                f"  fix: place {pin.filename} (sha256 {pin.sha256}) in {downloads}"
            )
        return _adopt(got, downloads, pin.filename, pin.sha256, "PyPI")


_APT_NOT_FOUND = ("Unable to locate package", "Can't select candidate", "was not found", "has no installation candidate")


def fetch_deb(pin: DebPin, downloads: Path) -> Path:
    """``apt-get download`` the pinned .deb (running ``apt-get update`` first if
    apt's package lists lack it); return its verified path. Nothing is installed."""
    downloads.mkdir(parents=True, exist_ok=True)
    hit = _cached(downloads, pin.filename, pin.sha256)
    if hit:
        return hit
    if shutil.which("apt-get") is None:
        raise ToolchainError(
            f"apt-get is not available, so {pin.filename} cannot be downloaded\n"
            f"  fix: download {pin.package} {pin.version} ({pin.arch}) from a Debian 12 mirror or "
            f"snapshot.debian.org and place it in {downloads} as {pin.filename} (sha256 {pin.sha256})"
        )
    fix = (
        f"check that apt can reach a Debian bookworm mirror; or place {pin.filename} "
        f"(sha256 {pin.sha256}) in {downloads}"
    )
    with tempfile.TemporaryDirectory(prefix=".apt-", dir=downloads) as td:
        cmd = ["apt-get", "download", pin.apt_spec]
        try:
            run(cmd, what=f"apt-get download {pin.apt_spec}", cwd=Path(td), fix=fix)
        except ToolchainError as first:
            if not any(s in str(first) for s in _APT_NOT_FOUND):
                raise
            if os.geteuid() != 0:
                raise ToolchainError(
                    f"{first}\n  apt's package lists do not have {pin.apt_spec}; "
                    "run `sudo apt-get update` and retry"
                ) from first
            print(f"  apt's package lists lack {pin.apt_spec}: running apt-get update", flush=True)
            run(["apt-get", "update"], what="apt-get update", fix=fix)
            run(cmd, what=f"apt-get download {pin.apt_spec}", cwd=Path(td), fix=fix)
        debs = sorted(Path(td).glob("*.deb"))
        if len(debs) != 1:
            raise ToolchainError(f"apt-get download {pin.apt_spec} produced {[d.name for d in debs]}, expected one .deb\n  fix: {fix}")
        return _adopt(debs[0], downloads, pin.filename, pin.sha256, "Debian")
