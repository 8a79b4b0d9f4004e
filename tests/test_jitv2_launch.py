"""The launch oracle of mori's JIT v2 (``tests/jitv2_oracle.py``): mori's own EP v2 op with the HIP
backend, constructed and called on the HIP runtime double, every launch recorded with its pointers
named by allocation -- and its self-tests.

The oracle compares two runs of mori's op that differ only in where its code objects come from (mori
compiling through its own JIT, or a cache gemmar-aot seeded): these tests hold it to that job. On one
seeded cache (the smoke store's JIT v2 code objects, at the cache entries the lock names, and a hipcc
that answers ``--version`` and compiles nothing) two runs record identical launches and a run with
another token count does not; a cache miss is mori's error, never a compile. ``-k jitv2`` selects them
(and the double's ``extra`` rule in tests/test_hipstub.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemmar_aot.model.jitv2 import HIPCC_IDENTITY

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

#: smoke.toml's HIP-backend [[ep]] entries, as mori's config fields.
INTRA = {"name": "intranode", "world_size": 8, "hidden_dim": 1024, "max_num_inp_token_per_rank": 128,
         "num_experts_per_rank": 1, "num_experts_per_token": 2, "data_type": "bf16"}
INTER = {"name": "internode", "world_size": 16, "gpu_per_node": 8, "hidden_dim": 1024,
         "max_num_inp_token_per_rank": 64, "num_experts_per_rank": 2, "num_experts_per_token": 2,
         "data_type": "bf16", "internode_kernel": "v2"}
DEVICE = {"gfx950": "mi355x", "gfx942": "mi300x"}


def served_hipcc(path: Path) -> Path:
    """What a served pod points ``$MORI_JIT_HIPCC`` at: the identity line the build keyed, and no compile."""
    path.write_text(f"#!/bin/sh\n[ \"$*\" = \"--version\" ] && {{ echo '{HIPCC_IDENTITY}'; exit 0; }}\n"
                    f"echo \"no compiler here: hipcc $*\" >&2; exit 1\n")
    path.chmod(0o755)
    return path


def seed_cache(store: Path, lock, cache: Path, arch: str, nic: str = "mlx5") -> dict[str, tuple[str, tuple]]:
    """``cache`` holding the lock's JIT v2 code objects of ``arch``/``nic`` at their cache entries (only
    ``kernel.hsaco``, as a pod seeds it); returns cache entry -> (blob sha256, the object's kernels)."""
    from gemmar_aot.store import Store

    st, seeded = Store(store, readonly=True), {}
    for j in lock.jitv2:
        if (j.variant.arch, j.variant.nic) == (arch, nic):
            d = cache / j.cache_entry
            d.mkdir(parents=True)
            (d / "kernel.hsaco").write_bytes(st.load_blob(j.entry.blob.hash, j.entry.blob.size))
            seeded[j.cache_entry] = (j.entry.blob.hash, j.entry.symbols)
    return seeded


def run_oracle(configs: list[dict], cache: Path | None, hipcc: Path | None, hipstub_lib: Path, arch: str, *,
               check: bool = True, served: dict | None = None):
    """The oracle in a process of its own with mori's JIT environment set as given; its JSON (or, with
    ``check=False``, the finished process). ``served``: the op is the one gemmar-aot's EP op returns
    (its runtime sets mori's cache and hipcc; ``cache`` and ``hipcc`` None), in a pod with no ROCm."""
    from gemmar_aot.toolchain import load_toolchain

    env = {k: v for k, v in os.environ.items() if not k.startswith("MORI_") and k not in ("ROCM_PATH", "HIP_PATH")}
    env.update(MORI_JIT_ARCH=arch, MORI_DEVICE_NIC="mlx5", PYTHONPATH=os.pathsep.join((str(ROOT), str(TESTS))))
    if served is None:
        env.update(MORI_JIT_CACHE_DIR=str(cache), MORI_JIT_HIPCC=str(hipcc), MORI_DEVICE_IONIC_CCQE="0")
    else:
        env["GEMMAR_AOT_MORI_JIT_DIR"] = served.pop("root")
    args = {"mori_dir": str(load_toolchain().mori_dir), "hipstub": str(hipstub_lib.with_name("libamdhip64.so.7")),
            "configs": [{"device": DEVICE[arch], **c} for c in configs], "served": served}
    cache = cache or Path(env.get("GEMMAR_AOT_MORI_JIT_DIR", "."))
    p = subprocess.run([sys.executable, str(TESTS / "jitv2_oracle.py"), json.dumps(args)], capture_output=True,
                       text=True, env=env, cwd=cache.parent, timeout=600, check=False)
    if not check:
        return p
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.splitlines()[-1])


