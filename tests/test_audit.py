"""Audit by reproduction (gemmar_aot.builder.audit) against a poisoned entry on a real nginx.

A rogue writer of the shared cache puts, under one kernel's action key, a valid code object of
another kernel with a record claiming the key (its spec and ingredients, the other kernel's
blob, launch and metadata). Every digest agrees, so a plain build takes it. `gemmar-aot audit`
recompiles and finds it, naming the key, both digests and the remote it came from, and
quarantines it; `build --audit-remote N` finds it before trusting the rest, distrusts every
remote hit, and builds the manifest here into the right lock (and the signed provenance says
it audited). The oracle is the store the session compiled itself, never the remote. The
poisoned entry is a per-key one, so the remote's closure entries are taken off first
(``mini_per_key_remote``); a closure's entries are remote hits like any other and audited alike.
An audit of every kernel, and a distrusted remote, compile the whole manifest: those tests use
tests/fixtures/mini.toml (one kernel of each family), the others smoke.toml.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from store_health import assert_verifies_clean
from click.testing import CliRunner

from test_remote_build import MINI, SMOKE, _a_cheap_kernel_with_its_own_blob, _build, _lock_bytes, _lock_entries
from gemmar_aot.builder.audit import FETCHES_FILE, sample
from gemmar_aot.cli import main
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.trust.signing_keys import generate_key, load_signing_key
from gemmar_aot.store import Store
from gemmar_aot.store.remote.remote_backend import HttpBackend

pytestmark = pytest.mark.compile


def _poison(store: Path, url: str, name: str) -> tuple[str, dict, dict]:
    """Put another kernel's code object under a cheap kernel's key (of lock ``name`` in ``store``)
    on the remote. Returns (victim key, the victim's true record, the donor's record)."""
    victim, vblob = _a_cheap_kernel_with_its_own_blob(store, name)
    entries = _lock_entries(store, name)
    kind = entries[victim][0]
    donor = sorted(k for k, (kd, h) in entries.items() if kd == kind and h != vblob and k != victim)[0]
    st = Store(store, readonly=True)
    true_rec, _ = st.load(victim)
    donor_rec, _ = st.load(donor)
    forged = {**donor_rec, "key": victim, "spec": true_rec["spec"], "ingredients": true_rec["ingredients"]}
    HttpBackend(url).put_record(victim, forged)  # the donor's blobs are already in /cas/
    return victim, true_rec, donor_rec


def test_a_poisoned_entry_is_taken_by_a_plain_build_and_caught_by_audit(mini_store, mini_per_key_remote, tmp_path):
    remote = mini_per_key_remote
    victim, true_rec, donor_rec = _poison(mini_store, remote.url, "mini")
    naive = _build(tmp_path / "naive", remote.url, MINI)
    assert naive["compiled"] == 0 and naive["remote_hits"] == naive["distinct_specs"]  # every digest agrees
    assert _lock_bytes(tmp_path / "naive", "mini") != _lock_bytes(mini_store, "mini")  # ...and the lock names the forgery
    fetched = (Store(tmp_path / "naive").stats_dir / FETCHES_FILE).read_text()
    assert victim in fetched and remote.url in fetched

    lock = tmp_path / "naive" / "locks" / "mini.lock.json"
    r = CliRunner().invoke(main, ["audit", str(lock), "--all", "--json", "-j", "2"])
    assert r.exit_code == 1, r.output
    rep = json.loads(r.stdout)
    assert rep["audited"] == rep["kernels"] == naive["distinct_specs"]
    (f,) = rep["findings"]
    assert f["key"] == victim and f["problem"] == "another code object than this key compiles to"
    assert f["claimed_blob"] == donor_rec["blob"]["hash"] and f["rebuilt_blob"] == true_rec["blob"]["hash"]
    assert remote.url in f["origin"]
    assert rep["quarantined"] == [victim] and not Store(tmp_path / "naive").record_path(victim).exists()
    reasons = [p.read_text() for p in Store(tmp_path / "naive").quarantine_dir.glob("*.reason")]
    assert any("POISONED" in x and victim[:16] in x for x in reasons)
    # the next build (no remote) compiles the quarantined kernel, and only it: the right lock
    again = _build(tmp_path / "naive", None, MINI)
    assert again["compiled"] == 1 and _lock_bytes(tmp_path / "naive", "mini") == _lock_bytes(mini_store, "mini")
    # an audit of a clean store finds nothing (a sample, seeded and reported)
    r = CliRunner().invoke(main, ["audit", str(lock), "--sample", "4", "--seed", "11", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["seed"] == 11 and json.loads(r.stdout)["audited"] == 4


def test_build_audit_remote_catches_the_poisoned_entry_and_builds_the_right_lock(mini_store, mini_per_key_remote,
                                                                                  tmp_path):
    remote = mini_per_key_remote
    victim, true_rec, _donor = _poison(mini_store, remote.url, "mini")
    keys = sorted(_lock_entries(mini_store, "mini"))
    seed = next(s for s in range(1000) if victim in sample(keys, 3, s)[0])  # a sample that holds it
    priv, pub, keyid = generate_key(tmp_path / "k", "ci")
    s = _build(tmp_path / "audited", remote.url, MINI, audit_remote=3, audit_seed=seed,
               signers=[load_signing_key(priv)])
    a = s["audit"]
    assert (a["sampled"], a["of"], a["seed"], a["audited"]) == (3, len(keys), seed, 3)
    assert [f["key"] for f in a["findings"]] == [victim] and a["distrusted"] == len(keys)
    assert s["remote_hits"] == 0 and s["failed"] == 0 and s["compiled"] == len(keys), {k: v for k, v in s.items() if k in ("hits", "local_hits", "misses", "compiled", "rederived")}
    assert _lock_bytes(tmp_path / "audited", "mini") == _lock_bytes(mini_store, "mini")
    # the rebuilt entry replaced the poisoned one on the remote
    assert HttpBackend(remote.url).get_record(victim)["blob"] == true_rec["blob"]
    # the signed provenance says the remote hits were audited, and what was found
    env = json.loads(LockBundle(tmp_path / "audited" / "locks" / "mini.lock.json").envelope.read_bytes())
    pred = json.loads(base64.b64decode(env["payload"]))["predicate"]
    audit = pred["buildDefinition"]["internalParameters"]["remote_audit"]
    assert audit == {"remote": True, "remote_hits": 0, "audited": 3, "seed": seed, "findings": 1}
    assert_verifies_clean(tmp_path / "audited")  # the audit's repair leaves a whole store


def test_a_clean_remote_passes_its_audit_and_its_hits_are_trusted(smoke_store, warm_remote, tmp_path):
    s = _build(tmp_path / "b", warm_remote.url, audit_remote=2, audit_seed=5)
    assert s["audit"]["audited"] == 2 and s["audit"]["findings"] == [] and s["audit"]["distrusted"] == 0
    assert s["compiled"] == 0 and s["remote_hits"] == s["distinct_specs"]
    assert _lock_bytes(tmp_path / "b") == _lock_bytes(smoke_store)
    r = CliRunner().invoke(main, ["build", str(SMOKE), "--store", str(tmp_path / "c"),
                                  "--audit-remote", "2", "-q"])
    assert r.exit_code == 2 and "give --remote URL" in r.output
