"""The HIP SDK for mori's hipcc-JIT kernels, from Debian's archive, and the clang that compiles them.

mori compiles its EP v1, collective, shmem and IO kernels with ``hipcc --genco`` at first use
(``mori/jit/core.py``). Building them here takes what a ROCm install would give hipcc's clang:

* HIP 7.2.4's headers (bf16, fp8/OCP included): ``libamdhip64-dev 7.2.4-1~exp2``, Debian
  experimental, the release mori 1.2.4 was built against (``mori/_rocm_build_info.py``);
* the device libraries for gfx942 and gfx950, built for LLVM 22:
  ``rocm-device-libs-22 7.2.4+dfsg-1~exp1``, experimental;
* ``hsakmt/hsakmttypes.h`` (mori reads ``HSAuint64`` and ``HSA_QUEUE_PRIORITY``): trixie's
  ``libhsakmt-dev 6.2.4+ds-1``, in neither of the above;
* clang 22 (zig's, the toolchain's own) with the clang resource dir the cco bitcode uses, and an
  ``lld`` next to the SDK: clang's AMDGPU device link runs ``lld -flavor gnu``, zig ships
  ``ld.lld``, so ``bin/lld`` drops the flavour and runs the toolchain's zig.

Each package is pinned by version and sha256 and fetched with Debian's own tools through a
private apt configuration (its own sources list, lists and cache under ``<root>/apt/``): the
machine's apt configuration is never touched. Experimental versions get replaced; a verified
``.deb`` in ``<root>/downloads`` is used as it is, and when the archive has moved on, setup
fails with the exact fix (the snapshot URL of the pinned file, or the pin to move to).

Everything lands in ``<root>/rocm-sdk/`` (``include/``, ``amdgcn/bitcode/``, ``share/hip/version``,
``bin/lld``); how clang is pointed at it (by relative paths, from a staging directory) is the
recipe's, ``gemmar_aot_kernels.hipcc``. What is installed reaches every hipcc kernel's key
through the fingerprint (:func:`fingerprint`: packages, content digest, clang, lld).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gemmar_aot.model.hipcc import SDK_REL
from gemmar_aot.util.atomic_write import atomic_write_text
from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import sha256_file, tree_digest

#: The day the pinned files were verified in Debian's archive: where snapshot.debian.org has them.
VERIFIED_ON = "20261205T000000Z"
#: Debian's archive keyring on a Debian host (the private apt configuration trusts exactly it).
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MIRROR = "http://deb.debian.org/debian"
#: The suites of the private apt configuration (``<root>/apt``), shared by every table of pinned
#: Debian packages (this module's and ``debian_rocm``'s): one sources list, one set of lists.
SUITES = ("experimental", "trixie")


@dataclass(frozen=True)
class ArchiveDeb:
    """A ``.deb`` of one Debian suite, pinned by version and sha256, and what is taken from it
    (member directory or file -> where it goes under ``rocm-sdk/``)."""

    package: str
    version: str
    suite: str
    pool: str  # the file's path in the archive (apt's Filename)
    sha256: str
    take: tuple[tuple[str, str], ...]

    @property
    def filename(self) -> str:
        return self.pool.rsplit("/", 1)[-1]

    def describe(self) -> str:
        return f"{self.package} {self.version} ({self.suite})"


DEBS = (
    ArchiveDeb("libamdhip64-dev", "7.2.4-1~exp2", "experimental",
               "pool/main/r/rocm-hipamd/libamdhip64-dev_7.2.4-1~exp2_amd64.deb",
               "28ae316c5be2d33b53fae8f2151e76a758f84aa3493abafeaef935e49cc5ba07",
               (("usr/include/hip", "include/hip"), ("usr/share/hip/version", "share/hip/version"))),
    ArchiveDeb("rocm-device-libs-22", "7.2.4+dfsg-1~exp1", "experimental",
               "pool/main/r/rocm-llvm/rocm-device-libs-22_7.2.4+dfsg-1~exp1_amd64.deb",
               "24b439be7c151ff67bc1f4f4f42a7c4047b3e6fd7905b9e6df89c0fa5dea8031",
               (("usr/lib/llvm-22/lib/clang/22/amdgcn/bitcode", "amdgcn/bitcode"),)),
    ArchiveDeb("libhsakmt-dev", "6.2.4+ds-1", "trixie",
               "pool/main/r/roct-thunk-interface/libhsakmt-dev_6.2.4+ds-1_amd64.deb",
               "1cb7a1e52e7a568de002a576f3893dc4e12fa007f9d66e11793622a9edf433ec",
               (("usr/include/hsakmt", "include/hsakmt"),)),
)
#: What a usable SDK holds (checked by setup, ``doctor`` and the compile).
MARKERS = ("include/hip/hip_runtime.h", "include/hip/hip_fp8.h", "include/hip/hip_ext_ocp.h",
           "include/hsakmt/hsakmttypes.h", "amdgcn/bitcode/ocml.bc", "amdgcn/bitcode/oclc_isa_version_950.bc",
           "amdgcn/bitcode/oclc_isa_version_942.bc", "share/hip/version", "bin/lld")
#: Host packages whose headers a device compile reads (libstdc++, glibc, the kernel's uapi headers).
HOST_HEADER_PACKAGES = ("libstdc++-*-dev", "libc6-dev", "linux-libc-dev")


def sdk_dir(root: Path) -> Path:
    return Path(root) / SDK_REL


def lld_wrapper_text() -> str:
    """``rocm-sdk/bin/lld``: clang's ``lld -flavor gnu`` as the toolchain's zig ``ld.lld``."""
    return ('#!/bin/sh\n# generated by gemmar_aot.toolchain.rocm_sdk: clang runs `lld -flavor gnu ...`\n'
            '[ "$1" = "-flavor" ] && shift 2\n'
            'exec "$(dirname "$0")/../../rocm/llvm/bin/zig" ld.lld "$@"\n')


# ---------------------------------------------------------------- fetching, through a private apt


def apt_options(apt_root: Path) -> list[str]:
    opts = {"Dir::Etc::SourceList": apt_root / "sources.list", "Dir::Etc::SourceParts": "/nonexistent",
            "Dir::State::Lists": apt_root / "lists", "Dir::Cache": apt_root / "cache",
            "Dir::State::status": "/dev/null", "APT::Architecture": "amd64"}
    if os.geteuid() == 0:  # apt's _apt user cannot write into our directories; as root, download as root
        opts["APT::Sandbox::User"] = "root"
    return [arg for k, v in opts.items() for arg in ("-o", f"{k}={v}")]


def apt_get(apt_root: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``apt-get`` under the private configuration (never the machine's)."""
    return subprocess.run(["apt-get", *apt_options(apt_root), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "LC_ALL": "C"}, check=False)