def _launches(result: dict) -> list[dict]:
    return [l for c in result["calls"] for l in c["launches"]]


def _arg(launch: dict, name: str):
    return next(a[2] for a in launch["args"] if a[0] == name)


@pytest.fixture(scope="module")
def seeded(smoke_store, smoke_lock, tmp_path_factory):
    """arch -> (cache, hipcc, seeded entries): one served cache per arch of the smoke lock's JIT v2 items."""
    out = {}
    for arch in sorted({j.variant.arch for j in smoke_lock.jitv2}):
        d = tmp_path_factory.mktemp(f"jitv2-{arch}")
        out[arch] = (d / "mori-jit", served_hipcc(d / "hipcc"), seed_cache(smoke_store, smoke_lock, d / "mori-jit",
                                                                             arch))
    return out


def _configs(arch: str) -> list[dict]:
    return [INTRA, INTER] if arch == "gfx950" else [INTRA]


@pytest.mark.parity
@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_jitv2_oracle_records_the_same_launches_twice_from_one_seeded_cache(seeded, hipstub_lib, arch):
    """Two runs of mori's op on one seeded cache, in two processes (other addresses): identical records.
    Every launch is of a seeded code object, through ``extra`` with mori's argument struct, every
    pointer named by its allocation; every plan was a hit (nothing compiled, nothing written)."""
    if arch not in seeded:
        pytest.skip(f"the store's lock has no JIT v2 code objects for {arch}")
    cache, hipcc, entries = seeded[arch]
    first = run_oracle(_configs(arch), cache, hipcc, hipstub_lib, arch)
    assert run_oracle(_configs(arch), cache, hipcc, hipstub_lib, arch) == first
    assert not (cache / "tmp").exists()  # mori makes it for a compile only
    for result, cfg in zip(first, _configs(arch)):
        assert result["problems"] == [] and {p["cache_entry"] for p in result["plans"]} <= set(entries)
        edge = cfg["max_num_inp_token_per_rank"]
        assert result["tokens"] == [1, edge]  # no schedule on this shape: 1 and the capacity
        per_round = 6 if cfg is INTER else 2  # copystaging + dispatch, then the four combine passes
        assert len(_launches(result)) == per_round * len(result["tokens"])
        for call in result["calls"]:
            for launch in call["launches"]:
                assert launch["code_object"] in {d for d, _ in entries.values()} and launch["via_extra"]
                assert launch["explicit"] == [[0, 480 if cfg is INTER else 200, "by_value"]]
                assert launch["kernarg_size"] >= launch["explicit"][0][1]
                assert _arg(launch, "curRankNumToken" if cfg is INTER else "numTokens") == call["tokens"]
                pointers = [a[2] for a in launch["args"] if a[1] == "p" and a[2] != 0]
                assert pointers and all(p.startswith("<") for p in pointers)
        # every plan mori made was launched, each kernel the one its seeded code object defines
        kernels = {s for p in result["plans"] for s in entries[p["cache_entry"]][1]}
        assert {l["kernel"] for l in _launches(result)} == kernels


