"""What is signed, and how it is written: a DSSE envelope (``payloadType``, base64
``payload``, ``signatures[{keyid, sig}]``), each signature over DSSE's pre-authentication
encoding (:func:`pae`); its payload an in-toto Statement v1 whose one subject is the lock (its
file name and the sha256 of its canonical bytes), with a SLSA Provenance v1 predicate holding
the build's inputs; optionally ``expiresOn``. :func:`sign_lock_file` writes the envelope beside
the lock (its path: ``gemmar_aot.model.bundle.LockBundle.envelope``)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from gemmar_aot.model.lock_codec import plain_lock_bytes
from gemmar_aot.model.lock import Lock
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.util.canonical_json import canonical_json_line

from .signing_keys import SIGN_KEY_ENV, SignatureError, Signer
from gemmar_aot.util.filedigest import sha256_hex


#: DSSE's payload type for an in-toto statement.
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
#: What SLSA calls the build type: a gemmar-aot build of one manifest into one lock.
BUILD_TYPE = "https://gemmar-aot.dev/build/v1"
#: An envelope larger than this is refused unread (ours are ~2 KB).
MAX_ENVELOPE_BYTES = 1 << 20


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what a signature is over."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


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
    payload = canonical_json_line(stmt)
    to_sign = pae(PAYLOAD_TYPE, payload)
    sigs = [{"keyid": s.keyid, "sig": base64.b64encode(s.sign(to_sign)).decode()} for s in signers]
    env = {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE, "signatures": sigs}
    return canonical_json_line(env) + b"\n"


def lock_statement(lock_bytes: bytes, *, audit: Mapping[str, Any] | None = None, started: datetime | None = None,
                   expires: datetime | None = None, builder: str = "gemmar-aot build",
                   lock: Lock | None = None) -> dict:
    """The statement that vouches for the lock whose canonical bytes are ``lock_bytes``: the lock by
    its store name (``<manifest>[.<profile>].lock.json``) and sha256, the build's provenance read
    from the lock itself, and this gemmar-aot."""
    lock = lock if lock is not None else Lock.from_bytes(lock_bytes, "<lock to sign>")
    now = datetime.now(timezone.utc)
    name = LockBundle.in_store("", lock.manifest.name, lock.toolchain.profile).lock.name
    pred = provenance(manifest={"name": lock.manifest.name, "sha256": lock.manifest.sha256},
                      profile=lock.toolchain.profile, toolchain_digest=lock.toolchain.digest,
                      gemmar_aot=own_identity(), audit=audit, started=started or now, finished=now,
                      expires=expires, builder=builder)
    return statement(name, sha256_hex(lock_bytes), pred)


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
    dest = LockBundle(lock_path).envelope
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
