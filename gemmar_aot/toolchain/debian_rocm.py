"""Debian's own ROCm 7.2.4 compiler, set up as it is: the oracle for mori's hipcc kernels.

Our hipcc code objects are made by our reading of hipcc (``gemmar_aot_kernels.hipcc.clang_argv``)
and zig's clang. Debian packages ROCm against upstream LLVM: ``hipcc 7.2.4+dfsg-1~exp1``
(experimental) runs ``/usr/lib/llvm-22/bin/clang++`` of trixie's ``clang-22 1:22.1.8-1~deb13u5``,
with the HIP 7.2.4 headers and device libraries we pin. That is what mori's ``compile_genco`` runs
in a pod whose ROCm comes from Debian, written by others: an independent compiler to compare with.

What is installed (:data:`DEBS`, each pinned by version and sha256, fetched with Debian's own apt
under the private configuration of ``rocm_sdk``, ``<root>/apt``: the machine's apt is not touched)
is the smallest set that is closed for what runs, by role:

* ``runs``: Debian's ``hipcc``, ``clang-22``, ``lld-22`` (clang's device link), ``clang-tools-22``
  (``clang-offload-bundler``: ``hipcc --genco`` writes an offload bundle unless told
  ``--no-gpu-bundle-output``) and ``llvm-22`` (``llvm-objcopy``, which the bundler runs to
  write it), ``dash`` (``/bin/sh``: hipcc runs clang through ``system()``);
* ``library``: the shared libraries those programs need, as their ELF ``NEEDED`` entries say
  (trixie's glibc 2.41: Debian's hipcc needs glibc >= 2.38; bookworm has 2.36);
* ``compile``: what a device compile reads: clang's resource headers, HIP 7.2.4's headers, the
  device libraries, ``hsakmt`` headers, trixie's glibc, libstdc++ 14 and kernel headers, and
  libgcc 14 (clang finds the GCC installation, so libstdc++'s headers, by its ``crtbegin.o``).

Package ``Depends`` are not followed as such: ``hipcc`` depends on ``rocminfo``,
``libclang-rt-22-dev`` and ``libstdc++-16-dev`` (not installable from trixie and experimental),
``libamdhip64-dev`` on the HIP runtime; none of them takes part in a device compile. Closure is checked instead: setup runs every
program of :data:`PROGRAMS` in the tree, so a missing library fails setup by name.

Everything is unpacked (``dpkg -x``) into ``<root>/debian-rocm/``, a root-like tree with the
usrmerge links (``bin``, ``lib``, ``lib64``, ``sbin`` -> ``usr/...``), ``tmp/`` and ``dev/null``.

How it runs: in a chroot of that tree (as root; otherwise in a user namespace,
``unshare --user --map-root-user``). Not through the tree's own loader
(``lib64/ld-linux-x86-64.so.2 --library-path ...``): hipcc runs ``/usr/lib/llvm-22/bin/clang++``
by that absolute path through ``/bin/sh``, and clang runs ``lld`` and ``clang-offload-bundler``
from its own directory; none of these would go through the loader, and hipcc finds its
installation from ``/proc/self/exe``, which would name the loader. The chroot has no ``/proc``
(mounting one needs privileges a container may not grant): without it hipcc cannot read
``/proc/self/exe``, so :data:`ENV` gives it ``HIP_PATH=/usr``, the value it derives itself from
``/usr/bin/hipcc``. Nothing else: ``ROCM_PATH`` in the environment is also read by clang, which
then no longer finds Debian's device libraries. With ``HIP_PATH`` alone, hipcc's clang command
and clang's own commands (``-###``) are the ones of a chroot with ``/proc`` mounted in a private
mount namespace (``tests/test_debian_rocm.py``; also checked for mori's ``_hipcc_genco`` command). clang falls back to ``argv[0]``
for its own path: ``InstalledDir`` stays ``/usr/lib/llvm-22/bin``.

A host working directory reaches the chroot as a copy (symlinks followed: a compile's staging
directory links mori's tree from elsewhere, which a bind mount would not carry, and a bind mount
needs privileges): :func:`run_in_tree` copies ``cwd`` to ``/tmp/job-XXXX`` in the tree, runs
there, copies back every file the run created or changed, and removes the copy. Arguments naming
the host ``cwd`` are rewritten to the copy; paths relative to ``cwd`` (as the project's compiles
use) need nothing and put no host path into a code object (the copy's path reaches clang only as
``-fdebug-compilation-dir``: debug info, which ``--genco`` without ``-g`` has none of).
:func:`unbundle` takes the code object out of the offload bundle ``hipcc --genco`` writes.

``python -m gemmar_aot.toolchain.debian_rocm pin`` prints the table the archive serves now (to
move the pins); ``... version`` runs ``hipcc --version`` in the tree.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path

from gemmar_aot.util.atomic_write import atomic_write_text
from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import iter_files, sha256_file, tree_digest

from .rocm_sdk import MIRROR, apt_get, apt_options, moved_on, prepare_apt

#: The snapshot.debian.org timestamp at which every pinned file below was in Debian's archive.
VERIFIED_ON = "20261206T000000Z"
TREE_REL = "debian-rocm"
STEP = "debian-rocm"  # the setup step (its stamp records the tree's digest)
PINS_AT = ("gemmar_aot/toolchain/debian_rocm.py (DEBS; `python -m gemmar_aot.toolchain.debian_rocm pin` prints the "
           "table the archive serves now)", "set it up again and run the oracle (pytest -m parity -k debian)")
RUNS, LIBRARY, COMPILE = "runs", "library", "compile"


@dataclass(frozen=True)
class DebianDeb:
    """One ``.deb`` of the tree: pinned by version and sha256, unpacked whole."""

    package: str
    version: str
    suite: str
    role: str  # RUNS, LIBRARY or COMPILE (see the module's docstring)
    source_dir: str  # where the archive keeps its source package's files, under pool/main/
    size: int
    sha256: str
    arch: str = "amd64"

    @property
    def filename(self) -> str:
        """Debian's pool name: the version without its epoch."""
        return f"{self.package}_{self.version.split(':')[-1]}_{self.arch}.deb"

    @property
    def pool(self) -> str:  # the file's path in the archive (apt's Filename)
        return f"pool/main/{self.source_dir}/{self.filename}"

    def describe(self) -> str:
        return f"{self.package} {self.version} ({self.suite})"


