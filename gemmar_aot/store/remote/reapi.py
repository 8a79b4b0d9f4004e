"""The few REAPI messages a Bazel HTTP cache stores under ``/ac/``, in protobuf wire format.

A stock bazel-remote validates every ``PUT /ac/<key>`` as a
``build.bazel.remote.execution.v2.ActionResult`` (``remote_execution.proto``), so the
action-cache entry we upload is one: the record and the code object are its output
files, named by :class:`Digest` and stored in ``/cas/``. Only these fields are written
or read (field numbers from the proto)::

    message Digest       { string hash = 1; int64 size_bytes = 2; }
    message OutputFile   { string path = 1; Digest digest = 2; bool is_executable = 4; bytes contents = 5; }
    message ActionResult { repeated OutputFile output_files = 2; int32 exit_code = 4; }

A ``Digest`` message is our :class:`~gemmar_aot.model.types.Digest` (``hash``, ``size``: the
wire's ``size_bytes`` is field 2 and nothing more), so an entry's digests are checked -- 64
lowercase hex, a size >= 0 -- as they are decoded, and one digest type runs through the code.
An ActionResult with an output file whose digest is not a sha256 digest (or that has none) is
therefore no entry of ours, and refused whole.

Decoding skips every other field (a server or another client may add some) and
rejects malformed input with :class:`ProtobufError`; encoding is deterministic (fields
in number order, output files in the order given), so the same record always uploads
the same bytes. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemmar_aot.model.types import Digest

#: Output-file paths of our entries (what Bazel would call the action's outputs).
RECORD_PATH = "gemmar-aot/record.json"
CODE_PATH = "gemmar-aot/code.hsaco"
#: The compile's second output (``compiler.launcher``), named by records that have one.
LAUNCHER_PATH = "gemmar-aot/launcher.json"

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class ProtobufError(ValueError):
    """Bytes that are not the message they should be. ``str(e)`` says where."""


@dataclass(frozen=True)
class OutputFile:
    path: str
    digest: Digest
    is_executable: bool = False
    #: The file's bytes inlined (REAPI's ``contents``); empty when only the digest is given.
    #: A reader checks them against ``digest`` exactly as it would the ``/cas/`` copy.
    contents: bytes = b""


@dataclass(frozen=True)
class ActionResult:
    output_files: tuple[OutputFile, ...]
    exit_code: int = 0

    def file(self, path: str) -> OutputFile | None:
        """The output file at ``path`` (the last one, as protobuf merges repeated scalars)."""
        found = None
        for f in self.output_files:
            if f.path == path:
                found = f
        return found


# ---------------------------------------------------------------- wire format


def _varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1  # int32/int64 negatives are ten-byte two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _len_field(field: int, payload: bytes) -> bytes:
    return _tag(field, _LEN) + _varint(len(payload)) + payload


def _read_varint(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtobufError(f"{what}: truncated varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7
        if shift >= 70:
            raise ProtobufError(f"{what}: varint longer than 10 bytes")


def _fields(buf: bytes, what: str):
    """Yield (field number, wire type, value) of a message: int for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos, what)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ProtobufError(f"{what}: field number 0")
        if wire == _VARINT:
            val, pos = _read_varint(buf, pos, what)
        elif wire == _LEN:
            n, pos = _read_varint(buf, pos, what)
            if pos + n > len(buf):
                raise ProtobufError(f"{what}: field {field} runs past the end ({n} bytes)")
            val, pos = buf[pos:pos + n], pos + n
        elif wire in (_I64, _I32):
            n = 8 if wire == _I64 else 4
            if pos + n > len(buf):
                raise ProtobufError(f"{what}: truncated fixed-width field {field}")
            val, pos = buf[pos:pos + n], pos + n
        else:
            raise ProtobufError(f"{what}: unsupported wire type {wire} (field {field})")
        yield field, wire, val


def _expect(wire: int, want: int, what: str, field: int) -> None:
    if wire != want:
        raise ProtobufError(f"{what}: field {field} has wire type {wire}, expected {want}")


def _signed64(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


# ---------------------------------------------------------------- messages


def encode_digest(d: Digest) -> bytes:
    out = b""
    if d.hash:
        out += _len_field(1, d.hash.encode("ascii"))
    if d.size:
        out += _tag(2, _VARINT) + _varint(d.size)
    return out


def decode_digest(buf: bytes) -> Digest:
    h, size = "", 0
    for field, wire, val in _fields(buf, "Digest"):
        if field == 1:
            _expect(wire, _LEN, "Digest", field)
            try:
                h = val.decode("ascii")
            except UnicodeDecodeError:
                raise ProtobufError("Digest: hash is not ASCII") from None
        elif field == 2:
            _expect(wire, _VARINT, "Digest", field)
            size = _signed64(val)
    try:
        return Digest(h, size)
    except ValueError as e:
        raise ProtobufError(f"Digest: {e}") from None


def encode_output_file(f: OutputFile) -> bytes:
    out = _len_field(1, f.path.encode("utf-8")) + _len_field(2, encode_digest(f.digest))
    if f.is_executable:
        out += _tag(4, _VARINT) + _varint(1)
    if f.contents:
        out += _len_field(5, bytes(f.contents))
    return out


def decode_output_file(buf: bytes) -> OutputFile:
    path, digest, exe, contents = "", None, False, b""
    for field, wire, val in _fields(buf, "OutputFile"):
        if field == 1:
            _expect(wire, _LEN, "OutputFile", field)
            try:
                path = val.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtobufError("OutputFile: path is not UTF-8") from None
        elif field == 2:
            _expect(wire, _LEN, "OutputFile", field)
            digest = decode_digest(val)
        elif field == 4:
            _expect(wire, _VARINT, "OutputFile", field)
            exe = bool(val)
        elif field == 5:
            _expect(wire, _LEN, "OutputFile", field)
            contents = bytes(val)
    if digest is None:
        raise ProtobufError(f"OutputFile {path!r}: no digest")
    return OutputFile(path, digest, exe, contents)


def encode_action_result(ar: ActionResult) -> bytes:
    out = b"".join(_len_field(2, encode_output_file(f)) for f in ar.output_files)
    if ar.exit_code:
        out += _tag(4, _VARINT) + _varint(ar.exit_code)
    return out


def decode_action_result(buf: bytes) -> ActionResult:
    files: list[OutputFile] = []
    exit_code = 0
    for field, wire, val in _fields(bytes(buf), "ActionResult"):
        if field == 2:
            _expect(wire, _LEN, "ActionResult", field)
            files.append(decode_output_file(val))
        elif field == 4:
            _expect(wire, _VARINT, "ActionResult", field)
            exit_code = _signed64(val)
    return ActionResult(tuple(files), exit_code)
