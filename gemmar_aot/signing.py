"""Signed locks: who vouched for a set of artifacts, checked before a pod loads any of it.

The lock commits to every record, code object, launcher and rank part it serves by digest,
and the runtime checks every one of those digests; so a signature over the lock's bytes is a
signature over everything a pod runs. This module writes and checks that signature.

The format is standard, so tools other than ours can read it:

* a **DSSE envelope** (``payloadType``, base64 ``payload``, ``signatures[{keyid, sig}]``); each
  signature is over DSSE's pre-authentication encoding (:func:`pae`), never over JSON that a
  parser could read two ways;
* its payload an **in-toto Statement v1** whose one subject is the lock: its file name and the
  sha256 of its canonical bytes (a wheel ships those bytes zstd-compressed; the digest is of
  the bytes inside, so the build's envelope stays valid in the wheel);
* its predicate **SLSA Provenance v1** (``buildDefinition``/``runDetails``) holding the build's
  inputs: manifest name and sha256, toolchain profile and digest, gemmar-aot's version and
  source digest, whether remote hits were audited, the time. Optionally ``expiresOn``
  (an extension field beside SLSA's ``finishedOn``): after it the runtime refuses the lock.

Keys are Ed25519 or ECDSA P-256 (SHA-256), PEM files, through ``cryptography``; a key's id is
the sha256 of its DER SubjectPublicKeyInfo. Signing and checking are offline. A KMS- or
HSM-held key plugs in as any object with ``keyid`` and ``sign(pae_bytes) -> bytes``
(:class:`Signer`); a Sigstore keyless flow would verify its certificate first and hand the
certificate's public key to :class:`TrustSet` (not built here).

``cryptography`` is imported only when a key is loaded or a signature checked: a pod that
sets no trusted keys never imports it.

Shared module (build and runtime): imports nothing of the build side.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

from gemmar_aot.model.codec import plain_lock_bytes
from gemmar_aot.model.lock import Lock, lock_file_path, lock_sibling
from gemmar_aot.atomic_write import atomic_write_bytes
from gemmar_aot.errors import GemmarError

#: DSSE's payload type for an in-toto statement.
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
#: What SLSA calls the build type: a gemmar-aot build of one manifest into one lock.
BUILD_TYPE = "https://gemmar-aot.dev/build/v1"
#: Beside a lock (``lock_sibling``): ``locks/M.intoto.jsonl`` in a store, ``lock.intoto.jsonl``
#: in a wheel. One envelope per line, as SLSA's provenance files.
ENVELOPE_SUFFIX = ".intoto.jsonl"

#: The signing key: a PEM private key, or the path of one (a CI secret).
SIGN_KEY_ENV = "GEMMAR_AOT_SIGN_KEY"
#: The password of an encrypted signing key, when it is one.
SIGN_KEY_PASSWORD_ENV = "GEMMAR_AOT_SIGN_KEY_PASSWORD"
#: The pod's trusted public keys: a PEM file (one or more keys) or a directory of them.
TRUSTED_KEYS_ENV = "GEMMAR_AOT_TRUSTED_KEYS"
#: In a trusted-keys directory: key ids (one per line, ``#`` comments) that are refused even
#: when their key is present. Beside a trusted-keys file ``F``: ``F.revoked``.
REVOKED_FILE = "revoked.txt"
#: Files of a trusted-keys directory that are read as keys.
KEY_FILE_SUFFIXES = (".pem", ".pub")
#: An envelope larger than this is refused unread (ours are ~2 KB).
MAX_ENVELOPE_BYTES = 1 << 20

_FIX_TRUST = (f"sign the lock with a trusted key (gemmar-aot build/wheel --sign-key KEY), or add the "
              f"signer's public key to ${TRUSTED_KEYS_ENV}")


class SignatureError(GemmarError):
    """A signing key, a trust set or an envelope cannot be used, or a lock is not vouched for."""


def envelope_path(lock_path: str | os.PathLike) -> Path:
    """Where the signature envelope of the lock at ``lock_path`` lives."""
    return lock_sibling(lock_path, ENVELOPE_SUFFIX)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what a signature is over."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _keyid(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _algorithm(key: Any, where: str) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return "ed25519"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and key.curve.name == "secp256r1":
        return "ecdsa-p256"
    raise SignatureError(f"{where} is a {type(key).__name__.lstrip('_')} key; gemmar-aot signs with Ed25519 or "
                         f"ECDSA P-256 only: make one with `gemmar-aot keygen`")


# ---------------------------------------------------------------------------
# signing (the build side)
# ---------------------------------------------------------------------------


class Signer(Protocol):
    """What signs: a key id and a signature over DSSE's PAE bytes (a file key, a KMS, an HSM)."""

    keyid: str

    def sign(self, data: bytes) -> bytes: ...