DEBS = tuple(DebianDeb(*row) for row in (
    # package, version, suite, role, source dir under pool/main/, size, sha256[, arch]
    ("hipcc", "7.2.4+dfsg-1~exp1", "experimental", RUNS, "r/rocm-llvm", 109792,
     "e6b040fc66993b1fbb78c38cd0a514af89e71c03f08a27b56013e8d97ab6799b"),
    ("clang-22", "1:22.1.8-1~deb13u5", "trixie", RUNS, "l/llvm-toolchain-22", 173532,
     "6f6b7f4f6974a2754e6ebf7f8e6286e66cdea062da5e7066adc3a8a44a134f15"),
    ("lld-22", "1:22.1.8-1~deb13u5", "trixie", RUNS, "l/llvm-toolchain-22", 1500188,
     "b1ff5fbc2be90441acdef25a3caab7f31049a9e3f1997362596904615a0b97da"),
    ("clang-tools-22", "1:22.1.8-1~deb13u5", "trixie", RUNS, "l/llvm-toolchain-22", 9334116,
     "f8a0c6b3a604113d17e3953fe6bbb43ad2554a33afc118cfb99037200f36c2a8"),
    ("llvm-22", "1:22.1.8-1~deb13u5", "trixie", RUNS, "l/llvm-toolchain-22", 19224268,
     "68ae228f9f761b2bf271eb5cdd7f849c5c9da3284374212875dd731152361b90"),
    ("dash", "0.5.12-12", "trixie", RUNS, "d/dash", 98504,
     "a8902cb6d8650134764a25fb80aec8589d858ef71ece1680a62e84816c37bb04"),
    ("libc6", "2.41-12+deb13u5", "trixie", LIBRARY, "g/glibc", 2850108,
     "b59b0625cd1a791375d40dab23a4d5d3d0641e3d0a773501becdc3725b7f99cf"),
    ("libgcc-s1", "14.2.0-19", "trixie", LIBRARY, "g/gcc-14", 72772,
     "3c71917b490d1a17aed43196a2787a256ecf060526cdb20216a74bedc061b150"),
    ("libstdc++6", "14.2.0-19", "trixie", LIBRARY, "g/gcc-14", 713628,
     "ab1fa05837aa7a92aae748fd07a18a35f7d18bb4a71c4724fe2bbf0e32089de0"),
    ("libllvm22", "1:22.1.8-1~deb13u5", "trixie", LIBRARY, "l/llvm-toolchain-22", 29478960,
     "2b299d0615054df8cf0bd9f99b51bad1c4595ee4fa6cda61c060176f90950566"),
    ("libclang-cpp22", "1:22.1.8-1~deb13u5", "trixie", LIBRARY, "l/llvm-toolchain-22", 13282964,
     "2113dcb400bbfebbeb4b2effc2238fde16216383218a7de9f5a0c7763030507b"),
    ("libffi8", "3.4.8-2", "trixie", LIBRARY, "libf/libffi", 24144,
     "0ebdc340de33333639c3c63874cd4b15ac2e83dfa1ef3053b7eefaf4919f4f68"),
    ("libedit2", "3.1-20250104-1", "trixie", LIBRARY, "libe/libedit", 93832,
     "b002ea172b9c1e34a67bc497c523c67bb74c3f0a4e98113cb083990a1f1d3bfe"),
    ("libbsd0", "0.12.2-2", "trixie", LIBRARY, "libb/libbsd", 130968,
     "e5a85986fa6bec3307ab1bc860736b478b331882bc45e17675a7bdf88eecb43a"),
    ("libmd0", "1.1.0-2+b1", "trixie", LIBRARY, "libm/libmd", 36272,
     "7244ec3839b61fac0c1884fe08aaa040f26e8f1f35f1f5d3482eacefd30d1b44"),
    ("libtinfo6", "6.5+20250216-2", "trixie", LIBRARY, "n/ncurses", 348380,
     "8b9f6a7983e9418564e48a627518de4c03917b56efe68d7f3e93bd8fffa1cc10"),
    ("libz3-4", "4.13.3-1", "trixie", LIBRARY, "z/z3", 8560036,
     "71383373523ef62d47eccf660cf6535c3febcbb3f88e54cb7a43124014b57359"),
    ("libxml2", "2.12.7+dfsg+really2.9.14-2.1+deb13u3", "trixie", LIBRARY, "libx/libxml2", 699724,
     "e0c6b63ce4602a036a526f60fe5e6c1586710688058d98fc1001b9b3147b7efd"),
    ("liblzma5", "5.8.1-1+deb13u2", "trixie", LIBRARY, "x/xz-utils", 309696,
     "b38acab30f295bf1066a6632e31cbd0a1980f2924b38040cda131d5dea5384ec"),
    ("zlib1g", "1:1.3.dfsg+really1.3.1-1+deb13u1", "trixie", LIBRARY, "z/zlib", 88720,
     "8c27c342230503b73dfde629642c3b352e87b554e06d60cf58772f236a305ceb"),
    ("libzstd1", "1.5.7+dfsg-1", "trixie", LIBRARY, "libz/libzstd", 303836,
     "2f6a2aeacfc925eba8b00ac9139bc4bfccf8cacb09eb93de067074b26948eef9"),
    ("libclang-common-22-dev", "1:22.1.8-1~deb13u5", "trixie", COMPILE, "l/llvm-toolchain-22", 805976,
     "80d285cb01e065ffd5bd077c1194ffe16097a93a18bb3924cdb84ea4ebb998aa"),
    ("libamdhip64-dev", "7.2.4-1~exp2", "experimental", COMPILE, "r/rocm-hipamd", 262944,
     "28ae316c5be2d33b53fae8f2151e76a758f84aa3493abafeaef935e49cc5ba07"),
    ("rocm-device-libs-22", "7.2.4+dfsg-1~exp1", "experimental", COMPILE, "r/rocm-llvm", 479556,
     "24b439be7c151ff67bc1f4f4f42a7c4047b3e6fd7905b9e6df89c0fa5dea8031"),
    ("libhsakmt-dev", "6.2.4+ds-1", "trixie", COMPILE, "r/roct-thunk-interface", 29536,
     "1cb7a1e52e7a568de002a576f3893dc4e12fa007f9d66e11793622a9edf433ec"),
    ("libc6-dev", "2.41-12+deb13u5", "trixie", COMPILE, "g/glibc", 1991168,
     "858f4d477cc39324f3c6582cdebcf38928fb385bb17b40518c77a7dccd296428"),
    ("libstdc++-14-dev", "14.2.0-19", "trixie", COMPILE, "g/gcc-14", 2375760,
     "4b962fac5f1af0bd8b1b3f97e0f47b9d8e9a79e88802143f00ebfbd78ad87a7b"),
    ("libgcc-14-dev", "14.2.0-19", "trixie", COMPILE, "g/gcc-14", 2672328,
     "ca6f2d36d96b19b3eb71405b0b80134d8c89380b02204a2512e5c58ceb090628"),
    ("linux-libc-dev", "6.12.117-1", "trixie", COMPILE, "l/linux", 3085840,
     "8b4848725a2705e5b1612f2135c44300716690ba762368ab87df127e9a5ed416", "all"),
))

