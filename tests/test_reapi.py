"""Our hand-written ActionResult encoding, checked against Google's protobuf runtime.

The oracle is the ``protobuf`` package with the REAPI messages declared from their
field numbers in ``remote_execution.proto`` -- the parser a Bazel server (bazel-remote
validates ``/ac/`` uploads with the Go equivalent) uses, not our own decoder.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemmar_aot.model.types import Digest
from gemmar_aot.store.remote import reapi

pb = pytest.importorskip("google.protobuf", reason="the protobuf package is the test extra's oracle")


def _classes():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="gemmar_test_reapi.proto",
                                             package="build.bazel.remote.execution.v2", syntax="proto3")

    def msg(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, num, typ, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=typ, label=label)
            if tname:
                f.type_name = tname

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("Digest", [("hash", 1, F.TYPE_STRING, opt, None), ("size_bytes", 2, F.TYPE_INT64, opt, None)])
    msg("OutputFile", [("path", 1, F.TYPE_STRING, opt, None),
                       ("digest", 2, F.TYPE_MESSAGE, opt, ".build.bazel.remote.execution.v2.Digest"),
                       ("is_executable", 4, F.TYPE_BOOL, opt, None),
                       ("contents", 5, F.TYPE_BYTES, opt, None)])
    msg("ActionResult", [("output_files", 2, F.TYPE_MESSAGE, rep, ".build.bazel.remote.execution.v2.OutputFile"),
                         ("exit_code", 4, F.TYPE_INT32, opt, None),
                         ("stdout_raw", 5, F.TYPE_BYTES, opt, None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("build.bazel.remote.execution.v2.ActionResult"))


ActionResultPB = _classes()

_hex = st.text("0123456789abcdef", min_size=64, max_size=64)
_files = st.lists(st.builds(reapi.OutputFile, path=st.text(min_size=1, max_size=40),
                            digest=st.builds(Digest, _hex, st.integers(0, 2**40)),
                            is_executable=st.booleans(), contents=st.binary(max_size=64)), max_size=4)


@settings(max_examples=200, deadline=None)
@given(files=_files, exit_code=st.integers(-2**31, 2**31 - 1))
def test_protobuf_reads_what_we_write_and_we_read_what_it_writes(files, exit_code):
    ar = reapi.ActionResult(tuple(files), exit_code)
    ours = reapi.encode_action_result(ar)
    theirs = ActionResultPB.FromString(ours)
    assert theirs.exit_code == exit_code
    assert [(f.path, f.digest.hash, f.digest.size_bytes, f.is_executable, f.contents) for f in theirs.output_files] == \
           [(f.path, f.digest.hash, f.digest.size, f.is_executable, f.contents) for f in files]
    # Deterministic and canonical: protobuf's own serialisation of the same message is byte-equal.
    assert theirs.SerializeToString(deterministic=True) == ours
    assert reapi.decode_action_result(theirs.SerializeToString()) == ar


def test_unknown_fields_are_skipped_and_garbage_is_refused():
    m = ActionResultPB()
    f = m.output_files.add(path=reapi.RECORD_PATH, contents=b"inlined record bytes")
    f.digest.hash, f.digest.size_bytes = "ab" * 32, 7
    m.stdout_raw = b"a server may add fields"
    ar = reapi.decode_action_result(m.SerializeToString())
    assert ar.file(reapi.RECORD_PATH).digest == Digest("ab" * 32, 7)
    assert ar.file(reapi.RECORD_PATH).contents == b"inlined record bytes"
    assert ar.file(reapi.CODE_PATH) is None
    good = m.SerializeToString()
    for bad in (good[:-3], b"\x12\xff\xff\xff\xff\x0f", b"\x00\x01", b"\x13"):
        with pytest.raises(reapi.ProtobufError):
            reapi.decode_action_result(bad)


@pytest.mark.parametrize("hash_, size, why", [("AB" * 32, 7, "64 lowercase hex"), ("ab" * 31, 7, "64 lowercase hex"),
                                              ("ab" * 32, -1, "non-negative"), (None, 7, "no digest")])
def test_an_output_file_whose_digest_is_not_a_sha256_digest_is_refused_as_it_is_decoded(hash_, size, why):
    """A ``Digest`` message decodes into our Digest: a hash that is not a sha256's 64 lowercase hex,
    a negative size, or no digest at all is malformed input, named, never an entry."""
    m = ActionResultPB()
    f = m.output_files.add(path=reapi.CODE_PATH)
    if hash_ is not None:
        f.digest.hash, f.digest.size_bytes = hash_, size
    with pytest.raises(reapi.ProtobufError, match=why):
        reapi.decode_action_result(m.SerializeToString())