@dataclass(frozen=True)
class SigningKey:
    """A private key read from a PEM file or a CI secret. ``where`` names its source, never its bytes."""

    keyid: str
    algorithm: str
    where: str
    _key: Any = field(repr=False, compare=False)

    def sign(self, data: bytes) -> bytes:
        if self.algorithm == "ed25519":
            return self._key.sign(data)
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def load_signing_key(spec: str | os.PathLike, where: str = "--sign-key") -> SigningKey:
    """The private key ``spec`` names: PEM text, or the path of a PEM file. Errors name ``where``
    (the option or variable) and the file, never the key's bytes."""
    from cryptography.hazmat.primitives import serialization

    text = os.fspath(spec)
    from_env = where.startswith("$")
    if isinstance(text, str) and "-----BEGIN" in text:
        data, src = text.encode(), f"the key in {where}"
    else:
        path = Path(text).expanduser()
        # A value from the environment may be a secret that is not a PEM (say, base64 of one): it is
        # never repeated in a message, whatever it holds.
        shown = f"the path in {where}" if from_env or "\n" in text or len(text) > 4096 else str(path)
        try:
            data = path.read_bytes()
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise SignatureError(f"cannot read the signing key ({shown}, {where}): {why}; give a PEM private "
                                 f"key, or the path of one (gemmar-aot keygen makes one)") from None
        src = f"{shown} ({where})" if shown != str(path) else f"{path} ({where})"
    password = os.environ.get(SIGN_KEY_PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(data, password=password.encode() if password else None)
    except TypeError:
        raise SignatureError(f"the signing key {src} is encrypted: put its password in "
                             f"${SIGN_KEY_PASSWORD_ENV}") from None
    except ValueError:
        raise SignatureError(f"{src} is not a PEM private key (or its password in ${SIGN_KEY_PASSWORD_ENV} "
                             f"is wrong); give an Ed25519 or ECDSA P-256 key in PEM (gemmar-aot keygen "
                             f"makes one)") from None
    alg = _algorithm(key, src)
    return SigningKey(_keyid(key.public_key()), alg, src, key)


def signing_keys(specs: Sequence[str | os.PathLike] = ()) -> list[SigningKey]:
    """The keys a build signs with: ``specs`` (``--sign-key``, repeatable for key rotation), else
    ``$GEMMAR_AOT_SIGN_KEY`` (a PEM key or its path), else none."""
    if specs:
        return [load_signing_key(s) for s in specs]
    env = os.environ.get(SIGN_KEY_ENV, "").strip()
    return [load_signing_key(env, f"${SIGN_KEY_ENV}")] if env else []


def generate_key(out_dir: str | os.PathLike, name: str, algorithm: str = "ed25519") -> tuple[Path, Path, str]:
    """A new key pair: ``out_dir/name.key`` (private, PKCS#8 PEM, mode 0600) and
    ``out_dir/name.pub.pem`` (public). Returns both paths and the key id. Refuses to overwrite."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if algorithm == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
    elif algorithm == "ecdsa-p256":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        raise SignatureError(f"unknown key algorithm {algorithm!r}: use ed25519 or ecdsa-p256")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    priv, pub = out / f"{name}.key", out / f"{name}.pub.pem"
    for p in (priv, pub):
        if p.exists():
            raise SignatureError(f"{p} exists; gemmar-aot keygen never overwrites a key (choose another --name)")
    fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub, _keyid(key.public_key())


def statement(lock_name: str, lock_sha256: str, predicate: Mapping[str, Any]) -> dict:
    """The in-toto Statement v1 a lock's envelope carries."""
    return {"_type": STATEMENT_TYPE, "subject": [{"name": lock_name, "digest": {"sha256": lock_sha256}}],
            "predicateType": PREDICATE_TYPE, "predicate": dict(predicate)}


def provenance(*, manifest: Mapping[str, str], profile: str | None, toolchain_digest: str,
               gemmar_aot: Mapping[str, str], audit: Mapping[str, Any] | None, started: datetime,
               finished: datetime, expires: datetime | None = None, builder: str = "gemmar-aot build") -> dict:
    """The SLSA Provenance v1 predicate of a build: what was built from what, by which code, when.
    ``audit``: how many remote hits were recompiled and compared before they were trusted (None:
    no remote was used, or its hits were not audited)."""
    metadata = {"startedOn": _rfc3339(started), "finishedOn": _rfc3339(finished)}
    if expires is not None:
        metadata["expiresOn"] = _rfc3339(expires)
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"manifest": dict(manifest), "profile": profile or "default"},
            "internalParameters": {"toolchain": {"digest": toolchain_digest}, "remote_audit": audit},
            "resolvedDependencies": [{"name": "gemmar-aot", "digest": {"sha256": gemmar_aot["source_digest"]},
                                      "annotations": {"version": gemmar_aot["version"]}}],
        },
        "runDetails": {"builder": {"id": builder}, "metadata": metadata},
    }


