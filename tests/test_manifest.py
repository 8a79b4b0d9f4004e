"""gemmar_aot.builder.manifest: parsing, validation, messages, shipped manifests, fuzzing."""

from __future__ import annotations

import datetime
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from gemmar_aot.model import rules
from gemmar_aot.util.errors import ManifestError
from gemmar_aot.builder.manifest import (
    MAX_GEMM_COMPILES,
    MAX_REPEAT_WARNINGS,
    MAX_WORKLOADS,
    Manifest,
    gemm_compiles,
    load_manifest,
    parse_manifest,
)
from gemmar_aot.builder.manifest_check import MAX_M_VALUES
from gemmar_aot.builder.workload import MODES, Workload

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests"

# --------------------------------------------------------------------------
# A small TOML writer, so tests (and the fuzzer) can build documents from dicts
# --------------------------------------------------------------------------


def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_str(k)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(type(v))


def to_toml(doc: dict) -> str:
    """Scalars first, then [tables], then [[arrays of tables]]; nested values inline."""
    lines = []
    tables, arrays = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, v))
        else:
            lines.append(f"{toml_key(k)} = {toml_value(v)}")
    for k, v in tables:
        lines += ["", f"[{toml_key(k)}]"] + [f"{toml_key(kk)} = {toml_value(vv)}" for kk, vv in v.items()]
    for k, items in arrays:
        for item in items:
            lines += ["", f"[[{toml_key(k)}]]"] + [f"{toml_key(kk)} = {toml_value(vv)}" for kk, vv in item.items()]
    return "\n".join(lines) + "\n"


def test_toml_writer_round_trips():
    doc = {"a": 1, "b": [1, 2], "s": 'q"\\\n\x7f', "t": {"x": {"y": 1.5}}, "arr": [{"k": True}, {"k": False}]}
    assert tomllib.loads(to_toml(doc)) == doc


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

REF = dict(transport="fused-sdma", m=4096, n=7168, k=2048, world=8, quant="blockscale")


def doc(*tuples, manifest=None, **top) -> str:
    d = dict(top)
    if manifest is not None:
        d["manifest"] = manifest
    d["tuple"] = [dict(t) for t in tuples]
    return to_toml(d)


def tup(**changes):
    t = dict(REF)
    for k, v in changes.items():
        if v is DROP:
            t.pop(k, None)
        else:
            t[k] = v
    return t


DROP = object()


def problems(text: str, path: str = "test.toml") -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, path=path)
    assert info.value.problems, "a ManifestError must carry its problems"
    assert all(isinstance(p, str) for p in info.value.problems)
    return info.value.problems


def one_problem(text: str, path: str = "test.toml") -> str:
    got = problems(text, path)
    assert len(got) == 1, got
    return got[0]


# --------------------------------------------------------------------------
# Shipped manifests
# --------------------------------------------------------------------------


def _collective_ok(w: Workload) -> None:
    assert w.m % (w.world * w.block_m) == 0
    assert rules.check_gemm_ar(
        w.m, w.n, w.k, w.world, block_m=w.block_m, block_n=w.block_n, gather_dtype=w.gather_dtype,
        gather_transport=w.gather_transport, quant=w.quant, m_max=w.m_max, sdma_queues=w.sdma_queues,
    ) is None


def assert_valid_workload(w: Workload) -> None:
    assert w.transport in MODES
    assert w.m >= w.m_requested >= 1
    assert w.source
    if w.collective:
        _collective_ok(w)
        if w.m_max is not None:
            assert w.m <= w.m_max and w.m_max % (w.world * w.block_m) == 0
    elif w.transport == "gemv":
        assert w.quant == "mxfp8" and w.m in rules.GEMV_M_BUCKETS and w.m_requested <= w.m
        assert rules.check_mxfp8_gemv(w.n, w.k, m=w.m) is None
        assert w.m_max is None
    else:
        assert w.quant == "mxfp8" and w.block_m == 256 and w.m % 64 == 0
        assert rules.check_mxfp8_gemm(w.n, w.k, block_n=w.block_n, m=w.m) is None
        assert w.m_max is None


def test_reference_manifest():
    m = load_manifest(MANIFESTS / "dsv4-pro-wo_b.toml")
    assert m.name == "dsv4-pro-wo_b" and m.arch == "gfx950" and m.description
    assert [w.m for w in m.workloads] == list(range(4096, 16385, 1024))
    assert len(m.workloads) == 13
    assert {(w.transport, w.n, w.k, w.world, w.quant, w.gather_dtype) for w in m.workloads} == {
        ("fused-sdma", 7168, 2048, 8, "blockscale", "bf16")
    }
    assert m.warnings == ()
    for w in m.workloads:
        assert_valid_workload(w)
        assert w.source.startswith(str(MANIFESTS / "dsv4-pro-wo_b.toml") + ":tuple[0] (line ")


