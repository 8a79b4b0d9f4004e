"""The lock document's schema: its version (:data:`LOCK_SCHEMA`), the members of each of its
objects, and :class:`LockFileError`, which every refusal of a lock file raises."""

from __future__ import annotations


from gemmar_aot.util.errors import GemmarError
from gemmar_aot.model.launch import PARAM_SIZES
from gemmar_aot.model.layout import _WINDOW_FIELDS, _WINDOW_STR_FIELDS, _WINDOW_TUPLE_FIELDS
from gemmar_aot.model.types import _TUPLE_ID_FIELDS

#: Version of the lock-file schema this gemmar-aot reads and writes.
#: 2: typed model; kernels named once by action key, launch records de-duplicated, blobs and
#: records as Digest(hash, size), the window layout split into shared and per-M values.
#: 3: JSON Lines, a head and one part per rank, so a rank reads its own kernels only.
#: 4: schema 3 and the ``ep`` list of built [[ep]] entries (written only for a manifest with some).
#: 5: the records it names are of record schema 2 (``store.backend.RECORD_SCHEMA``: their blobs
#:    spelled ``{"hash", "size"}``, as a lock spells every digest), so every record digest moved;
#:    one schema whether or not the manifest has [[ep]] entries: ``ep`` is always there, and a
#:    part's launch item indexes ``tuples`` followed by ``ep`` (item ``len(tuples) + i`` is entry i).
#: 6: schema 5 and the ``hipcc`` list: the code objects of mori's hipcc-JIT kernels the build made
#:    ([[hipcc]] entries), each a variant (source, arch, NIC, host proxy) and its kernel (action key,
#:    blob, record, symbols), in the head. A schema-5 lock is read as one with no such list.
#: 7: schema 6 and the ``jitv2`` list: the code objects of mori's JIT v2 kernels the build made
#:    (HIP-backend [[ep]] entries), each a plan, arch and NIC variant, mori's cache entry for it, the
#:    hipcc identity it was keyed with, and its kernel, in the head. Older locks read as having none.
LOCK_SCHEMA = 7
#: The schemas this gemmar-aot reads.
READ_SCHEMAS = (5, 6, 7)
_REBUILD = "rebuild the lock with `gemmar-aot build MANIFEST`"


class LockFileError(GemmarError, ValueError):
    """A lock file (or a lock being written) is malformed, or of a schema this version does not read."""


class LockSchemaError(LockFileError):
    """A lock of a schema this gemmar-aot does not read: written by an older or a newer gemmar-aot.
    Not damage (``gemmar-aot inspect`` says so); ``str(e)`` names the schema and the fix."""


# ---------------------------------------------------------------------------
# Validation
#
# Every check has a fast path made of C-level operations (a key-set comparison, a
# set of element types) and, only when that fails, a slow path that finds the first
# offending value and names it. Reading the reference lock is dominated by json.loads.
# ---------------------------------------------------------------------------

_TOP = ("schema", "manifest", "arch", "code_object_version", "toolchain", "env", "launch_records", "tuples",
        "ep", "hipcc", "jitv2", "parts")
#: The lock schema each optional member first appeared in.
_SINCE = {"hipcc": 6, "jitv2": 7}


def top_keys(schema: int) -> tuple[str, ...]:
    """The members of a lock head of ``schema`` (one of :data:`READ_SCHEMAS`)."""
    return tuple(k for k in _TOP if schema >= _SINCE.get(k, 0))
_EP_KEYS = ("config", "source", "arena", "ranks")
_PART_KEYS = ("rank", "kernels", "launches")
_PART_REF_KEYS = ("rank", "hash", "size")
_TUPLE_KEYS = (*_TUPLE_ID_FIELDS, "source", "layout", "ranks")
_KERNEL_KEYS = ("kind", "blob", "symbol", "record", "launch")
_RECORD_KEYS = ("params", "args", "kernel_args", "kernel_arg_types", "program", "grid", "block", "stream_param")
_ARG_KEYS = ("name", "kind", "params", "dtype")
_DIGEST_KEYS = ("hash", "size")
_ARG_KINDS = ("tensor", "i32", "i64", "stream")
_PARAM_TYPES = tuple(PARAM_SIZES)
_WINDOW_KEYS = (*_WINDOW_FIELDS, "call")
_WINDOW_INT_FIELDS = tuple(f for f in _WINDOW_FIELDS if f not in _WINDOW_STR_FIELDS + _WINDOW_TUPLE_FIELDS)