def sign_statement(stmt: Mapping[str, Any], signers: Sequence[Signer]) -> bytes:
    """One DSSE envelope (a JSON line) over ``stmt``, signed by every one of ``signers``."""
    if not signers:
        raise SignatureError("nothing to sign with: give --sign-key KEY or set $" + SIGN_KEY_ENV)
    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()
    to_sign = pae(PAYLOAD_TYPE, payload)
    sigs = [{"keyid": s.keyid, "sig": base64.b64encode(s.sign(to_sign)).decode()} for s in signers]
    env = {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE, "signatures": sigs}
    return json.dumps(env, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def lock_statement(lock_bytes: bytes, *, audit: Mapping[str, Any] | None = None, started: datetime | None = None,
                   expires: datetime | None = None, builder: str = "gemmar-aot build",
                   lock: Lock | None = None) -> dict:
    """The statement that vouches for the lock whose canonical bytes are ``lock_bytes``: the lock by
    its store name (``<manifest>[.<profile>].lock.json``) and sha256, the build's provenance read
    from the lock itself, and this gemmar-aot."""
    lock = lock if lock is not None else Lock.from_bytes(lock_bytes, "<lock to sign>")
    now = datetime.now(timezone.utc)
    name = lock_file_path("", lock.manifest.name, lock.toolchain.profile).name
    pred = provenance(manifest={"name": lock.manifest.name, "sha256": lock.manifest.sha256},
                      profile=lock.toolchain.profile, toolchain_digest=lock.toolchain.digest,
                      gemmar_aot=own_identity(), audit=audit, started=started or now, finished=now,
                      expires=expires, builder=builder)
    return statement(name, hashlib.sha256(lock_bytes).hexdigest(), pred)


def sign_lock_file(lock_path: str | os.PathLike, signers: Sequence[Signer], *, lock: Lock | None = None,
                   **statement_args: Any) -> Path:
    """Sign the lock at ``lock_path``: its envelope written beside it (atomically). Returns its path.
    ``lock``: the lock the caller wrote there; then what is signed is its canonical bytes, never
    what the file holds by now (a writer of the store could have swapped it), and a file that is
    not those bytes is refused."""
    lock_path = Path(lock_path)
    plain = plain_lock_bytes(lock_path.read_bytes(), str(lock_path))
    if lock is not None:
        mine = lock.to_bytes()
        if plain != mine:
            raise SignatureError(f"{lock_path} is not the lock this build wrote (it changed after it was written): "
                                 f"nothing signed; rebuild")
        plain = mine
    env = sign_statement(lock_statement(plain, lock=lock, **statement_args), signers)
    dest = envelope_path(lock_path)
    atomic_write_bytes(dest, env)
    return dest


_OWN: dict | None = None


def own_identity() -> dict:
    """This gemmar-aot: its version and the digest of its sources and recipes (:func:`source_digest`)."""
    global _OWN
    if _OWN is None:
        import importlib.util

        import gemmar_aot

        roots = [Path(gemmar_aot.__file__).parent]
        spec = importlib.util.find_spec("gemmar_aot_kernels")
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).parent)
        _OWN = {"version": gemmar_aot.__version__, "source_digest": source_digest(roots)}
    return _OWN


