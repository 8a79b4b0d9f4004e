"""Signed locks (gemmar_aot.trust), with real Ed25519 and ECDSA P-256 keys from `cryptography`.

The runtime with trusted keys refuses an unsigned lock, a lock signed by another key, a signature
over other bytes, a revoked key and an expired signature, each naming the lock, the signer and
the fix; it accepts any of several trusted keys (rotation). A forged lock whose every digest is
consistent -- record, lock and record index rewritten together, as a writer of the store can --
is served without trusted keys and refused with them: only the signature stops it.

The envelope is checked against the DSSE and in-toto specifications by hand (PAE bytes, the
statement's fields), not against our own reader alone.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from fakes import FakeCommunicator, FakeHipDriver
from lock_docs import kernel_entry, rank_launches, read_doc, write_doc
from gemmar_aot.model.lock import read_lock
from gemmar_aot.store.record import record_digest
from gemmar_aot.cli import main
from gemmar_aot.runtime import ArtifactSignatureError, GemmAllReduceOp, load_artifacts
from gemmar_aot.trust.envelope import PAYLOAD_TYPE, sign_lock_file
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.trust.signing_keys import SIGN_KEY_ENV, SignatureError, TRUSTED_KEYS_ENV, generate_key, load_signing_key
from gemmar_aot.trust.trust_set import load_trust
from gemmar_aot.store import Store
from gemmar_aot.store.record_index import build_index_from_store, write_index

N, K, WORLD = 1024, 256, 2


def _op(artifacts, lock, rank=0, **kw):
    return GemmAllReduceOp(FakeCommunicator(rank=rank, nranks=WORLD), n=N, k=K, m_max=512,
                           driver=FakeHipDriver([lock]), self_test=False, artifacts=artifacts, **kw)


def _cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Three key pairs: ci (Ed25519), next (ECDSA P-256, the rotation target), rogue."""
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name, alg in (("ci", "ed25519"), ("next", "ecdsa-p256"), ("rogue", "ed25519")):
        priv, pub, keyid = generate_key(d / name, name, alg)
        out[name] = {"key": priv, "pub": pub, "id": keyid, "dir": d / name}
    return out


@pytest.fixture
def signed_store(smoke_store, tmp_path, keys):
    """A copy of the smoke store whose lock is signed by the ci key."""
    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    lock_path = root / "locks" / "smoke.lock.json"
    sign_lock_file(lock_path, [load_signing_key(keys["ci"]["key"])])
    return root, lock_path


def _trusted(tmp_path, *pubs, revoked=()) -> Path:
    d = tmp_path / "trusted"
    d.mkdir(exist_ok=True)
    for p in pubs:
        shutil.copy(p, d / Path(p).name)
    if revoked:
        (d / "revoked.txt").write_text("# revoked keys\n" + "".join(f"{k}\n" for k in revoked))
    return d


# ---- the envelope is standard DSSE + in-toto ----

def test_the_envelope_is_dsse_over_an_in_toto_statement_naming_the_lock(signed_store, keys):
    root, lock_path = signed_store
    env = json.loads(LockBundle(lock_path).envelope.read_bytes())
    assert LockBundle(lock_path).envelope == root / "locks" / "smoke.intoto.jsonl"
    assert env["payloadType"] == "application/vnd.in-toto+json" == PAYLOAD_TYPE
    payload = base64.b64decode(env["payload"])
    stmt = json.loads(payload)
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["subject"] == [{"name": "smoke.lock.json",
                                "digest": {"sha256": hashlib.sha256(lock_path.read_bytes()).hexdigest()}}]
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    bd = stmt["predicate"]["buildDefinition"]
    lock = read_lock(lock_path)
    assert bd["externalParameters"]["manifest"] == {"name": "smoke", "sha256": lock.manifest.sha256}
    assert bd["internalParameters"]["toolchain"]["digest"] == lock.toolchain.digest
    # the signature is over DSSE's PAE, checked here with cryptography directly
    (sig,) = env["signatures"]
    assert sig["keyid"] == keys["ci"]["id"]
    pub = serialization.load_pem_public_key(keys["ci"]["pub"].read_bytes())
    pae = b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload), payload)
    pub.verify(base64.b64decode(sig["sig"]), pae)  # raises InvalidSignature otherwise
    der = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert keys["ci"]["id"] == hashlib.sha256(der).hexdigest()


