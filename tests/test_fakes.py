"""The HIP driver double's own checks: each comes from the code object it is handed, never from a record.

The code objects are real gfx950 (and gfx942) ones compiled by clang from
tests/hipstub/kernels.cl in well under a second, so this runs in the fast tier.
"""

from __future__ import annotations

import struct

import pytest

from fakes import FakeHipDriver, roles_of
from gemmar_aot.model.codeobject import parse_code_object
from gemmar_aot.runtime.driver import KernArgs
from note_oracle import NoteError, read_note


def _fill_args(ptr: int, value: int = 7, n: int = 64, size: int = 24) -> KernArgs:
    args = KernArgs(size)  # fill(global int*, int, long): 8 + 4 (+4 pad) + 8
    struct.pack_into("<Qi4xq", args.buf, 0, ptr, value, n)
    return args


def test_note_reader_agrees_with_the_section_reader(test_co):
    """Two readers, two paths (program headers here, section headers in gemmar_aot.model.codeobject), one answer."""
    ours, theirs = read_note(test_co), parse_code_object(test_co)
    assert ours.target.endswith("gfx950") and set(ours.kernels) == {k.name for k in theirs.kernels} == {"fill", "axpy"}
    for k in theirs.kernels:
        n = ours.kernel(k.name)
        assert (n.kernarg_size, n.kernarg_align, n.max_flat_workgroup_size, n.reqd_workgroup_size, n.lds_bytes) == \
            (k.kernarg_size, k.kernarg_align, k.max_flat_workgroup_size, k.reqd_workgroup_size, k.lds_bytes)
        assert [(a.offset, a.size, a.kind) for a in n.args] == [(a.offset, a.size, a.value_kind) for a in k.args]
    assert ours.kernel("fill").reqd_workgroup_size == (64, 1, 1)
    assert [a.kind for a in ours.kernel("axpy").explicit_args] == ["global_buffer", "global_buffer", "by_value",
                                                                    "by_value"]


def test_note_reader_refuses_what_is_not_a_code_object(test_co):
    with pytest.raises(NoteError, match="not a 64-bit"):
        read_note(b"\x7fELF" + bytes(60))
    no_phdrs = bytearray(test_co)
    struct.pack_into("<H", no_phdrs, 56, 0)  # e_phnum
    with pytest.raises(NoteError, match="no program headers"):
        read_note(bytes(no_phdrs))


def test_a_launch_the_code_object_allows_is_logged_with_its_arguments(test_co):
    drv = FakeHipDriver()
    fn = drv.get_function(drv.load_module(test_co), "fill")
    drv.launch(fn, (3, 1, 1), (64, 1, 1), _fill_args(0x1000, 7, 192), drv.stream)
    (log,) = drv.launches
    assert (log.kernel, log.grid, log.block, log.args) == ("fill", (3, 1, 1), (64, 1, 1), (0x1000, 7, 192))


@pytest.mark.parametrize("case,match", [
    ("kernarg", r"kernarg buffer is 16 bytes, the code object says 24"),
    ("reqd", r"block \(128, 1, 1\), the code object requires \(64, 1, 1\)"),
    ("null", r"a null pointer for the argument at offset 0"),
    ("grid", r"grid \(0, 1, 1\)"),
])
def test_a_launch_the_code_object_forbids_is_refused(test_co, case, match):
    drv = FakeHipDriver()
    fn = drv.get_function(drv.load_module(test_co), "fill")
    grid, block, args = (1, 1, 1), (64, 1, 1), _fill_args(0x1000)
    if case == "kernarg":
        args = KernArgs(16)
    elif case == "reqd":
        block = (128, 1, 1)
    elif case == "null":
        args = _fill_args(0)
    elif case == "grid":
        grid = (0, 1, 1)
    with pytest.raises(AssertionError, match=match):
        drv.launch(fn, grid, block, args, drv.stream)
    assert not drv.launches


