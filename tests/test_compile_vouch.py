"""A shared cache whose every entry is vouched for (gemmar_aot.builder.compile_vouch), on a real
nginx (WebDAV PUT) on 127.0.0.1, with the real compiler.

A builder with a compile key signs what it compiles; a build with trusted compile keys takes a
remote entry only when one of them signed it. The oracle of "the right lock" is the lock a build
with no remote at all writes (every kernel compiled here), never what the remote holds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import drop_closures
from store_health import assert_verifies_clean
from test_remote_build import _build as remote_build, _lock_bytes

from gemmar_aot.builder.compile_vouch import FIELD, VouchCheck, statement, vouch, vouches
from gemmar_aot.cli import main
from gemmar_aot.model.lock import read_lock
from gemmar_aot.store import Store
from gemmar_aot.store.remote.remote_backend import HttpBackend
from gemmar_aot.trust.signing_keys import generate_key, load_signing_key
from gemmar_aot.trust.trust_set import load_trust

pytestmark = pytest.mark.compile


@pytest.fixture
def keys(tmp_path):
    """Three compile key pairs: the trusted builder's (in a trusted-keys directory), another
    builder's, an attacker's. name -> (private key path, public key path, key id)."""
    out = {}
    for name in ("ci", "other", "attacker"):
        priv, pub, keyid = generate_key(tmp_path / "keys", name)
        out[name] = (priv, pub, keyid)
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copy(out["ci"][1], trusted / "ci.pub.pem")
    out["trusted_dir"] = trusted
    return out


def _build(store: Path, manifest: Path, remote: str | None, **kw) -> dict:
    s = remote_build(store, remote, manifest, **kw)
    assert s["failed"] == 0, s["failures"]
    return s


def _lock(store: Path) -> bytes:
    return _lock_bytes(store, "tiny")


def _signed_remote(nginx, keys, tiny_manifest, tmp_path) -> dict:
    """The trusted CI builder compiles the manifest with its compile key into the remote."""
    ci = load_signing_key(keys["ci"][0])
    s = _build(tmp_path / "ci", tiny_manifest, nginx.url, compile_key=ci)
    assert s["compiled"] == s["distinct_specs"] and s["compile_keys"]["signed"] == s["compiled"]
    assert s["closure"]["uploaded"]
    return s


def test_entries_a_trusted_builder_signed_serve_a_fresh_runner_with_no_compile(nginx, keys, tiny_manifest, tmp_path):
    """The CI builder's signed entries: a fresh runner trusting its key compiles nothing, from the
    closure (two requests) or key by key, and writes the lock a local build writes; the lock it
    signs names the compile key that vouched for its remote hits."""
    seeded = _signed_remote(nginx, keys, tiny_manifest, tmp_path)
    n = seeded["distinct_specs"]
    trust = load_trust(keys["trusted_dir"])
    fresh = _build(tmp_path / "fresh", tiny_manifest, nginx.url, trusted_compile_keys=trust)
    assert fresh["compiled"] == 0 and fresh["remote_hits"] == n
    assert fresh["closure"]["status"] == "hit" and fresh["remote"]["requests"] == 2
    ck = fresh["compile_keys"]
    assert ck["vouched"] == n and ck["vouched_by"] == {keys["ci"][2]: n} and ck["refused"] == {}
    _build(tmp_path / "local", tiny_manifest, None)
    assert _lock(tmp_path / "fresh") == _lock(tmp_path / "local")
    for store in ("ci", "fresh"):  # signed records, and records taken with their signatures, verify clean
        assert_verifies_clean(tmp_path / store)
    # key by key (no closure), and through the command line, the lock signed with a release key
    assert drop_closures(nginx) == 2
    rel_priv, rel_pub, _ = generate_key(tmp_path / "keys", "release")
    r = CliRunner().invoke(main, ["build", str(tiny_manifest), "--store", str(tmp_path / "per-key"), "--remote",
                                  nginx.url, "--trusted-compile-keys", str(keys["trusted_dir"]), "--sign-key",
                                  str(rel_priv), "--json", "-q"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["compiled"] == 0 and s["remote_hits"] == n and s["compile_keys"]["vouched_by"] == {keys["ci"][2]: n}
    env = Path(s["signature"]["envelope"]).read_text()
    from gemmar_aot.trust.envelope import read_envelope

    predicate = read_envelope(env.encode(), "envelope").predicate
    assert json.dumps(predicate).count(keys["ci"][2]) >= 1  # the provenance names who vouched
    assert _lock(tmp_path / "per-key") == _lock(tmp_path / "local")
    # the packaging job: `gemmar-aot wheel` with the trusted compile keys from the environment
    r = CliRunner().invoke(main, ["wheel", str(tiny_manifest), "--store", str(tmp_path / "release"), "--remote",
                                  nginx.url, "--out", str(tmp_path / "dist"), "-q"],
                           env={"GEMMAR_AOT_TRUSTED_COMPILE_KEYS": str(keys["trusted_dir"])})
    assert r.exit_code == 0, r.output
    assert f"trusted compile keys (1): {n} remote entries vouched for ({keys['ci'][2][:16]} {n})" in r.output
    assert " 0 compiled" in r.output and list((tmp_path / "dist").glob("*.whl"))


@pytest.mark.parametrize("writer", ["other", None])
def test_entries_no_trusted_builder_signed_are_all_compiled_again(nginx, keys, tiny_manifest, tmp_path, writer):
    """A remote filled by another builder (its own key, or none): a build trusting the CI key takes
    none of it -- every kernel compiled here, uploaded signed with the CI key this build holds -- and
    the next build trusting the CI key takes them all."""
    other = load_signing_key(keys[writer][0]) if writer else None
    seeded = _build(tmp_path / "writer", tiny_manifest, nginx.url, compile_key=other)
    n = seeded["distinct_specs"]
    trust = load_trust(keys["trusted_dir"])
    ci = load_signing_key(keys["ci"][0])
    fresh = _build(tmp_path / "fresh", tiny_manifest, nginx.url, trusted_compile_keys=trust, compile_key=ci)
    assert fresh["compiled"] == n and fresh["remote_hits"] == 0
    assert fresh["compile_keys"]["refused"] == {("untrusted" if writer else "unsigned"): n}
    assert fresh["compile_keys"]["signed"] == n and fresh["uploads"] == n  # replaced, signed
    again = _build(tmp_path / "again", tiny_manifest, nginx.url, trusted_compile_keys=trust)
    assert again["compiled"] == 0 and again["compile_keys"]["vouched_by"] == {keys["ci"][2]: n}
    assert_verifies_clean(tmp_path / "fresh")


def test_a_forged_entry_never_reaches_the_lock(nginx, keys, tiny_manifest, tmp_path):
    """Under one kernel's key, the record of another valid kernel (the right spec and ingredients,
    the other's code object: every digest agrees), signed by the attacker's key -- or carrying
    the CI key's signature of the true entry. A build trusting the CI key refuses both as
    unvouched, compiles that kernel here and writes the right lock; a build without trusted
    compile keys takes the forgery (what the audit is for)."""
    _signed_remote(nginx, keys, tiny_manifest, tmp_path)
    drop_closures(nginx)
    st = Store(tmp_path / "ci", readonly=True)
    lock = read_lock(tmp_path / "ci" / "locks" / "tiny.lock.json")
    entries = {k: st.get_record(k) for k in lock.action_keys()}
    by_kind: dict[str, list[str]] = {}
    for k, rec in sorted(entries.items()):
        by_kind.setdefault(rec["spec"]["kind"], []).append(k)
    victim, donor = next(ks[:2] for ks in by_kind.values() if len(ks) >= 2
                         and entries[ks[0]]["blob"] != entries[ks[1]]["blob"])
    true_rec, donor_rec = entries[victim], entries[donor]
    forged = {k: v for k, v in donor_rec.items() if k != FIELD}
    forged.update(key=victim, spec=true_rec["spec"], ingredients=true_rec["ingredients"])
    attacker = load_signing_key(keys["attacker"][0])
    trust = load_trust(keys["trusted_dir"])
    _build(tmp_path / "local", tiny_manifest, None)
    for name, rec, why in (("attacker", vouch(victim, forged, attacker), "untrusted"),
                           ("replayed", {**forged, FIELD: vouches(true_rec)}, "bad_signature")):
        HttpBackend(nginx.url).put_record(victim, rec)  # the donor's blobs are in /cas/ already
        s = _build(tmp_path / name, tiny_manifest, nginx.url, trusted_compile_keys=trust)
        assert s["compiled"] == 1 and s["compile_keys"]["refused"] == {why: 1}, s["compile_keys"]
        assert _lock(tmp_path / name) == _lock(tmp_path / "local")
    HttpBackend(nginx.url).put_record(victim, vouch(victim, forged, attacker))
    drop_closures(nginx)  # the trusted builds' closures hold the true entry: key by key, as an attacker leaves it
    naive = _build(tmp_path / "naive", tiny_manifest, nginx.url)
    assert naive["compiled"] == 0 and _lock(tmp_path / "naive") != _lock(tmp_path / "local")


def test_revoking_the_builder_key_takes_effect_on_the_next_build(nginx, keys, tiny_manifest, tmp_path):
    """The CI key's id in the trusted-keys directory's revoked.txt: the next build takes none of
    its entries, from the closure or key by key."""
    seeded = _signed_remote(nginx, keys, tiny_manifest, tmp_path)
    trust = load_trust(keys["trusted_dir"])
    assert _build(tmp_path / "before", tiny_manifest, nginx.url, trusted_compile_keys=trust)["compiled"] == 0
    (keys["trusted_dir"] / "revoked.txt").write_text(f"{keys['ci'][2]}  # leaked\n")
    after = _build(tmp_path / "after", tiny_manifest, nginx.url, trusted_compile_keys=load_trust(keys["trusted_dir"]))
    n = seeded["distinct_specs"]
    assert after["compiled"] == n and after["compile_keys"]["refused"] == {"revoked": n}


def test_a_signature_binds_the_key_the_record_and_every_output(keys, smoke_store):
    """What a compile key signs: another action key, another record (one field of it), another
    blob or launcher digest each make the signature fail; the volatile fields (timings, the
    signatures themselves) are outside it, so a lock names the same record digest signed or not."""
    from gemmar_aot.store.record import record_digest

    st = Store(smoke_store, readonly=True)
    key = read_lock(smoke_store / "locks" / "smoke.lock.json").kernels().popitem()[0]
    rec = st.get_record(key)
    ci = load_signing_key(keys["ci"][0])
    signed = vouch(key, rec, ci)
    check = VouchCheck(load_trust(keys["trusted_dir"]))
    assert check(key, signed) == keys["ci"][2]
    assert record_digest(signed) == record_digest(rec) and statement(key, signed) == statement(key, rec)
    other_key = "0" * 64
    assert check(other_key, signed) is None and check.seen[other_key] == (None, "bad_signature")
    assert check(key, {**signed, "metadata": {**rec["metadata"], "x": 1}}) is None
    assert check(key, {**signed, "blob": {**rec["blob"], "hash": "1" * 64}}) is None
    assert check(key, {k: v for k, v in signed.items() if k != "launcher"}) is None
    assert check(key, {**signed, "compile_seconds": 99.0}) == keys["ci"][2]
    # every kind of entry a lock names (FlyDSL kernels, EP, mori's hipcc objects) signs and checks alike
    lock = read_lock(smoke_store / "locks" / "smoke.lock.json")
    recipes: set[str] = set()
    for k in lock.action_keys():
        r = st.get_record(k)
        recipes.add(r["spec"]["recipe"])
        assert check(k, vouch(k, r, ci)) == keys["ci"][2], k
    assert {"gemm-only", "ep", "hipcc"} <= recipes, recipes


def test_the_keys_come_from_the_options_or_the_environment(keys, tmp_path, monkeypatch):
    """``--compile-key``/``--trusted-compile-keys`` or their variables; a key that cannot be read
    stops the build before anything runs, naming where it came from."""
    from gemmar_aot.cli.trust_commands import resolve_compile_keys

    assert resolve_compile_keys(None, None) == (None, None)  # neither: behaviour as before
    monkeypatch.setenv("GEMMAR_AOT_COMPILE_KEY", str(keys["ci"][0]))
    monkeypatch.setenv("GEMMAR_AOT_TRUSTED_COMPILE_KEYS", str(keys["trusted_dir"]))
    signer, trust = resolve_compile_keys(None, None)
    assert signer.keyid == keys["ci"][2] and [k.keyid for k in trust.keys] == [keys["ci"][2]]
    signer, trust = resolve_compile_keys(str(keys["other"][0]), str(keys["other"][1]))  # options win
    assert signer.keyid == keys["other"][2] and [k.keyid for k in trust.keys] == [keys["other"][2]]

    manifest = Path(__file__).resolve().parent.parent / "manifests" / "smoke.toml"
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, env, named in ((["--trusted-compile-keys", str(empty)], {}, str(empty)),
                             ([], {"GEMMAR_AOT_TRUSTED_COMPILE_KEYS": str(tmp_path / "gone")},
                              "$GEMMAR_AOT_TRUSTED_COMPILE_KEYS"),
                             ([], {"GEMMAR_AOT_COMPILE_KEY": str(tmp_path / "gone.key")}, "$GEMMAR_AOT_COMPILE_KEY")):
        for k in ("GEMMAR_AOT_COMPILE_KEY", "GEMMAR_AOT_TRUSTED_COMPILE_KEYS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        store = tmp_path / "store"
        r = CliRunner().invoke(main, ["build", str(manifest), "--store", str(store), "-q", *args])
        assert r.exit_code == 2 and named in r.output and not store.exists(), r.output


def test_a_record_derived_again_sheds_the_signatures_over_what_it_was(nginx, keys, tiny_manifest, tmp_path):
    """After a derive-code change, the CI builder's warm store is derived again and refreshes the
    remote: never with the old signatures (they were over the record it was, so every trusted
    build would refuse the entry as badly signed); signed anew when the build holds a compile key
    and checks signatures."""
    import tree_copy

    seeded = _signed_remote(nginx, keys, tiny_manifest, tmp_path)
    n = seeded["distinct_specs"]
    action_keys = read_lock(tmp_path / "ci" / "locks" / "tiny.lock.json").action_keys()
    tree = tree_copy.rewrite_parser(tree_copy.copy_tree(tmp_path / "derive-edit"))
    remote = HttpBackend(nginx.url)
    check = VouchCheck(load_trust(keys["trusted_dir"]))
    for name, extra in (("plain", ()), ("trusting", ("--compile-key", str(keys["ci"][0]),
                                                     "--trusted-compile-keys", str(keys["trusted_dir"])))):
        store = shutil.copytree(tmp_path / "ci", tmp_path / name)
        s = tree_copy.build(tree, tiny_manifest, store, "--remote", nginx.url, *extra)
        assert s["compiled"] == 0 and s["rederived"] == n, s
        if name == "plain":  # no key: the refreshed entries are unsigned, never badly signed
            assert all(FIELD not in remote.get_record(k) for k in action_keys)
        else:
            assert {check(k, remote.get_record(k)) for k in action_keys} == {keys["ci"][2]}, check.seen
        assert_verifies_clean(store)