# ---- the pod: accepted, and each refusal ----

def test_a_lock_signed_by_a_trusted_key_is_served_and_says_who_signed(signed_store, smoke_lock, keys, tmp_path):
    root, _ = signed_store
    op = _op(root, smoke_lock, trusted_keys=_trusted(tmp_path, keys["ci"]["pub"]))
    try:
        (info,) = op.artifacts.locks
        assert info.signed_by.keyid == keys["ci"]["id"] and info.signed_by.signer.endswith("ci.pub.pem")
    finally:
        op.close()


def test_trusted_keys_from_the_environment_file_or_directory(signed_store, smoke_lock, keys, tmp_path, monkeypatch):
    root, _ = signed_store
    for spec in (keys["ci"]["pub"], _trusted(tmp_path, keys["ci"]["pub"])):
        monkeypatch.setenv(TRUSTED_KEYS_ENV, str(spec))
        assert load_artifacts(root).locks[0].signed_by.keyid == keys["ci"]["id"]
    monkeypatch.setenv(TRUSTED_KEYS_ENV, str(keys["rogue"]["pub"]))
    with pytest.raises(ArtifactSignatureError, match="none of them trusted"):
        load_artifacts(root)


def test_the_pod_reads_the_trusted_keys_variable_the_trust_package_names():
    """The runtime checks ``$GEMMAR_AOT_TRUSTED_KEYS`` before it imports the trust package (a pod
    with no keys never imports it), so it spells the name itself: the two must be one name."""
    from gemmar_aot.runtime import artifacts

    assert artifacts.TRUSTED_KEYS_ENV == TRUSTED_KEYS_ENV


def test_an_unsigned_lock_is_refused_naming_the_lock_and_the_fix(smoke_store, smoke_lock, keys, tmp_path):
    comm = FakeCommunicator(rank=0, nranks=WORLD)
    with pytest.raises(ArtifactSignatureError) as err:
        GemmAllReduceOp(comm, n=N, k=K, m_max=512, driver=FakeHipDriver([smoke_lock]), self_test=False,
                        artifacts=smoke_store, trusted_keys=keys["ci"]["pub"])
    msg = str(err.value)
    assert "smoke.lock.json" in msg and "is not signed" in msg and "--sign-key" in msg
    assert not comm.acquired


def test_a_lock_signed_by_another_key_is_refused_naming_the_signer(signed_store, smoke_lock, keys):
    root, _ = signed_store
    with pytest.raises(ArtifactSignatureError) as err:
        _op(root, smoke_lock, trusted_keys=keys["rogue"]["pub"])
    msg = str(err.value)
    assert keys["ci"]["id"][:16] in msg and "none of them trusted" in msg and TRUSTED_KEYS_ENV in msg


def test_a_signature_over_other_bytes_is_refused(signed_store, smoke_lock, keys):
    """The lock changed after signing (a field added to its head, the file re-encoded)."""
    root, lock_path = signed_store
    doc = read_doc(lock_path)
    doc["env"] = {**doc.get("env", {}), "edited": "after signing"}
    write_doc(lock_path, doc)
    with pytest.raises(ArtifactSignatureError, match="is not the lock its signature vouches for") as err:
        _op(root, smoke_lock, trusted_keys=keys["ci"]["pub"])
    assert keys["ci"]["id"][:16] in str(err.value)


