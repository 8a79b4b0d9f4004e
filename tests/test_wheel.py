"""Prebuilt artifact wheels (gemmar_aot.package, ``gemmar-aot wheel`` / ``inspect``).

Fast tier: a synthetic store and lock (random bytes as "code objects") exercise the
writer, the zip layout, RECORD, determinism and ``inspect``'s tamper detection.

Compile tier (``-m compile``): the real smoke artifacts (the session ``smoke_build``,
or GEMMAR_AOT_TEST_SMOKE_STORE) are packed into wheels, ``pip install``ed into fresh
virtual environments (``python -m venv`` + ``pip install --no-deps --no-index``), and
the runtime in that environment -- no artifacts= argument, no env var, only the
installed entry points -- loads every kernel with FakeHipDriver / FakeCommunicator.
The fresh venvs see gemmar_aot, torch and the test fakes through a ``.pth`` file that
adds this checkout's .venv site-packages (no network). No test here compiles a kernel:
every wheel build reuses the smoke store (asserted: 0 compiled).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import random
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from gemmar_aot.store.backend import RESERVED_FIELDS
from click.testing import CliRunner

from index_frames import find_line, read_frames, write_frames

from gemmar_aot.model.lock import Lock
from gemmar_aot.model.types import Digest, LaunchEntry, LockTuple, ManifestRef, RankLaunches, ToolchainInfo, TupleId
from gemmar_aot.cli import main
from gemmar_aot.store import CorruptArtifactError, Store
from gemmar_aot.store.pack import PackBackend
from gemmar_aot.package.archive import zip_date_time
from gemmar_aot.package.inspect import inspect_wheel
from gemmar_aot.package.wheel_layout import WheelError, check_version, default_version, names, requires_dist
from gemmar_aot.package.wheel import wheel_from_lock

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SMOKE = ROOT / "manifests" / "smoke.toml"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _members(whl: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(whl) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _rewrite_zip(src: Path, dst: Path, change) -> str:
    """Copy the wheel ``src`` to ``dst`` with ``change(name, data) -> data | None`` applied to the
    first member it changes (RECORD untouched). Returns the changed member's name."""
    changed = None
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for zi in zin.infolist():
            data = zin.read(zi.filename)
            if changed is None:
                new = change(zi.filename, data)
                if new is not None:
                    data, changed = new, zi.filename
            zout.writestr(zi, data)
    assert changed is not None
    return changed