def prepare_apt(apt_root: Path) -> None:
    """The private apt configuration: Debian's :data:`SUITES`, signed by the archive keyring, with
    lists and cache of its own; its package lists fetched once."""
    (apt_root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt_root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    suites = sorted(SUITES)
    text = "".join(f"deb [signed-by={KEYRING}] {MIRROR} {s} main\n" for s in suites)
    src = apt_root / "sources.list"
    if not src.is_file() or src.read_text() != text:
        atomic_write_text(src, text)
        for p in (apt_root / "lists").glob("*_Packages*"):
            p.unlink()
    if any((apt_root / "lists").glob("*_Packages*")):
        return
    p = apt_get(apt_root, "update")
    if p.returncode != 0:
        raise ToolchainError(f"apt-get update of the private Debian sources ({', '.join(suites)}) failed:\n"
                             f"{(p.stdout + p.stderr).strip()[-1500:]}\n  fix: check that {MIRROR} is reachable "
                             f"(and that {KEYRING} exists: Debian's debian-archive-keyring)")


#: Where this module's pins live and how a moved pin is checked (``moved_on``'s fix).
PINS_AT = ("gemmar_aot/toolchain/rocm_sdk.py (DEBS)", "rebuild a manifest's [[hipcc]] kernels and compare them with "
           "mori's own compile (pytest -m parity -k hipcc) before shipping them")


def moved_on(pin, apt_root: Path, downloads: Path, pins_at: tuple[str, str] = PINS_AT,
             verified_on: str = VERIFIED_ON) -> ToolchainError:
    """The archive no longer serves the pinned version: what it has now, and the exact fixes
    (``pins_at``: where the pin is set, and how a moved pin is checked; ``verified_on``: the
    snapshot.debian.org timestamp that holds the pinned file)."""
    show = subprocess.run(["apt-cache", *apt_options(apt_root), "show", pin.package], capture_output=True,
                          text=True, check=False, env={**os.environ, "LC_ALL": "C"})
    now = [line.split(":", 1)[1].strip() for line in show.stdout.splitlines() if line.startswith("Version:")]
    sha = [line.split(":", 1)[1].strip() for line in show.stdout.splitlines() if line.startswith("SHA256:")]
    has = (f"it has {', '.join(f'{v} (sha256 {s})' for v, s in zip(now, sha))}" if now
           else f"it has no {pin.package} at all")
    return ToolchainError(
        f"Debian's {pin.suite} suite no longer serves {pin.describe()}, which the toolchain pins; {has}.\n"
        f"  fix (keep the verified set): download "
        f"https://snapshot.debian.org/archive/debian/{verified_on}/{pin.pool}\n"
        f"    and place it in {downloads}/{pin.filename} (its sha256 must be {pin.sha256}); setup takes it from there\n"
        f"  or move the pin: set the new version, pool path and sha256 in {pins_at[0]}, {pins_at[1]}")


def fetch(pin: ArchiveDeb, downloads: Path, apt_root: Path) -> Path:
    """The verified ``.deb`` of ``pin`` in ``downloads``: taken as it is when its sha256 matches,
    else ``apt-get download``ed through the private configuration and verified."""
    downloads.mkdir(parents=True, exist_ok=True)
    dest = downloads / pin.filename
    if dest.is_file() and sha256_file(dest) == pin.sha256:
        return dest
    if shutil.which("apt-get") is None:
        raise ToolchainError(f"apt-get is not available to download {pin.describe()}\n  fix: download "
                             f"https://snapshot.debian.org/archive/debian/{VERIFIED_ON}/{pin.pool} into {dest} "
                             f"(sha256 {pin.sha256})")
    prepare_apt(apt_root)
    with tempfile.TemporaryDirectory(prefix=".apt-", dir=downloads) as td:
        p = apt_get(apt_root, "download", f"{pin.package}={pin.version}", cwd=Path(td))
        if p.returncode != 0:
            if any(s in p.stdout + p.stderr for s in ("was not found", "Unable to locate", "Can't select")):
                raise moved_on(pin, apt_root, downloads)
            raise ToolchainError(f"apt-get download {pin.package}={pin.version} failed:\n"
                                 f"{(p.stdout + p.stderr).strip()[-1500:]}\n  fix: check that {MIRROR} is reachable")
        got = sorted(Path(td).glob("*.deb"))
        if len(got) != 1 or sha256_file(got[0]) != pin.sha256:
            raise ToolchainError(f"{pin.describe()} from {MIRROR} does not have the pinned sha256 {pin.sha256} "
                                 f"(got {[sha256_file(g) for g in got]}): refused\n  fix: if Debian rebuilt it, "
                                 f"review the new file and move the pin in gemmar_aot/toolchain/rocm_sdk.py")
        os.replace(got[0], dest)
    return dest


# ---------------------------------------------------------------- installing


def install(root: Path, downloads: Path) -> None:
    """``<root>/rocm-sdk`` from the pinned packages (replaced as a whole), plus ``bin/lld``."""
    from .fsutil import staging_dir
    from .tools import run

    if shutil.which("dpkg") is None:
        raise ToolchainError("dpkg is not available to unpack the HIP SDK's .debs\n  fix: run setup on a Debian host")
    debs = [(pin, fetch(pin, downloads, root / "apt")) for pin in DEBS]
    with tempfile.TemporaryDirectory(prefix=".sdk-", dir=root) as td, staging_dir(sdk_dir(root)) as tmp:
        for pin, deb in debs:
            unpacked = Path(td) / pin.package
            run(["dpkg", "-x", str(deb), str(unpacked)], what=f"dpkg -x {deb.name}")
            for member, to in pin.take:
                src, dst = unpacked / member, tmp / to
                if not src.exists():
                    raise ToolchainError(f"{deb.name} has no {member}")
                dst.parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
        atomic_write_text(tmp / "bin" / "lld", lld_wrapper_text(), mode=0o755)
        missing = [m for m in MARKERS if not (tmp / m).is_file()]
        if missing:
            raise ToolchainError(f"the HIP SDK is missing {missing} after unpacking {[d.name for _, d in debs]}")


def problems(root: Path) -> list[str]:
    """What is wrong with ``<root>/rocm-sdk`` (empty: usable)."""
    d = sdk_dir(root)
    if not d.is_dir():
        return [f"{d} is missing"]
    out = [f"{d}/{m} is missing" for m in MARKERS if not (d / m).is_file()]
    lld = d / "bin" / "lld"
    if lld.is_file() and lld.read_text() != lld_wrapper_text():
        out.append(f"{lld} is not the wrapper this gemmar-aot writes")
    return out


def describe(root: Path, fp: dict | None) -> str:
    """``doctor``'s line for the SDK: its packages, digest and lld, checked against ``fp`` (the
    profile's toolchain.json, None when unreadable); ToolchainError naming what is wrong."""
    from .tools import lld_identity

    bad = problems(root)
    if bad:
        raise ToolchainError("; ".join(bad[:3]))
    h = (fp or {}).get("hipcc")
    if fp is not None and h is None:
        raise ToolchainError("toolchain.json has no hipcc section (set up before mori's hipcc kernels were built)")
    digest = tree_digest(sdk_dir(root))
    if h is not None and digest != h["sdk_digest"]:
        raise ToolchainError(f"{SDK_REL} digest {digest[:16]} != toolchain.json's {h['sdk_digest'][:16]}")
    return (", ".join(f"{d.package} {d.version}" for d in DEBS) + f" [{digest[:16]}]; "
            + f"lld {lld_identity([str(sdk_dir(root) / 'bin' / 'lld'), '-flavor', 'gnu'])}")


def host_header_pins() -> list[str]:
    """Installed versions of the host header packages a device compile reads."""
    if shutil.which("dpkg-query") is None:
        return ["unknown (no dpkg-query)"]
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package} ${Version}\n",
                           *HOST_HEADER_PACKAGES], capture_output=True, text=True, check=False)
    return sorted(" ".join(line.split()[1:3]) for line in proc.stdout.splitlines() if line.startswith("ii "))