def parse_duration(text: str) -> float:
    """``90d``, ``12h``, ``30m``, ``45s`` -> seconds (for ``--sign-expires``)."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    t = str(text).strip()
    try:
        value = float(t[:-1]) if t and t[-1] in units else float("nan")
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise SignatureError(f"{text!r} is not a duration: give a positive number and a unit, d, h, m or s "
                             f"(90d, 12h)")
    return value * units[t[-1]]


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: Any, where: str) -> datetime:
    try:
        return datetime.strptime(str(s), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise SignatureError(f"{where}: {s!r} is not an RFC 3339 UTC time (YYYY-MM-DDTHH:MM:SSZ)") from None


# ---------------------------------------------------------------------------
# reading an envelope (inspect, verify)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """A DSSE envelope as read, not yet verified: its statement and its signatures."""

    where: str
    payload: bytes
    statement: dict
    signatures: tuple[tuple[str, bytes], ...]  # (keyid, signature)

    @property
    def subject(self) -> tuple[str, str]:
        """The lock it vouches for: (name, sha256)."""
        s = self.statement["subject"][0]
        return s["name"], s["digest"]["sha256"]

    @property
    def predicate(self) -> dict:
        return self.statement.get("predicate") or {}

    @property
    def expires(self) -> datetime | None:
        v = ((self.predicate.get("runDetails") or {}).get("metadata") or {}).get("expiresOn")
        return None if v is None else parse_time(v, f"{self.where}: expiresOn")

    def summary(self) -> dict:
        """Who signed and what the provenance says, for inspect and verify (no key bytes)."""
        p = self.predicate
        bd, rd = p.get("buildDefinition") or {}, p.get("runDetails") or {}
        ext, internal = bd.get("externalParameters") or {}, bd.get("internalParameters") or {}
        dep = next(iter(bd.get("resolvedDependencies") or [{}]), {})
        meta = rd.get("metadata") or {}
        return {"subject": {"name": self.subject[0], "sha256": self.subject[1]},
                "signers": [k for k, _ in self.signatures],
                "manifest": ext.get("manifest"), "profile": ext.get("profile"),
                "toolchain_digest": (internal.get("toolchain") or {}).get("digest"),
                "remote_audit": internal.get("remote_audit"),
                "gemmar_aot": {"version": (dep.get("annotations") or {}).get("version"),
                               "source_digest": (dep.get("digest") or {}).get("sha256")},
                "builder": (rd.get("builder") or {}).get("id"),
                "finished": meta.get("finishedOn"), "expires": meta.get("expiresOn")}


def read_envelope(data: bytes, where: str) -> Envelope:
    """Parse an envelope's bytes (one JSON line) and check its shape. Verifies no signature."""
    bad = f"{where} is not a gemmar-aot signature envelope (DSSE, in-toto Statement v1)"
    fix = "re-sign the lock (gemmar-aot sign LOCK --sign-key KEY)"
    if len(data) > MAX_ENVELOPE_BYTES:
        raise SignatureError(f"{bad}: {len(data)} bytes, more than {MAX_ENVELOPE_BYTES}; {fix}")
    try:
        env = json.loads(data)
        if not isinstance(env, dict):
            raise TypeError("the envelope is not a JSON object")
        if env["payloadType"] != PAYLOAD_TYPE:
            raise SignatureError(f"{bad}: payloadType {env['payloadType']!r}, not {PAYLOAD_TYPE!r}; {fix}")
        payload = base64.b64decode(env["payload"], validate=True)
        sigs = tuple((str(s["keyid"]), base64.b64decode(s["sig"], validate=True)) for s in env["signatures"])
        stmt = json.loads(payload)
        if not isinstance(stmt, dict) or not isinstance(stmt.get("subject"), list) or not all(
                isinstance(x, dict) and isinstance(x.get("digest"), dict) for x in stmt["subject"]):
            raise TypeError("the statement is not an in-toto statement object")
        if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
            raise SignatureError(f"{bad}: statement type {stmt.get('_type')!r} / predicate type "
                                 f"{stmt.get('predicateType')!r}; {fix}")
        subj = stmt["subject"]
        if len(subj) != 1 or not isinstance(subj[0]["digest"]["sha256"], str) or not isinstance(subj[0]["name"], str):
            raise SignatureError(f"{bad}: it must name exactly one subject, the lock; {fix}")
    except SignatureError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, binascii.Error) as exc:
        raise SignatureError(f"{bad} ({type(exc).__name__}: {exc}); {fix}") from None
    if not sigs:
        raise SignatureError(f"{where} carries no signature; {fix}")
    return Envelope(where, payload, stmt, sigs)