#: Every program the oracle runs, relative to the tree, with arguments that prove it starts.
PROGRAMS = {"usr/bin/hipcc": ("--version",), "usr/lib/llvm-22/bin/clang": ("--version",),
            "usr/lib/llvm-22/bin/lld": ("-flavor", "gnu", "--version"),
            "usr/lib/llvm-22/bin/clang-offload-bundler": ("--version",),
            "usr/lib/llvm-22/bin/llvm-objcopy": ("--version",), "usr/bin/dash": ("-c", "true")}
#: What a usable tree holds besides the programs (checked by setup, ``doctor`` and every run).
MARKERS = ("usr/bin/sh", "lib64/ld-linux-x86-64.so.2", "usr/share/hip/version", "usr/include/hip/hip_runtime.h",
           "usr/include/hip/hip_ext_ocp.h", "usr/include/hsakmt/hsakmttypes.h",
           "usr/lib/llvm-22/lib/clang/22/include/__clang_hip_runtime_wrapper.h",
           "usr/lib/llvm-22/lib/clang/22/amdgcn/bitcode/ocml.bc",
           "usr/lib/llvm-22/lib/clang/22/amdgcn/bitcode/oclc_isa_version_950.bc",
           "usr/lib/llvm-22/lib/clang/22/amdgcn/bitcode/oclc_isa_version_942.bc",
           "usr/include/c++/14/cmath", "usr/include/stdlib.h", "usr/lib/gcc/x86_64-linux-gnu/14/crtbegin.o")