def test_fp8_manifest():
    m = load_manifest(MANIFESTS / "dsv4-pro-wo_b-fp8.toml")
    assert len(m.workloads) == 26
    wires = sorted({(w.gather_dtype, w.gather_transport) for w in m.workloads})
    assert wires == [("fp8", "lsa"), ("fp8", "sdma")]
    for wire in wires:
        ms = [w.m for w in m.workloads if (w.gather_dtype, w.gather_transport) == wire]
        assert ms == list(range(4096, 16385, 1024))
    for w in m.workloads:
        assert_valid_workload(w)
        assert (w.n, w.k, w.world) == (7168, 2048, 8)


def test_smoke_manifest():
    m = load_manifest(MANIFESTS / "smoke.toml")
    assert m.name == "smoke" and m.warnings == ()
    modes = {w.transport for w in m.workloads}
    assert modes == set(MODES)
    assert {w.world for w in m.workloads} == {2, 4}
    # N 1024, but for the fused mxfp8 tuple built at M=1024 alone (another key: its own window)
    assert {(w.n, w.m) for w in m.workloads if w.n != 1024} == {(2048, 1024)}
    assert {w.k for w in m.workloads} == {256, 512}
    fused = [w for w in m.workloads if w.transport == "fused-sdma"]
    # the compile tier's coverage: both fp8 gathers, the fused mxfp8 GEMM (block_m 256), world 4
    assert {(w.gather_dtype, w.gather_transport) for w in fused if w.gather_dtype == "fp8"} == {
        ("fp8", "lsa"), ("fp8", "sdma")}
    assert any(w.quant == "mxfp8" and w.block_m == 256 for w in fused)
    assert any(w.world == 4 for w in fused)
    gemm_only = [w for w in m.workloads if w.transport == "gemm-only"]
    # one M per mxfp8 kernel: the narrow tile and the wide one
    assert sorted(rules.gemm_only_wants_narrow(w.m, w.n) for w in gemm_only) == [False, True]
    assert sorted(w.m for w in m.workloads if w.transport == "gemv") == [1, 32]
    assert len(m.workloads) <= 16
    for w in m.workloads:
        assert_valid_workload(w)


@pytest.mark.parametrize("name", ["dsv4-pro-wo_b", "dsv4-pro-wo_b-fp8", "dsv4-pro-wo_b-modes", "smoke"])
def test_shipped_manifests_parse_from_text_too(name):
    path = MANIFESTS / f"{name}.toml"
    a = load_manifest(path)
    b = parse_manifest(path.read_text(), path=str(path))
    assert a == b


# --------------------------------------------------------------------------
# The accepted forms
# --------------------------------------------------------------------------


def test_minimal_manifest_defaults():
    m = parse_manifest(doc(REF), path="dir/my-model.toml")
    assert isinstance(m, Manifest)
    assert m.name == "my-model" and m.arch == "gfx950" and m.description == "" and m.path == "dir/my-model.toml"
    (w,) = m.workloads
    assert w == Workload(
        transport="fused-sdma", m=4096, n=7168, k=2048, world=8, quant="blockscale", gather_dtype="bf16",
        gather_transport="lsa", block_m=128, block_n=256, m_max=None, sdma_queues=1, m_requested=4096,
        source="dir/my-model.toml:tuple[0] (line 2)",
    )
    assert parse_manifest(doc(REF)).name == "manifest"


def test_manifest_table():
    m = parse_manifest(doc(REF, manifest=dict(name="x.y_z-1", description="d", arch="gfx950", format=1)))
    assert (m.name, m.description, m.arch) == ("x.y_z-1", "d", "gfx950")


def test_m_forms():
    assert [w.m for w in parse_manifest(doc(tup(m=5000))).workloads] == [5120]
    assert [w.m_requested for w in parse_manifest(doc(tup(m=5000))).workloads] == [5000]
    assert [w.m for w in parse_manifest(doc(tup(m=[2048, 1024, 8192]))).workloads] == [2048, 1024, 8192]
    got = parse_manifest(doc(tup(m=dict(start=1024, stop=4096, step=1024)))).workloads
    assert [w.m for w in got] == [1024, 2048, 3072, 4096]  # stop is inclusive
    one = parse_manifest(doc(tup(m=dict(start=2048, stop=2048, step=7)))).workloads
    assert [w.m for w in one] == [2048]


def test_range_stop_off_grid_warns():
    m = parse_manifest(doc(tup(m=dict(start=1024, stop=3500, step=1024))), path="w.toml")
    assert [w.m for w in m.workloads] == [1024, 2048, 3072]
    assert len(m.warnings) == 1 and "the last M is 3072" in m.warnings[0] and m.warnings[0].startswith("w.toml: ")