# ---------------------------------------------------------------------------
# the trust set (the pod side)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TrustedKey:
    keyid: str
    algorithm: str
    name: str  # the file it came from, for messages
    _key: Any = field(repr=False, compare=False)

    def verifies(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            if self.algorithm == "ed25519":
                self._key.verify(signature, data)
            else:
                from cryptography.hazmat.primitives import hashes
                from cryptography.hazmat.primitives.asymmetric import ec

                self._key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class Verified:
    """A lock vouched for: by which key (id and file) and with which provenance."""

    keyid: str
    signer: str
    envelope: Envelope

    def describe(self) -> str:
        return f"key {self.keyid[:16]} ({self.signer})"


@dataclass(frozen=True)
class TrustSet:
    """The public keys a pod trusts (several at once while keys rotate) and the revoked key ids."""

    keys: tuple[TrustedKey, ...]
    revoked: frozenset[str]
    source: str

    def by_id(self) -> dict[str, TrustedKey]:
        return {k.keyid: k for k in self.keys}

    def verify(self, envelope_bytes: bytes | None, lock_bytes: bytes, lock_where: str,
               envelope_where: str, now: datetime | None = None) -> Verified:
        """Check that a signature by a trusted, unrevoked key covers exactly these lock bytes (the
        canonical bytes, decompressed) and has not expired. Raises SignatureError naming the lock,
        the signer and the fix."""
        if envelope_bytes is None:
            raise SignatureError(f"the lock {lock_where} is not signed (no {envelope_where}) and trusted keys are "
                                 f"set ({self.source}): {_FIX_TRUST}")
        env = read_envelope(envelope_bytes, envelope_where)
        name, want = env.subject
        have = hashlib.sha256(lock_bytes).hexdigest()
        to_check = pae(PAYLOAD_TYPE, env.payload)
        trusted = self.by_id()
        revoked, unknown, bad = [], [], []
        good: Verified | None = None
        for keyid, sig in env.signatures:
            key = trusted.get(keyid)
            if keyid in self.revoked:
                revoked.append(keyid)
            elif key is None:
                unknown.append(keyid)
            elif not key.verifies(sig, to_check):
                bad.append(keyid)
            elif good is None:
                good = Verified(keyid, key.name, env)
        if good is None:
            if bad:
                why = (f"its signature by trusted key {bad[0][:16]} does not verify: the envelope was modified "
                       f"after signing")
            elif revoked:
                why = (f"it is signed by key {revoked[0][:16]}, which is revoked ({self.source}); re-sign the lock "
                       f"with a current key")
            else:
                why = (f"it is signed by key{'s' if len(unknown) > 1 else ''} "
                       f"{', '.join(k[:16] for k in unknown)}, none of them trusted ({self.source})")
            raise SignatureError(f"the lock {lock_where} is not vouched for: {why}; {_FIX_TRUST}")
        if want != have:
            raise SignatureError(
                f"the lock {lock_where} is not the lock its signature vouches for ({envelope_where}, signed by "
                f"{good.describe()}): the signature is over {name} with sha256 {want[:16]}, these bytes have "
                f"sha256 {have[:16]}; the lock was modified or its envelope belongs to another lock: reinstall "
                f"the artifacts or rebuild and re-sign them")
        exp = env.expires
        if exp is not None and (now or datetime.now(timezone.utc)) >= exp:
            raise SignatureError(f"the signature of {lock_where} by {good.describe()} expired on {_rfc3339(exp)}: "
                                 f"rebuild and re-sign the artifacts (gemmar-aot build/wheel --sign-key KEY)")
        return good


def describe_signature(envelope: bytes | None, lock_bytes: bytes, lock_where: str, envelope_where: str,
                       trust: TrustSet | None) -> tuple[dict | None, str | None]:
    """For inspect and verify: (who signed and the provenance, or None when unsigned; the problem,
    or None). With ``trust``, the summary's ``verified`` is the signer that verified or False."""
    if envelope is None:
        return None, (f"the lock {lock_where} is not signed (no {envelope_where})" if trust is not None else None)
    try:
        out = read_envelope(envelope, envelope_where).summary()
    except SignatureError as e:
        return None, str(e)
    out["verified"] = None
    if trust is None:
        if out["subject"]["sha256"] != hashlib.sha256(lock_bytes).hexdigest():
            return out, (f"{envelope_where} vouches for other bytes than the lock {lock_where} (rebuilt after it was "
                         f"signed?): re-sign it (gemmar-aot sign LOCK --sign-key KEY)")
        return out, None
    try:
        v = trust.verify(envelope, lock_bytes, lock_where, envelope_where)
    except SignatureError as e:
        out["verified"] = False
        return out, str(e)
    out["verified"] = {"keyid": v.keyid, "signer": v.signer}
    return out, None


def _public_keys_in(data: bytes, where: str) -> list[TrustedKey]:
    from cryptography.hazmat.primitives import serialization

    out = []
    blocks = data.split(b"-----BEGIN ")[1:]
    if not blocks:
        raise SignatureError(f"{where} holds no PEM public key; put one or more PUBLIC KEY blocks in it "
                             f"(gemmar-aot keygen writes NAME.pub.pem)")
    for block in blocks:
        pem = b"-----BEGIN " + block
        if pem.startswith(b"-----BEGIN PRIVATE KEY") or b"PRIVATE KEY-----" in pem.split(b"\n", 1)[0]:
            raise SignatureError(f"{where} holds a private key: a pod must be given only public keys "
                                 f"(NAME.pub.pem); remove it from the trusted keys and rotate that key")
        try:
            key = serialization.load_pem_public_key(pem)
        except ValueError:
            raise SignatureError(f"{where} holds a PEM block that is not a public key") from None
        out.append(TrustedKey(_keyid(key), _algorithm(key, where), where, key))
    return out


def _revoked_ids(path: Path) -> set[str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise SignatureError(f"cannot read the revocation list {path}: {exc.strerror or exc}") from None
    out = set()
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip().removeprefix("sha256:")
        if not line:
            continue
        if len(line) != 64 or any(c not in "0123456789abcdef" for c in line):
            raise SignatureError(f"{path}:{n}: {line!r} is not a key id (64 hex digits: the sha256 of the key, "
                                 f"as gemmar-aot keygen and inspect print it)")
        out.add(line)
    return out


def load_trust(spec: Any) -> TrustSet:
    """The trust set ``spec`` names: a PEM file of public keys (its revocation list ``F.revoked``
    beside it), a directory of ``*.pem``/``*.pub`` files (revocation list ``revoked.txt``), PEM
    bytes, a list of any of these, or a TrustSet."""
    if isinstance(spec, TrustSet):
        return spec
    keys: list[TrustedKey] = []
    revoked: set[str] = set()
    sources: list[str] = []
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    for item in items:
        if isinstance(item, TrustSet):
            keys += item.keys
            revoked |= item.revoked
            sources.append(item.source)
        elif isinstance(item, (bytes, bytearray)):
            keys += _public_keys_in(bytes(item), "trusted_keys= (PEM bytes)")
            sources.append("trusted_keys=")
        elif isinstance(item, (str, os.PathLike)):
            path = Path(item).expanduser()
            if path.is_dir():
                files = sorted(p for p in path.iterdir() if p.suffix in KEY_FILE_SUFFIXES and p.is_file())
                if not files:
                    raise SignatureError(f"the trusted-keys directory {path} holds no *.pem or *.pub file; put "
                                         f"the signers' public keys there (NAME.pub.pem from gemmar-aot keygen)")
                for p in files:
                    keys += _public_keys_in(p.read_bytes(), str(p))
                revoked |= _revoked_ids(path / REVOKED_FILE)
            elif path.is_file():
                keys += _public_keys_in(path.read_bytes(), str(path))
                revoked |= _revoked_ids(path.with_name(path.name + ".revoked"))
            else:
                raise SignatureError(f"the trusted keys {path} do not exist: point ${TRUSTED_KEYS_ENV} or "
                                     f"trusted_keys= at a PEM file of public keys or a directory of them")
            sources.append(str(path))
        else:
            raise TypeError(f"trusted_keys= must be a path, PEM bytes, a TrustSet or a list of these; got "
                            f"{type(item).__name__}")
    if not keys:
        raise SignatureError("the trusted keys are empty: name at least one public key")
    return TrustSet(tuple(keys), frozenset(revoked), ", ".join(sources))


def trust_from(trusted_keys: Any = None) -> TrustSet | None:
    """``trusted_keys`` if given, else ``$GEMMAR_AOT_TRUSTED_KEYS`` if set, else None (nothing is
    authenticated)."""
    if isinstance(trusted_keys, str) and os.pathsep in trusted_keys:  # as the variable spells several
        trusted_keys = [p for p in trusted_keys.split(os.pathsep) if p.strip()]
    if trusted_keys is not None:
        return load_trust(trusted_keys)
    env = os.environ.get(TRUSTED_KEYS_ENV, "").strip()
    if not env:
        return None
    return load_trust([p for p in env.split(os.pathsep) if p.strip()])


def source_digest(roots: Iterable[Path]) -> str:
    """sha256 over the Python sources under ``roots`` (relative name and bytes of each ``*.py``):
    which gemmar-aot code made a build, for its provenance."""
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            rel = f"{root.name}/{p.relative_to(root).as_posix()}"
            data = p.read_bytes()
            h.update(b"%s\0%d\0" % (rel.encode(), len(data)))
            h.update(data)
    return h.hexdigest()