HIPCC = "/usr/bin/hipcc"
#: The environment of every program run in the tree (nothing of the host's): see the docstring.
ENV = {"PATH": "/usr/bin:/bin", "HIP_PATH": "/usr", "HOME": "/tmp", "LC_ALL": "C"}
#: What the tree records of its packages, and what its digest leaves out (runs' scratch).
RECORD = "var/lib/gemmar-aot/debs.json"
SCRATCH = ("tmp/", "dev/", "proc/")
USRMERGE = ("bin", "lib", "lib64", "sbin")


def tree_dir(root: Path) -> Path:
    return Path(root) / TREE_REL


def download_size() -> int:
    return sum(d.size for d in DEBS)


def _pin_record(d: DebianDeb) -> dict:
    return {"package": d.package, "version": d.version, "sha256": d.sha256}


# ---------------------------------------------------------------- fetching, through the private apt


def _verified(path: Path, pin: DebianDeb) -> bool:
    return path.is_file() and sha256_file(path) == pin.sha256


def fetch_all(downloads: Path, apt_root: Path) -> list[Path]:
    """The verified ``.deb`` of every pin, in ``downloads``: a verified file there is taken as it
    is (no apt run); the others are ``apt-get download``ed in one run of the private apt."""
    downloads.mkdir(parents=True, exist_ok=True)
    todo = [d for d in DEBS if not _verified(downloads / d.filename, d)]
    if todo and shutil.which("apt-get") is None:
        urls = "\n".join(f"    https://snapshot.debian.org/archive/debian/{VERIFIED_ON}/{d.pool}" for d in todo)
        raise ToolchainError(f"apt-get is not available to download {len(todo)} of Debian's ROCm packages\n"
                             f"  fix: download these into {downloads} (sha256 as in {PINS_AT[0]}):\n{urls}")
    if todo:
        prepare_apt(apt_root)
        with tempfile.TemporaryDirectory(prefix=".apt-", dir=downloads) as td:
            p = apt_get(apt_root, "download", *(f"{d.package}={d.version}" for d in todo), cwd=Path(td))
            if p.returncode != 0:
                raise _download_failed(todo, p, apt_root, downloads)
            by_sha = {sha256_file(f): f for f in Path(td).glob("*.deb")}
            for d in todo:
                if d.sha256 not in by_sha:
                    raise ToolchainError(f"{d.describe()} from {MIRROR} does not have the pinned sha256 {d.sha256}: "
                                         f"refused\n  fix: if Debian rebuilt it, review the new file and move the pin "
                                         f"in {PINS_AT[0]}")
                os.replace(by_sha[d.sha256], downloads / d.filename)
    return [downloads / d.filename for d in DEBS]


