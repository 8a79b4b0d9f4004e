"""Every pinned input of the build toolchain, in one place.

Each pin can change the bytes of a code object, so each one is recorded in the
toolchain fingerprint (``toolchain.json``). The Python packages pinned here are
also pinned in ``pyproject.toml`` (extra ``build``); a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Python packages the venv must hold (installed by ``pip install -e '.[build]'``).
FLYDSL_VERSION = "0.4.2"
TORCH_VERSION = "2.13.0"  # a local version suffix (``+cpu``) is accepted
ZIGLANG_VERSION = "0.17.0"  # provides clang 22.1.8 and ld.lld (knows gfx950)

#: What the kernels are built for.
TARGET_ARCH = "gfx950"
CODE_OBJECT_VERSION = 6  # FlyDSL's ROCm backend uses ABI 600
#: FlyDSL's optimisation level when FLYDSL_COMPILE_OPT_LEVEL is unset (FlyDSL's own default).
DEFAULT_FLYDSL_OPT_LEVEL = 2

#: Fixed compilation-unit id for the cco bitcode: without it clang derives a
#: random ``__hip_cuid_<hash>`` symbol and the bitcode is not reproducible.
CCO_CUID = "gemmar_aot_cco"


@dataclass(frozen=True)
class WheelPin:
    """A wheel fetched with ``pip download`` and verified by its sha256."""

    project: str
    version: str
    filename: str
    sha256: str
    python_version: str  # pip download --python-version
    abi: str  # pip download --abi
    platform: str  # pip download --platform

    def pip_download_args(self, dest: str) -> list[str]:
        """Arguments after ``python -m pip``; explicit tags make the choice host-independent."""
        return [
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--only-binary=:all:",
            "--python-version",
            self.python_version,
            "--implementation",
            "cp",
            "--abi",
            self.abi,
            "--platform",
            self.platform,
            "-d",
            dest,
            f"{self.project}=={self.version}",
        ]


@dataclass(frozen=True)
class DebPin:
    """A Debian package fetched with ``apt-get download`` (never installed)."""

    package: str
    version: str
    arch: str
    filename: str
    sha256: str

    @property
    def apt_spec(self) -> str:
        return f"{self.package}={self.version}"


#: mori's pure-Python kernel generators and the cco device-wrapper sources.
#: Only unpacked: its native libraries need ROCm. The default profile's mori.
MORI = WheelPin(
    project="amd-mori",
    version="1.2.4",
    filename="amd_mori-1.2.4-cp310-cp310-manylinux_2_35_x86_64.whl",
    sha256="ba60848d9f10fe2de1848d4d4cd5edbae1f7bb3421c3200b66a3c91f52886e02",
    python_version="3.10",
    abi="cp310",
    platform="manylinux_2_35_x86_64",
)

#: mori's nightly: the GEMM main-loop read-done barrier fix (matters at K = 256, where the
#: main loop runs zero times) and a changed cco device API (``put_ptr``, ``cco_local_ptr``,
#: a new SDMA doorbell protocol). The ``nightly`` profile's mori. The _jit-sources and the
#: Python generators are identical in the cp310 and cp312 wheels; cp310 is the one pinned.
MORI_NIGHTLY = WheelPin(
    project="amd-mori-nightly",
    version="1.2.5.dev20261026",
    filename="amd_mori_nightly-1.2.5.dev20261026-cp310-cp310-manylinux_2_35_x86_64.whl",
    sha256="dc9760eedff617558ab402652d0a7fb6bcde9968c22479b74797c44e17d0d2b5",
    python_version="3.10",
    abi="cp310",
    platform="manylinux_2_35_x86_64",
)

#: HIP 7.1 headers and ockl.bc/ocml.bc (triton/backends/amd/{include,lib}).
#: 248 MB; deleted after the two directories are extracted.
TRITON = WheelPin(
    project="triton",
    version="3.8.0",
    filename="triton-3.8.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    sha256="68988ac85d5e7086baeda0ddc175af9667db7529b3c5e11a5c0601b8bef2200a",
    python_version="3.11",
    abi="cp311",
    platform="manylinux_2_28_x86_64",
)

#: clang's HIP/CUDA wrapper headers, which zig's clang resource dir lacks.
LIBCLANG_COMMON = DebPin(
    package="libclang-common-19-dev",
    version="1:19.1.7-3~deb12u1",
    arch="amd64",
    filename="libclang-common-19-dev_1%3a19.1.7-3~deb12u1_amd64.deb",
    sha256="811c2d398ad772204ec05ffde485cbbc4c210abc5dcf0068ff9ca3e647591ce7",
)