def test_padding_per_mode():
    m = parse_manifest(doc(
        tup(m=300, world=2),
        tup(m=300, world=2, quant="mxfp8"),
        tup(transport="gemm-only", m=100, n=1024, k=256, world=2, quant="mxfp8"),
        tup(transport="split-lsa", m=1, world=4),
    ))
    assert [(w.m, w.m_requested, w.block_m) for w in m.workloads] == [(512, 300, 128), (512, 300, 256),
                                                                      (128, 100, 256), (512, 1, 128)]


def test_duplicates_after_padding_are_merged_with_a_warning():
    m = parse_manifest(doc(tup(m=[4000, 4096, 100]), tup(m=dict(start=1, stop=1024, step=1023))), path="d.toml")
    assert [(w.m, w.m_requested) for w in m.workloads] == [(4096, 4000), (1024, 100)]
    assert len(m.warnings) == 3
    assert "m = 4000 and m = 4096 both pad to 4096" in m.warnings[0]
    assert "tuple[1] (line 10): m = 1 (padded 1024) repeats tuple[0] (line 2)" in m.warnings[1]
    assert all(w.startswith("d.toml: ") for w in m.warnings)


def test_distinct_options_are_not_duplicates():
    m = parse_manifest(doc(tup(), tup(gather_dtype="fp8"), tup(m_max=8192), tup(sdma_queues=2)))
    assert len(m.workloads) == 4


def test_m_max_is_padded_and_kept():
    m = parse_manifest(doc(tup(m=[1024, 4000], m_max=9000)))
    assert {w.m_max for w in m.workloads} == {9216}


def test_optional_fields():
    m = parse_manifest(doc(
        tup(gather_dtype="fp8", gather_transport="sdma", sdma_queues=2, block_n=256, block_m=256),
        tup(transport="split-lsa", gather_dtype="bf16", gather_transport="lsa", m_max=16384),
    ))
    a, b = m.workloads
    assert (a.gather_dtype, a.gather_transport, a.sdma_queues, a.block_m, a.m) == ("fp8", "sdma", 2, 256, 4096)
    assert (b.transport, b.m_max) == ("split-lsa", 16384)


def test_every_mode_is_accepted():
    m = parse_manifest(doc(
        tup(transport="split-sdma", gather_dtype="fp8", gather_transport="sdma", sdma_queues=2),
        tup(transport="fused-lsa", sdma_queues=2),
        tup(transport="split-lsa"),
        tup(transport="gemm-only", quant="mxfp8"),
        tup(transport="gemv", quant="mxfp8", m=[1, 3, 32]),
    ))
    got = [(w.transport, w.m, w.collective) for w in m.workloads]
    assert got == [("split-sdma", 4096, True), ("fused-lsa", 4096, True), ("split-lsa", 4096, True),
                   ("gemm-only", 4096, False), ("gemv", 1, False), ("gemv", 4, False), ("gemv", 32, False)]
    for w in m.workloads:
        assert_valid_workload(w)


def test_gemv_m_values_merge_into_buckets():
    m = parse_manifest(doc(tup(transport="gemv", quant="mxfp8", n=5120, k=2048, m=dict(start=1, stop=32, step=1))),
                       path="g.toml")
    assert [w.m for w in m.workloads] == list(rules.GEMV_M_BUCKETS)
    assert len(m.warnings) == 32 - 6
    assert "m = 3 and m = 4 both pad to 4" in m.warnings[0]


def test_total_gemm_compiles_are_bounded():
    # 1024 padded M values x 8 ranks = 8192 fused GEMMs per tuple: one tuple is at the limit, two are over.
    big = dict(m=dict(start=1024, stop=1024 * 1024, step=1024), n=1024, k=1024)
    assert len(parse_manifest(doc(tup(**big))).workloads) == 1024
    p = one_problem(doc(tup(**big), tup(**dict(big, k=512)), tup(transport="split-lsa", **big)), path="big.toml")
    assert p.startswith("big.toml: top level: the tuples ask for 16385 GEMM compiles (fused-sdma 16384, split 1; "
                        "about 6.8 CPU-hours")
    assert f"more than the {MAX_GEMM_COMPILES} one manifest may ask for; split it into several manifests" in p


