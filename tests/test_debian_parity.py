"""mori's hipcc-JIT kernels against a toolchain we did not write: Debian's own ROCm 7.2.4.

The oracle is mori's own ``compile_genco`` (``tests/hipcc_oracle.py``) running Debian's real ``hipcc``
(``tests/debian_hipcc.py``: Debian's packages, pinned, in a tree of their own; paths made relative and
``-cuid`` fixed, as every byte-parity test does) -- what a pod whose ROCm comes from Debian or Ubuntu
compiles. Every ``[[hipcc]]`` code object of ``smoke.toml`` is compared with ours section by section:
every ELF section must be equal but ``.comment``, which holds the compilers' own names (Debian clang and
LLD against zig's); that one is reported apart (a test property, and the first test's message). No test
here uses ``tests/hipcc_shim.py``. ``pytest -m parity -k debian`` selects them.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gemmar_aot.model.hipcc import HipccVariant

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
#: smoke.toml's [[hipcc]] code objects (tests/test_hipcc.py holds the manifest to them).
SMALL = ("cast_kernel", "ep_local_expert_count", "shmem_kernels", "scatter_gather", "fabric_copy")
VARIANTS = sorted({HipccVariant(s, a, "mlx5") for s in SMALL for a in ("gfx950", "gfx942")}
                  | {HipccVariant("shmem_kernels", "gfx950", n) for n in ("bnxt", "ionic", "ionic-ccqe")})


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> its bytes (a NOBITS section: its size, as bytes of zeros) of an ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple:
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)

    strtab = header(shstrndx)
    names = data[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for i in range(1, shnum):
        name_off, kind, _flags, _addr, off, size = header(i)[:6]
        name = names[name_off:names.index(b"\0", name_off)].decode()
        out[name] = bytes(size) if kind == 8 else data[off:off + size]  # SHT_NOBITS
    return out


@pytest.fixture(scope="module")
def debian_objects(tmp_path_factory) -> tuple[dict[HipccVariant, bytes], Path]:
    """mori's compile_genco of every smoke [[hipcc]] variant, its hipcc Debian's (one process): the code
    objects, and the log of what Debian's hipcc ran clang with."""
    from gemmar_aot.toolchain import debian_rocm, load_toolchain

    tc = load_toolchain()
    missing = debian_rocm.problems(tc.root) or ([debian_rocm.runner_problem()] if debian_rocm.runner_problem() else [])
    if missing:
        pytest.skip(f"Debian's ROCm oracle is not set up here ({'; '.join(missing)}): run `make setup`")
    from test_hipcc import _fake_rocm

    tmp = tmp_path_factory.mktemp("debian")
    rocm = _fake_rocm(tmp, TESTS / "debian_hipcc.py")
    log = tmp / "debian-hipcc.jsonl"
    env = {**os.environ, "DEBIAN_HIPCC_LOG": str(log), "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(TESTS / "hipcc_oracle.py"), str(rocm), str(tc.mori_dir),
                        str(tmp / "mori-cache"), json.dumps([{**v.to_json(), "dir": v.dir} for v in VARIANTS])],
                       capture_output=True, text=True, env=env, timeout=3600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert len(log.read_text().splitlines()) == len(VARIANTS)  # Debian's hipcc ran once for each
    out = {}
    for t in json.loads(p.stdout.splitlines()[-1]):
        v = t["variant"]
        out[HipccVariant(v["source"], v["arch"], v["nic"], v["host_proxy"])] = Path(t["path"]).read_bytes()
    return out, log


@pytest.mark.parity
@pytest.mark.compile
@pytest.mark.parametrize("variant", VARIANTS, ids=[f"{v.source}-{v.arch}-{v.nic}" for v in VARIANTS])
def test_debian_hipcc_compiles_moris_command_to_our_code_object_but_the_compilers_names(
        debian_objects, smoke_store, smoke_lock, variant, record_property):
    from gemmar_aot.store import Store

    item = next(h for h in smoke_lock.hipcc if h.variant == variant)
    ours = elf_sections(Store(smoke_store, readonly=True).load_blob(item.entry.blob.hash, item.entry.blob.size))
    theirs = elf_sections(debian_objects[0][variant])
    differ = sorted(n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n))
    record_property("comment_ours", ours.get(".comment", b"").decode(errors="replace"))
    record_property("comment_debian", theirs.get(".comment", b"").decode(errors="replace"))
    assert [n for n in differ if n != ".comment"] == [], f"{variant.describe()}: sections differ: {differ}"
    assert b"Debian clang version 22.1.8" in theirs[".comment"] and b"clang version 22.1.8" in ours[".comment"]


@pytest.mark.parity
@pytest.mark.compile
def test_debian_hipcc_hands_clang_what_our_build_runs(debian_objects):
    """What Debian's hipcc ran clang with for mori's command (its HIPCC_VERBOSE line) is the clang
    command our build records for the same variant, less where each clang is installed."""
    from gemmar_aot_kernels import hipcc as recipe

    lines = debian_objects[1].read_text().splitlines()
    assert len(lines) == len(VARIANTS)
    for line in lines:
        d = json.loads(line)
        (cmd,) = d["clang"]
        args = cmd.split()[1:]
        mori_root = next(a for a in d["hipcc"] if a.endswith(".hip")).rsplit("/_jit-sources", 1)[0] + "/_jit-sources"
        ours = recipe.clang_argv(["hipcc", *d["hipcc"]], mori_root, "bundle.o")
        want = [a.strip('"') for a in args]
        source = Path(next(a for a in d["hipcc"] if a.endswith(".hip"))).stem
        assert want == ours + [f"-cuid=mori_{source}"], (want, ours)
