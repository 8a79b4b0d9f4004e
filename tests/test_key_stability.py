"""Keys move only when bytes can (key schema 3): edits of a copy of our code, run for real.

* comments and docstrings in every file move no key, and a build against the original store
  compiles nothing;
* a builder argument moves exactly the keys of the recipes whose build runs it;
* a new recipe moves no key;
* a behaviour-preserving rewrite of the derive code (the note parser) compiles nothing: the
  records are derived again from the stored blobs, locally and from a remote cache, and the
  lock changes only where it names the derive code;
* a store built by key schema 2 (``tests/fixtures/store-key-schema-2``, made by commit
  fd3056f) is built over without an error, into the same code objects.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tree_copy
from lock_docs import decode_lock_doc

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = "manifests/dsv4-pro-wo_b.toml"
SMOKE = "manifests/smoke.toml"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "store-key-schema-2"


@pytest.fixture(scope="module")
def our_keys():
    return tree_copy.keys(None, REFERENCE, SMOKE)


@pytest.fixture(scope="module")
def documented_tree(tmp_path_factory):
    """A copy of the package and the recipes with a comment line added and the module docstring
    edited (or added) in every Python file."""
    tree = tree_copy.copy_tree(tmp_path_factory.mktemp("documented"))
    files = tree_copy.python_files(tree)
    assert len(files) > 60
    for p in files:
        tree_copy.edit_comments_and_docstrings(p)
    return tree


def test_comments_and_docstrings_in_every_file_move_no_key(documented_tree, our_keys):
    theirs = tree_copy.keys(documented_tree, REFERENCE, SMOKE)
    assert len(our_keys[REFERENCE]) == 424 and len(our_keys[SMOKE]) == 143
    assert theirs == our_keys


def _moved(a: dict, b: dict) -> set[str]:
    """The spec ids whose action key differs between two ``tree_copy.keys`` answers."""
    assert set(a) == set(b)
    return {sid for sid in a if a[sid] != b[sid]}


def _of_recipe(keys: dict, recipe: str) -> set[str]:
    return {sid for sid, (label, _key) in keys.items() if label.startswith(recipe + ":")}


def test_a_builder_argument_moves_exactly_the_keys_of_the_kernels_that_build_runs(tmp_path, our_keys):
    """split-lsa's build passes one more argument to mori's build_lsa_ar: its LSA all-reduce
    kernels move; their GEMMs (gemm-only's build) and every other mode's kernels do not."""
    tree = tree_copy.copy_tree(tmp_path / "tree")
    recipe = tree / "gemmar_aot_kernels" / "split_lsa.py"
    src = recipe.read_text()
    call = 'build_lsa_ar(make_cfg(p["cfg"]), spec.rank, **p["builder"])'
    assert call in src
    recipe.write_text(src.replace(call, call[:-1] + ", num_warps=8)"))
    theirs = tree_copy.keys(tree, REFERENCE, SMOKE)
    for m in (REFERENCE, SMOKE):
        assert _moved(our_keys[m], theirs[m]) == _of_recipe(our_keys[m], "split-lsa"), m
    moved = _moved(our_keys[SMOKE], theirs[SMOKE])
    assert {our_keys[SMOKE][sid][0].split(":")[1] for sid in moved} == {"lsa_ar"} and len(moved) == 2
    # An argument of gemv's builder call, passed by keyword now: exactly the gemv kernels move.
    gemv = tree / "gemmar_aot_kernels" / "gemv.py"
    call = 'select_config(p["n"], p["k"], p["bucket"])'
    assert call in gemv.read_text()
    gemv.write_text(gemv.read_text().replace(call, 'select_config(p["n"], p["k"], bucket=p["bucket"])'))
    after = tree_copy.keys(tree, SMOKE)[SMOKE]
    assert _moved(theirs[SMOKE], after) == _of_recipe(after, "gemv") != set()


def test_a_new_recipe_moves_no_existing_key(tmp_path, our_keys):
    tree = tree_copy.copy_tree(tmp_path / "tree")
    (tree / "gemmar_aot_kernels" / "new_mode.py").write_text(
        '"""A mode added later."""\nRECIPE = "new-mode"\n\n\ndef build(spec):\n    raise NotImplementedError\n')
    keys_py = tree / "gemmar_aot" / "compiler" / "keys.py"
    src = keys_py.read_text()
    anchor, entry = '    "gemm-only": ("kernels.gemm_only",),', '    "kernels": "gemmar_aot_kernels",'
    assert anchor in src and entry in src
    src = src.replace(anchor, anchor + '\n    "new-mode": ("kernels.new_mode",),')
    keys_py.write_text(src.replace(entry, entry + '\n    "kernels.new_mode": "gemmar_aot_kernels.new_mode",'))
    assert tree_copy.keys(tree, REFERENCE, SMOKE) == our_keys


@pytest.mark.compile
def test_a_build_by_the_documented_copy_against_the_original_store_compiles_nothing(
        documented_tree, smoke_store, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    summary = tree_copy.build(documented_tree, SMOKE, store)
    assert (summary["compiled"], summary["rederived"], summary["hits"]) == (0, 0, 143)
    assert (store / "locks" / "smoke.lock.json").read_bytes() == (smoke_store / "locks" / "smoke.lock.json").read_bytes()


# ---- derive code ----

def _parser_rewritten(tmp_path: Path) -> Path:
    """A copy whose code-object parser is rewritten, returning the same for every code object."""
    return tree_copy.rewrite_parser(tree_copy.copy_tree(tmp_path / "derive-edit"))


def _masked(doc, derive_fields=("record", "parts", "derive_code")):
    """The lock document with every value that names the derive code (directly, or through a
    record digest) replaced by a marker."""
    if isinstance(doc, dict):
        return {k: ("<derive>" if k in derive_fields else _masked(v, derive_fields)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_masked(v, derive_fields) for v in doc]
    return doc


def _lock_doc(store: Path, name: str = "smoke") -> dict:
    return decode_lock_doc((store / "locks" / f"{name}.lock.json").read_bytes())


@pytest.mark.compile
def test_a_derive_code_change_compiles_nothing_and_derives_every_record_again(smoke_store, tmp_path):
    tree = _parser_rewritten(tmp_path)
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    before = _lock_doc(store)
    summary = tree_copy.build(tree, SMOKE, store)
    assert (summary["compiled"], summary["rederived"], summary["hits"]) == (0, 143, 143)
    after = _lock_doc(store)
    # Only what names the derive code changed: its digest in the head, and the record digests.
    assert _masked(after) == _masked(before)
    ours, theirs = before["toolchain"]["ingredients"]["compiler"], after["toolchain"]["ingredients"]["compiler"]
    assert ours["derive_code"] != theirs["derive_code"] and ours["compile_code"] == theirs["compile_code"]
    # Every record names the derive code it came from; a second build has nothing to do.
    again = tree_copy.build(tree, SMOKE, store)
    assert (again["compiled"], again["rederived"]) == (0, 0)
    # And our own derive code takes the records back, again without a compile.
    back = tree_copy.build(None, SMOKE, store)
    assert (back["compiled"], back["rederived"]) == (0, 143)
    assert (store / "locks" / "smoke.lock.json").read_bytes() == (smoke_store / "locks" / "smoke.lock.json").read_bytes()


@pytest.mark.compile
def test_a_record_that_cannot_be_derived_again_is_compiled(smoke_store, tmp_path):
    """A stale record whose launcher is gone is a miss (compiled), never served as it is."""
    from gemmar_aot.store import Store
    from gemmar_aot.store.backend import record_launcher

    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    st = Store(store)
    lock = _lock_doc(store)
    key = sorted(lock["parts"][0]["kernels"])[0]
    rec = st.read_record_file(key)
    st.put_record(key, {**rec, "derive": {**rec["derive"], "code": "0" * 64}})
    st.blob_path(record_launcher(rec).hash).unlink()
    summary = tree_copy.build(None, SMOKE, store)
    assert (summary["compiled"], summary["rederived"]) == (1, 0)
    assert (store / "locks" / "smoke.lock.json").read_bytes() == (smoke_store / "locks" / "smoke.lock.json").read_bytes()


@pytest.mark.compile
def test_a_remote_entry_made_by_other_derive_code_is_derived_again_never_trusted_nor_a_miss(
        nginx, tiny_manifest, tmp_path):
    tree = _parser_rewritten(tmp_path)
    first = tree_copy.build(None, tiny_manifest, tmp_path / "a", "--remote", nginx.url)
    assert first["compiled"] == 4 and first["uploads"] == 4
    # A fresh runner with other derive code: every entry is a hit, derived again from the
    # remote's verified blobs (code object and launcher), and uploaded as derived now.
    fresh = tree_copy.build(tree, tiny_manifest, tmp_path / "b", "--remote", nginx.url)
    assert (fresh["compiled"], fresh["remote_hits"], fresh["rederived"]) == (0, 4, 4)
    assert fresh["remote"]["rederived"] == 4 and fresh["uploads"] == 4
    # The next runner of that code finds entries it made: nothing to derive.
    next_ = tree_copy.build(tree, tiny_manifest, tmp_path / "c", "--remote", nginx.url)
    assert (next_["compiled"], next_["remote_hits"], next_["rederived"]) == (0, 4, 0)
    assert _masked(_lock_doc(tmp_path / "c", "tiny")) == _masked(_lock_doc(tmp_path / "a", "tiny"))
    assert _lock_doc(tmp_path / "c", "tiny") == _lock_doc(tmp_path / "b", "tiny")


# ---- the move from key schema 2 ----

@pytest.mark.compile
def test_a_store_built_by_key_schema_2_is_built_over_into_the_same_code_objects(tmp_path):
    """Key schema 3 moves every key once (our code is hashed by normal form, per recipe): the
    old store's kernels compile again, into byte-identical code objects; its old records are
    left for ``gc``, and nothing refuses or breaks on them."""
    from gemmar_aot.store import Store

    store = tmp_path / "store"
    shutil.copytree(FIXTURE, store, ignore=shutil.ignore_patterns("README.md", "tiny.toml"))
    old_blobs = {d for d, _ in Store(store, readonly=True).local.iter_blob_files()}
    old_keys = {k for k, _ in Store(store, readonly=True).local.iter_record_files()}
    assert len(old_blobs) == 4 and len(old_keys) == 4
    summary = tree_copy.build(None, FIXTURE / "tiny.toml", store)
    assert (summary["compiled"], summary["hits"], summary["failed"]) == (4, 0, 0)
    st = Store(store, readonly=True)
    lock = _lock_doc(store, "tiny")
    code_blobs = {e["blob"]["hash"] for part in lock["parts"] for e in part["kernels"].values()}
    assert code_blobs == old_blobs, "the same code objects, byte for byte"
    new_keys = {k for k, _ in st.local.iter_record_files()} - old_keys
    assert len(new_keys) == 4
    launchers = {st.read_record_file(k)["launcher"]["hash"] for k in new_keys}
    assert {d for d, _ in st.local.iter_blob_files()} - old_blobs == launchers, "the launchers are the new blobs"
    p = tree_copy.cli(None, "verify", "--store", str(store), "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    p = tree_copy.cli(None, "gc", "--store", str(store), "--keep", str(store / "locks" / "tiny.lock.json"),
                      "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    st = Store(store, readonly=True)
    assert {k for k, _ in st.local.iter_record_files()} == new_keys
    assert {d for d, _ in st.local.iter_blob_files()} == old_blobs | launchers, "gc keeps every launcher"
    again = tree_copy.build(None, FIXTURE / "tiny.toml", store)
    assert (again["compiled"], again["hits"]) == (0, 4)
    json.dumps(again)


FIXTURE3 = Path(__file__).resolve().parent / "fixtures" / "store-key-schema-3"


@pytest.mark.compile
def test_a_store_built_by_key_schema_3_is_taken_over_without_a_compile(tmp_path):
    """Key schema 4 moves every key once (modules hashed under logical names) while no code
    changed: the build finds each kernel's schema-3 entry (keys.schema3_key), derives its record
    again from the stored blobs under the new key, and compiles nothing. The code objects are
    the fixture's, the store verifies clean, and a second build is all hits."""
    from gemmar_aot.store import Store

    store = tmp_path / "store"
    shutil.copytree(FIXTURE3, store, ignore=shutil.ignore_patterns("README.md", "tiny.toml"))
    old_blobs = {d for d, _ in Store(store, readonly=True).local.iter_blob_files()}
    old_keys = {k for k, _ in Store(store, readonly=True).local.iter_record_files()}
    assert len(old_keys) == 4
    summary = tree_copy.build(None, FIXTURE3 / "tiny.toml", store)
    assert (summary["compiled"], summary["relabelled"], summary["hits"], summary["failed"]) == (0, 4, 4, 0), summary
    st = Store(store, readonly=True)
    new_keys = {k for k, _ in st.local.iter_record_files()} - old_keys
    assert len(new_keys) == 4
    assert {d for d, _ in st.local.iter_blob_files()} == old_blobs, "no new blob: the same code objects"
    lock = _lock_doc(store, "tiny")
    assert {k for part in lock["parts"] for k in part["kernels"]} == new_keys
    p = tree_copy.cli(None, "verify", "--store", str(store), "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    again = tree_copy.build(None, FIXTURE3 / "tiny.toml", store)
    assert (again["compiled"], again["relabelled"], again["rederived"], again["hits"]) == (0, 0, 0, 4)


# ---- record schema 2: a record's blobs spelled as the lock spells them, no key moved ----

FIXTURE_RECORDS1 = Path(__file__).resolve().parent / "fixtures" / "store-record-schema-1"


@pytest.mark.compile
def test_a_store_of_record_schema_1_is_rewritten_in_schema_2_without_a_compile(tmp_path):
    """Record schema 2 names a record's code object and launcher ``{"hash", "size"}``, as a lock
    names every digest; it moves no key. A store built before it (20a7e08) verifies clean as it
    is, its schema-3 lock is refused with the fix, and the build compiles nothing: it derives each
    schema-1 record again from its verified blobs and writes it back in schema 2 under the same
    key, with no new blob. The store then verifies clean and a second build is all hits."""
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.model.schema import LockFileError
    from gemmar_aot.store import Store

    store = tmp_path / "store"
    shutil.copytree(FIXTURE_RECORDS1, store, ignore=shutil.ignore_patterns("README.md", "tiny.toml"))
    old = Store(store, readonly=True).local
    old_blobs = {d for d, _ in old.iter_blob_files()}
    on_disk = {k: old.codec.decode_frame_only(p.read_bytes()) for k, p in old.iter_record_files()}
    assert len(on_disk) == 4 and all(b'"digest"' in t and b'"schema": 1' in t for t in on_disk.values())
    lines = (store / "locks" / "tiny.lock.json").read_bytes().splitlines()
    old_lock_keys = {k for line in lines[1:] for k in json.loads(line)["kernels"]}
    assert old_lock_keys == set(on_disk)
    p = tree_copy.cli(None, "verify", "--store", str(store), "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with pytest.raises(LockFileError, match="lock schema 3 was written by an older gemmar-aot.*nothing is recompiled"):
        read_lock(store / "locks" / "tiny.lock.json")
    summary = tree_copy.build(None, FIXTURE_RECORDS1 / "tiny.toml", store)
    assert (summary["compiled"], summary["rederived"], summary["hits"], summary["failed"]) == (0, 4, 4, 0), summary
    st = Store(store, readonly=True)
    assert {d for d, _ in st.local.iter_blob_files()} == old_blobs, "no new blob: the same code objects"
    for key, path in st.local.iter_record_files():
        rec = json.loads(st.local.codec.decode_frame_only(path.read_bytes()))
        assert rec["schema"] == 2 and set(rec["blob"]) == set(rec["launcher"]) == {"hash", "size"}, key
    lock = read_lock(store / "locks" / "tiny.lock.json")
    assert set(lock.kernels()) == old_lock_keys, "the same keys"
    p = tree_copy.cli(None, "verify", "--store", str(store), "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    again = tree_copy.build(None, FIXTURE_RECORDS1 / "tiny.toml", store)
    assert (again["compiled"], again["rederived"], again["hits"]) == (0, 0, 4)