_NOT_FOUND = ("was not found", "Unable to locate", "Can't select", "Can't find a source")


def _download_failed(todo: list[DebianDeb], p: subprocess.CompletedProcess, apt_root: Path,
                     downloads: Path) -> ToolchainError:
    """Why ``apt-get download`` failed: the pins the archive no longer serves, each with its exact
    fix (``rocm_sdk.moved_on``), or apt's own words."""
    out = (p.stdout + p.stderr).strip()
    if any(s in out for s in _NOT_FOUND):
        gone = [d for d in todo if not _archive_has(d, apt_root)]
        if gone:
            return ToolchainError("\n".join(str(moved_on(d, apt_root, downloads, PINS_AT, VERIFIED_ON)) for d in gone))
    return ToolchainError(f"apt-get download of {len(todo)} of Debian's ROCm packages failed:\n{out[-1500:]}\n"
                          f"  fix: check that {MIRROR} is reachable")


def _archive_has(pin: DebianDeb, apt_root: Path) -> bool:
    """Whether the private apt's lists have the pinned version (``apt-cache show`` of a version a
    package no longer has prints nothing and exits 0)."""
    p = subprocess.run(["apt-cache", *apt_options(apt_root), "show", f"{pin.package}={pin.version}"],
                       capture_output=True, text=True, check=False)
    return p.returncode == 0 and "Package:" in p.stdout


# ---------------------------------------------------------------- installing


#: How the unpacked packages are made a root-like tree (a setup input: a change redoes the tree).
TREE_RECIPE = "dpkg -x each; usrmerge links " + ",".join(USRMERGE) + "; tmp 1777; proc; dev/null; " + RECORD


def install(root: Path, downloads: Path) -> None:
    """``<root>/debian-rocm`` from the pinned packages (replaced as a whole, after every program of
    :data:`PROGRAMS` has run in the new tree when programs can run here)."""
    from .fsutil import staging_dir
    from .tools import run

    if shutil.which("dpkg") is None:
        raise ToolchainError("dpkg is not available to unpack Debian's ROCm packages\n  fix: run setup on a Debian host")
    debs = fetch_all(Path(downloads), Path(root) / "apt")
    with staging_dir(tree_dir(root)) as tmp:
        for deb in debs:
            run(["dpkg", "-x", str(deb), str(tmp)], what=f"dpkg -x {deb.name}")
        _finish_tree(tmp)
        missing = [m for m in (*PROGRAMS, *MARKERS) if not (tmp / m).exists()]
        if missing:
            raise ToolchainError(f"Debian's ROCm tree is missing {missing} after unpacking {len(debs)} packages\n"
                                 f"  fix: a package of {PINS_AT[0]} no longer ships it: find the one that does")
        if runner_problem() is None:
            check_runs(tmp)