def test_an_envelope_edited_after_signing_is_refused(signed_store, smoke_lock, keys):
    """The statement re-pointed at another lock digest: the signature no longer verifies."""
    root, lock_path = signed_store
    p = LockBundle(lock_path).envelope
    env = json.loads(p.read_bytes())
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = "0" * 64
    env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    p.write_text(json.dumps(env))
    with pytest.raises(ArtifactSignatureError, match="does not verify: the envelope was modified"):
        _op(root, smoke_lock, trusted_keys=keys["ci"]["pub"])


@pytest.mark.parametrize("where", ["directory", "file"])
def test_a_revoked_key_is_refused_even_when_its_public_key_is_trusted(signed_store, smoke_lock, keys, tmp_path,
                                                                      where):
    root, _ = signed_store
    if where == "directory":
        trust = _trusted(tmp_path, keys["ci"]["pub"], revoked=[keys["ci"]["id"]])
    else:
        trust = tmp_path / "trusted.pem"
        trust.write_bytes(keys["ci"]["pub"].read_bytes())
        (tmp_path / "trusted.pem.revoked").write_text(f"sha256:{keys['ci']['id']}  # leaked 2026-12-01\n")
    with pytest.raises(ArtifactSignatureError, match="which is revoked") as err:
        _op(root, smoke_lock, trusted_keys=trust)
    assert keys["ci"]["id"][:16] in str(err.value) and "re-sign" in str(err.value)