@pytest.mark.parity
def test_jitv2_oracle_sees_a_changed_token_count_and_only_that(seeded, hipstub_lib):
    """The comparison can fail: one token fewer at the capacity edge changes the records, and in exactly
    the token count the kernels are told (what normalisation keeps is what a launch depends on)."""
    cache, hipcc, _ = seeded["gfx950"]
    base = run_oracle([INTRA], cache, hipcc, hipstub_lib, "gfx950")[0]
    fewer = run_oracle([{**INTRA, "tokens": [1, 127]}], cache, hipcc, hipstub_lib, "gfx950")[0]
    assert fewer != base and fewer["tokens"] == [1, 127]
    assert [c["launches"] for c in fewer["calls"][:2]] == [c["launches"] for c in base["calls"][:2]]
    for got, want in zip(_launches(fewer)[2:], _launches(base)[2:]):
        diff = {a[0] for a, b in zip(got["args"], want["args"]) if a != b}
        assert diff == {"numTokens"} and (_arg(got, "numTokens"), _arg(want, "numTokens")) == (127, 128)
        assert got["arg_bytes"] != want["arg_bytes"]


def test_jitv2_oracle_cache_miss_with_no_compiler_is_moris_error_not_a_compile(hipstub_lib, tmp_path):
    """An empty cache and a hipcc that compiles nothing: mori's op constructor fails with mori's own
    ``hipcc failed`` for the first plan, and nothing is published into the cache."""
    cache = tmp_path / "mori-jit"
    p = run_oracle([INTRA], cache, served_hipcc(tmp_path / "hipcc"), hipstub_lib, "gfx950", check=False)
    assert p.returncode != 0
    assert "mori jit [ep_dispatch]: mori jit: hipcc failed for 'ep_dispatch'" in p.stderr
    assert "no compiler here: hipcc --genco --offload-arch=gfx950" in p.stderr
    assert not list(cache.glob("*/kernel.*"))


def test_jitv2_oracle_names_pointers_by_allocation_and_reports_the_others():
    """The oracle's normalisation, on its own: a pointer field is ``<allocation+offset>`` or null, a
    pointer into nothing the harness knows is a problem, a struct by value has its known pointers
    named and zeroed, and the argument bytes keep everything but the named pointers."""
    import struct

    from jitv2_oracle import Allocations, decode_args

    allocs = Allocations()
    allocs.add("op.total_recv", 0x10000, 4)
    allocs.add("cco.mem0", 0x20000, 0x1000)
    allocs.add("inside", 0x20010, 8)  # inside an allocation already known: the first name wins
    layout = [("window", "u64", 0, 8), ("rank", "i32", 8, 4), ("a", "p", 16, 8), ("b", "p", 24, 8),
              ("c", "p", 32, 8), ("blob", "b16", 40, 16)]
    raw = struct.pack("<QiiQQQQQ", 0x1000, 3, 0, 0x10000, 0x20123, 0xDEAD000, 0x20018, 7)
    problems: list = []
    args, hexed = decode_args(raw, layout, allocs, problems, "here")
    assert [a[2] for a in args[:5]] == [0x1000, 3, "<op.total_recv+0x0>", "<cco.mem0+0x123>", "<unknown>"]
    assert args[5][2] == {"bytes": bytes(8).hex() + struct.pack("<Q", 7).hex(), "pointers": [[0, "<cco.mem0+0x18>"]]}
    assert problems == ["here: c = 0xdead000 points into no allocation the harness knows"]
    assert bytes.fromhex(hexed) == struct.pack("<QiiQQQQQ", 0x1000, 3, 0, 0, 0, 0, 0, 7)


