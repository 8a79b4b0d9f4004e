"""The lock bundle (gemmar_aot.model.bundle): one place names the lock's files and orders their
writing; every other module asks it."""

from __future__ import annotations

import ast
from pathlib import Path

from gemmar_aot.model.bundle import LockBundle

REPO = Path(__file__).resolve().parents[1]


def test_the_files_beside_a_store_lock_and_a_wheel_lock():
    b = LockBundle.in_store("/s", "dsv4-pro-wo_b")
    assert b.lock == Path("/s/locks/dsv4-pro-wo_b.lock.json")
    assert (b.record_index.name, b.blob_index.name, b.envelope.name) == (
        "dsv4-pro-wo_b.records.zst", "dsv4-pro-wo_b.blobs.zst", "dsv4-pro-wo_b.intoto.jsonl")
    assert LockBundle.in_store("/s", "m", "nightly").lock.name == "m.nightly.lock.json"
    assert LockBundle.in_store("/s", "m", "default") == LockBundle.in_store("/s", "m")
    w = LockBundle("pkg/lock.json.zst")
    assert (w.record_index, w.envelope) == (Path("pkg/lock.records.zst"), Path("pkg/lock.intoto.jsonl"))


def test_the_indexes_are_written_before_the_lock(tmp_path, smoke_lock, monkeypatch):
    """A reader never finds the new lock beside the old indexes (it would bind records another
    build wrote): every index is published before the lock is."""
    import gemmar_aot.util.atomic_write as aw

    order = []
    real = aw.atomic_write_bytes

    def spy(path, data, **kw):
        order.append(Path(path).name)
        return real(path, data, **kw)

    monkeypatch.setattr(aw, "atomic_write_bytes", spy)
    import gemmar_aot.model.lock as lock_mod

    monkeypatch.setattr(lock_mod, "atomic_write_bytes", spy)
    (tmp_path / "locks").mkdir()
    got = LockBundle.in_store(tmp_path, "smoke").write(smoke_lock, record_index=b"r", blob_index=b"b")
    assert got == tmp_path / "locks" / "smoke.lock.json"
    assert order == ["smoke.records.zst", "smoke.blobs.zst", "smoke.lock.json"]


def test_no_other_module_spells_the_bundle_s_file_names():
    """The names of the files beside a lock are the bundle's: no other module builds them."""
    spelled = {}
    for p in sorted((REPO / "gemmar_aot").rglob("*.py")):
        if p.name == "bundle.py" or "__pycache__" in p.parts:
            continue
        tree = ast.parse(p.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs and n.value in (
                    ".records.zst", ".blobs.zst", ".intoto.jsonl", ".lock.json"):
                spelled.setdefault(str(p.relative_to(REPO)), []).append(n.value)
    assert spelled == {}