def test_total_workloads_are_bounded():
    cheap = [tup(transport="gemm-only", quant="mxfp8", n=1024, k=256 * (i + 1),
                 m=dict(start=64, stop=64 * 1024, step=64)) for i in range(MAX_WORKLOADS // 1024 + 1)]
    p = one_problem(doc(*cheap))
    assert f"expand to more than {MAX_WORKLOADS} distinct workloads" in p
    assert f"tuple[{MAX_WORKLOADS // 1024}] (line" in p  # the tuple that goes past it


def test_a_million_workloads_are_refused_without_making_them():
    """~130 KB of TOML asking for a million M values: refused once 4,097 are counted, never all
    made (the parser made every workload first: ~0.53 GB; now ~4 MB traced)."""
    import tracemalloc

    text = doc(*[tup(transport="gemm-only", quant="mxfp8", n=1024 + 256 * (i % 40), k=256 + 256 * (i // 40),
                     m=dict(start=64, stop=64 * 1024, step=64)) for i in range(1000)])
    assert len(text) > 100_000
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as ei:
            parse_manifest(text, "big.toml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (p,) = ei.value.problems
    assert f"more than {MAX_WORKLOADS} distinct workloads" in p and "tuple[4] (line" in p
    assert peak < 16 * 2**20, peak


def test_repeats_are_built_once_and_warned_about_up_to_a_bound():
    """A thousand copies of one tuple: its M values once, the first repeats named, the rest counted."""
    m = parse_manifest(doc(*[tup(m=[4096, 8192]) for _ in range(1000)]))
    assert [w.m for w in m.workloads] == [4096, 8192]
    assert len(m.warnings) == MAX_REPEAT_WARNINGS + 1
    assert "m = 4096 (padded 4096) repeats tuple[0]" in m.warnings[0]
    assert f"and {2 * 999 - MAX_REPEAT_WARNINGS} more M values repeat" in m.warnings[-1]


def test_gemm_compiles_count_shared_kernels_once():
    m = parse_manifest(doc(
        tup(m=[4096, 8192]), tup(transport="fused-lsa"), tup(transport="split-sdma", m=[1024, 2048]),
        tup(transport="split-lsa", m=[1024, 2048]), tup(transport="gemm-only", quant="mxfp8", m=[64, 128, 16384]),
        tup(transport="gemv", quant="mxfp8", m=[1, 2, 3])))
    assert gemm_compiles(m.workloads) == {"fused-sdma": 16, "fused-lsa": 8, "split": 1, "gemm-only": 2, "gemv": 3}


def test_gemm_only_world_is_recorded_only():
    m = parse_manifest(doc(tup(transport="gemm-only", n=1024, k=256, world=1, quant="mxfp8")))
    assert m.workloads[0].world == 1 and not m.workloads[0].collective


def test_inline_array_of_tuples():
    text = 'tuple = [\n  { transport = "fused-sdma", m = 1024, n = 7168, k = 2048, world = 8, quant = "blockscale" },\n]\n'
    m = parse_manifest(text, path="i.toml")
    assert m.workloads[0].source == "i.toml:tuple[0] (line 1)"
    p = one_problem(text.replace("k = 2048", "k = 100"), path="i.toml")
    assert p.startswith("i.toml: tuple[0] (line 1): k = 100: ")


def test_lines_point_at_the_tuple_headers():
    text = doc(REF, tup(k=200), tup(k=300), manifest=dict(name="x"))
    lines = text.splitlines()
    got = problems(text)
    for p, i in zip(got, (1, 2)):
        line = int(re.search(r"\(line (\d+)\)", p).group(1))
        assert lines[line - 1] == "[[tuple]]"
        assert p.startswith(f"test.toml: tuple[{i}] (line {line}): k = ")


# --------------------------------------------------------------------------
# One rule at a time: every message names file, entry, field, value, rule and fix
# --------------------------------------------------------------------------

RULE_CASES = [
    # (tuple changes, field = value, rule fragment, fix fragment)
    (dict(k=200), "k = 200", "K must be a multiple of 128 (the block-scale group)", "use 256"),
    (dict(k=300), "k = 300", "multiple of 128", "use 256 or 384"),
    (dict(k=128), "k = 128", "at least 256", "use 256"),
    (dict(k=200, quant="mxfp8"), "k = 200", "the scaled MFMA's K step", "use 256"),
    (dict(n=7000), "n = 7000", "N must be a multiple of block_n = 256", "6912 or 7168"),
    (dict(world=6), "world = 6", "world must divide the 512-thread block", "use 2, 4 or 8"),
    (dict(world=16), "world = 16", "world must be in [2, 8]", "use 2, 4 or 8"),
    (dict(world=1), "world = 1", "world must be in [2, 8]", "use 2, 4 or 8"),
    (dict(quant="int4"), 'quant = "int4"', 'quant must be one of "blockscale" or "mxfp8"', 'use "blockscale" or "mxfp8"'),
    (dict(quant="MXFP8"), 'quant = "MXFP8"', "quant must be one of", 'write quant = "mxfp8"'),
    (dict(quant="blockscal"), 'quant = "blockscal"', "quant must be one of", 'did you mean "blockscale"?'),
    (dict(transport="fused-sdm"), 'transport = "fused-sdm"', "transport must be one of", 'did you mean "fused-sdma"?'),
    (dict(transport="fused-lsa", gather_dtype="fp8"), 'gather_dtype = "fp8"', "fused-lsa runs the bf16 gather only",
     'use transport = "fused-sdma" or "split-sdma"'),
    (dict(transport="split-sdma", gather_dtype="fp8", n=1536), "n = 1536", "an fp8 gather needs N to be a multiple of 1024",
     'use gather_dtype = "bf16"'),
    (dict(transport="split-lsa", block_m=192), "block_m = 192", "block_m must be a positive multiple of 128",
     "use 128 or 256"),
    (dict(transport="gemv", quant="mxfp8", n=1024, k=256, m=64), "m = 64", "M must be in [1, 32]",
     'use transport = "gemm-only" for larger M'),
    (dict(transport="gemv", quant="mxfp8", n=1040, k=256, m=8), "n = 1040", "N must be a multiple of 32",
     "use 1024 or 1056"),
    (dict(transport="gemv", quant="mxfp8", n=1024, k=200, m=8), "k = 200", "the skinny kernel's MFMA step",
     "use 128 or 256"),
    (dict(transport="gemv", n=1024, k=256, m=8), 'quant = "blockscale"', "Mxfp8GemvOp, which implements only mxfp8",
     'set quant = "mxfp8"'),
    (dict(transport="gemv", quant="mxfp8", n=1024, k=256, m=8, block_m=256), "block_m = 256",
     'does not apply to transport "gemv"', "remove it"),
    (dict(transport="gemv", quant="mxfp8", n=1024, k=256, m=8, sdma_queues=1), "sdma_queues = 1",
     'does not apply to transport "gemv"', "remove it"),
    (dict(transport="split-lsa", sdma_queues=2, m=8), "sdma_queues = 2", 'does not apply to transport "split-lsa"',
     "remove it"),
    (dict(quant="mxfp8", block_m=128), "block_m = 128", "mxfp8 requires block_m = 256", "set block_m = 256 or remove it"),
    (dict(block_m=192), "block_m = 192", "block_m must be a positive multiple of 128", "use 128 or 256"),
    (dict(block_n=512), "block_n = 512", "block_n must be exactly 256 (the permlane epilogue", "set block_n = 256"),
    (dict(block_n=128), "block_n = 128", "exactly 256", "set block_n = 256"),
    (dict(gather_dtype="fp16"), 'gather_dtype = "fp16"', "gather_dtype must be one of", 'use "bf16" or "fp8"'),
    (dict(gather_transport="xgmi"), 'gather_transport = "xgmi"', "gather_transport must be one of", 'use "sdma" or "lsa"'),
    (dict(gather_dtype="fp8", n=1536), "n = 1536", "an fp8 gather needs N to be a multiple of 1024",
     'use gather_dtype = "bf16"'),
    (dict(transport="split-lsa", gather_dtype="fp8"), 'gather_dtype = "fp8"', "the split-lsa all-reduce has no fp8 path",
     'use transport = "fused-sdma"'),
    (dict(transport="split-lsa", gather_transport="sdma"), 'gather_transport = "sdma"', "split-lsa moves every byte over LSA",
     "remove gather_transport"),
    (dict(transport="split-lsa", sdma_queues=2), "sdma_queues = 2", 'does not apply to transport "split-lsa"', "remove it"),
    (dict(transport="gemm-only", quant="mxfp8", n=1024, k=256, gather_dtype="bf16"), 'gather_dtype = "bf16"',
     'does not apply to transport "gemm-only"', "remove it"),
    (dict(transport="gemm-only", quant="mxfp8", n=1024, k=256, gather_transport="lsa"), 'gather_transport = "lsa"',
     'does not apply to transport "gemm-only"', "remove it"),
    (dict(transport="gemm-only", quant="mxfp8", n=1024, k=256, m_max=4096), "m_max = 4096",
     'does not apply to transport "gemm-only"', "remove it"),
    (dict(transport="gemm-only", quant="mxfp8", n=1024, k=256, sdma_queues=1), "sdma_queues = 1",
     'does not apply to transport "gemm-only"', "remove it"),
    (dict(transport="gemm-only", n=1024, k=256), 'quant = "blockscale"', "implements only mxfp8", 'set quant = "mxfp8"'),
    (dict(transport="gemm-only", quant="mxfp8", n=1152, k=256), "n = 1152", "N must be a multiple of block_n = 256",
     "1024 or 1280"),
    (dict(transport="gemm-only", quant="mxfp8", n=1024, k=256, block_m=128), "block_m = 128", "requires block_m = 256",
     "set block_m = 256"),
    (dict(m=16384, m_max=8192), "m_max = 8192", "smaller than the largest padded M of this tuple (m = 16384",
     "raise m_max to at least 16384"),
    (dict(m=[1000, 3000], m_max=2000), "m_max = 2000", "m = 3000 pads to 3072", "raise m_max to at least 3072"),
    (dict(m_max=0), "m_max = 0", "must be at least 1", "write a whole number"),
    (dict(sdma_queues=0), "sdma_queues = 0", "must be at least 1", "write a whole number"),
    (dict(m=0), "m = 0", "must be at least 1", "write a whole number"),
    (dict(m=[]), "m = []", "the M list is empty", "list at least one M"),
    (dict(m=dict(start=1024, stop=4096, step=0)), "m.step = 0", "must be at least 1", "m.step = 1024"),
    (dict(m=dict(start=1024, stop=4096, step=-1024)), "m.step = -1024", "must be at least 1", "m.step = 1024"),
    (dict(m=dict(start=4096, stop=1024, step=1024)), "m = { start = 4096, stop = 1024, step = 1024 }",
     "start (4096) is greater than stop (1024)", "swap them"),
    (dict(m=dict(start=1, stop=10**6, step=1)), "m = { start = 1", f"more than the {MAX_M_VALUES}", "use a larger step"),
    (dict(m=dict(start=1024, stop=4096)), "m = { start = 1024, stop = 4096 }", "needs start, stop and step", "add step"),
    (dict(m=dict(start=1024, stop=4096, step=1024, stride=2)), "unknown key stride", "an M range takes only start, stop, step",
     "remove it"),
    (dict(m=300_000), "m = 300000", "M*N (C's elements)", "keep M at or below"),
    (dict(m=[1024, 4096], m_max=10**6), "m_max = 1000000", "int32", "keep m_max at or below"),
    (dict(k=2**31), "k = 2147483648", "must be at most 2147483647", "write a whole number"),
]


@pytest.mark.parametrize("changes, field_value, rule, fix", RULE_CASES)
def test_each_rule_message(changes, field_value, rule, fix):
    p = one_problem(doc(tup(**changes)), path="manifests/x.toml")
    assert p.startswith("manifests/x.toml: tuple[0] (line 2): "), p
    assert field_value in p, p
    assert rule in p, p
    assert fix in p, p


def test_the_briefs_example_message():
    text = "\n".join(["# a comment"] * 11) + "\n" + doc(REF, REF, tup(k=200))
    p = one_problem(text, path="smoke.toml")
    line = [i + 1 for i, ln in enumerate(text.splitlines()) if ln == "[[tuple]]"][2]
    assert p == (f"smoke.toml: tuple[2] (line {line}): k = 200: K must be a multiple of 128 "
                 "(the block-scale group); use 256")


# --------------------------------------------------------------------------
# Types, missing fields, unknown keys
# --------------------------------------------------------------------------

TYPE_CASES = [
    (dict(k=True), "k = true: must be an integer, not a boolean"),
    (dict(world=False), "world = false: must be an integer, not a boolean"),
    (dict(m=True), "m = true: M must be an integer, an array of integers or a range table, not a boolean"),
    (dict(m=[1024, True]), "m[1] = true: must be an integer, not a boolean"),
    (dict(k="2048"), 'k = "2048": must be an integer, not a string; drop the quotes: k = 2048'),
    (dict(n="big"), 'n = "big": must be an integer, not a string; write a whole number, e.g. n = 7168'),
    (dict(k=2048.0), "k = 2048.0: must be an integer, not a float; write k = 2048"),
    (dict(k=2048.5), "k = 2048.5: must be an integer, not a float; write a whole number"),
    (dict(k=float("nan")), "k = nan: must be an integer, not a float"),
    (dict(k=float("inf")), "k = inf: must be an integer, not a float"),
    (dict(n=[7168]), "n = [7168]: must be an integer, not an array"),
    (dict(world={"size": 8}), "world = { size = 8 }: must be an integer, not a table"),
    (dict(k=datetime.date(2024, 1, 1)), "k = 2024-01-01: must be an integer, not a date/time"),
    (dict(m="4096"), 'm = "4096": M must be an integer, an array of integers or a range table, not a string'),
    (dict(m=4096.0), "m = 4096.0: M must be an integer, an array of integers or a range table, not a float"),
    (dict(m=dict(start=1024.0, stop=2048, step=1024)), "m.start = 1024.0: must be an integer, not a float"),
    (dict(transport=1), 'transport = 1: must be a string, not an integer; use "fused-sdma", "split-sdma", "split-lsa", "fused-lsa", "gemm-only" or "gemv"'),
    (dict(quant=["blockscale"]), 'quant = ["blockscale"]: must be a string, not an array'),
    (dict(gather_dtype=True), "gather_dtype = true: must be a string, not a boolean"),
]


@pytest.mark.parametrize("changes, expected", TYPE_CASES)
def test_bad_types(changes, expected):
    p = one_problem(doc(tup(**changes)))
    assert p.startswith("test.toml: tuple[0] (line 2): ")
    assert expected in p, p


@pytest.mark.parametrize("field", ["transport", "m", "n", "k", "world", "quant"])
def test_missing_required_field(field):
    p = one_problem(doc(tup(**{field: DROP})))
    assert p.startswith(f"test.toml: tuple[0] (line 2): {field} is missing: every tuple needs ")
    assert "; add e.g. " + field in p


def test_unknown_keys_everywhere():
    text = doc(tup(trasport="x", transport="fused-sdma"), manifest=dict(nmae="x"), tuples=1)
    got = problems(text)
    assert len(got) == 3
    assert got[0].startswith("test.toml: top level: unknown key tuples") and 'did you mean "[[tuple]]"' in got[0]
    assert got[1].startswith("test.toml: [manifest]: unknown key nmae") and 'did you mean "name"?' in got[1]
    assert got[2].startswith("test.toml: tuple[0] (line ") and "unknown key trasport" in got[2]
    assert 'did you mean "transport"?' in got[2] and "remove it" in got[2]


def test_unknown_key_with_odd_characters_is_quoted():
    p = one_problem(doc(tup(**{"bad key\n": 1})))
    assert 'unknown key "bad key\\u000a"' in p


def test_sub_table_in_a_tuple_is_an_unknown_key():
    text = doc(REF) + "[tuple.extra]\nx = 1\n"
    assert "unknown key extra" in one_problem(text)


@pytest.mark.parametrize(
    "manifest, expected",
    [
        (dict(arch="gfx942"), 'top level: arch = "gfx942": [[tuple]] and FlyDSL [[ep]] entries are mori\'s FlyDSL '
                              'ops, built for gfx950 (MI355X) only; a gfx942 manifest holds [[hipcc]] entries and '
                              'HIP-backend [[ep]] entries'),
        (dict(arch=950), '[manifest]: arch = 950: the supported targets are "gfx950" or "gfx942"'),
        (dict(format=2), "[manifest]: format = 2: this gemmar-aot reads manifest format 1; write format = 1"),
        (dict(format=True), "[manifest]: format = true"),
        (dict(name="has space"), '[manifest]: name = "has space": a name is 1-100 letters'),
        (dict(name=""), '[manifest]: name = "": a name is'),
        (dict(name=3), "[manifest]: name = 3: must be a string, not an integer"),
        (dict(description=["x"]), '[manifest]: description = ["x"]: must be a string, not an array'),
    ],
)
def test_manifest_table_errors(manifest, expected):
    assert one_problem(doc(REF, manifest=manifest)).startswith("test.toml: " + expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "test.toml: top level: there is no [[tuple]]"),
        ("[manifest]\nname = \"x\"\n", "test.toml: top level: there is no [[tuple]]"),
        ("tuple = []\n", "test.toml: top level: tuple = []: a manifest must list at least one workload"),
        ("tuple = 3\n", "test.toml: top level: tuple = 3: tuples must be [[tuple]] sections, not an integer"),
        ("[tuple]\nm = 1\n", "test.toml: top level: [tuple] is a single table"),
        ("tuple = [1]\n", "test.toml: tuple[0] (line 1): 1 is an integer, but each [[tuple]] must be a table"),
        ("manifest = 3\n" + doc(REF), "test.toml: top level: manifest = 3: [manifest] must be a table"),
    ],
)
def test_structure_errors(text, expected):
    assert one_problem(text).startswith(expected)


def test_several_errors_are_reported_together():
    text = doc(
        tup(k=200, world=3),  # two problems
        REF,  # fine
        tup(transport="split-rccl", n="7168", m=[]),  # three problems
        tup(quant=DROP, extra=1),  # two problems
        manifest=dict(arch="gfx90a"),
    )
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, path="many.toml")
    got = info.value.problems
    assert len(got) == 8, got
    assert [re.match(r"many\.toml: (\S+)", p).group(1) for p in got] == [
        "[manifest]:", "tuple[0]", "tuple[0]", "tuple[2]", "tuple[2]", "tuple[2]", "tuple[3]", "tuple[3]"]
    text_of_error = str(info.value)
    assert text_of_error.startswith("8 problems in manifest; nothing was compiled:")
    assert all(f"  - {p}" in text_of_error for p in got)


# --------------------------------------------------------------------------
# Files and malformed text
# --------------------------------------------------------------------------


def test_malformed_toml_names_file_and_position():
    p = one_problem('[[tuple]]\ntransport = "fused-sdma"\nm = = 4096\nn = 7168\n', path="broken.toml")
    assert p.startswith("broken.toml: not valid TOML: ")
    assert "line 3, column 5" in p, p
    p = one_problem('[[tuple]]\nm = [1, 2\n', path="broken.toml")
    assert p.startswith("broken.toml: not valid TOML: ") and "end of document" in p


def test_malformed_toml_duplicate_key():
    p = one_problem("[[tuple]]\nk = 1\nk = 2\n", path="dup.toml")
    assert p.startswith("dup.toml: not valid TOML: ") and "line 3" in p


def test_parser_limits_are_manifest_errors():
    assert "nested too deeply" in one_problem("a = " + "[" * 5000)
    assert one_problem("a = " + "1" * 5000).startswith("test.toml: not valid TOML")


def test_load_manifest_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.problems == [f"{path}: no such file; check the path (the shipped manifests are in manifests/)"]


def test_load_manifest_directory(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert str(tmp_path) in info.value.problems[0]


def test_load_manifest_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(doc(REF).encode() + b"# caf\xe9\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.problems[0].startswith(f"{path}: not UTF-8 text")


def test_load_manifest_reads_and_names_the_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(doc(tup(k=200)))
    with pytest.raises(ManifestError) as info:
        load_manifest(str(path))
    assert info.value.problems[0].startswith(f"{path}: tuple[0] (line 2): k = 200")
    path.write_text(doc(REF))
    m = load_manifest(path)
    assert m.name == "mine" and m.path == str(path)


def test_parse_manifest_rejects_non_text():
    with pytest.raises(ManifestError):
        parse_manifest(None)  # type: ignore[arg-type]
    with pytest.raises(ManifestError):
        parse_manifest(b"\xff\xfe")  # type: ignore[arg-type]
    assert parse_manifest(doc(REF).encode()).workloads  # UTF-8 bytes are fine


# --------------------------------------------------------------------------
# Fuzzing: the parser yields a valid Manifest or a ManifestError, nothing else
# --------------------------------------------------------------------------


def check_outcome(text, path="fuzz.toml"):
    try:
        m = parse_manifest(text, path=path)
    except ManifestError as exc:
        assert exc.problems and all(isinstance(p, str) and p.startswith(path + ":") for p in exc.problems)
        return None
    assert isinstance(m, Manifest) and m.workloads
    for w in m.workloads:
        assert_valid_workload(w)
    assert len(set(m.workloads)) == len(m.workloads)
    return m


KNOWN_KEYS = ["transport", "m", "n", "k", "world", "quant", "gather_dtype", "gather_transport", "block_m",
              "block_n", "m_max", "sdma_queues", "start", "stop", "step", "manifest", "tuple", "name", "arch",
              "description", "format"]
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=8))
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-5, 20000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["fused-sdma", "split-lsa", "gemm-only", "split-sdma", "blockscale", "mxfp8", "bf16", "fp8",
                     "lsa", "sdma", "gfx950"]),
    st.dates(),
    st.datetimes(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, values, max_size=6))
