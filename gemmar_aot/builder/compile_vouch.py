"""What a builder vouches for when it shares a kernel, and how a build checks who vouched.

A shared cache is written by every job that can reach it (fork pull requests included, in
many CI setups): anyone who can write it can map a key to another valid kernel, and a build
that trusts the cache takes it. As Nix's binary caches do, a builder signs what it compiled
and a client takes only what a key it trusts signed; the cache itself is not trusted.

* A **compile key** (``build --compile-key``, ``$GEMMAR_AOT_COMPILE_KEY``: a key pair from
  ``gemmar-aot keygen``, separate from the release key that signs locks) signs each
  action-cache entry the build compiled: :func:`statement` binds the action key to the
  record (its digest, :func:`gemmar_aot.store.record.record_digest`) and to every output
  digest (the code object, the launcher), in DSSE's pre-authentication encoding under
  :data:`PAYLOAD_TYPE`.
* The signatures travel in the record's ``vouched`` member (:data:`FIELD`): a volatile field,
  left out of the record digest, so a lock names the same record whoever vouched for it; a
  closure carries them for all its records (:mod:`.closure`).
* A build given **trusted compile keys** (``--trusted-compile-keys``,
  ``$GEMMAR_AOT_TRUSTED_COMPILE_KEYS``: public keys and a revocation list, as a pod's trusted
  keys) takes a remote entry only when one of its signatures is by a trusted, unrevoked key and
  verifies (:class:`VouchCheck`); an unsigned entry, or one signed by another key only, is a
  miss: compiled here, and uploaded signed when this build has a compile key.

What stays open: a compromised compile key vouches for anything until it is revoked (the audit,
``build --audit-remote``, stays as defence in depth), and the local store is trusted as it is.
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from typing import Any, Mapping

from gemmar_aot.model.types import Digest
from gemmar_aot.store.backend import record_blob, record_launcher
from gemmar_aot.store.record import VOUCHED_FIELD, record_digest
from gemmar_aot.trust.envelope import pae
from gemmar_aot.util.canonical_json import canonical_json_bytes

#: The record member holding the signatures (volatile: ``store.record.RECORD_VOLATILE_FIELDS``;
#: dropped when a record is derived again, ``builder.remote_session.RemoteSession.refresh``).
FIELD = VOUCHED_FIELD
#: DSSE payload type of a compile statement.
PAYLOAD_TYPE = "application/vnd.gemmar-aot.compile+json"
#: The compile key: a PEM private key, or the path of one (a CI secret).
COMPILE_KEY_ENV = "GEMMAR_AOT_COMPILE_KEY"
#: The compile keys a build trusts: a PEM file or a directory of them (``revoked.txt`` beside).
TRUSTED_COMPILE_KEYS_ENV = "GEMMAR_AOT_TRUSTED_COMPILE_KEYS"


def statement(key: str, rec: Mapping[str, Any], record: Digest | None = None) -> bytes:
    """What a compile key signs for the entry ``rec`` under action ``key``: the key, the record's
    digest (``record``, when the caller has verified it already) and every output's digest, as
    canonical JSON."""
    ln = record_launcher(rec)
    record = record if record is not None else record_digest(rec)
    return canonical_json_bytes({
        "what": "gemmar-aot compile", "version": 1, "key": key, "record": record.to_json(),
        "blob": record_blob(rec).to_json(), "launcher": None if ln is None else ln.to_json()})


def vouches(rec: Mapping[str, Any]) -> list[dict]:
    """The signatures ``rec`` carries (well-formed ones only)."""
    got = rec.get(FIELD)
    return [v for v in got if isinstance(v, dict) and isinstance(v.get("keyid"), str)
            and isinstance(v.get("sig"), str)] if isinstance(got, list) else []


def vouch(key: str, rec: Mapping[str, Any], signer: Any) -> dict:
    """``rec`` with ``signer``'s signature (a Signer: ``keyid``, ``sign(bytes)``) added (replacing an
    earlier one of the same key)."""
    sig = base64.b64encode(signer.sign(pae(PAYLOAD_TYPE, statement(key, rec)))).decode()
    kept = [v for v in vouches(rec) if v["keyid"] != signer.keyid]
    return {**rec, FIELD: [*kept, {"keyid": signer.keyid, "sig": sig}]}


class VouchCheck:
    """Who vouches for an entry among ``trust``'s keys (a :class:`~gemmar_aot.trust.trust_set.TrustSet`),
    and what was seen, the last answer per action key (a key asked of the closure, then of the
    remote key by key, counts once)."""

    def __init__(self, trust: Any):
        self.trust = trust
        #: action key -> (the vouching key id, or None and why: unsigned, untrusted, revoked, bad)
        self.seen: dict[str, tuple[str | None, str]] = {}

    def __call__(self, key: str, rec: Mapping[str, Any], record: Digest | None = None) -> str | None:
        """The id of a trusted, unrevoked key whose signature over ``rec`` (under ``key``; its digest
        ``record`` when verified already) verifies; None when there is none."""
        keyid, why = self._check(key, rec, record)
        self.seen[key] = (keyid, why)
        return keyid

    def _check(self, key: str, rec: Mapping[str, Any], record: Digest | None) -> tuple[str | None, str]:
        found = vouches(rec)
        if not found:
            return None, "unsigned"
        sigs = []
        for v in found:
            try:
                sigs.append((v["keyid"], base64.b64decode(v["sig"], validate=True)))
            except (binascii.Error, ValueError):
                sigs.append((v["keyid"], b""))  # never verifies: a bad signature of that key
        signer, refused = self.trust.signer(sigs, pae(PAYLOAD_TYPE, statement(key, rec, record)))
        if signer is not None:
            return signer.keyid, "vouched"
        return None, ("bad_signature" if refused["bad"] else "revoked" if refused["revoked"] else "untrusted")

    def summary(self) -> dict:
        """For the build summary and the lock's provenance: the remote entries checked, against
        which keys, and who vouched for the ones taken."""
        whys = Counter(why for _k, why in self.seen.values())
        by_key = Counter(k for k, _why in self.seen.values() if k is not None)
        return {"trusted_keys": sorted({k.keyid for k in self.trust.keys}), "revoked": sorted(self.trust.revoked),
                "vouched": whys["vouched"], "vouched_by": dict(sorted(by_key.items())),
                "refused": {w: whys[w] for w in ("unsigned", "untrusted", "revoked", "bad_signature") if whys[w]}}
