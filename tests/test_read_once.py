"""Each command reads each input once: the manifest (read, parsed), the lock (serialised), every
blob (read and verified from the store). Counted at the functions that do each, in-process,
on the smoke manifest built into a copy of the smoke store (every kernel a hit)."""

from __future__ import annotations

import shutil
import tomllib
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "manifests" / "smoke.toml"


@pytest.fixture
def counted(monkeypatch):
    """Counters of manifest reads, TOML parses, lock encodings and blob reads (by digest)."""
    import gemmar_aot.model.lock as lock_mod
    from gemmar_aot.store.local import DirectoryBackend

    n: Counter = Counter()
    blobs: Counter = Counter()
    read_bytes, read_text = Path.read_bytes, Path.read_text

    def counting(read):
        def f(self, *a, **k):
            if self.name == MANIFEST.name and self.resolve() == MANIFEST:
                n["manifest reads"] += 1
            return read(self, *a, **k)
        return f

    monkeypatch.setattr(Path, "read_bytes", counting(read_bytes))
    monkeypatch.setattr(Path, "read_text", counting(read_text))
    loads = tomllib.loads
    monkeypatch.setattr(tomllib, "loads", lambda *a, **k: (n.update(["TOML parses"]), loads(*a, **k))[1])
    encode = lock_mod.encode_lock_doc
    monkeypatch.setattr(lock_mod, "encode_lock_doc", lambda d: (n.update(["lock encodings"]), encode(d))[1])
    load_blob = DirectoryBackend.load_blob

    def counted_load(self, digest, size=None):
        blobs[digest] += 1
        return load_blob(self, digest, size)

    monkeypatch.setattr(DirectoryBackend, "load_blob", counted_load)
    return n, blobs


@pytest.mark.parametrize("command", ["build", "wheel"])
def test_a_command_reads_each_input_once(smoke_store, tmp_path, counted, command):
    """``gemmar-aot build`` and ``gemmar-aot wheel`` of a manifest whose kernels are all in the store:
    the manifest read and parsed once, the lock encoded once, each blob read from the store once
    (the look-up's verification, the derive check, the blob index and the wheel share the bytes)."""
    from gemmar_aot.cli import main
    from gemmar_aot.model.lock import read_lock

    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    n, blobs = counted
    args = [command, str(MANIFEST), "--store", str(store)]
    args += ["-q"] if command == "build" else ["--out", str(tmp_path / "dist")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    lock = read_lock(store / "locks" / "smoke.lock.json")
    wanted = {e.blob.hash for _p, e in lock.iter_entries()}
    assert dict(n) == {"manifest reads": 1, "TOML parses": 1, "lock encodings": 1}
    assert wanted <= set(blobs) and max(blobs.values()) == 1, blobs.most_common(3)
