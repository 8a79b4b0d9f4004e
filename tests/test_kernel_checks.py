"""The runtime's code-object checks (runtime/kernel_checks.py, runtime/launches.py) against a real clang-built gfx950 code object.

``fill(global int*, int, long)`` is compiled with ``reqd_work_group_size(64,1,1)``
(tests/hipstub/kernels.cl). A launch record that agrees with its metadata note is
accepted; one that launches another block, or passes an integer where the note
says pointer (or the reverse) with the sizes still agreeing, is refused.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import hipstub as hs
from gemmar_aot.model.codeobject import parse_code_object
from gemmar_aot.model.launch import LaunchRecord
from gemmar_aot.runtime.artifact_errors import ArtifactMismatchError
from gemmar_aot.runtime.launches import prepare_launch
from gemmar_aot.runtime.kernel_checks import verify_code_object

RECORD = LaunchRecord(kernel="fill", params=("ptr", "i32", "i64", "stream"), args=(),
                      kernel_args=("p0", "p1", "p2"), kernel_arg_types=("ptr", "i32", "i64"), program=(),
                      grid=(1, 1, 1), block=(64, 1, 1), stream_param=3)


@pytest.fixture(scope="module")
def fill(tmp_path_factory):
    return parse_code_object(hs.build_test_code_object(tmp_path_factory.mktemp("co") / "fill.co", only_fill=True))


def test_a_record_that_agrees_with_the_note_is_accepted(fill):
    kern = verify_code_object(fill, RECORD, arch="gfx950", where="fill")
    assert kern.reqd_workgroup_size == (64, 1, 1)


@pytest.mark.parametrize("block, why", [
    ((32, 2, 1), r"block \[32, 2, 1\], the kernel was compiled for exactly \[64, 1, 1\] \(reqd_workgroup_size\)"),
    ((128, 1, 1), r"block \[128, 1, 1\], the kernel was compiled for exactly \[64, 1, 1\]"),
])
def test_a_block_the_kernel_was_not_compiled_for_is_refused(fill, block, why):
    with pytest.raises(ArtifactMismatchError, match=why):
        verify_code_object(fill, replace(RECORD, block=block), arch="gfx950", where="fill")


def test_a_computed_block_is_checked_when_resolved(fill):
    rec = replace(RECORD, program=(("v0", "mul", "p1", 2, "i32"),), block=("v0", 1, 1))
    kern = verify_code_object(fill, rec, arch="gfx950", where="fill")  # not constant: checked at resolve
    prepare_launch(kind="fill", digest="0" * 64, record=rec, kernel=kern, function=None,
                   fixed={0: 0x1000, 1: 32, 2: 7}, per_call=(), where="fill")
    with pytest.raises(ArtifactMismatchError, match=r"block \[128, 1, 1\]"):
        prepare_launch(kind="fill", digest="0" * 64, record=rec, kernel=kern, function=None,
                       fixed={0: 0x1000, 1: 64, 2: 7}, per_call=(), where="fill")


@pytest.mark.parametrize("types, why", [
    (("i64", "i32", "i64"), "argument 0 is a global_buffer in the code object, the record passes a i64"),
    (("ptr", "i32", "ptr"), "argument 2 is a by_value in the code object, the record passes a ptr"),
])
def test_an_argument_of_the_wrong_kind_is_refused_even_at_the_right_size(fill, types, why):
    with pytest.raises(ArtifactMismatchError, match=why):
        verify_code_object(fill, replace(RECORD, kernel_arg_types=types), arch="gfx950", where="fill")


def test_a_construction_s_caches_reuse_only_what_the_same_inputs_decide(fill):
    """verify_code_object and prepare_launch share results within one construction only where
    every input that decides them is the same; a different block or kernel is checked again."""
    cache: dict = {}
    kern = verify_code_object(fill, RECORD, arch="gfx950", where="fill", cache=cache)
    assert verify_code_object(fill, replace(RECORD), arch="gfx950", where="fill", cache=cache) is kern
    with pytest.raises(ArtifactMismatchError, match=r"block \[128, 1, 1\]"):
        verify_code_object(fill, replace(RECORD, block=(128, 1, 1)), arch="gfx950", where="fill", cache=cache)
    with pytest.raises(ArtifactMismatchError, match="the launch record names 'other'"):
        verify_code_object(fill, replace(RECORD, kernel="other"), arch="gfx950", where="fill", cache=cache)
    with pytest.raises(ArtifactMismatchError, match="code object is for gfx950, the artifacts say gfx942"):
        verify_code_object(fill, RECORD, arch="gfx942", where="fill", cache=cache)
    # two launches without per-call arguments and the same inputs share their packed buffer ...
    fixed = {0: 0x1000, 1: 32, 2: 7}
    a = prepare_launch(kind="fill", digest="0" * 64, record=RECORD, kernel=kern, function="fa", fixed=fixed,
                       per_call=(), where="fill", cache=cache)
    b = prepare_launch(kind="fill", digest="1" * 64, record=replace(RECORD), kernel=kern, function="fb",
                       fixed=dict(fixed), per_call=(), where="fill", cache=cache)
    assert a.args is b.args and (a.function, b.function, b.digest) == ("fa", "fb", "1" * 64)
    assert a.args.tobytes() == b.args.tobytes() == bytes.fromhex("0010000000000000" "20000000" "00000000"
                                                                   "0700000000000000")
    # ... other values, or per-call arguments (written at every call), never do
    c = prepare_launch(kind="fill", digest="0" * 64, record=RECORD, kernel=kern, function="fa",
                       fixed={**fixed, 1: 33}, per_call=(), where="fill", cache=cache)
    d = prepare_launch(kind="fill", digest="0" * 64, record=RECORD, kernel=kern, function="fa",
                       fixed={1: 32, 2: 7}, per_call=(0,), where="fill", cache=cache)
    e = prepare_launch(kind="fill", digest="0" * 64, record=RECORD, kernel=kern, function="fa",
                       fixed={1: 32, 2: 7}, per_call=(0,), where="fill", cache=cache)
    assert len({id(x.args) for x in (a, c, d, e)}) == 4 and c.args.tobytes()[8:12] == (33).to_bytes(4, "little")


class _Counting:
    def __init__(self):
        self.launches = []

    def launch(self, function, grid, block, args, stream):
        self.launches.append((grid, block, args.tobytes()))


def test_a_launch_writes_each_call_s_values_and_evaluates_a_grid_that_reads_them(fill):
    """The standalone ops' shape of launch: M per call, the grid the record's own program of it,
    evaluated per distinct M (a program that divides by M resolves at construction too)."""
    rec = replace(RECORD, program=(("v0", "sdiv", 4096, "p1", "i32"),), grid=("v0", 1, 1))
    kern = verify_code_object(fill, rec, arch="gfx950", where="fill")
    launch = prepare_launch(kind="fill", digest="0" * 64, record=rec, kernel=kern, function="f",
                            fixed={2: 7}, per_call=(0, 1), where="fill")
    assert launch.grid is None  # it depends on a per-call value
    drv = _Counting()
    launch.launch(drv, 0, (0x1000, 64))
    launch.launch(drv, 0, (0x2000, 128))
    assert [(g, b) for g, b, _a in drv.launches] == [((64, 1, 1), (64, 1, 1)), ((32, 1, 1), (64, 1, 1))]
    assert drv.launches[1][2] == bytes.fromhex("0020000000000000" "80000000" "00000000" "0700000000000000")


def test_a_pointer_given_per_call_that_reaches_nothing_is_refused_a_length_is_not(fill):
    rec = replace(RECORD, params=("ptr", "i32", "i64", "ptr", "len32", "stream"), stream_param=5)
    kern = verify_code_object(fill, rec, arch="gfx950", where="fill")
    with pytest.raises(ArtifactMismatchError, match=r"per-call pointers \[3\] of fill reach no kernel argument"):
        prepare_launch(kind="fill", digest="0" * 64, record=rec, kernel=kern, function="f",
                       fixed={1: 32, 2: 7, 4: 0}, per_call=(0, 3), where="fill")
    prepare_launch(kind="fill", digest="0" * 64, record=rec, kernel=kern, function="f",
                   fixed={1: 32, 2: 7, 3: 0}, per_call=(0, 4), where="fill")  # an unread length is harmless