def test_fuzz_arbitrary_documents(d):
    check_outcome(to_toml(d))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text(text):
    check_outcome(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="[]{}=\"',.\n #tuplemanifest0123456789kn", max_size=200))
def test_fuzz_toml_like_text(text):
    check_outcome(text)


field_values = {
    "transport": st.sampled_from(["fused-sdma", "split-lsa", "gemm-only", "split-sdma", "fused-lsa", "gemv", "x", 3]),
    "m": st.one_of(
        st.integers(-2, 70000),
        st.lists(st.one_of(st.integers(-2, 70000), st.booleans()), max_size=5),
        st.fixed_dictionaries({"start": st.integers(-2, 20000), "stop": st.integers(-2, 40000),
                               "step": st.integers(-2, 5000)}),
        st.dictionaries(st.sampled_from(["start", "stop", "step", "x"]), st.integers(-2, 20000), max_size=4),
    ),
    "n": st.sampled_from([0, 128, 256, 1000, 1024, 1536, 2048, 7168, 2**20, True, "7168", 7168.0]),
    "k": st.sampled_from([0, 128, 200, 256, 512, 2048, 2**24, -256]),
    "world": st.sampled_from([0, 1, 2, 3, 4, 6, 8, 16]),
    "quant": st.sampled_from(["blockscale", "mxfp8", "ptpc", ""]),
    "gather_dtype": st.sampled_from(["bf16", "fp8", "fp16"]),
    "gather_transport": st.sampled_from(["sdma", "lsa", "rdma"]),
    "block_m": st.sampled_from([0, 64, 128, 192, 256, 384]),
    "block_n": st.sampled_from([128, 256, 512]),
    "m_max": st.sampled_from([0, 1, 1000, 4096, 16384, 10**6]),
    "sdma_queues": st.sampled_from([0, 1, 2, 8]),
    "bogus": st.integers(),
}


@st.composite
def near_valid_tuple(draw):
    base = dict(REF)
    start = draw(st.integers(0, 2))
    if start == 1:
        base.update(transport="gemm-only", quant="mxfp8", n=1024, k=256, world=2)
    elif start == 2:
        base.update(transport="gemv", quant="mxfp8", n=1024, k=256, world=2, m=draw(st.integers(1, 40)))
    for key in draw(st.lists(st.sampled_from(sorted(field_values)), max_size=4, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            base.pop(key, None)
        else:
            base[key] = draw(field_values[key])
    return base


@settings(max_examples=400, deadline=None)
@given(st.lists(near_valid_tuple(), min_size=1, max_size=4))
def test_fuzz_near_valid_manifests(tuples):
    m = check_outcome(doc(*tuples))
    if m is not None:
        assert len(m.workloads) <= sum(MAX_M_VALUES for _ in tuples)