#: What mori's own JIT cache keys a source by (``compile_genco``: the source directory's parent and
#: ``include/mori``, files of these suffixes: ``jit/cache.py``), relative to ``_jit-sources``.
MORI_KEYED_SUFFIXES = (".hpp", ".h", ".cpp", ".hip")
MORI_INCLUDE = "include/mori"


def mori_jit_digests(mori_dir: Path) -> dict:
    """The mori inputs of a hipcc kernel, hashed whole (sha256 over relative paths and contents):
    ``jit``, mori's compile driver (``mori/jit/*.py``: the flags, the NIC and OCP defines); and
    per tree mori's cache keys a source by -- each ``src/<subsystem>`` holding ``kernels/``, and
    ``include/mori`` -- the files mori hashes there."""
    jit = Path(mori_dir) / "mori" / "jit"
    src = Path(mori_dir) / "mori" / "_jit-sources"
    jit_files = sorted(p.name for p in jit.glob("*.py"))
    if not jit_files or not (src / MORI_INCLUDE).is_dir():
        raise ToolchainError(f"mori's JIT sources are missing under {mori_dir}: no mori/jit/*.py or "
                             f"mori/_jit-sources/{MORI_INCLUDE}\n  fix: run `make setup`")
    trees = [MORI_INCLUDE] + sorted(p.parent.relative_to(src).as_posix() for p in (src / "src").glob("*/kernels"))
    out = {"jit": tree_digest(jit, jit_files), "trees": {}}
    for t in trees:
        files = sorted(f.relative_to(src).as_posix() for f in (src / t).rglob("*")
                       if f.is_file() and f.suffix in MORI_KEYED_SUFFIXES)
        out["trees"][t] = tree_digest(src, files)
    return out


