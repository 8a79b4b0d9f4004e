"""Who signs and who is trusted: signing keys (Ed25519 or ECDSA P-256, PEM, through
``cryptography``, imported only when a key is loaded), a key's id (the sha256 of its DER
SubjectPublicKeyInfo), the pod's trusted public keys and their revocation list. A KMS- or
HSM-held key plugs in as any object with ``keyid`` and ``sign(pae_bytes) -> bytes``
(:class:`Signer`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from gemmar_aot.util.errors import GemmarError
from gemmar_aot.util.filedigest import sha256_hex


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


class SignatureError(GemmarError):
    """A signing key, a trust set or an envelope cannot be used, or a lock is not vouched for."""


def _keyid(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return sha256_hex(der)


def _algorithm(key: Any, where: str) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return "ed25519"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and key.curve.name == "secp256r1":
        return "ecdsa-p256"
    raise SignatureError(f"{where} is a {type(key).__name__.lstrip('_')} key; gemmar-aot signs with Ed25519 or "
                         f"ECDSA P-256 only: make one with `gemmar-aot keygen`")


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
        hidden = from_env or "\n" in text or len(text) > 4096
        # where the key came from, said once: the option or variable names itself when the path is hidden
        src = f"the path in {where}" if hidden else f"{path} ({where})"
        try:
            data = path.read_bytes()
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise SignatureError(f"cannot read the signing key ({src}): {why}; give a PEM private "
                                 f"key, or the path of one (gemmar-aot keygen makes one)") from None
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


def signing_keys(specs: Sequence[str | os.PathLike] = (), *, env: str = SIGN_KEY_ENV,
                 option: str = "--sign-key") -> list[SigningKey]:
    """The keys a build signs with: ``specs`` (``--sign-key``, repeatable for key rotation), else
    ``$GEMMAR_AOT_SIGN_KEY`` (a PEM key or its path), else none. ``env``/``option``: another key's
    variable and option (the compile key's, ``builder.compile_vouch``)."""
    if specs:
        return [load_signing_key(s, option) for s in specs]
    value = os.environ.get(env, "").strip()
    return [load_signing_key(value, f"${env}")] if value else []


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