def _jit_hipcc(path: Path) -> Path:
    """mori's own JIT with a hipcc: ROCm's hipcc as a test double (tests/hipcc_shim.py) on the toolchain's clang."""
    from gemmar_aot.toolchain import load_toolchain

    path.write_text(f"#!/bin/sh\nGEMMAR_AOT_TOOLCHAIN='{load_toolchain().root}' exec '{sys.executable}' "
                    f"'{TESTS / 'hipcc_shim.py'}' \"$@\"\n")
    path.chmod(0o755)
    return path


@pytest.mark.parity
@pytest.mark.compile
@pytest.mark.parametrize("config", [INTRA, INTER], ids=["intranode-world8", "internode-2x8"])
def test_jitv2_moris_op_compiling_through_its_jit_launches_what_it_launches_served_by_gemmar_aot(
        smoke_store, hipstub_lib, tmp_path, config):
    """mori's own EP v2 op with the HIP backend, on the HIP double, once compiling every plan through its
    own JIT (an empty cache, ROCm's hipcc as a test double on the same clang) and once served by
    gemmar-aot's runtime (JitV2Server: the verified code objects seeded at their cache entries, its hipcc
    that compiles nothing): the same plans resolved, and every launch of every bucket edge identical --
    kernel, code object bytes, grid, block, LDS, argument bytes (pointers named by allocation)."""
    jit = run_oracle([config], tmp_path / "mori-jit", _jit_hipcc(tmp_path / "hipcc-jit"), hipstub_lib, "gfx950")[0]
    root = tmp_path / "served"
    served = run_oracle([config], None, None, hipstub_lib, "gfx950",
                        served={"artifacts": str(smoke_store), "root": str(root)})[0]
    assert jit["problems"] == served["problems"] == [] and len(jit["tokens"]) >= 2
    assert (served["resolved"], served["tokens"]) == (jit["resolved"], jit["tokens"])
    assert served["calls"] == jit["calls"]  # kernel, code object, grid, block, shared memory, argument bytes
    assert len(_launches(served)) == (6 if config is INTER else 2) * len(served["tokens"])
    (cache,) = root.iterdir()  # gemmar-aot's seeded cache: mori opened its entries and compiled nothing
    assert {p["cache_entry"] for p in served["plans"]} <= {f"{t.name}/{e.name}" for t in cache.glob("gfx950_*")
                                                          for e in t.iterdir()}
    assert not (cache / "tmp").exists()


@pytest.mark.parity
def test_jitv2_a_pod_with_no_compiler_refuses_an_unbuilt_config_with_the_manifest_lines_that_build_it(
        smoke_store, hipstub_lib, tmp_path):
    """gemmar-aot's EP op with the HIP backend, in a pod with no hipcc and no ROCM_PATH, for a config
    the artifacts lack (another hidden size): nothing is compiled (mori asked our hipcc, which refused),
    the error is ArtifactMissingError with the HIP-backend [[ep]] entry that builds it, the miss goes to
    the report, and `gemmar-aot suggest` turns the report into that entry."""
    from click.testing import CliRunner

    from gemmar_aot.cli import main

    report = tmp_path / "misses"
    report.mkdir()
    got = run_oracle([{**INTER, "hidden_dim": 2048}], None, None, hipstub_lib, "gfx950",
                     served={"artifacts": str(smoke_store), "root": str(tmp_path / "served"),
                             "miss_report": str(report)})[0]
    err = got["refused"]
    assert err.startswith("ArtifactMissingError: no prebuilt code object for mori's JIT v2 kernels of EP v2 (HIP "
                          "backend) 2 nodes x 8, hidden 2048"), err
    assert "nothing is compiled at run time" in err and "exit 86" in err
    lines = err[err.index("[[ep]]"):]
    assert lines.startswith('[[ep]]\nkernel_backend = "hip"\nworld = 16\ngpu_per_node = 8\nhidden = 2048\n')
    assert 'internode_kernel = "v2"' in lines and 'device = "MI355X"' in lines and 'nics = ["mlx5"]' in lines
    r = CliRunner().invoke(main, ["suggest", str(report), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["snippet"] == lines