def _flip(data: bytes) -> bytes:
    b = bytearray(data)
    b[len(b) // 2] ^= 0xFF
    return bytes(b)


def _pack_entry(pack: bytes, digest: str) -> tuple[int, int]:
    """(absolute offset, length) of the first entry of ``digest`` in pack bytes."""
    from gemmar_aot.store.pack import PREFIX_HEX, read_index

    index, start = read_index(pack, "<pack>")
    off, n = index[digest[:PREFIX_HEX]][0]
    return start + off, n


def _flip_in_pack(pack: bytes, digest: str) -> bytes:
    off, n = _pack_entry(pack, digest)
    b = bytearray(pack)
    b[off + n // 2] ^= 0xFF
    return bytes(b)


def _run(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


# ---------------------------------------------------------------------------
# a synthetic store + lock (fast tier)
# ---------------------------------------------------------------------------

SYNTH_MANIFEST = b'[manifest]\nname = "synth_test.v1"\narch = "gfx950"\n\n[[tuple]]\ntransport = "fused-sdma"\n'


def _synth_blob(rng: random.Random, i: int) -> bytes:
    # structured like a code object: shared boilerplate + per-kernel bytes (a dictionary pays)
    common = b"".join(bytes([(j * 7) % 251]) * 3 for j in range(2000))
    return common + rng.randbytes(600) + f"kernel-{i}".encode() * 40


def make_synth(root: Path, *, n_blobs: int = 40, manifest: bytes = SYNTH_MANIFEST) -> Lock:
    """A store at ``root`` with ``n_blobs`` blobs and a lock naming them; returns the lock."""
    from synth_lock import launch_record, window

    rng = random.Random(1234)
    st = Store(root, durable=False)
    blobs = [st.put_blob(_synth_blob(rng, i)) for i in range(n_blobs)]
    tuples = []
    per = n_blobs // 4
    for ti, (m, gd) in enumerate([(256, "bf16"), (512, "bf16"), (512, "fp8")]):
        ranks = []
        for r in range(2):
            chunk = blobs[(ti * 2 + r) * per // 2:(ti * 2 + r) * per // 2 + per]
            ranks.append(RankLaunches(r, self_test=(), launches=tuple(
                LaunchEntry(kind="gemm", key=_sha(f"{ti}/{r}/{j}".encode()), blob=b,
                            launch=launch_record(f"k{j}"), record=Digest(_sha(f"record {ti}/{r}/{j}".encode()), 99))
                for j, b in enumerate(chunk))))
        tuples.append(LockTuple(TupleId("fused-sdma", m, 1024, 256, 2, "blockscale", gd, "lsa"), f"synth.toml:{ti}",
                                window(2, 1024, 512, m, gd, "lsa"), tuple(ranks)))
    return Lock(manifest=ManifestRef("synth_test.v1", "gfx950", _sha(manifest)), arch="gfx950",
                code_object_version=6, toolchain=ToolchainInfo("ab" * 32, {"toolchain": {"python": "3.11.7"}}),
                env={}, tuples=tuple(tuples))


@pytest.fixture()
def synth(tmp_path):
    root = tmp_path / "synth-store"
    lock = make_synth(root)
    return lock, root


def _synth_wheel(lock, root, out, **kw) -> dict:
    return wheel_from_lock(lock, root, None, out, manifest_text=SYNTH_MANIFEST, manifest_file="synth.toml", **kw)


def test_names_version_and_requires():
    assert names("dsv4-pro-wo_b") == ("gemmar-artifacts-dsv4-pro-wo-b", "gemmar_artifacts_dsv4_pro_wo_b")
    assert names("Smoke.V2__x") == ("gemmar-artifacts-smoke-v2-x", "gemmar_artifacts_smoke_v2_x")
    v = default_version(b"lock bytes")
    assert v == "1.0.0+" + _sha(b"lock bytes")[:12] == default_version(b"lock bytes", "default")
    assert default_version(b"lock bytes", "nightly") == "1.0.0+nightly." + _sha(b"lock bytes")[:12]
    assert check_version(default_version(b"lock bytes", "nightly"))
    assert check_version("2.1.0rc1") == "2.1.0rc1" and check_version("1.0.0+b7.x") == "1.0.0+b7.x"
    for bad in ("v1.0", "1.0-1", "01.0", "1.0.0+", "1.0.0+UP"):
        with pytest.raises(WheelError, match="PEP 440"):
            check_version(bad)
    assert requires_dist() == "gemmar-aot<1,>=0.1.0"


def test_source_date_epoch(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert zip_date_time() == (1980, 1, 1, 0, 0, 0)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000001")  # 2023-11-14 22:13:21 UTC, odd second
    assert zip_date_time() == (2023, 11, 14, 22, 13, 20)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")  # before zip's epoch: clamped
    assert zip_date_time() == (1980, 1, 1, 0, 0, 0)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(WheelError, match="SOURCE_DATE_EPOCH"):
        zip_date_time()


def test_layout_record_and_zip_metadata(synth, tmp_path):
    lock, root = synth
    s = _synth_wheel(lock, root, tmp_path / "dist")
    whl = Path(s["wheel"])
    dist, pkg = "gemmar-artifacts-synth-test-v1", "gemmar_artifacts_synth_test_v1"
    assert (s["distribution"], s["package"]) == (dist, pkg)
    assert whl.name == f"{pkg}-{s['version']}-py3-none-any.whl"
    files = _members(whl)
    di = f"{pkg}-{s['version']}.dist-info"
    names_ = list(files)
    # package files sorted, then the dist-info with RECORD last
    assert names_[-1] == f"{di}/RECORD"
    pkg_files = [n for n in names_ if n.startswith(pkg + "/")]
    assert pkg_files == sorted(pkg_files) and names_[:len(pkg_files)] == pkg_files
    assert {f"{pkg}/__init__.py", f"{pkg}/lock.json.zst", f"{pkg}/BUILD_INFO.json", f"{pkg}/store/STORE_FORMAT",
            f"{di}/METADATA", f"{di}/WHEEL", f"{di}/entry_points.txt"} <= set(files)
    # one pack file instead of a zip entry per blob: exactly the lock's blobs, plus the
    # dictionary once (no spare copy in a wheel), each verified on load
    from gemmar_aot.store.pack import PREFIX_HEX, read_index

    assert [n for n in files if n.endswith(".zst")] == [f"{pkg}/lock.json.zst"]
    assert f"{pkg}/store/blobs.pack" in files and f"{pkg}/lock.json" not in files
    pack = files[f"{pkg}/store/blobs.pack"]
    index, _start = read_index(pack, "pack")
    wanted = lock.blob_digests()
    assert s["dictionary"] and set(index) == {d[:PREFIX_HEX] for d in wanted | {s["dictionary"]}}
    assert all(len(index[d[:PREFIX_HEX]]) == 1 for d in wanted | {s["dictionary"]})
    reader = PackBackend(".", data=pack, where="pack")
    src = Store(root, readonly=True)
    assert all(reader.load_blob(d) == src.load_blob(d) for d in wanted)
    assert not any("/ac/" in n for n in files)  # no records
    # the lock: its canonical bytes in one zstd frame with content size and checksum
    import zstandard

    lz = files[f"{pkg}/lock.json.zst"]
    params = zstandard.get_frame_parameters(lz)
    assert params.has_checksum and params.content_size == len(read_lock_bytes(lock))
    assert zstandard.ZstdDecompressor().decompress(lz) == read_lock_bytes(lock)
    assert Lock.from_bytes(lz, "w") == lock and len(lz) < len(read_lock_bytes(lock)) / 3
    # metadata
    meta = files[f"{di}/METADATA"].decode()
    assert f"Name: {dist}\n" in meta and f"Version: {s['version']}\n" in meta
    assert "Requires-Dist: gemmar-aot<1,>=0.1.0\n" in meta
    wheel = files[f"{di}/WHEEL"].decode()
    assert "Root-Is-Purelib: true\n" in wheel and "Tag: py3-none-any\n" in wheel and "Wheel-Version: 1.0\n" in wheel
    assert files[f"{di}/entry_points.txt"] == f"[gemmar_aot.artifacts]\nsynth_test.v1 = {pkg}:locate\n".encode()
    # RECORD: every other file with its urlsafe-b64 sha256 and size; RECORD itself without
    rows = [ln.split(",") for ln in files[f"{di}/RECORD"].decode().splitlines()]
    rec = {r[0]: (r[1], r[2]) for r in rows}
    assert set(rec) == set(files)
    assert rec[f"{di}/RECORD"] == ("", "")
    for n, data in files.items():
        if n != f"{di}/RECORD":
            h = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert rec[n] == (h, str(len(data)))
    # fixed zip metadata: date, permissions, system; zstd frames stored, the pack and text deflated
    with zipfile.ZipFile(whl) as zf:
        for zi in zf.infolist():
            assert zi.date_time == (1980, 1, 1, 0, 0, 0)
            assert zi.external_attr >> 16 == 0o100644 and zi.create_system == 3
            assert zi.compress_type == (zipfile.ZIP_STORED if zi.filename.endswith(".zst")
                                        else zipfile.ZIP_DEFLATED)
    # BUILD_INFO
    info = json.loads(files[f"{pkg}/BUILD_INFO.json"])
    assert info["manifest"]["text"].encode() == SYNTH_MANIFEST
    assert info["manifest"]["digest"] == {"hash": _sha(SYNTH_MANIFEST), "size": len(SYNTH_MANIFEST)}
    assert info["manifest"]["file"] == "synth.toml" and info["arch"] == "gfx950"
    assert info["toolchain"]["digest"] == "ab" * 32
    plain = read_lock_bytes(lock)
    assert info["format"] == 2 and info["lock"]["digest"] == {"hash": _sha(plain), "size": len(plain)}
    assert info["lock"]["file"] == "lock.json.zst" and info["lock"]["file_size"] == len(lz)
    assert s["version"] == "1.0.0+" + info["lock"]["digest"]["hash"][:12]
    assert str(tmp_path) not in json.dumps(info)  # no paths


def read_lock_bytes(lock) -> bytes:
    return lock.to_bytes()


def test_same_lock_same_bytes_whatever_the_store(synth, tmp_path, monkeypatch):
    lock, root = synth
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    a = _synth_wheel(lock, root, tmp_path / "a")
    # another path, and a store with another history: the blobs re-encoded without a dictionary
    other = tmp_path / "elsewhere" / "store"
    st = Store(other, durable=False, level=3)
    src = Store(root, readonly=True)
    for d in sorted(lock.blob_digests()):
        st.put_blob(src.load_blob(d), use_dictionary=False)
    some = lock.tuples[0].ranks[0].launches[0].blob.hash
    assert src.blob_path(some).read_bytes() != st.blob_path(some).read_bytes()  # other file bytes
    b = _synth_wheel(copy.deepcopy(lock), other, tmp_path / "b" / "c")
    assert Path(a["wheel"]).name == Path(b["wheel"]).name
    assert Path(a["wheel"]).read_bytes() == Path(b["wheel"]).read_bytes()
    # a changed lock is a new version
    lock2 = replace(lock, env={"X": "1"})
    c = _synth_wheel(lock2, root, tmp_path / "a")
    assert c["version"] != a["version"] and c["wheel"] != a["wheel"]
    # --version is taken verbatim; SOURCE_DATE_EPOCH moves every date
    d = _synth_wheel(lock, root, tmp_path / "d", version="3.1.4")
    assert Path(d["wheel"]).name.startswith("gemmar_artifacts_synth_test_v1-3.1.4-py3-none-any")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    e = _synth_wheel(lock, root, tmp_path / "e")
    with zipfile.ZipFile(e["wheel"]) as zf:
        assert {zi.date_time for zi in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}


def test_refuses_a_lock_from_another_manifest_or_with_missing_blobs(synth, tmp_path):
    lock, root = synth
    with pytest.raises(WheelError, match="another version of the manifest"):
        wheel_from_lock(lock, root, None, tmp_path / "o", manifest_text=SYNTH_MANIFEST + b"# edited\n",
                        manifest_file="synth.toml")
    gone = lock.tuples[1].ranks[0].launches[0].blob.hash
    Store(root).blob_path(gone).unlink()
    with pytest.raises(WheelError, match=f"(?s)no wheel written.*{gone}"):
        _synth_wheel(lock, root, tmp_path / "o")
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


def test_inspect_reports_and_verifies(synth, tmp_path):
    lock, root = synth
    s = _synth_wheel(lock, root, tmp_path / "dist")
    r = inspect_wheel(s["wheel"])
    assert r["ok"] and r["problems"] == []
    assert r["distribution"] == s["distribution"] and r["version"] == s["version"]
    assert r["entry_points"] == [f"synth_test.v1 = {s['package']}:locate"]
    assert r["arch"] == "gfx950" and r["toolchain"]["digest"] == "ab" * 32
    assert r["manifest"]["sha256"] == _sha(SYNTH_MANIFEST) and r["manifest"]["text"].encode() == SYNTH_MANIFEST
    assert [(g["transport"], g["m"], g["wire"]) for g in r["coverage"]] == [
        ("fused-sdma", [256, 512], "bf16"), ("fused-sdma", [512], "fp8/lsa")]
    assert r["code_objects"] == len(lock.blob_digests())
    assert r["kernels"] == len(lock.action_keys())
    sz = r["sizes"]
    assert sz["wheel_bytes"] == Path(s["wheel"]).stat().st_size == s["wheel_bytes"]
    assert sz["raw_bytes"] == s["raw_bytes"] and sz["blob_bytes"] == s["blob_bytes"] < sz["raw_bytes"]
    res = _run("inspect", s["wheel"])
    assert res.exit_code == 0, res.output
    for text in ("gemmar-artifacts-synth-test-v1", "arch gfx950", "toolchain default " + "ab" * 32, "sha256 " + _sha(SYNTH_MANIFEST),
                 "M=256,512 N=1024 K=256 world=2 blockscale wire=bf16", "wire=fp8/lsa", f"{r['code_objects']} code objects",
                 "raw code objects", "| transport = \"fused-sdma\"", "verified:"):
        assert text in res.output, text
    res = _run("inspect", s["wheel"], "--json")
    assert res.exit_code == 0 and json.loads(res.output)["ok"] is True


def test_a_damaged_dictionary_in_the_wheel_is_refused_naming_the_pack(synth, tmp_path):
    """The wheel holds its dictionary once (no spare: reinstalling is the fix); a flipped byte
    in it is refused at load, naming the pack and the dictionary, and found by inspect."""
    lock, root = synth
    s = _synth_wheel(lock, root, tmp_path / "dist")
    pack = _members(Path(s["wheel"]))[f"{s['package']}/store/blobs.pack"]
    PackBackend(".", data=pack, where="pack").load_blob(next(iter(lock.blob_digests())))  # intact: loads
    damaged = _flip_in_pack(pack, s["dictionary"])
    assert damaged != pack
    reader = PackBackend(".", data=damaged, where="site/pkg/store/blobs.pack")
    some = next(iter(lock.blob_digests()))
    with pytest.raises(CorruptArtifactError, match="(?s)site/pkg/store/blobs.pack.*dictionary|dictionary.*site/pkg"):
        reader.load_blob(some)
    bad = tmp_path / "bad" / Path(s["wheel"]).name
    bad.parent.mkdir()
    _rewrite_zip(Path(s["wheel"]), bad, lambda n, d: damaged if n.endswith("/store/blobs.pack") else None)
    r = inspect_wheel(bad)
    assert not r["ok"] and any("blobs.pack: RECORD says" in p for p in r["problems"])
    assert any("dictionary" in p for p in r["problems"]), r["problems"]


def test_a_damaged_compressed_lock_is_refused_at_load_naming_the_path(synth, tmp_path):
    """One flipped byte in the installed lock.json.zst: the runtime's lock reader refuses it
    (the frame's checksum), naming the file and the fix; inspect reports it too."""
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.model.schema import LockFileError
    from gemmar_aot.runtime import load_artifacts

    lock, root = synth
    s = _synth_wheel(lock, root, tmp_path / "dist")
    site_dir = tmp_path / "site"
    with zipfile.ZipFile(s["wheel"]) as zf:
        zf.extractall(site_dir)
    lz = site_dir / s["package"] / "lock.json.zst"
    assert read_lock(lz) == lock
    data = bytearray(lz.read_bytes())
    data[len(data) // 2] ^= 0x01
    lz.write_bytes(bytes(data))
    with pytest.raises(LockFileError, match="does not decompress") as ei:
        read_lock(lz)
    assert str(lz) in str(ei.value) and "reinstall" in str(ei.value)
    with pytest.raises(LockFileError, match="does not decompress") as ei:
        load_artifacts((str(lz), str(site_dir / s["package"] / "store")))
    assert str(lz) in str(ei.value)
    bad = tmp_path / "bad" / Path(s["wheel"]).name
    bad.parent.mkdir()
    _rewrite_zip(Path(s["wheel"]), bad, lambda n, d: bytes(data) if n.endswith("/lock.json.zst") else None)
    r = inspect_wheel(bad)
    assert not r["ok"] and any("lock.json.zst: RECORD says" in p for p in r["problems"])
    assert any("lock.json.zst is a zstd-compressed lock that does not decompress" in p for p in r["problems"])


@pytest.mark.parametrize("what", ["blob", "lock", "extra", "removed"])
def test_inspect_finds_tampering(synth, tmp_path, what):
    lock, root = synth
    s = _synth_wheel(lock, root, tmp_path / "dist")
    bad = tmp_path / "bad" / Path(s["wheel"]).name
    bad.parent.mkdir()
    target = lock.tuples[0].ranks[1].launches[2].blob.hash
    is_pack = lambda n: n.endswith("/store/blobs.pack")  # noqa: E731
    if what == "blob":
        name = _rewrite_zip(Path(s["wheel"]), bad, lambda n, d: _flip_in_pack(d, target) if is_pack(n) else None)
        expect = [f"{name}: RECORD says", f"blob {target}: corrupt blob"]
    elif what == "lock":
        import zstandard

        def edit_lock(lz: bytes) -> bytes:  # a well-formed frame holding edited JSON
            text = zstandard.ZstdDecompressor().decompress(lz)
            assert b'"m":256' in text or b'"m": 256' in text
            text = text.replace(b'"m":256', b'"m":768').replace(b'"m": 256', b'"m": 768')
            return zstandard.ZstdCompressor(level=19, write_checksum=True).compress(text)

        name = _rewrite_zip(Path(s["wheel"]), bad, lambda n, d: edit_lock(d) if n.endswith("/lock.json.zst") else None)
        expect = [f"{name}: RECORD says", "lock.json.zst does not have the sha256"]
    elif what == "extra":
        from gemmar_aot.store.pack import write_pack

        def add_entry(pack: bytes) -> bytes:
            rd = PackBackend(".", data=pack, where="p")
            blobs = {d: [rd.load_blob_file(d)] for d in lock.blob_digests()}
            blobs["0" * 64] = [b"x"]
            dd = next(iter(rd.dictionary_refs()))
            blobs[dd] = [rd.load_blob_file(dd)]
            return write_pack(blobs)

        name = _rewrite_zip(Path(s["wheel"]), bad, lambda n, d: add_entry(d) if is_pack(n) else None)
        expect = [f"{name}: RECORD says", "a blob the lock does not name"]
    else:
        from gemmar_aot.store.pack import write_pack

        def drop_entry(pack: bytes) -> bytes:
            rd = PackBackend(".", data=pack, where="p")
            blobs = {d: [rd.load_blob_file(d)] for d in lock.blob_digests() if d != target}
            dd = next(iter(rd.dictionary_refs()))
            blobs[dd] = [rd.load_blob_file(dd)]
            return write_pack(blobs)

        name = _rewrite_zip(Path(s["wheel"]), bad, lambda n, d: drop_entry(d) if is_pack(n) else None)
        expect = [f"{name}: RECORD says", f"blob {target} is not in"]
    r = inspect_wheel(bad)
    assert not r["ok"]
    for e in expect:
        assert any(e in p for p in r["problems"]), (e, r["problems"])
    res = _run("inspect", bad)
    assert res.exit_code == 1 and "TAMPERED" in res.output and "modified after it was built" in res.output


def test_inspect_refuses_what_is_not_an_artifact_wheel(tmp_path):
    p = tmp_path / "x.whl"
    p.write_bytes(b"not a zip")
    with pytest.raises(WheelError, match="not a wheel"):
        inspect_wheel(p)
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("foo-1.0.dist-info/RECORD", "")
        zf.writestr("foo/__init__.py", "")
    with pytest.raises(WheelError, match="not a gemmar-aot artifact wheel"):
        inspect_wheel(p)


OLD_WHEEL = next((Path(__file__).resolve().parent / "fixtures" / "wheel-lock-schema-3").glob("*.whl"))


def test_inspect_says_a_wheel_of_an_older_lock_schema_is_another_schema_not_damage(tmp_path):
    """A wheel 20a7e08 built (lock schema 3, records of record schema 1) is intact: inspect names
    the schema and the fix, exits 3, and never calls it tampered. Its bytes are still checked: a
    file added to it, or its lock edited with RECORD rewritten to match (BUILD_INFO.json's sha256
    no longer does), is tampering all the same."""
    r = inspect_wheel(OLD_WHEEL)
    assert not r["ok"] and r["problems"] == [] and r["files_checked"] == 10
    assert "lock schema 3 was written by an older gemmar-aot" in r["other_schema"]
    assert "rebuild it with `gemmar-aot build MANIFEST`" in r["other_schema"]
    res = _run("inspect", OLD_WHEEL, "--no-manifest")
    assert res.exit_code == 3 and "TAMPERED" not in res.output and "OTHER SCHEMA" in res.output, res.output
    assert "signature: none" in res.output  # the envelope is still looked for
    assert "not damaged as far as this gemmar-aot can tell (10 files match RECORD)" in res.output
    added = tmp_path / OLD_WHEEL.name
    shutil.copy(OLD_WHEEL, added)
    with zipfile.ZipFile(added, "a") as zf:
        zf.writestr("gemmar_artifacts_tiny/extra.py", "print('not built')\n")
    r = inspect_wheel(added)
    assert [p for p in r["problems"] if "extra.py: not listed in RECORD" in p] and r["other_schema"]
    res = _run("inspect", added, "--json")
    assert res.exit_code == 1 and json.loads(res.output)["problems"] == r["problems"]
    import zstandard

    from gemmar_aot.package.archive import record_hash

    edited = tmp_path / "edited" / OLD_WHEEL.name
    edited.parent.mkdir()
    with zipfile.ZipFile(OLD_WHEEL) as zf:
        files = {i.filename: zf.read(i) for i in zf.infolist()}
    lock_name = "gemmar_artifacts_tiny/lock.json.zst"
    plain = zstandard.ZstdDecompressor().decompress(files[lock_name])
    assert b'"symbol":"' in plain
    new_lock = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(plain.replace(b'"symbol":"', b'"symbol":"x', 1))
    record_name = next(n for n in files if n.endswith(".dist-info/RECORD"))
    files[record_name] = files[record_name].replace(
        f"{lock_name},{record_hash(files[lock_name])},{len(files[lock_name])}".encode(),
        f"{lock_name},{record_hash(new_lock)},{len(new_lock)}".encode())
    files[lock_name] = new_lock
    with zipfile.ZipFile(edited, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    r = inspect_wheel(edited)
    assert r["problems"] == [f"{lock_name} does not have the sha256 BUILD_INFO.json records"], r["problems"]
    assert r["other_schema"] and _run("inspect", edited, "--json").exit_code == 1


def test_unpacked_package_locates_its_lock_and_store(synth, tmp_path, monkeypatch):
    import importlib

    from gemmar_aot.runtime import load_artifacts

    lock, root = synth
    s = _synth_wheel(lock, root, tmp_path / "dist")
    site_dir = tmp_path / "site"
    with zipfile.ZipFile(s["wheel"]) as zf:
        zf.extractall(site_dir)
    monkeypatch.syspath_prepend(str(site_dir))
    mod = importlib.import_module(s["package"])
    lock_path, store_root = mod.locate()
    assert lock_path == str(site_dir / s["package"] / "lock.json.zst") and mod.MANIFEST == "synth_test.v1"
    assert store_root == str(site_dir / s["package"] / "store") and mod.__version__ == s["version"]
    arts = load_artifacts(mod.locate())
    assert sorted((k.gather_dtype, m) for k, by_m in arts.index.items() for m in by_m) == [
        ("bf16", 256), ("bf16", 512), ("fp8", 512)]
    assert arts.store(arts.sources[0]).readonly
    digest = lock.tuples[0].ranks[0].launches[0].blob.hash
    assert arts.store(arts.sources[0]).load_blob(digest) == Store(root).load_blob(digest)



@pytest.mark.compile
def test_a_wheel_per_toolchain_profile(tmp_path, tiny_manifest, monkeypatch):
    """`gemmar-aot wheel --toolchain nightly` packages the nightly profile's lock and kernels and says
    so; the default profile's wheel of the same manifest, from the same store, is another wheel."""
    import importlib

    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.runtime import load_artifacts

    monkeypatch.delenv("GEMMAR_AOT_TOOLCHAIN_PROFILE", raising=False)
    manifest = tiny_manifest
    store = tmp_path / "store"
    made = {}
    for profile in ("nightly", "default"):
        r = CliRunner().invoke(main, ["wheel", str(manifest), "--store", str(store), "--out", str(tmp_path / profile),
                                      "-j", "2", "--toolchain", profile, "--json"])
        assert r.exit_code == 0, r.output
        made[profile] = json.loads(r.output)
    n, d = made["nightly"], made["default"]
    assert n["toolchain_profile"] == "nightly" and d["toolchain_profile"] == "default"
    assert n["build"]["lock_file"].endswith("tiny.nightly.lock.json") and d["build"]["lock_file"].endswith("tiny.lock.json")
    assert n["version"].startswith("1.0.0+nightly.") and "nightly" not in d["version"]
    assert n["distribution"] == d["distribution"]  # one name: a pod installs the wheel of its own mori
    assert n["toolchain"] != d["toolchain"] and n["wheel_sha256"] != d["wheel_sha256"]
    info = inspect_wheel(n["wheel"])
    assert info["ok"], info["problems"]
    assert info["toolchain"]["profile"] == "nightly"
    # the wheel's lock is the nightly build's, byte for byte, and its code objects are that store's
    members = _members(Path(n["wheel"]))
    packed = Lock.from_bytes(members[f"{n['package']}/lock.json.zst"])
    assert packed.toolchain.profile == "nightly"
    assert packed.to_bytes() == read_lock(Path(n["build"]["lock_file"])).to_bytes()
    site_dir = tmp_path / "site"
    with zipfile.ZipFile(n["wheel"]) as zf:
        zf.extractall(site_dir)
    monkeypatch.syspath_prepend(str(site_dir))
    arts = load_artifacts(importlib.import_module(n["package"]).locate())
    nightly_blobs = {le.blob.hash for le in packed.kernels().values()}
    default_blobs = {le.blob.hash for le in read_lock(Path(d["build"]["lock_file"])).kernels().values()}
    assert nightly_blobs != default_blobs  # the GEMMs at least change bytes between the profiles
    st = arts.store(arts.sources[0])
    assert all(st.load_blob(h) == Store(store).load_blob(h) for h in nightly_blobs)


def test_failed_build_writes_no_wheel(tmp_path, monkeypatch):
    import gemmar_aot.builder.pipeline

    summary = {"manifest": "smoke", "store": str(tmp_path), "lock_file": None, "jobs": 1, "kernel_instances": 1,
               "distinct_specs": 1, "hits": 0, "misses": 1, "compiled": 0, "failed": 1, "wall_seconds": 1.0,
               "by_kind": {}, "failures": [{"spec_id": "ab" * 32, "key": "cd" * 32, "label": "gemm r0",
                                            "error": "boom"}]}
    monkeypatch.setattr(gemmar_aot.builder.pipeline, "build",
                        lambda *a, **kw: gemmar_aot.builder.pipeline.Built(summary, None, None, None, None, {}))
    res = _run("wheel", SMOKE, "--store", tmp_path / "s", "--out", tmp_path / "dist")
    assert res.exit_code == 1 and "FAILED gemm r0" in res.output and "no wheel was written" in res.output
    assert not (tmp_path / "dist").exists()
    res = _run("wheel", SMOKE, "--store", tmp_path / "s", "--out", tmp_path / "dist", "--json")
    assert res.exit_code == 1 and json.loads(res.output)["wheel"] is None


# ---------------------------------------------------------------------------
# the real smoke artifacts (compile tier: needs the smoke store)
# ---------------------------------------------------------------------------




@pytest.fixture(scope="session")
def store_copy(smoke_store, tmp_path_factory) -> Path:
    """A writable copy of the smoke store (``gemmar-aot wheel`` runs the build, which writes its lock)."""
    dest = tmp_path_factory.mktemp("wheel-store") / "store"
    shutil.copytree(smoke_store, dest, ignore=shutil.ignore_patterns("quarantine"))
    return dest


def cli_wheel(manifest: Path, store: Path, out: Path, *extra) -> dict:
    res = _run("wheel", manifest, "--store", store, "--out", out, "-j", "1", "--json", *extra)
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["build"]["compiled"] == 0 and s["build"]["failed"] == 0, "the wheel build must reuse the store"
    return s


@pytest.fixture(scope="session")
def smoke_wheel(store_copy, tmp_path_factory) -> dict:
    return cli_wheel(SMOKE, store_copy, tmp_path_factory.mktemp("dist"))


class FreshEnv:
    """A new virtual environment whose only extras are this checkout's .venv packages (via a .pth)."""

    def __init__(self, path: Path):
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
        self.python = path / "bin" / "python"
        purelib = subprocess.run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        self.site = Path(purelib)
        ours = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_path("purelib")]
        (self.site / "_gemmar_aot_dev.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in ours))

    def pip_install(self, *wheels) -> None:
        # pip of this checkout's .venv, installing into the fresh environment
        out = subprocess.run([sys.executable, "-m", "pip", "--python", str(self.python), "install", "--no-deps",
                              "--no-index", "--disable-pip-version-check", "--no-input", *map(str, wheels)], check=False,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr

    def run(self, code: str, *args, check=True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("GEMMAR_AOT_ARTIFACTS", "GEMMAR_AOT_STORE",
                                                               "PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = str(TESTS)  # the fakes
        script = self.path / "probe.py"
        script.write_text(textwrap.dedent(code))
        out = subprocess.run([str(self.python), str(script), *map(str, args)], check=False, capture_output=True,
                             text=True, cwd=self.path, env=env, timeout=600)
        if check:
            assert out.returncode == 0, out.stdout + out.stderr
        return out


LOAD_EVERY_KERNEL = """
    import json, sys
    import torch
    from fakes import FakeCommunicator, FakeHipDriver
    from gemmar_aot.runtime import GemmAllReduceOp, load_artifacts
    from gemmar_aot.model.lock import read_lock

    FP8 = torch.float8_e4m3fn

    def operands(quant, m, n, k):
        if quant == "mxfp8":
            return (torch.zeros(m, k, dtype=FP8), torch.zeros(n, k, dtype=FP8),
                    torch.zeros(m * k // 128, dtype=torch.int32), torch.zeros((n // 32) * (k // 32), dtype=torch.int32))
        return (torch.zeros(m, k, dtype=FP8), torch.zeros(n, k, dtype=FP8),
                torch.ones(k // 128, m), torch.ones(n // 128, k // 128))

    oracle = read_lock(sys.argv[1])  # the build's own lock: the fake's independent expectations
    arts = load_artifacts()  # no artifacts=, no env var: installed entry points only
    out = {"sources": [[str(s.lock_path), str(s.store_root), s.origin] for s in arts.sources], "ops": []}
    groups = sorted({(key.n, key.k, key.world, key.quant, key.gather_dtype, key.gather_transport or "lsa",
                      next(iter(by_m.values()))[0].layout.m_max)
                     for key, by_m in arts.index.items() if key.transport == "fused-sdma"})  # what is installed
    for n, k, world, quant, gd, gt, m_max in groups:
        for rank in range(world):
            drv = FakeHipDriver([oracle])
            op = GemmAllReduceOp(FakeCommunicator(rank=rank, nranks=world), n=n, k=k, m_max=m_max, quant=quant,
                                 gather_dtype=gd, gather_transport=gt, driver=drv, self_test=False)
            loaded = sorted({m.digest for m in drv.loaded.values()})
            launched = []
            for m in op.m_values:
                drv.clear()
                op(*operands(quant, m, n, k))
                launched.append([l.digest for l in drv.launches])
            out["ops"].append({"n": n, "k": k, "world": world, "quant": quant, "wire": gd, "gt": gt, "rank": rank,
                               "m": list(op.m_values), "loaded": loaded, "launched": launched,
                               "store": str(arts.entry(op.key, op.m_values[0], rank).lock.source.store_root)})
            op.close()
    print(json.dumps(out))
"""


def _fused_groups(lock):
    """(n, k, world, quant, wire, transport of the gather, rank) -> its M values, for every fused-sdma tuple."""
    out: dict = {}
    for t in lock.tuples:
        if t.id.transport != "fused-sdma":
            continue
        for r in t.ranks:
            g = (t.id.n, t.id.k, t.id.world, t.id.quant, t.id.gather_dtype, t.id.gather_transport or "lsa", r.rank)
            out.setdefault(g, set()).add(t.id.m)
    return {g: sorted(ms) for g, ms in out.items()}


def _expected_blobs(lock, n, k, gd, rank, ms=None, *, world=2, quant="blockscale", gt="lsa"):
    out = set()
    for t in lock.tuples:
        if (t.id.transport, t.id.n, t.id.k, t.id.gather_dtype, t.id.world, t.id.quant,
                t.id.gather_transport or "lsa") == ("fused-sdma", n, k, gd, world, quant, gt) and \
                (ms is None or t.id.m in ms):
            r = next(r for r in t.ranks if r.rank == rank)
            out |= {e.blob.hash for e in r.launches + r.self_test}
    return sorted(out)


def _smoke_tuple(lock, m, k, wire, *, world=2, quant="blockscale", gt="lsa"):
    return next(t for t in lock.tuples if (t.id.transport, t.id.m, t.id.k, t.id.gather_dtype, t.id.world, t.id.quant,
                                           t.id.gather_transport or "lsa") ==
                ("fused-sdma", m, k, wire, world, quant, gt))


@pytest.mark.compile
def test_installed_smoke_wheel_serves_every_fused_tuple_and_rank(smoke_wheel, smoke_lock, smoke_store, tmp_path):
    env = FreshEnv(tmp_path / "venv")
    env.pip_install(smoke_wheel["wheel"])
    pkg_dir = env.site / smoke_wheel["package"]
    assert (pkg_dir / "lock.json.zst").is_file() and (pkg_dir / "store" / "STORE_FORMAT").is_file()
    res = json.loads(env.run(LOAD_EVERY_KERNEL, smoke_store / "locks" / "smoke.lock.json").stdout.splitlines()[-1])
    assert res["sources"] == [[str(pkg_dir / "lock.json.zst"), str(pkg_dir / "store"),
                               "entry point smoke = gemmar_artifacts_smoke:locate"]]
    groups = _fused_groups(smoke_lock)
    # every fused tuple of the manifest (bf16, fp8 over lsa and sdma, mxfp8, world 4), every rank
    assert {(g[2], g[3], g[4], g[5]) for g in groups} >= {(2, "blockscale", "bf16", "lsa"),
                                                           (2, "blockscale", "fp8", "lsa"),
                                                           (2, "blockscale", "fp8", "sdma"),
                                                           (2, "mxfp8", "bf16", "lsa"), (4, "blockscale", "bf16", "lsa")}
    seen = {(o["n"], o["k"], o["world"], o["quant"], o["wire"], o["gt"], o["rank"]) for o in res["ops"]}
    assert seen == set(groups)
    for o in res["ops"]:
        g = (o["n"], o["k"], o["world"], o["quant"], o["wire"], o["gt"], o["rank"])
        assert o["m"] == groups[g]
        ident = dict(world=o["world"], quant=o["quant"], gt=o["gt"])
        assert o["loaded"] == _expected_blobs(smoke_lock, o["n"], o["k"], o["wire"], o["rank"], **ident), o
        assert o["store"] == str(pkg_dir / "store")
        for m, digests in zip(o["m"], o["launched"]):
            t = _smoke_tuple(smoke_lock, m, o["k"], o["wire"], **ident)
            assert digests == [e.blob.hash for e in next(r for r in t.ranks if r.rank == o["rank"]).launches]
    # installing never writes into the package (the store is opened read-only)
    assert not (pkg_dir / "store" / "quarantine").exists() and not (pkg_dir / "store" / "stats").exists()


@pytest.mark.compile
def test_smoke_wheel_is_reproducible(smoke_wheel, smoke_store, smoke_lock, tmp_path, monkeypatch):
    # another checkout path for the manifest, another store path, another cwd, another output path
    other_checkout = tmp_path / "checkout2" / "manifests"
    other_checkout.mkdir(parents=True)
    shutil.copy(SMOKE, other_checkout / "smoke.toml")
    store2 = tmp_path / "store2"
    shutil.copytree(smoke_store, store2, ignore=shutil.ignore_patterns("quarantine"))
    monkeypatch.chdir(tmp_path)
    again = cli_wheel(other_checkout / "smoke.toml", store2, tmp_path / "out2")
    assert Path(again["wheel"]).name == Path(smoke_wheel["wheel"]).name
    assert Path(again["wheel"]).read_bytes() == Path(smoke_wheel["wheel"]).read_bytes()
    # a store with another history (every blob re-encoded without a dictionary, at level 3): same bytes
    store3 = tmp_path / "store3"
    src, dst = Store(smoke_store, readonly=True), Store(store3, durable=False, level=3)
    for key in sorted(smoke_lock.action_keys()):
        rec, code = src.load(key)
        dst.put(key, code, {k: v for k, v in rec.items() if k not in RESERVED_FIELDS},
                launcher=src.load_blob(rec["launcher"]["hash"], rec["launcher"]["size"])
                if "launcher" in rec else None)  # a hipcc code object has none
    some = smoke_lock.tuples[0].ranks[0].launches[0].blob.hash
    assert dst.blob_path(some).read_bytes() != src.blob_path(some).read_bytes()
    third = cli_wheel(SMOKE, store3, tmp_path / "out3")
    assert Path(third["wheel"]).read_bytes() == Path(smoke_wheel["wheel"]).read_bytes()
    assert third["wheel_sha256"] == smoke_wheel["wheel_sha256"]


@pytest.mark.compile
def test_smoke_wheel_inspect(smoke_wheel, smoke_lock):
    res = _run("inspect", smoke_wheel["wheel"], "--json")
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert r["ok"] and r["arch"] == "gfx950" and r["toolchain"]["digest"] == smoke_lock.toolchain.digest
    assert r["manifest"]["text"] == SMOKE.read_text() and r["manifest"]["sha256"] == smoke_lock.manifest.sha256
    cov = {(g["transport"], tuple(g["m"]), g["n"], g["k"], g["world"], g["quant"], g["wire"]) for g in r["coverage"]
           if g["transport"] not in ("ep", "hipcc", "jitv2")}
    assert [g for g in r["coverage"] if g["transport"] == "ep"] == [
        {"transport": "ep", **ep.config.to_json(), "ranks": [r.rank for r in ep.ranks]} for ep in smoke_lock.eps]
    small = ["cast_kernel", "ep_local_expert_count", "fabric_copy", "scatter_gather", "shmem_kernels"]
    assert [(g["arch"], g["nic"], g["sources"]) for g in r["coverage"] if g["transport"] == "hipcc"] == [
        ("gfx942", "mlx5", small), ("gfx950", "bnxt", ["shmem_kernels"]), ("gfx950", "ionic", ["shmem_kernels"]),
        ("gfx950", "ionic-ccqe", ["shmem_kernels"]), ("gfx950", "mlx5", small)]  # the smoke manifest's [[hipcc]]
    # one row per [[tuple]] of manifests/smoke.toml, written out by hand from the manifest
    assert cov == {("fused-sdma", (256, 512), 1024, 256, 2, "blockscale", "bf16"),
                   ("fused-sdma", (256, 512), 1024, 512, 2, "blockscale", "bf16"),
                   ("fused-sdma", (512,), 1024, 256, 2, "blockscale", "fp8/lsa"),
                   ("fused-sdma", (512,), 1024, 256, 2, "blockscale", "fp8/sdma"),
                   ("fused-sdma", (512,), 1024, 256, 2, "mxfp8", "bf16"),
                   ("fused-sdma", (1024,), 2048, 256, 2, "mxfp8", "bf16"),
                   ("fused-sdma", (512,), 1024, 256, 4, "blockscale", "bf16"),
                   ("split-sdma", (512,), 1024, 256, 2, "blockscale", "bf16"),
                   ("split-lsa", (512,), 1024, 256, 2, "blockscale", "bf16"),
                   ("fused-lsa", (512,), 1024, 256, 2, "blockscale", "bf16"),
                   ("gemm-only", (256, 9216), 1024, 256, 2, "mxfp8", None),
                   ("gemv", (1, 32), 1024, 256, 2, "mxfp8", None)}
    blobs = {d.hash: d.size for d in smoke_lock.blobs().values()}
    assert r["code_objects"] == len(blobs) and r["sizes"]["raw_bytes"] == sum(blobs.values())
    assert r["sizes"]["blob_bytes"] < r["sizes"]["raw_bytes"] / 3  # zstd 19 + a dictionary


@pytest.mark.compile
@pytest.mark.parametrize("where", ["in the zip", "installed"])
def test_tampered_blob_is_refused_at_load_naming_it(smoke_wheel, smoke_lock, smoke_store, tmp_path, where):
    _t = _smoke_tuple(smoke_lock, 256, 256, "bf16")
    digest = _t.ranks[0].launches[0].blob.hash  # rank 0's GEMM at M=256
    whl = Path(smoke_wheel["wheel"])
    if where == "in the zip":
        bad = tmp_path / "bad" / whl.name
        bad.parent.mkdir()
        name = _rewrite_zip(whl, bad, lambda n, d: _flip_in_pack(d, digest) if n.endswith("/blobs.pack") else None)
        res = _run("inspect", bad)
        assert res.exit_code == 1 and f"TAMPERED {name}: RECORD says" in res.output, res.output
        whl = bad
    env = FreshEnv(tmp_path / "venv")
    env.pip_install(whl)  # pip does not check RECORD hashes: the runtime must
    blob = env.site / smoke_wheel["package"] / "store" / "blobs.pack"
    if where == "installed":
        blob.write_bytes(_flip_in_pack(blob.read_bytes(), digest))
    before = blob.read_bytes()
    out = env.run("""
        import sys
        from fakes import FakeCommunicator, FakeHipDriver
        from gemmar_aot.runtime import GemmAllReduceOp
        from gemmar_aot.store import CorruptArtifactError
        from gemmar_aot.model.lock import read_lock
        drv = FakeHipDriver([read_lock(sys.argv[1]).check_parts()])
        try:
            GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512, driver=drv, self_test=False)
        except CorruptArtifactError as e:
            print("REFUSED", e.path, "|", e, "|", drv.counters["load_module"])
            sys.exit(3)
    """, smoke_store / "locks" / "smoke.lock.json", check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith(f"REFUSED {blob} |") and str(blob) in line.split("|")[1]
    assert line.endswith("| 0")  # nothing handed to HIP
    # not moved, not rewritten, no quarantine inside site-packages
    assert blob.read_bytes() == before
    assert not (env.site / smoke_wheel["package"] / "store" / "quarantine").exists()


SUBSET = """
[manifest]
name = "{name}"
arch = "gfx950"

[[tuple]]
transport = "fused-sdma"
m = {m}
m_max = 512
n = 1024
k = 256
world = 2
quant = "blockscale"
"""


@pytest.mark.compile
def test_two_installed_wheels_merge(store_copy, smoke_lock, smoke_store, tmp_path):
    wheels = []
    for name, m in (("smoke-m256", 256), ("smoke-m512", 512)):
        p = tmp_path / f"{name}.toml"
        p.write_text(SUBSET.format(name=name, m=m))
        wheels.append(cli_wheel(p, store_copy, tmp_path / "dist"))
    assert [w["distribution"] for w in wheels] == ["gemmar-artifacts-smoke-m256", "gemmar-artifacts-smoke-m512"]
    env = FreshEnv(tmp_path / "venv")
    env.pip_install(*(w["wheel"] for w in wheels))
    res = json.loads(env.run(LOAD_EVERY_KERNEL, smoke_store / "locks" / "smoke.lock.json").stdout.splitlines()[-1])
    assert sorted(s[2] for s in res["sources"]) == [
        "entry point smoke-m256 = gemmar_artifacts_smoke_m256:locate",
        "entry point smoke-m512 = gemmar_artifacts_smoke_m512:locate"]
    # the op for N=1024 K=256 bf16 serves M=256 from one wheel and M=512 from the other
    ops = [o for o in res["ops"] if (o["k"], o["wire"]) == (256, "bf16")]
    assert len(ops) == 2
    for o in ops:
        assert o["m"] == [256, 512]
        assert o["loaded"] == _expected_blobs(smoke_lock, 1024, 256, "bf16", o["rank"])


@pytest.mark.compile
def test_conflicting_wheels_are_an_error_naming_both(smoke_wheel, smoke_lock, smoke_store, tmp_path):
    # a second wheel whose lock claims smoke's fused bf16 M=256 rank-0 kernels with another key and blob
    evil_text = SMOKE.read_bytes().replace(b'name = "smoke"', b'name = "smoke-rebuilt"')
    t = _smoke_tuple(smoke_lock, 256, 256, "bf16")
    r0, r1 = (next(r for r in t.ranks if r.rank == i) for i in (0, 1))
    r0 = replace(r0, launches=(replace(r1.launches[0], key="f" * 64),) + r0.launches[1:])  # rank 1's GEMM blob,
    t = replace(t, ranks=tuple(r0 if r.rank == 0 else r for r in t.ranks))              # a made-up key
    lock = replace(smoke_lock, manifest=replace(smoke_lock.manifest, name="smoke-rebuilt", sha256=_sha(evil_text)),
                   tuples=tuple(t if u.id == t.id else u for u in smoke_lock.tuples))
    evil = wheel_from_lock(lock, smoke_store, None, tmp_path / "dist", manifest_text=evil_text,
                           manifest_file="smoke-rebuilt.toml")
    env = FreshEnv(tmp_path / "venv")
    env.pip_install(smoke_wheel["wheel"], evil["wheel"])
    out = env.run("""
        from gemmar_aot.runtime import ArtifactConflictError, load_artifacts
        try:
            load_artifacts()
        except ArtifactConflictError as e:
            print("CONFLICT", e)
            raise SystemExit(3)
    """, check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    msg = out.stdout
    assert "M=256 rank 0" in msg and "different action keys" in msg
    assert "gemmar_artifacts_smoke:locate" in msg and "gemmar_artifacts_smoke_rebuilt:locate" in msg
    assert str(env.site / "gemmar_artifacts_smoke" / "lock.json.zst") in msg
    assert str(env.site / "gemmar_artifacts_smoke_rebuilt" / "lock.json.zst") in msg


@pytest.mark.compile
def test_installed_wheel_binds_its_lock_through_the_record_index(smoke_wheel, smoke_lock, smoke_store, tmp_path):
    """The wheel carries the lock's record index; installed, the runtime reads it (the pack has no
    records), and a tampered line of it is refused naming both digests."""
    info = inspect_wheel(smoke_wheel["wheel"])
    assert info["ok"], info["problems"]
    env = FreshEnv(tmp_path / "venv")
    env.pip_install(smoke_wheel["wheel"])
    index = env.site / smoke_wheel["package"] / "lock.records.zst"
    assert index.is_file()
    probe = """
        import sys
        from fakes import FakeCommunicator, FakeHipDriver
        from gemmar_aot.runtime import ArtifactMismatchError, GemmAllReduceOp
        from gemmar_aot.runtime.record_binding import RecordBinding
        from gemmar_aot.model.lock import read_lock
        checked = []
        orig = RecordBinding.check
        RecordBinding.check = lambda self, *a, **k: checked.append(orig(self, *a, **k) is None)
        try:
            op = GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512,
                                 driver=FakeHipDriver([read_lock(sys.argv[1]).check_parts()]), self_test=False)
        except ArtifactMismatchError as e:
            print("REFUSED", e)
            sys.exit(3)
        index = op.artifacts.record_index(op.artifacts.locks[0])
        print("BOUND", len(checked), all(checked), index.path)
    """
    out = env.run(probe, smoke_store / "locks" / "smoke.lock.json")
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[0] == "BOUND" and int(last[1]) > 0 and last[2] == "True" and last[3] == str(index), out.stdout
    # one line of the installed index relabelled: refused, naming the lock's record digest and the line's
    head, groups = read_frames(index)
    r0 = next(r for r in _smoke_tuple(smoke_lock, 512, 256, "bf16").ranks if r.rank == 0)
    key = next(le.key for le in r0.launches if le.kind == "reduce")
    g, i = find_line(head, groups, key)
    assert b'"rank":0' in groups[g][i]
    groups[g][i] = groups[g][i].replace(b'"rank":0', b'"rank":1', 1)
    write_frames(index, head, groups)
    out = env.run(probe, smoke_store / "locks" / "smoke.lock.json", check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "record index holds" in out.stdout and str(index) in out.stdout, out.stdout


def test_an_installed_wheel_without_its_record_index_is_refused_never_served_unchecked(
        smoke_wheel, smoke_lock, smoke_store, tmp_path):
    """The pack holds no records, so the record index is the only place a lock entry's record can
    be found. Removed, and the lock edited where only the record check looks (two pointer
    arguments of rank 0's first GEMM swapped: same kinds and sizes, the code object's note
    agrees): the op is refused, naming the record the lock names and the fix."""
    from gemmar_aot.model.lock_codec import encode_lock_doc
    from lock_docs import decode_lock_doc
    from gemmar_aot.model.lock import Lock, compress_lock

    env = FreshEnv(tmp_path / "venv")
    env.pip_install(smoke_wheel["wheel"])
    pkg = env.site / smoke_wheel["package"]
    (pkg / "lock.records.zst").unlink()
    lock_file = pkg / "lock.json.zst"
    doc = decode_lock_doc(lock_file.read_bytes())
    r0 = next(p for p in doc["parts"] if p["rank"] == 0)
    gemm = next(e for e in r0["kernels"].values() if e["kind"] == "gemm")
    launch = doc["launch_records"][gemm["launch"]]
    args = launch["kernel_args"]
    assert args[0] != args[2]
    args[0], args[2] = args[2], args[0]
    lock_file.write_bytes(compress_lock(Lock.from_bytes(encode_lock_doc(doc))))
    probe = """
        from fakes import FakeCommunicator, FakeHipDriver
        from gemmar_aot.runtime import ArtifactMismatchError, GemmAllReduceOp
        from gemmar_aot.model.lock import read_lock
        import sys
        try:
            GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512,
                            driver=FakeHipDriver([read_lock(sys.argv[1]).check_parts()]), self_test=False)
        except ArtifactMismatchError as e:
            print("REFUSED", e)
            sys.exit(3)
        print("BUILT")
    """
    out = env.run(probe, smoke_store / "locks" / "smoke.lock.json", check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "neither a record index beside the lock nor the store has it" in out.stdout, out.stdout
    assert "reinstall the artifact wheel" in out.stdout, out.stdout


def test_the_wheel_of_a_build_is_made_in_memory_and_is_the_wheel_of_its_lock(smoke_wheel, store_copy, tmp_path,
                                                                              monkeypatch):
    """``gemmar-aot wheel`` hands the build's lock, record index and store handle to the wheel:
    the lock is serialised once and never read back, the record index is the build's, and the
    bytes are those of the wheel written from the same lock on disk."""
    from gemmar_aot.model.lock import Lock

    lock_path = Path(smoke_wheel["build"]["lock_file"])
    from_disk = wheel_from_lock(lock_path, store_copy, SMOKE, tmp_path / "from-disk")
    assert Path(from_disk["wheel"]).read_bytes() == Path(smoke_wheel["wheel"]).read_bytes()
    serialised, rebuilt, read_back = [], [], []
    real_encode = Lock.to_bytes
    monkeypatch.setattr("gemmar_aot.package.wheel.build_index_from_store", lambda *a, **k: rebuilt.append(a))
    monkeypatch.setattr("gemmar_aot.package.wheel.read_lock", lambda *a, **k: read_back.append(a))
    monkeypatch.setattr(Lock, "to_bytes", lambda self: (serialised.append("_bytes" not in self.__dict__),
                                                        real_encode(self))[1])
    again = cli_wheel(SMOKE, store_copy, tmp_path / "again")
    assert Path(again["wheel"]).read_bytes() == Path(smoke_wheel["wheel"]).read_bytes()
    assert rebuilt == [] and read_back == [] and sum(serialised) == 1, (rebuilt, read_back, serialised)
