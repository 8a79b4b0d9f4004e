"""gemmar_aot.model.rules: the op's arithmetic, its checks, and the window layout."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemmar_aot.model.layout import window_layout
from gemmar_aot.model import rules

# --------------------------------------------------------------------------
# Shape helpers
# --------------------------------------------------------------------------


def test_constants():
    assert rules.MAX_CHUNKS == 8
    assert rules.SCALE_BLOCK_K == 128
    assert rules.MXFP8_BLOCK == 32
    assert rules.MIN_K == 256
    assert rules.DEFAULT_BLOCK_N == 256
    assert rules.DEFAULT_BLOCK_M == {"blockscale": 128, "mxfp8": 256}
    assert rules.TILE_M_GRANULE == 128
    assert rules.WORLD_SIZES == (2, 4, 8)
    assert rules.default_block_m("blockscale") == 128
    assert rules.default_block_m("mxfp8") == 256


@pytest.mark.parametrize(
    "m, world, block_m, want",
    [
        (1, 8, 128, 1024),
        (1024, 8, 128, 1024),
        (1025, 8, 128, 2048),
        (4000, 8, 128, 4096),
        (16384, 8, 128, 16384),
        (1, 2, 128, 256),
        (300, 2, 128, 512),
        (1, 2, 256, 512),
        (5000, 4, 256, 5120),
        (5121, 4, 256, 6144),
    ],
)
def test_padded_m(m, world, block_m, want):
    assert rules.padded_m(m, world, block_m) == want


def test_padded_m_rejects_empty_granule():
    with pytest.raises(ValueError):
        rules.padded_m(100, 0, 128)


def test_counter_chunks_spec_sequence():
    # ws*bm = 1024, M = 1k..16k (spec section 1). 11264 and 13312 get one chunk.
    got = [rules.counter_chunks(b * 1024, 8, 128) for b in range(1, 17)]
    assert got == [1, 2, 3, 4, 5, 6, 7, 8, 3, 5, 1, 6, 1, 7, 5, 8]
    assert rules.counter_chunks(1024, 4, 256) == 1


def test_counter_chunks_rejects_less_than_a_band():
    with pytest.raises(ValueError):
        rules.counter_chunks(512, 8, 128)


@given(st.integers(1, 4000))
def test_counter_chunks_is_the_largest_divisor(b):
    c = rules.counter_chunks(b * 256, 2, 128)
    assert 1 <= c <= min(8, b) and b % c == 0
    assert all(b % d for d in range(c + 1, min(8, b) + 1))


def test_default_max_shapes_and_slots():
    assert rules.default_max_shapes(16384, 8, 128) == 16
    assert rules.default_max_shapes(1024, 2, 128) == 4
    assert rules.default_max_shapes(100, 8, 128) == 1  # never below one
    assert [rules.counter_slot(m, 8, 128) for m in (1024, 4096, 16384)] == [0, 3, 15]
    assert rules.counter_slot(512, 2, 128) == 1
    # every padded M up to m_max has a slot in the window's table
    for m in range(1024, 16385, 1024):
        assert rules.counter_slot(m, 8, 128) < rules.default_max_shapes(16384, 8, 128)


@pytest.mark.parametrize("m_pad", [0, 1000, -1024])
def test_counter_slot_rejects_unpadded(m_pad):
    with pytest.raises(ValueError):
        rules.counter_slot(m_pad, 8, 128)


def test_gemm_only_padding_and_tile_choice():
    assert rules.gemm_only_padded_m(1) == 64
    assert rules.gemm_only_padded_m(64) == 64
    assert rules.gemm_only_padded_m(100) == 128
    # The measured crossovers in mori's gemm.py: wq_b (N=8192) turns wide between
    # M=1024 and 1280, wo_b (N=5120) between 1536 and 1792.
    assert rules.gemm_only_wants_narrow(1024, 8192)
    assert not rules.gemm_only_wants_narrow(1280, 8192)
    assert rules.gemm_only_wants_narrow(1536, 5120)
    assert not rules.gemm_only_wants_narrow(1792, 5120)
    assert rules.gemm_only_wants_narrow(256, 1024)
    assert not rules.gemm_only_wants_narrow(9216, 1024)  # 36 x 4 = 144 workgroups


def test_lsa_stage():
    assert rules.lsa_stage(2, 10**9) == 1
    assert rules.lsa_stage(4, 160 * 1024 - 1) == 1
    assert rules.lsa_stage(4, 160 * 1024) == 2
    assert rules.lsa_stage(8, 80 * 1024 - 1) == 1
    assert rules.lsa_stage(8, 80 * 1024) == 2


# --------------------------------------------------------------------------
# Checks, one by one
# --------------------------------------------------------------------------


def test_check_quant():
    assert rules.check_quant("blockscale") is None
    assert rules.check_quant("mxfp8") is None
    assert "quant must be one of" in rules.check_quant("ptpc")


def test_check_block_m_for_quant():
    assert rules.check_block_m_for_quant("mxfp8", 256) is None
    assert "requires block_m = 256" in rules.check_block_m_for_quant("mxfp8", 128)
    assert rules.check_block_m_for_quant("blockscale", 256) is None  # other granule tiles stay legal


def test_check_gather():
    assert rules.check_gather_dtype("bf16") is None and rules.check_gather_dtype("fp8") is None
    assert "gather_dtype" in rules.check_gather_dtype("FP8")
    assert rules.check_gather_transport("sdma") is None and rules.check_gather_transport("lsa") is None
    assert "gather_transport" in rules.check_gather_transport("sla")


def test_check_block_n_permlane():
    assert rules.check_block_n(256) is None
    for bad in (128, 512, 0):
        assert "exactly 256" in rules.check_block_n(bad)


@pytest.mark.parametrize(
    "block_m, block_n, field",
    [(0, 256, "block_m"), (64, 256, "block_m"), (192, 256, "block_m"), (128, 128, "block_n"), (128, 384, "block_n")],
)
def test_check_tile(block_m, block_n, field):
    why = rules.check_tile(block_m, block_n)
    assert why is not None and why.startswith(field)


def test_check_tile_ok():
    assert rules.check_tile(128, 256) is None
    assert rules.check_tile(256, 512) is None  # the granule allows it; permlane does not
    assert rules.check_tile(256, 128, n_granule=128) is None


def test_check_counts():
    assert rules.check_m_max(1) is None and "m_max" in rules.check_m_max(0)
    assert rules.check_sdma_queues(1) is None and "sdma_queues" in rules.check_sdma_queues(0)
    assert rules.check_max_shapes(1) is None and "max_shapes" in rules.check_max_shapes(0)
    assert rules.check_m(1) is None and rules.check_m(0) is not None


def test_check_k():
    assert rules.check_k(256) is None and rules.check_k(2048) is None
    assert "multiple of 128 (the block-scale group)" in rules.check_k(200)
    assert "multiple of 128 (the scaled MFMA's K step)" in rules.check_k(200, "mxfp8")
    assert "at least 256" in rules.check_k(128)
    assert "at least 256" in rules.check_k(0)


def test_check_n():
    assert rules.check_n(7168) is None
    assert "multiple of block_n = 256" in rules.check_n(7000)
    assert "multiple of block_n = 256" in rules.check_n(384)
    # The scale-group rules are only reachable with a tile narrower than the group.
    assert "multiple of 128 (the B scale group)" in rules.check_n(192, 64, "blockscale")
    assert "multiple of 32 (the B scale group)" in rules.check_n(48, 16, "mxfp8")
    assert rules.check_n(96, 32, "mxfp8") is None
    # K is checked before N, as in the op
    assert "K" in rules.check_gemm_shape(7000, 200)


@pytest.mark.parametrize("world", [-1, 0, 1, 3, 5, 6, 7, 9, 16])
def test_check_world_rejects(world):
    assert rules.check_world(world) is not None


@pytest.mark.parametrize("world", [2, 4, 8])
def test_check_world_accepts(world):
    assert rules.check_world(world) is None


def test_check_payload_and_fp8_gather():
    assert rules.check_payload(1024, 7168, 8) is None
    assert "multiple of world*16" in rules.check_payload(1, 8, 8)
    assert rules.check_fp8_gather_n(1536, "bf16") is None
    assert rules.check_fp8_gather_n(2048, "fp8") is None
    assert "multiple of 1024" in rules.check_fp8_gather_n(1536, "fp8")


def test_check_int32_extents():
    assert rules.check_int32_extents(16384, 7168, 2048) is None
    assert "M*N" in rules.check_int32_extents(300_000, 7168, 2048)
    assert "M*K" in rules.check_int32_extents(2**21, 256, 2**11)
    assert "N*K" in rules.check_int32_extents(1, 2**20, 2**12)


def test_check_gemm_ar_reference_shape_ok():
    assert rules.check_gemm_ar(16384, 7168, 2048, 8) is None
    assert rules.check_gemm_ar(4096, 7168, 2048, 8, gather_dtype="fp8", gather_transport="sdma") is None
    assert rules.check_gemm_ar(512, 1024, 256, 2, quant="mxfp8") is None
    assert rules.check_gemm_ar(300, 1024, 256, 2, m_max=1000) is None  # padded


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        # each row breaks the rule named, and rules later in the op's order too
        (dict(quant="ptpc", k=200, world=3), "quant must be one of"),
        (dict(quant="mxfp8", block_m=128, gather_dtype="x"), "requires block_m = 256"),
        (dict(gather_dtype="fp16", block_n=512), "gather_dtype must be"),
        (dict(gather_transport="xgmi", block_n=512), "gather_transport must be"),
        (dict(block_n=512, block_m=192), "exactly 256"),
        (dict(block_m=192, k=200), "block_m must be a positive multiple of 128"),
        (dict(m_max=0, k=200), "m_max must be >= 1"),
        (dict(sdma_queues=0, k=200), "sdma_queues must be >= 1"),
        (dict(max_shapes=0, k=200), "max_shapes must be >= 1"),
        (dict(k=200, n=7000, world=3), "multiple of 128"),
        (dict(k=128, n=7000), "at least 256"),
        (dict(n=7000, world=3), "multiple of block_n"),
        (dict(world=6, gather_dtype="fp8", n=1536), "world must"),
        (dict(m=0, m_max=4096), "M must be >= 1"),
        (dict(m=20000, m_max=16384), "exceeds m_max"),
        (dict(gather_dtype="fp8", n=1536), "multiple of 1024"),
        (dict(m=300_000), "int32"),
    ],
)
def test_check_gemm_ar_first_failure_in_op_order(kwargs, fragment):
    args = dict(m=4096, n=7168, k=2048, world=8)
    args.update(kwargs)
    why = rules.check_gemm_ar(args.pop("m"), args.pop("n"), args.pop("k"), args.pop("world"), **args)
    assert why is not None and fragment in why, why


def test_check_gemm_ar_never_checks_what_it_cannot_pad():
    # A world of 0 must be rejected as a world, not divide by zero.
    assert "world" in rules.check_gemm_ar(4096, 7168, 2048, 0)


def test_check_mxfp8_gemm():
    assert rules.check_mxfp8_gemm(1024, 256) is None
    assert rules.check_mxfp8_gemm(5120, 2048) is None
    assert rules.check_mxfp8_gemm(8192, 1280) is None
    assert "exactly 256" in rules.check_mxfp8_gemm(1024, 256, block_n=512)
    assert "block_n must be a positive multiple of 256" in rules.check_mxfp8_gemm(1024, 256, block_n=128)
    assert "MFMA's K step" in rules.check_mxfp8_gemm(1024, 200)
    assert "at least 256" in rules.check_mxfp8_gemm(1024, 128)
    assert "block_n = 256" in rules.check_mxfp8_gemm(1152, 256)
    assert rules.check_mxfp8_gemm(1024, 256, m=9216) is None
    assert "int32" in rules.check_mxfp8_gemm(1024, 256, m=2**22)


# --------------------------------------------------------------------------
# Window layout
# --------------------------------------------------------------------------


def test_layout_reference_bf16():
    d = window_layout(8, 7168, 16384, 128, "bf16", "lsa", 16).flat()
    assert d["start_off"] == 0
    assert d["end_off"] == 2560
    assert d["flag_off"] == 5120
    assert d["counter_region_off"] == 5504
    assert d["lock_off"] == 9600
    assert d["input_off"] == 10240
    assert d["output_off"] == 234_891_264
    assert d["gout_off"] == d["output_off"]  # the bf16 gather reads output in place
    assert d["tmp_off"] == 469_772_288
    assert d["recv_off"] == 499_132_416
    assert [d["recv_slot_offs"][p] - d["recv_off"] for p in range(8)] == [29_360_128 * p for p in range(8)]
    assert d["window_bytes"] == 734_013_440  # ~700 MiB
    for s in range(16):
        m = (s + 1) * 1024
        per_call = window_layout(8, 7168, 16384, 128, "bf16", "lsa", 16, m_pad=m).flat()
        assert per_call["slot"] == s
        assert per_call["counter_off"] == 5504 + 256 * s


def test_layout_reference_fp8():
    for transport in ("lsa", "sdma"):
        d = window_layout(8, 7168, 16384, 128, "fp8", transport, 16).flat()
        assert d["lock_off"] == 9600 and d["input_off"] == 10240
        assert d["output_off"] == 234_891_264
        assert d["gout_off"] == 469_772_288
        assert d["gout_scale_off"] == 587_212_800
        assert d["recv_off"] == 616_638_464
        assert d["window_bytes"] == 851_519_488


def test_layout_reference_small():
    d = window_layout(2, 1024, 1024, 128, "bf16", "lsa", 4, m_pad=512).flat()
    assert d["lock_off"] == 5760
    assert d["input_off"] == 6016
    assert d["output_off"] == 2_103_168
    assert d["recv_off"] == 5_248_896
    assert d["window_bytes"] == 7_346_048
    assert d["slot"] == 1
    assert d["counter_off"] == 5568
    assert d["counter_chunks"] == 2  # two bands per destination
    assert d["chunk_bytes"] == d["slice_bytes"] // 2
    assert d["slice_rows"] == 256
    assert d["slice_bytes"] == 256 * 1024 * 2


def test_layout_default_max_shapes():
    assert window_layout(8, 7168, 16384).max_shapes == 16
    assert window_layout(8, 7168, 16384) == window_layout(8, 7168, 16384, 128, "bf16", "lsa", 16)


def test_layout_per_call_values():
    d = window_layout(8, 7168, 16384, m_pad=16384).flat()
    assert d["counter_chunks"] == 8
    assert d["slice_bytes"] == 16384 * 7168 * 2 // 8
    assert d["chunk_bytes"] == d["slice_bytes"] // 8
    assert d["reduce_blocks"] == 256
    assert d["lsa_stage"] == 2 and d["lsa_blocks"] == 24
    d = window_layout(8, 7168, 16384, m_pad=11264).flat()
    assert d["counter_chunks"] == 1 and d["chunk_bytes"] == d["slice_bytes"]
    f = window_layout(8, 7168, 16384, 128, "fp8", "lsa", m_pad=4096).flat()
    assert f["gather_slice_bytes"] == 512 * 7168
    assert f["gather_scale_slice_bytes"] == 512 * 4
    assert f["gout_scale_slice_offs"][3] == f["gout_scale_off"] + 3 * 2048 * 4


def test_layout_recv_slots_override():
    d = window_layout(8, 7168, 16384, recv_slots=0).flat()
    assert d["recv_slot_offs"] == () and d["window_bytes"] == d["recv_off"]


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((3, 7168, 3072), {}),  # world
        ((8, 1536, 1024, 128, "fp8"), {}),  # fp8 needs N % 1024
        ((8, 7168, 1000), {}),  # m_max not padded
        ((8, 7168, 16384, 128, "bf16", "lsa", 0), {}),  # max_shapes
        ((8, 7168, 8192, 128, "bf16", "lsa", 16), {"m_pad": 16384}),  # beyond m_max
        ((8, 7168, 8192, 128, "bf16", "lsa", 16), {"m_pad": 1000}),  # not padded
        ((8, 7168, 8192, 128, "bf16", "lsa", 4), {"m_pad": 8192}),  # slot 7 but 4 sets
        ((8, 7168, 8192, 128, "bf16", "fast"), {}),
        ((8, 7168, 8192), {"recv_slots": 9}),
    ],
)
def test_layout_rejects(args, kwargs):
    with pytest.raises(ValueError):
        window_layout(*args, **kwargs)


_OFFSET_ORDER = ("input_off", "output_off", "output_end", "tmp_off", "recv_off", "window_bytes")


@settings(max_examples=300, deadline=None)
@given(
    world=st.sampled_from([2, 4, 8]),
    block_m=st.sampled_from([128, 256, 384]),
    n_units=st.integers(1, 64),
    bands_max=st.integers(1, 24),
    fp8=st.booleans(),
    transport=st.sampled_from(["sdma", "lsa"]),
    data=st.data(),
)
def test_layout_invariants(world, block_m, n_units, bands_max, fp8, transport, data):
    n = n_units * (1024 if fp8 else 256)
    m_max = bands_max * world * block_m
    gd = "fp8" if fp8 else "bf16"
    base = window_layout(world, n, m_max, block_m, gd, transport).flat()
    # every region is aligned and they come in order without overlapping
    for key in ("end_off", "flag_off", "counter_region_off", "lock_off", "input_off", "output_off",
                "output_end", "gout_off", "gout_scale_off", "window_bytes"):
        assert base[key] % 128 == 0, key
    assert [base[k] for k in _OFFSET_ORDER] == sorted(base[k] for k in _OFFSET_ORDER)
    assert base["output_off"] - base["input_off"] >= m_max * n * 2
    assert base["gather_counter_region_off"] + base["gather_counter_bytes"] <= base["input_off"]
    if fp8:
        assert base["gout_off"] >= base["output_end"]
        assert base["gout_scale_off"] >= base["gout_off"] + m_max * n
        assert base["tmp_off"] >= base["gout_scale_off"] + m_max * 4
    assert base["recv_slot_offs"][-1] + m_max // world * n * 2 <= base["window_bytes"]
    # the map does not depend on which M is being served; only per-call values do
    bands = data.draw(st.integers(1, bands_max))
    per_call = window_layout(world, n, m_max, block_m, gd, transport, m_pad=bands * world * block_m).flat()
    assert {k: per_call[k] for k in base} == base
    assert window_layout(world, n, m_max, block_m, gd, transport, m_pad=per_call["m"]).shared() == \
        window_layout(world, n, m_max, block_m, gd, transport)
    assert base["counter_region_off"] <= per_call["counter_off"]
    assert per_call["counter_off"] + base["counter_set_bytes"] <= base["lock_off"]
    assert per_call["gather_counter_off"] + base["gather_counter_set_bytes"] <= base["input_off"]
    assert per_call["slice_bytes"] * world == per_call["m"] * n * 2
    assert per_call["slice_bytes"] <= base["recv_slot_bytes"]


# --------------------------------------------------------------------------
# Cross-check against mori's own ArConfig, when the toolchain provides it
# --------------------------------------------------------------------------


def _mori_arconfig():
    """mori 1.2.4's ``ArConfig`` through the build toolchain, or skip saying why."""
    try:
        from gemmar_aot.toolchain import import_mori_device, load_toolchain
    except ImportError as exc:
        pytest.skip(f"cross-check against mori's ArConfig needs gemmar_aot.toolchain "
                    f"(load_toolchain, import_mori_device): {exc}")
    try:
        tc = load_toolchain()
    except Exception as exc:  # noqa: BLE001 - any failure means "no toolchain here"
        pytest.skip(f"cross-check against mori's ArConfig needs a set-up toolchain: {exc}")
    try:
        import_mori_device(tc)  # registers mori / mori.ops as bare packages
        # layout.py itself needs nothing but the standard library, but importing
        # it as mori.ops.gemm_ar.layout would run gemm_ar/__init__ (torch,
        # FlyDSL). Load the toolchain's file on its own instead.
        path = Path(sys.modules["mori.ops"].__path__[0]) / "gemm_ar" / "layout.py"
        name = "_gemmar_test_mori_layout"
        spec = importlib.util.spec_from_file_location(name, path)
        layout = importlib.util.module_from_spec(spec)
        sys.modules[name] = layout  # dataclasses look their module up
        spec.loader.exec_module(layout)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"cannot load mori's layout.py from the toolchain: {exc}")
    return layout.ArConfig


