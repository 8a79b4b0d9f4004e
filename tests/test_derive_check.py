"""A record that contradicts its own blobs: ``verify`` calls it damage, a build never takes it as a hit.

The forgery of the issue: one EP dispatch's launch record with the indices and weights pointers
swapped, and everything above it made again to match -- the action-cache record, the lock's record
index, the lock's record digest -- so every hash check passes and a pod launches the record as it
says. Deriving the record again from its own code object and launcher (no compile) tells.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gemmar_aot.cli import main
from gemmar_aot.compiler.derive_check import RecordCheck, derivation_problems
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.model.launch import LaunchRecord
from gemmar_aot.model.lock import read_lock, write_lock
from gemmar_aot.store import Store
from gemmar_aot.store.backend import record_blob, record_launcher
from gemmar_aot.store.record import record_digest
from gemmar_aot.store.record_index import build_index_from_store

ROOT = Path(__file__).resolve().parents[1]


def _ep_dispatch(lock):
    """The action key of rank 0's first EP dispatch."""
    (e,) = lock.eps
    return next(le.key for le in e.ranks[0].launches if le.kind == "dispatch")


def _swap_indices_and_weights(rec: dict) -> dict:
    """The launch record with ``addr_inp_idx`` and ``addr_inp_wts`` bound to each other's parameter."""
    launch = json.loads(json.dumps(rec["launch"]))
    args = {a["name"]: a for a in launch["args"]}
    args["addr_inp_idx"]["params"], args["addr_inp_wts"]["params"] = (args["addr_inp_wts"]["params"],
                                                                      args["addr_inp_idx"]["params"])
    return {**rec, "launch": launch}


def _forge(root: Path, key: str, edit) -> None:
    """Rewrite the record under ``key`` with ``edit``, then the lock's record digest and launch record
    and its record index to agree with it, as a build that wrote it would have (the blob index names
    the same code object: unchanged)."""
    st = Store(root)
    rec = edit(st.read_record_file(key))
    st.put_record(key, rec)
    stored = st.read_record_file(key)
    lock_path = root / "locks" / "smoke.lock.json"
    lock = read_lock(lock_path)

    def fix(le):
        return replace(le, launch=LaunchRecord.from_json(stored["launch"]), record=record_digest(stored)) \
            if le.key == key else le

    eps = tuple(replace(e, ranks=tuple(replace(r, launches=tuple(map(fix, r.launches))) for r in e.ranks))
                for e in lock.eps)
    lock = replace(lock, eps=eps)
    bundle = LockBundle(lock_path)
    bundle.record_index.write_bytes(build_index_from_store(lock, st))
    write_lock(lock_path, lock)


@pytest.fixture
def forged(smoke_store, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(smoke_store, root, ignore=shutil.ignore_patterns("*.claim", "quarantine"))
    key = _ep_dispatch(read_lock(root / "locks" / "smoke.lock.json"))
    _forge(root, key, _swap_indices_and_weights)
    return root, key


def test_the_check_names_the_kernel_and_each_field_its_blobs_contradict(smoke_store, smoke_lock):
    st = Store(smoke_store, readonly=True)
    rec = st.read_record_file(_ep_dispatch(smoke_lock))
    code = st.load_blob(record_blob(rec).hash)
    launcher = st.load_blob(record_launcher(rec).hash)
    assert derivation_problems(rec, code, launcher) == []

    def load(d):
        return st.load_blob(d.hash, d.size)

    assert RecordCheck()(rec, load) is None
    bad = RecordCheck()(_swap_indices_and_weights(rec), load)
    assert bad.startswith("ep:dispatch:r0: the record contradicts its own blobs: ")
    assert "launch.args[2].params[0] is 3, its blobs derive 2" in bad
    assert "launch.args[3].params[0] is 2, its blobs derive 3" in bad
    # a record of other derive code is stale, not damaged: derived again by the next build
    assert RecordCheck()({**_swap_indices_and_weights(rec), "derive": {"code": "0" * 64}}, load) is None


def test_verify_reports_a_consistently_rehashed_forgery_as_damage(forged, smoke_lock):
    root, key = forged
    # every hash agrees: the lock's record index line is the forged record, by the lock's digest
    lock = read_lock(root / "locks" / "smoke.lock.json")
    assert lock.kernels()[key].record != smoke_lock.kernels()[key].record
    r = CliRunner().invoke(main, ["verify", "--store", str(root), "--json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    by_kind = {p["kind"]: p for p in out["problems"]}
    assert set(by_kind) == {"record", "lock"} and not out["ok"]
    rec = by_kind["record"]
    assert key in rec["path"] and rec["quarantined_to"]
    assert "ep:dispatch:r0: the record contradicts its own blobs: launch.args[2].params[0] is 3" in rec["problem"]
    assert "the next build compiles the kernel again" in rec["problem"]
    lk = by_kind["lock"]
    assert lk["path"].endswith("smoke.lock.json") and "1 record(s) that contradict their own blobs" in lk["problem"]
    assert "gemmar-aot build MANIFEST --store" in lk["problem"]


def test_a_store_every_command_filled_passes_verify(smoke_store, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(smoke_store, root, ignore=shutil.ignore_patterns("*.claim", "quarantine"))
    r = CliRunner().invoke(main, ["verify", "--store", str(root), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["problems"] == []


@pytest.mark.compile
def test_a_build_compiles_a_record_its_blobs_contradict_instead_of_taking_it(forged, smoke_lock):
    from gemmar_aot.builder.pipeline import run_build

    root, key = forged
    s = run_build(ROOT / "manifests" / "smoke.toml", store=root, jobs=1, progress=False)
    assert s["failed"] == 0 and s["compiled"] == 1 and s["hits"] == s["distinct_specs"] - 1
    assert [c["key"] for c in s["contradicted"]] == [key]
    assert "launch.args[2].params[0] is 3, its blobs derive 2" in s["contradicted"][0]["problem"]
    # the lock is the one the honest build wrote, byte for byte
    assert (root / "locks" / "smoke.lock.json").read_bytes() == smoke_lock.to_bytes()
    r = CliRunner().invoke(main, ["verify", "--store", str(root), "--json"])
    assert r.exit_code == 0, r.output