#: What mori's JIT v2 keys an EP plan's sources by (``EpSourceDeps``: every file of these suffixes
#: under these trees of ``_jit-sources``): what a JIT v2 TU can include of mori's.
MORI_JITV2_TREES = ("include/mori", "src/ops/dispatch_combine_v2", "src/cco")
MORI_JITV2_SUFFIXES = (".hpp", ".h", ".cuh", ".hip", ".cpp")
#: mori's JIT v2 libraries: the renderer, the flags, the key and the cache layout.
MORI_JITV2_LIBS = ("libmori_jit.so", "libmori_ops_v2.so")


def mori_jitv2_digests(mori_dir: Path) -> dict:
    """The mori inputs of a JIT v2 kernel besides its rendered source (which its spec holds): per
    tree of :data:`MORI_JITV2_TREES`, the files mori's own key hashes there, hashed whole; and its
    JIT v2 libraries (:data:`MORI_JITV2_LIBS`)."""
    src = Path(mori_dir) / "mori" / "_jit-sources"
    if not (src / "src" / "ops" / "dispatch_combine_v2").is_dir():
        raise ToolchainError(f"mori's JIT v2 sources are missing under {mori_dir}: no "
                             f"mori/_jit-sources/src/ops/dispatch_combine_v2\n  fix: run `make setup`")
    out = {}
    for t in MORI_JITV2_TREES:
        files = sorted(f.relative_to(src).as_posix() for f in (src / t).rglob("*")
                       if f.is_file() and f.suffix in MORI_JITV2_SUFFIXES)
        out[t] = tree_digest(src, files)
    libs = [f"mori/{name}" for name in MORI_JITV2_LIBS]
    return {"trees": out, "libs": tree_digest(Path(mori_dir), libs)}


def fingerprint(root: Path) -> dict:
    """What a hipcc kernel's bytes depend on besides mori's sources and the spec: the SDK's
    packages and content, clang, its resource dir, the host headers, the linker. No paths."""
    from .tools import clang_version, lld_identity

    d = sdk_dir(root)
    return {
        "debs": [{"package": p.package, "version": p.version, "sha256": p.sha256} for p in DEBS],
        "sdk_digest": tree_digest(d),
        "clang": clang_version(),
        "resource_dir_digest": tree_digest(Path(root) / "clang-resource"),
        "host_headers": host_header_pins(),
        "linker": lld_identity([str(d / "bin" / "lld"), "-flavor", "gnu"]),
    }
