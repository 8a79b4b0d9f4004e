"""The artifact model: the typed hand-off between the build and the runtime. Standard library only.

Everything the build tells the runtime travels in one lock file
(``<store>/locks/<manifest>.lock.json``), and this package is the only code that reads or
writes one. The types, from the leaves up:

* :class:`Digest` -- a blob named by sha256 *and* size, as Bazel's ``Digest``: a reader
  knows how many bytes to expect before it reads them.
* :class:`TupleId` -- what makes a manifest tuple one build (mode, M, N, K, world, quant,
  wire, tile, queues, window cap). :class:`TupleKey` is what the runtime looks kernels up by
  (the identity without M and the window cap).
* :class:`WindowLayout` -- every offset of the symmetric window the kernels compiled in
  (``gemmar_aot.model.layout.window_layout`` returns one); :class:`CallLayout` holds the values that depend on
  the M being served.
* :class:`LaunchEntry` -- one kernel to launch: its kind, action key, blob, launch record and
  the digest of the action-cache record it was made from.
* :class:`RankLaunches` -- one rank's launches and self-test sequence;
  :class:`LockTuple` -- one tuple and its ranks; :class:`Lock` -- the whole file.

The document (schema :data:`LOCK_SCHEMA`, :meth:`Lock.to_json`) keeps what every rank
shares apart from what one rank launches:

* the head: the manifest, arch, toolchain and env; ``launch_records``, each distinct launch
  record once (without the kernel symbol, which is all that differs between ranks); and
  ``tuples``, each tuple's identity, manifest line, window layout and the ranks it was
  built for; and the other families' lists: ``ep`` (EP v2's FlyDSL backend: each entry's
  configuration, window layout and every rank's kernels), ``hipcc`` (mori's hipcc-JIT code
  objects, since schema 6) and ``jitv2`` (mori's JIT v2 code objects, since schema 7);
* ``parts``, one per rank: ``kernels``, the rank's kernels by action key (kind, blob, kernel
  symbol, record digest, launch record index), and ``launches``, for each tuple, the action
  keys the rank launches and self-tests, in order.

The file is that document as JSON Lines (:func:`encode_lock_doc`): the head on the first
line, naming each part by its :class:`Digest`, then one line per part. A rank getting ready
parses the head and its own part, a fifth of the reference lock; a part's bytes are
checked against the head's digest before they are parsed, the first time anything of it is
used (:meth:`Lock.check_parts` checks them all at once, as writing does).
:meth:`Lock.to_bytes` is the one canonical serialisation (the same lock always gives the
same bytes); reading checks every field and raises :class:`LockFileError` naming the file,
the JSON path, the value and the fix. A lock of another schema is refused, never migrated: a
newer one asks for a newer gemmar-aot, an older one for a rebuild. An artifact wheel ships
the same bytes in one zstd frame (``lock.json.zst``, :func:`compress_lock`);
:meth:`Lock.from_bytes` recognises the frame's magic number and decompresses it
(``zstandard``, imported only then), checking the frame's checksum.


Modules, each one job, none importing the store, the build, the compiler or the package
(``tests/test_imports.py``): :mod:`.layout`, :mod:`.types`, :mod:`.schema`, :mod:`.lock_codec`,
:mod:`.validate`, :mod:`.lock`. The record digest a lock names each record by is the
store's (:mod:`gemmar_aot.store.record`).
"""