_FIELDS = ("start_off", "end_off", "flag_off", "counter_region_off", "counter_set_bytes", "counter_bytes",
           "lock_off", "lock_bytes", "gather_counter_region_off", "gather_counter_bytes", "signal_bytes",
           "input_off", "output_off", "output_end", "gout_off", "gout_scale_off", "tmp_off", "recv_off",
           "window_bytes", "counter_off", "gather_counter_off", "counter_chunks", "slice_rows", "num_packs",
           "packs_per_rank", "largest_pack_part", "slice_bytes", "gather_slice_bytes",
           "gather_scale_slice_bytes", "reduce_blocks")


def test_layout_matches_mori_arconfig():
    ArConfig = _mori_arconfig()
    cases = 0
    for world in (2, 4, 8):
        for block_m in (128, 256):
            for n in (256, 768, 1024, 7168):
                for gd, gt in (("bf16", "lsa"), ("bf16", "sdma"), ("fp8", "lsa"), ("fp8", "sdma")):
                    if gd == "fp8" and n % 1024:
                        continue
                    for bands_max in (1, 3, 16):
                        m_max = bands_max * world * block_m
                        slots = rules.default_max_shapes(m_max, world, block_m)
                        for b in sorted({1, 2, bands_max}):
                            if b > bands_max:
                                continue
                            m = b * world * block_m
                            # built the way GemmAllReduceOp builds it (op.py _make_cfg)
                            cfg = ArConfig(
                                world_size=world, m=m, n=n, recv_slots=world,
                                counter_chunks=rules.counter_chunks(m, world, block_m),
                                counter_capacity=rules.MAX_CHUNKS, counter_shape_slots=slots,
                                counter_shape_index=rules.counter_slot(m, world, block_m),
                                capacity_m=m_max, gather_dtype=gd, gather_transport=gt,
                            )
                            cfg.validate()
                            ours = window_layout(world, n, m_max, block_m, gd, gt, slots, m_pad=m).flat()
                            for field in _FIELDS:
                                assert ours[field] == getattr(cfg, field), (field, world, block_m, n, gd, m_max, m)
                            assert list(ours["recv_slot_offs"]) == [cfg.recv_slot_off(p) for p in range(world)]
                            assert list(ours["gout_scale_slice_offs"]) == [
                                cfg.gout_scale_slice_off(p) for p in range(world)
                            ]
                            lsa = ArConfig(world_size=world, m=m, n=n)
                            assert (ours["lsa_stage"], ours["lsa_blocks"]) == (lsa.stage, lsa.blocks)
                            cases += 1
    assert cases > 100