def _finish_tree(t: Path) -> None:
    """The usrmerge links, ``tmp/``, ``proc/``, ``dev/null`` and the record of the packages."""
    for d in USRMERGE:
        link, real = t / d, t / "usr" / d
        real.mkdir(parents=True, exist_ok=True)
        if link.is_dir() and not link.is_symlink():  # a package shipped files outside /usr: merge them
            shutil.copytree(link, real, symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(link)
        if not link.is_symlink():
            link.symlink_to(f"usr/{d}")
    (t / "tmp").mkdir(exist_ok=True)
    os.chmod(t / "tmp", 0o1777)
    (t / "proc").mkdir(exist_ok=True)
    (t / "dev").mkdir(exist_ok=True)
    _reset_dev_null(t)
    (t / RECORD).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(t / RECORD, json.dumps([_pin_record(d) for d in DEBS], indent=1) + "\n", mode=0o644)


def _reset_dev_null(t: Path) -> None:
    """``dev/null``: the character device when it can be made (root); else an empty file, emptied
    before every run (``clang-offload-bundler`` reads ``/dev/null`` as the bundle's host part)."""
    null = t / "dev" / "null"
    if null.is_char_device():
        return
    if not null.exists():
        try:
            os.mknod(null, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR
            os.chmod(null, 0o666)
            return
        except OSError:
            pass
    null.write_bytes(b"")


def problems(root: Path) -> list[str]:
    """What is missing or wrong in ``<root>/debian-rocm`` (empty: usable). Files only: whether
    programs can run on this host is :func:`runner_problem`'s."""
    t = tree_dir(root)
    if not t.is_dir():
        return [f"{t} is missing"]
    out = [f"{t}/{m} is missing" for m in (*PROGRAMS, *MARKERS) if not (t / m).exists()]
    try:
        record = json.loads((t / RECORD).read_text())
    except (OSError, ValueError):
        record = None
    if record != [_pin_record(d) for d in DEBS]:
        out.append(f"{t}/{RECORD} does not list the pinned packages of {PINS_AT[0].split(' ')[0]}")
    return out


def output_digest(root: Path) -> str | None:
    """The tree's digest (its runs' scratch left out); None when :func:`problems` finds any."""
    if problems(root):
        return None
    t = tree_dir(root)
    return tree_digest(t, iter_files(t, keep=lambda rel: not rel.startswith(SCRATCH)))


# ---------------------------------------------------------------- running, in a chroot of the tree

_RUN_FIX = ("run as root (CI does), or allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, "
            "and kernel.unprivileged_userns_clone=1 where the kernel has it)")


def _chroot_program() -> str | None:
    return shutil.which("chroot") or next((p for p in ("/usr/sbin/chroot", "/sbin/chroot") if os.access(p, os.X_OK)), None)


@functools.lru_cache(maxsize=1)
def runner_problem() -> str | None:
    """Why programs cannot run in the tree on this host (None: they can: as root, a chroot; else
    a chroot in a user namespace of our own)."""
    if _chroot_program() is None:
        return "this host has no chroot program (coreutils)"
    if os.geteuid() == 0:
        return None
    if shutil.which("unshare") is None:
        return "not root, and no unshare (util-linux) to chroot in a user namespace"
    p = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        return f"not root, and user namespaces are not available here ({p.stderr.strip() or p.returncode})"
    return None


def chroot_argv(tree: Path, program: str, args: list[str], workdir: str = "/") -> list[str]:
    """The host command running ``program`` (a path in the tree) on ``args`` in a chroot of
    ``tree``, in ``workdir`` (a path in the tree). Run it with :data:`ENV` as its environment."""
    bad = runner_problem()
    if bad:
        raise ToolchainError(f"Debian's ROCm ({tree}) cannot run on this host: {bad}\n  fix: {_RUN_FIX}")
    userns = [] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user"]
    return [*userns, _chroot_program(), str(tree), "/bin/sh", "-c", 'cd "$0" && exec "$@"', workdir, program, *args]


def hipcc_argv(args: list[str], workdir: str = "/", root: Path | None = None) -> list[str]:
    """The host command running Debian's ``hipcc`` on ``args`` in the tree, in ``workdir``."""
    return chroot_argv(tree_dir(_root(root)), HIPCC, list(args), workdir)


def _root(root: Path | None) -> Path:
    from .paths import toolchain_root

    return Path(root) if root is not None else toolchain_root()


def run_in_tree(program: str, args: list[str], cwd: Path | None = None, *, root: Path | None = None,
                env: dict | None = None, timeout: float | None = None,
                tree: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``program`` (a path in the tree) on ``args`` in a chroot of the tree with :data:`ENV`
    (plus ``env``). With ``cwd`` (a host directory), in a copy of it; the files the run creates
    or changes are copied back into ``cwd`` (see the module's docstring). ``tree`` (instead of
    ``root``): a tree being set up."""
    if tree is None:
        bad = problems(_root(root))
        if bad:
            raise ToolchainError("Debian's ROCm is not set up: " + "; ".join(bad[:3]) +
                                 "\n  fix: run `make setup` (or `python -m gemmar_aot.toolchain setup`)")
        tree = tree_dir(_root(root))
    _reset_dev_null(tree)
    run_env = {**ENV, **(env or {})}
    if cwd is None:
        return subprocess.run(chroot_argv(tree, program, list(args)), env=run_env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    cwd = Path(cwd).resolve()
    if tree.resolve().is_relative_to(cwd):
        raise ToolchainError(f"{cwd} holds the tree itself ({tree}): it cannot be copied into it\n"
                             f"  fix: run in a directory holding only the compile's inputs")
    job = Path(tempfile.mkdtemp(prefix="job-", dir=tree / "tmp"))
    try:
        shutil.copytree(cwd, job, symlinks=False, ignore_dangling_symlinks=True, dirs_exist_ok=True)
        before = _files(job)
        inner = "/" + job.relative_to(tree).as_posix()
        argv = chroot_argv(tree, program, [a.replace(str(cwd), inner) for a in args], inner)
        p = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=timeout, check=False)
        _copy_back(job, cwd, before)
        return p
    finally:
        shutil.rmtree(job, ignore_errors=True)


def run_hipcc(args: list[str], cwd: Path | None = None, *, root: Path | None = None, verbose: bool = False,
              timeout: float | None = None) -> subprocess.CompletedProcess:
    """Debian's real ``hipcc`` on ``args`` (paths relative to ``cwd``), as :func:`run_in_tree`
    runs it; ``verbose``: ``HIPCC_VERBOSE=7`` (hipcc prints its clang command as ``hipcc-cmd:``)."""
    return run_in_tree(HIPCC, args, cwd, root=root, env={"HIPCC_VERBOSE": "7"} if verbose else None, timeout=timeout)


BUNDLER = "/usr/lib/llvm-22/bin/clang-offload-bundler"


def unbundle(bundle: Path, arch: str, out: Path, *, root: Path | None = None) -> None:
    """The ``arch`` code object of an offload bundle (what ``hipcc --genco`` writes) -> ``out``,
    by the tree's ``clang-offload-bundler``: the ELF a compile with ``--no-gpu-bundle-output``
    writes, to compare with ours section by section."""
    bundle, out = Path(bundle).resolve(), Path(out).resolve()
    if bundle.parent != out.parent:
        raise ToolchainError(f"unbundle: {bundle} and {out} must be in one directory")
    p = run_in_tree(BUNDLER, ["--unbundle", "--type=o", f"--targets=hipv4-amdgcn-amd-amdhsa--{arch}",
                              f"--input={bundle.name}", f"--output={out.name}"], bundle.parent, root=root, timeout=120)
    if p.returncode != 0 or not out.is_file():
        raise ToolchainError(f"clang-offload-bundler --unbundle {bundle} ({arch}) failed (exit {p.returncode}):\n"
                             f"{(p.stdout + p.stderr).strip()[-1500:]}")


def _files(d: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _dirs, names in os.walk(d):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), d)] = (st.st_size, st.st_mtime_ns)
    return out


def _copy_back(job: Path, cwd: Path, before: dict) -> None:
    """Every file the run created or changed in ``job`` -> the same place under ``cwd`` (never
    through a symlink of ``cwd`` to elsewhere)."""
    for rel, state in sorted(_files(job).items()):
        if before.get(rel) == state or not (job / rel).is_file():
            continue
        dst = cwd / rel
        if not dst.parent.resolve().is_relative_to(cwd) or dst.is_symlink():
            raise ToolchainError(f"the run wrote {rel}, which is {dst.resolve()} on the host, outside {cwd}: "
                                 f"not copied back\n  fix: name outputs inside the working directory, not under "
                                 f"a symlinked directory")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(job / rel, dst)


def check_runs(tree: Path) -> dict[str, str]:
    """Run every program of :data:`PROGRAMS` in ``tree``: {program: first line it printed}. A
    program that does not start (a library missing from the set, ...) is named, with the loader's
    words."""
    out = {}
    for prog, args in PROGRAMS.items():
        p = run_in_tree("/" + prog, list(args), tree=tree, timeout=120)
        if p.returncode != 0:
            raise ToolchainError(f"/{prog} does not run in {tree} (exit {p.returncode}):\n"
                                 f"{(p.stdout + p.stderr).strip()[-1500:]}\n  fix: if a shared library is missing, "
                                 f"add the trixie package shipping it to {PINS_AT[0]}")
        out[prog] = (p.stdout.strip().splitlines() or [""])[0]
    return out


def versions(root: Path | None = None) -> dict[str, str]:
    """What Debian's ``hipcc --version`` says of HIP and of clang, run in the tree."""
    p = run_hipcc(["--version"], root=root, timeout=120)
    lines = p.stdout.splitlines()
    hip = next((x.strip() for x in lines if x.startswith("HIP version:")), None)
    clang = next((x.strip() for x in lines if "clang version" in x), None)
    if p.returncode != 0 or hip is None or clang is None:
        raise ToolchainError(f"Debian's hipcc --version failed (exit {p.returncode}):\n"
                             f"{(p.stdout + p.stderr).strip()[-1500:]}\n  fix: run `make setup`")
    return {"hip": hip, "clang": clang}


def fingerprint(root: Path | None = None) -> dict:
    """The oracle's identity: its packages, the tree's digest, and what hipcc says it is."""
    root = _root(root)
    return {"debs": [_pin_record(d) for d in DEBS], "tree_digest": output_digest(root), **versions(root)}


def describe(root: Path) -> str:
    """``doctor``'s line: what runs, checked against the digest setup recorded; ToolchainError
    naming what is wrong."""
    bad = problems(root) or ([runner_problem()] if runner_problem() else [])
    if bad:
        raise ToolchainError("; ".join(bad[:3]))
    digest = output_digest(root)
    try:
        stamped = json.loads((Path(root) / "stamps" / f"{STEP}.json").read_text())["output"]
    except (OSError, ValueError, KeyError):
        stamped = None
    if digest != stamped:
        raise ToolchainError(f"{tree_dir(root)} digest {str(digest)[:16]} != the one setup recorded {str(stamped)[:16]}")
    v = versions(root)
    return f"{v['hip']}, {v['clang']}; {len(DEBS)} packages [{digest[:16]}]"


# ---------------------------------------------------------------- moving the pins


def archive_table(apt_root: Path) -> list[DebianDeb]:
    """What the archive serves now for each pinned package in its suite (role kept), as
    ``apt-get download --print-uris`` of the private apt says: to move the pins."""
    prepare_apt(apt_root)
    p = apt_get(apt_root, "download", "--print-uris", *(f"{d.package}/{d.suite}" for d in DEBS))
    if p.returncode != 0:
        raise ToolchainError(f"apt-get download --print-uris failed:\n{(p.stdout + p.stderr).strip()[-1500:]}")
    now = {}
    for line in p.stdout.splitlines():
        url, name, size, sha = line.split()
        pool = urllib.parse.unquote(url.strip("'").split("/debian/", 1)[1])
        package, version, arch = urllib.parse.unquote(name)[: -len(".deb")].split("_")
        now[package] = DebianDeb(package, version, "", "", pool[len("pool/main/"):].rsplit("/", 1)[0], int(size),
                                 sha.split(":", 1)[1], arch)
        if now[package].pool != pool:
            raise ToolchainError(f"{pool} is not named as Debian's pool names its files: {now[package].pool}")
    missing = [d.package for d in DEBS if d.package not in now]
    if missing:
        raise ToolchainError(f"the archive serves no {missing} in their suites\n  fix: find what replaced them")
    return [replace(now[d.package], suite=d.suite, role=d.role) for d in DEBS]


def table_text(debs: list[DebianDeb]) -> str:
    """``debs`` as the rows of :data:`DEBS`."""
    rows = [f'    ("{d.package}", "{d.version}", "{d.suite}", {d.role.upper()}, "{d.source_dir}", {d.size},\n'
            f'     "{d.sha256}"' + ("" if d.arch == "amd64" else f', "{d.arch}"') + "),"
            for d in debs]
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """``python -m gemmar_aot.toolchain.debian_rocm {pin | version | hipcc ARGS...}``: print the
    table the archive serves now; what the installed hipcc says it is; run Debian's hipcc here."""
    try:
        if argv[:1] == ["pin"]:
            print(table_text(archive_table(_root(None) / "apt")))
        elif argv[:1] == ["version"]:
            print(json.dumps(fingerprint(), indent=1))
        elif argv[:1] == ["hipcc"]:
            p = run_hipcc(argv[1:], Path.cwd())
            sys.stdout.write(p.stdout)
            sys.stderr.write(p.stderr)
            return p.returncode
        else:
            print(main.__doc__, file=sys.stderr)
            return 2
    except ToolchainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
