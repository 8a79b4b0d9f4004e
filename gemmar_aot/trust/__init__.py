"""Signed locks: who vouched for a set of artifacts, checked before a pod loads any of it.

The lock commits to every record, code object, launcher and rank part it serves by digest,
and the runtime checks every one of those digests; so a signature over the lock's bytes is a
signature over everything a pod runs. This package writes and checks that signature: :mod:`.signing_keys` (who signs, who is trusted), :mod:`.envelope` (what is signed, DSSE + in-toto + SLSA) and :mod:`.trust_set` (the pod's check).

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