def test_an_expired_signature_is_refused_and_an_unexpired_one_served(smoke_store, smoke_lock, keys, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    lock_path = root / "locks" / "smoke.lock.json"
    key = load_signing_key(keys["ci"]["key"])
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    sign_lock_file(lock_path, [key], expires=past)
    with pytest.raises(ArtifactSignatureError, match="expired on") as err:
        _op(root, smoke_lock, trusted_keys=keys["ci"]["pub"])
    assert "re-sign" in str(err.value)
    sign_lock_file(lock_path, [key], expires=datetime.now(timezone.utc) + timedelta(days=1))
    _op(root, smoke_lock, trusted_keys=keys["ci"]["pub"]).close()


def test_key_rotation_old_new_and_both_signatures(smoke_store, smoke_lock, keys, tmp_path):
    """The pod trusts the old and the new key while the fleet rotates; a lock signed by either,
    or by both at once (build --sign-key OLD --sign-key NEW), is served; once the old key is
    revoked, only what the new one signed."""
    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    lock_path = root / "locks" / "smoke.lock.json"
    both = _trusted(tmp_path, keys["ci"]["pub"], keys["next"]["pub"])
    old, new = load_signing_key(keys["ci"]["key"]), load_signing_key(keys["next"]["key"])
    for signers, want in (([old], "ci"), ([new], "next"), ([old, new], "ci")):
        sign_lock_file(lock_path, signers)
        assert load_artifacts(root, trusted_keys=both).locks[0].signed_by.keyid == keys[want]["id"]
    (both / "revoked.txt").write_text(keys["ci"]["id"] + "\n")
    assert load_artifacts(root, trusted_keys=both).locks[0].signed_by.keyid == keys["next"]["id"]
    sign_lock_file(lock_path, [old])
    with pytest.raises(ArtifactSignatureError, match="revoked"):
        load_artifacts(root, trusted_keys=both)


def test_a_forged_lock_with_every_digest_consistent_is_stopped_only_by_the_signature(
        signed_store, smoke_lock, keys, tmp_path):
    """A writer of the store swaps rank 0's GEMM's A and C pointer arguments in its record and in
    the lock, names the new record's digest, and rewrites the record index: every integrity check
    passes and the op is built. With trusted keys the forgery is refused; re-signed by the
    writer's own key it is refused by the key."""
    root, lock_path = signed_store
    st = Store(root)
    doc = read_doc(lock_path)
    ti = next(i for i, t in enumerate(doc["tuples"]) if t["transport"] == "fused-sdma" and t["m"] == 256)
    key = rank_launches(doc, ti, 0)["launches"][0]
    k = kernel_entry(doc, key)
    doc["launch_records"].append(copy.deepcopy(doc["launch_records"][k["launch"]]))
    k["launch"] = len(doc["launch_records"]) - 1
    args = doc["launch_records"][k["launch"]]["kernel_args"]
    args[0], args[2] = args[2], args[0]
    rec, _code = st.load(key)
    rec = copy.deepcopy(rec)
    rec["launch"]["kernel_args"] = list(args)
    st.put_record(key, rec)
    k["record"] = record_digest(rec).to_json()
    write_doc(lock_path, doc)
    forged = read_lock(lock_path)
    write_index(LockBundle(lock_path).record_index, build_index_from_store(forged, Store(root, readonly=True)))

    op = _op(root, forged)  # integrity alone: the forgery is served
    try:
        e = op._entries[256].launches[0]
        assert e.key == key and list(e.launch.kernel_args) == args and e.record == record_digest(rec)
    finally:
        op.close()
    with pytest.raises(ArtifactSignatureError, match="is not the lock its signature vouches for"):
        _op(root, forged, trusted_keys=keys["ci"]["pub"])
    sign_lock_file(lock_path, [load_signing_key(keys["rogue"]["key"])])
    with pytest.raises(ArtifactSignatureError, match="none of them trusted"):
        _op(root, forged, trusted_keys=keys["ci"]["pub"])


def test_without_trusted_keys_the_runtime_says_once_that_nothing_was_authenticated(smoke_store, caplog,
                                                                                     monkeypatch):
    import gemmar_aot.runtime.artifacts as arts_mod

    monkeypatch.delenv(TRUSTED_KEYS_ENV, raising=False)
    monkeypatch.setattr(arts_mod, "_said_unauthenticated", False)
    with caplog.at_level(logging.INFO, logger="gemmar_aot.runtime"):
        load_artifacts(smoke_store)
        load_artifacts(smoke_store)
    said = [r for r in caplog.records if "nothing was authenticated" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


def test_a_lock_given_as_data_or_preloaded_cannot_pass_for_authenticated(signed_store, smoke_lock, keys):
    root, lock_path = signed_store
    with pytest.raises(ArtifactSignatureError, match="given as data"):
        load_artifacts((smoke_lock.to_json(), root), trusted_keys=keys["ci"]["pub"])
    unchecked = load_artifacts(root)
    with pytest.raises(ArtifactSignatureError, match="loaded without the trusted keys"):
        load_artifacts(unchecked, trusted_keys=keys["ci"]["pub"])
    checked = load_artifacts(root, trusted_keys=keys["ci"]["pub"])
    assert load_artifacts(checked, trusted_keys=keys["ci"]["pub"]) is checked


# ---- keys: loading and refusals ----

def test_signing_keys_come_from_the_option_or_the_environment_and_never_leak(keys, tmp_path, monkeypatch):
    pem = keys["ci"]["key"].read_text()
    from gemmar_aot.trust.signing_keys import signing_keys

    monkeypatch.setenv(SIGN_KEY_ENV, pem)  # the key itself, as a CI secret
    (k,) = signing_keys()
    assert k.keyid == keys["ci"]["id"] and "BEGIN" not in k.where
    # a secret that is not a PEM (base64 of one, a common CI form) is never repeated in the error
    secret = base64.b64encode(pem.encode()).decode()
    monkeypatch.setenv(SIGN_KEY_ENV, secret)
    with pytest.raises(SignatureError) as err:
        signing_keys()
    assert secret[:20] not in str(err.value) and "the path in $GEMMAR_AOT_SIGN_KEY" in str(err.value)
    monkeypatch.setenv(SIGN_KEY_ENV, str(keys["ci"]["key"]))  # or its path
    assert signing_keys()[0].keyid == keys["ci"]["id"]
    monkeypatch.delenv(SIGN_KEY_ENV)
    assert signing_keys() == []
    bad = tmp_path / "bad.key"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    with pytest.raises(SignatureError, match="not a PEM private key"):
        load_signing_key(bad)
    rsa_free = tmp_path / "x.key"
    from cryptography.hazmat.primitives.asymmetric import ec

    rsa_free.write_bytes(ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(SignatureError, match="Ed25519 or ECDSA P-256 only"):
        load_signing_key(rsa_free)


def test_a_private_key_among_the_trusted_keys_is_refused(keys, tmp_path):
    d = _trusted(tmp_path, keys["ci"]["pub"])
    shutil.copy(keys["rogue"]["key"], d / "oops.pem")
    with pytest.raises(SignatureError, match="holds a private key"):
        load_trust(d)
    with pytest.raises(SignatureError, match="do not exist"):
        load_trust(tmp_path / "absent")
    (tmp_path / "bad-revoked").mkdir()
    shutil.copy(keys["ci"]["pub"], tmp_path / "bad-revoked" / "ci.pem")
    (tmp_path / "bad-revoked" / "revoked.txt").write_text("not-a-key-id\n")
    with pytest.raises(SignatureError, match=r"revoked.txt:1: 'not-a-key-id' is not a key id"):
        load_trust(tmp_path / "bad-revoked")


# ---- the command line: build signs, verify shows, the key stays secret ----

def test_build_signs_the_lock_and_verify_shows_the_signer(smoke_store, keys, tmp_path, monkeypatch):
    from conftest import SMOKE

    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    for p in (root / "locks").iterdir():
        p.unlink()
    pem = keys["ci"]["key"].read_text()
    r = _cli("build", SMOKE, "--store", root, "--json", "-q", env={SIGN_KEY_ENV: pem})
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["compiled"] == 0 and summary["signature"]["keyids"] == [keys["ci"]["id"]]
    lock_path = Path(summary["lock_file"])
    assert "PRIVATE KEY" not in r.output and pem.splitlines()[1] not in r.output  # output and summary
    env = json.loads(LockBundle(lock_path).envelope.read_bytes())
    pred = json.loads(base64.b64decode(env["payload"]))["predicate"]
    assert pred["buildDefinition"]["internalParameters"]["remote_audit"] == {
        "remote": False, "remote_hits": 0, "audited": 0}
    r = _cli("verify", "--store", root, "--trusted-keys", keys["ci"]["pub"])
    assert r.exit_code == 0, r.output
    assert f"verifies against the given keys: {keys['ci']['id'][:16]}" in r.output
    assert "gemmar-aot build of smoke" in r.output
    r = _cli("verify", "--store", root, "--trusted-keys", keys["rogue"]["pub"], "--json")
    assert r.exit_code == 1
    (lk,) = json.loads(r.stdout)["locks"]
    assert lk["signature"]["verified"] is False and "none of them trusted" in lk["problem"]


def test_a_bad_signing_key_is_refused_before_anything_is_built(tmp_path):
    from conftest import SMOKE

    bad = tmp_path / "k.pem"
    bad.write_text("hello")
    r = _cli("build", SMOKE, "--store", tmp_path / "s", "--sign-key", bad, "-q")
    assert r.exit_code == 2 and "not a PEM private key" in r.output
    assert not (tmp_path / "s").exists()
    r = _cli("build", SMOKE, "--store", tmp_path / "s", "--shard", "1/2", "--sign-key",
             tmp_path / "absent.key", "-q")
    assert r.exit_code == 2 and "cannot read the signing key" in r.output


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path):
    r = _cli("keygen", "--out", tmp_path, "--name", "k", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (Path(out["private_key"]).stat().st_mode & 0o777) == 0o600
    key = serialization.load_pem_private_key(Path(out["private_key"]).read_bytes(), None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    r = _cli("keygen", "--out", tmp_path, "--name", "k")
    assert r.exit_code == 2 and "never overwrites" in r.output


# ---- wheels carry the envelope ----

def test_a_signed_wheel_carries_its_envelope_inspect_shows_the_signer_and_the_pod_checks_it(
        smoke_store, smoke_lock, keys, tmp_path):
    from conftest import SMOKE
    from test_wheel import FreshEnv

    from gemmar_aot.trust.envelope import lock_statement, sign_statement
    from gemmar_aot.package.inspect import inspect_wheel
    from gemmar_aot.package.wheel_layout import ENVELOPE_ARCNAME
    from gemmar_aot.package.wheel import wheel_from_lock

    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    r = _cli("wheel", SMOKE, "--store", root, "--out", tmp_path / "dist", "--json", "-q",
             "--sign-key", keys["ci"]["key"], "--sign-expires", "30d")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["build"]["compiled"] == 0 and s["signature"]["signers"] == [keys["ci"]["id"]]
    whl = Path(s["wheel"])
    info = inspect_wheel(whl, trusted_keys=keys["ci"]["pub"])
    assert info["ok"], info["problems"]
    sig = info["signature"]
    assert sig["verified"]["keyid"] == keys["ci"]["id"] and sig["manifest"]["name"] == "smoke"
    assert sig["expires"] and sig["builder"] == "gemmar-aot build"
    r = _cli("inspect", whl, "--no-manifest", "--trusted-keys", keys["ci"]["pub"])
    assert r.exit_code == 0 and f"verifies against the given keys: {keys['ci']['id'][:16]}" in r.output, r.output
    r = _cli("inspect", whl, "--no-manifest", "--trusted-keys", keys["rogue"]["pub"])
    assert r.exit_code == 1 and "none of them trusted" in r.output

    # A re-signed forgery: a wheel of the same lock whose envelope the writer signed. Every digest
    # is consistent (inspect without keys finds nothing); the key refuses it.
    lock_path = root / "locks" / "smoke.lock.json"
    forged_env = sign_statement(lock_statement(lock_path.read_bytes()), [load_signing_key(keys["rogue"]["key"])])
    forged = Path(wheel_from_lock(lock_path, root, SMOKE, tmp_path / "forged", envelope=forged_env)["wheel"])
    assert inspect_wheel(forged)["ok"]
    bad = inspect_wheel(forged, trusted_keys=keys["ci"]["pub"])
    assert not bad["ok"] and any("none of them trusted" in p for p in bad["problems"])

    env = FreshEnv(tmp_path / "venv")
    env.pip_install(whl)
    assert (env.site / s["package"] / ENVELOPE_ARCNAME).is_file()
    probe = """
        import os, sys
        from fakes import FakeCommunicator, FakeHipDriver
        from gemmar_aot.runtime import ArtifactSignatureError, GemmAllReduceOp
        from gemmar_aot.model.lock import read_lock
        os.environ["GEMMAR_AOT_TRUSTED_KEYS"] = sys.argv[2]
        try:
            op = GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512,
                                 driver=FakeHipDriver([read_lock(sys.argv[1]).check_parts()]), self_test=False)
        except ArtifactSignatureError as e:
            print("REFUSED", e)
            sys.exit(3)
        print("SERVED", op.artifacts.locks[0].signed_by.keyid)
    """
    out = env.run(probe, lock_path, keys["ci"]["pub"])
    assert out.stdout.split()[-2:] == ["SERVED", keys["ci"]["id"]], out.stdout
    out = env.run(probe, lock_path, keys["rogue"]["pub"], check=False)
    assert out.returncode == 3 and "none of them trusted" in out.stdout, out.stdout + out.stderr


def test_artifacts_loaded_without_keys_cannot_pass_inside_a_list(signed_store, keys):
    root, _ = signed_store
    unchecked = load_artifacts(root)
    with pytest.raises(ArtifactSignatureError, match="loaded without the trusted keys"):
        load_artifacts([unchecked], trusted_keys=keys["ci"]["pub"])


def test_an_envelope_that_is_json_but_not_an_envelope_is_a_signature_error(signed_store, keys):
    root, lock_path = signed_store
    p = LockBundle(lock_path).envelope
    for bad in (b"[1, 2]", json.dumps({"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(b"[1,2]").decode(),
                                        "signatures": [{"keyid": "x", "sig": ""}]}).encode()):
        p.write_bytes(bad)
        with pytest.raises(ArtifactSignatureError, match="not a gemmar-aot signature envelope"):
            load_artifacts(root, trusted_keys=keys["ci"]["pub"])


def test_a_lock_signed_under_another_name_is_refused(smoke_store, keys, tmp_path):
    """The envelope vouches for these bytes, but names them as another manifest's lock."""
    from gemmar_aot.trust.envelope import lock_statement, sign_statement

    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    lock_path = root / "locks" / "smoke.lock.json"
    stmt = lock_statement(lock_path.read_bytes())
    stmt["subject"][0]["name"] = "other.lock.json"
    LockBundle(lock_path).envelope.write_bytes(sign_statement(stmt, [load_signing_key(keys["ci"]["key"])]))
    with pytest.raises(ArtifactSignatureError, match="signed as 'other.lock.json'"):
        load_artifacts(root, trusted_keys=keys["ci"]["pub"])


def test_the_build_signs_the_bytes_it_wrote_never_a_file_swapped_after(smoke_store, smoke_lock, keys, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    lock_path = root / "locks" / "smoke.lock.json"
    doc = read_doc(lock_path)
    doc["env"] = {**doc.get("env", {}), "swapped": "in"}
    write_doc(lock_path, doc)  # a writer of the store, between the build's write and its signature
    with pytest.raises(SignatureError, match="not the lock this build wrote"):
        sign_lock_file(lock_path, [load_signing_key(keys["ci"]["key"])], lock=smoke_lock)
    assert not LockBundle(lock_path).envelope.exists()


def test_the_ep_op_is_served_from_a_signed_lock_and_refused_by_another_key(signed_store, smoke_lock, keys, tmp_path):
    """The EP entries are in the lock the signature covers: no special case."""
    from gemmar_aot.runtime import EpDispatchCombineConfig, EpDispatchCombineOp

    root, _ = signed_store
    cfg = EpDispatchCombineConfig(rank=1, world_size=2, hidden_dim=1024, max_num_inp_token_per_rank=128,
                                  num_experts_per_rank=4, num_experts_per_token=2)
    with EpDispatchCombineOp(cfg, FakeCommunicator(rank=1, nranks=2), artifacts=root, driver=FakeHipDriver([smoke_lock]),
                             trusted_keys=_trusted(tmp_path, keys["ci"]["pub"])) as op:
        (info,) = op.artifacts.locks
        assert info.signed_by.keyid == keys["ci"]["id"]
    comm = FakeCommunicator(rank=1, nranks=2)
    with pytest.raises(ArtifactSignatureError, match="none of them trusted"):
        EpDispatchCombineOp(cfg, comm, artifacts=root, driver=FakeHipDriver([smoke_lock]),
                            trusted_keys=keys["rogue"]["pub"])
    assert not comm.acquired


def test_an_unreadable_lock_or_envelope_is_named_for_what_it_is(signed_store, keys, tmp_path, monkeypatch):
    """The lock's own read error stays the lock's; only the envelope's is reported as the envelope's."""
    root, lock_path = signed_store
    trusted = _trusted(tmp_path, keys["ci"]["pub"])
    envelope = LockBundle(lock_path).envelope
    real = Path.read_bytes

    def unreadable(bad: Path):
        def read_bytes(self):
            if self == bad:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)
        return read_bytes

    monkeypatch.setattr(Path, "read_bytes", unreadable(envelope))
    with pytest.raises(ArtifactSignatureError, match="cannot read the signature envelope"):
        load_artifacts(lock_path, trusted_keys=trusted)
    monkeypatch.setattr(Path, "read_bytes", unreadable(lock_path))
    with pytest.raises(Exception) as got:
        load_artifacts(lock_path, trusted_keys=trusted)
    assert not isinstance(got.value, ArtifactSignatureError) and "envelope" not in str(got.value), got.value
