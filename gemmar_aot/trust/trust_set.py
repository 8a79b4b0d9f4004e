"""Checking a lock's signature before a pod loads any of it: :class:`TrustSet` (the trusted,
unrevoked keys, from ``trusted_keys=`` or ``$GEMMAR_AOT_TRUSTED_KEYS``, :func:`trust_from`)
verifies an envelope over exactly the lock's bytes, by a trusted key, not expired, and says who
vouched (:class:`Verified`); :func:`describe_signature` is what ``verify`` and ``inspect``
print."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from .envelope import Envelope, PAYLOAD_TYPE, _rfc3339, pae, read_envelope
from .signing_keys import KEY_FILE_SUFFIXES, REVOKED_FILE, SignatureError, TRUSTED_KEYS_ENV, TrustedKey, _public_keys_in, _revoked_ids
from gemmar_aot.util.filedigest import sha256_hex

_FIX_TRUST = (f"sign the lock with a trusted key (gemmar-aot build/wheel --sign-key KEY), or add the "
              f"signer's public key to ${TRUSTED_KEYS_ENV}")


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

    def signer(self, signatures: Iterable[tuple[str, bytes]], data: bytes) -> tuple[TrustedKey | None, dict]:
        """The first trusted, unrevoked key among ``signatures`` ((key id, signature) pairs) whose
        signature over ``data`` verifies, or None; and the key ids that did not, by why:
        ``revoked``, ``unknown``, ``bad`` (a trusted key whose signature does not verify)."""
        trusted = self.by_id()
        refused: dict[str, list[str]] = {"revoked": [], "unknown": [], "bad": []}
        for keyid, sig in signatures:
            key = trusted.get(keyid)
            if keyid in self.revoked:
                refused["revoked"].append(keyid)
            elif key is None:
                refused["unknown"].append(keyid)
            elif not key.verifies(sig, data):
                refused["bad"].append(keyid)
            else:
                return key, refused
        return None, refused

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
        have = sha256_hex(lock_bytes)
        key, refused = self.signer(env.signatures, pae(PAYLOAD_TYPE, env.payload))
        revoked, unknown, bad = refused["revoked"], refused["unknown"], refused["bad"]
        good = None if key is None else Verified(key.keyid, key.name, env)
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
        if out["subject"]["sha256"] != sha256_hex(lock_bytes):
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


def load_trust(spec: Any, where: str | None = None) -> TrustSet:
    """The trust set ``spec`` names: a PEM file of public keys (its revocation list ``F.revoked``
    beside it), a directory of ``*.pem``/``*.pub`` files (revocation list ``revoked.txt``), PEM
    bytes, a list of any of these, or a TrustSet. Errors name ``where`` (the option or variable
    it came from; default: the pod's ``$GEMMAR_AOT_TRUSTED_KEYS`` or ``trusted_keys=``)."""
    where = where or f"${TRUSTED_KEYS_ENV} or trusted_keys="
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
                raise SignatureError(f"the trusted keys {path} do not exist: point {where} at a PEM file of "
                                     f"public keys or a directory of them")
            sources.append(str(path))
        else:
            raise TypeError(f"trusted_keys= must be a path, PEM bytes, a TrustSet or a list of these; got "
                            f"{type(item).__name__}")
    if not keys:
        raise SignatureError(f"the trusted keys ({where}) are empty: name at least one public key")
    return TrustSet(tuple(keys), frozenset(revoked), ", ".join(sources))


def trust_from(trusted_keys: Any = None, *, env: str = TRUSTED_KEYS_ENV, option: str | None = None) -> TrustSet | None:
    """``trusted_keys`` if given, else ``$GEMMAR_AOT_TRUSTED_KEYS`` if set, else None (nothing is
    authenticated). ``env``/``option``: another set's variable and option, which errors name (the
    trusted compile keys', ``builder.compile_vouch``)."""
    if isinstance(trusted_keys, str) and os.pathsep in trusted_keys:  # as the variable spells several
        trusted_keys = [p for p in trusted_keys.split(os.pathsep) if p.strip()]
    if trusted_keys is not None:
        return load_trust(trusted_keys, option)
    value = os.environ.get(env, "").strip()
    if not value:
        return None
    return load_trust([p for p in value.split(os.pathsep) if p.strip()], None if env == TRUSTED_KEYS_ENV else f"${env}")