def test_block_over_max_flat_workgroup_size_is_refused(test_co):
    drv = FakeHipDriver()
    fn = drv.get_function(drv.load_module(test_co), "axpy")
    limit = read_note(test_co).kernel("axpy").max_flat_workgroup_size
    args = KernArgs(read_note(test_co).kernel("axpy").kernarg_size)
    struct.pack_into("<QQfi", args.buf, 0, 0x1000, 0x2000, 1.0, 4)
    drv.launch(fn, (1, 1, 1), (limit, 1, 1), args, drv.stream)
    with pytest.raises(AssertionError, match=f"over max_flat_workgroup_size {limit}"):
        drv.launch(fn, (1, 1, 1), (limit, 2, 1), args, drv.stream)


def test_modules_functions_and_arch(test_co, gfx942_co):
    drv = FakeHipDriver()
    mod = drv.load_module(test_co)
    with pytest.raises(KeyError, match="no kernel 'nope'"):
        drv.get_function(mod, "nope")
    with pytest.raises(AssertionError, match="gfx942.* loaded on a gfx950"):
        drv.load_module(gfx942_co)
    drv.unload_module(mod)
    with pytest.raises(AssertionError, match="not loaded"):
        drv.get_function(mod, "fill")


def test_a_lock_bounds_what_may_be_loaded(test_co, smoke_lock):
    """With a lock the double refuses a module it does not name (what the runtime was given, not what is right)."""
    with pytest.raises(AssertionError, match="not named by any lock entry"):
        FakeHipDriver([smoke_lock]).load_module(test_co)


def test_every_built_kernel_name_allows_exactly_its_role(smoke_lock):
    """ROLES_BY_NAME covers every kernel we build, and each lock entry's kind is one its name allows."""
    seen = set()
    for _where, e in smoke_lock.iter_launches():
        roles = roles_of(e.symbol)
        assert e.kind in roles, (e.kind, e.symbol, sorted(roles))
        # one role a name, but a push GEMM's and a dispatch's (a replay dispatch has the same symbol)
        assert len(roles) == 1 or e.symbol.startswith(("push_", "ep_dispatch_")), (e.symbol, roles)
        seen.add(e.kind)
    assert {"gemm", "gemv", "scatter", "drain", "reduce", "gather", "quantize", "dequantize", "gather_barrier",
            "pull", "lsa_ar"} <= seen
    assert roles_of("fill") == frozenset()  # a name no mori builder gives


def test_parsed_notes_are_remembered_by_their_bytes_only(test_co):
    """gemmar_aot.model.codeobject keeps parsed metadata notes per process (a rank's code objects repeat a
    few): a note differing in one byte is parsed afresh, and a note that is not a map is refused."""
    from gemmar_aot.model.codeobject import CodeObjectError

    before = parse_code_object(test_co)
    assert parse_code_object(test_co) == before
    i = test_co.index(b".kernarg_segment_size") + len(b".kernarg_segment_size")
    assert test_co[i] < 0x40  # a msgpack positive fixint follows the key
    changed = bytearray(test_co)
    changed[i] += 8
    after = parse_code_object(bytes(changed))
    moved = [(a.name, a.kernarg_size, b.kernarg_size) for a, b in zip(before.kernels, after.kernels)
             if a.kernarg_size != b.kernarg_size]
    assert len(moved) == 1 and moved[0][2] == moved[0][1] + 8
    assert parse_code_object(test_co) == before  # the original still parses as before
    j = test_co.index(b"AMDGPU\0\0") + 8  # the note's name (7 bytes, padded to 8), then its msgpack
    assert test_co[j] & 0xF0 == 0x80  # a fixmap: amdhsa.version, .target, .kernels, ...
    not_a_map = bytearray(test_co)
    not_a_map[j] = 0x90 | 2 * (test_co[j] & 0x0F)  # the same entries, as a fixarray of keys and values
    with pytest.raises(CodeObjectError, match="is a msgpack list, not a map"):
        parse_code_object(bytes(not_a_map))
