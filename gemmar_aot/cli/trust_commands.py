"""Trust commands: ``gemmar-aot keygen`` and ``sign`` (:mod:`gemmar_aot.trust`), ``audit``
(:mod:`gemmar_aot.builder.audit`), and the ``--sign-key`` options that ``build`` and ``wheel`` share."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


def sign_options(fn):
    """``--sign-key`` (repeatable) and ``--sign-expires``, for every command that signs a lock."""
    fn = click.option("--sign-expires", "sign_expires", default=None, metavar="DURATION",
                      help="The signature expires after this long (90d, 12h); pods refuse it after. "
                           "Default: never.")(fn)
    fn = click.option("--sign-key", "sign_keys", multiple=True, metavar="FILE",
                      help="Sign the lock with this PEM private key (Ed25519 or ECDSA P-256); repeat while "
                           "rotating keys. Default: $GEMMAR_AOT_SIGN_KEY (the key itself or its path), else "
                           "unsigned. The key never reaches a log, key, lock or summary.")(fn)
    return fn


def compile_key_options(fn):
    """``--compile-key`` and ``--trusted-compile-keys``: who signs what a build compiles for the shared
    cache, and whose signatures a build takes a remote entry on (``builder.compile_vouch``)."""
    fn = click.option("--trusted-compile-keys", "trusted_compile_keys", default=None, metavar="PATH",
                      help="Take a remote entry only when a compile key here signed it (a PEM file of public "
                           "keys, or a directory of them with revoked.txt; several joined by ':'); anything "
                           "else is compiled here. Default: $GEMMAR_AOT_TRUSTED_COMPILE_KEYS, else every "
                           "verified entry is taken.")(fn)
    fn = click.option("--compile-key", "compile_key", default=None, metavar="FILE",
                      help="Sign each kernel this build compiles, for the shared cache, with this PEM private "
                           "key (gemmar-aot keygen; not the release key). Default: $GEMMAR_AOT_COMPILE_KEY (the "
                           "key itself or its path), else unsigned.")(fn)
    return fn


def resolve_compile_keys(compile_key: str | None, trusted: str | None):
    """(the compile key's Signer or None, the trusted compile keys' TrustSet or None), loaded
    before anything runs: a bad key costs no compile."""
    from gemmar_aot.builder.compile_vouch import COMPILE_KEY_ENV, TRUSTED_COMPILE_KEYS_ENV
    from gemmar_aot.trust.signing_keys import signing_keys
    from gemmar_aot.trust.trust_set import trust_from

    signers = signing_keys([compile_key] if compile_key else (), env=COMPILE_KEY_ENV, option="--compile-key")
    trust = trust_from(trusted or None, env=TRUSTED_COMPILE_KEYS_ENV, option="--trusted-compile-keys")
    return (signers[0] if signers else None), trust


def resolve_signing(sign_keys: tuple[str, ...], sign_expires: str | None):
    """(signers, seconds to expiry): loaded before anything runs, so a bad key costs no compile."""
    from gemmar_aot.trust.envelope import parse_duration
    from gemmar_aot.trust.signing_keys import signing_keys

    signers = signing_keys(sign_keys)
    if sign_expires is not None and not signers:
        raise click.UsageError("--sign-expires needs a signing key (--sign-key or $GEMMAR_AOT_SIGN_KEY)")
    return signers, (parse_duration(sign_expires) if sign_expires is not None else None)


def signature_lines(sig: dict | None) -> list[str]:
    """Who signed a lock, the provenance they signed, and whether it verified (inspect, verify)."""
    if sig is None:
        return ["signature: none (unsigned: a pod with trusted keys refuses it)"]
    v = sig.get("verified")
    state = ("verifies against the given keys: " + f"{v['keyid'][:16]} ({v['signer']})" if isinstance(v, dict)
             else "does NOT verify against the given keys" if v is False else "not checked (no --trusted-keys)")
    man = sig.get("manifest") or {}
    audit = sig.get("remote_audit")
    ga = sig.get("gemmar_aot") or {}
    return [f"signature: {', '.join(k[:16] for k in sig['signers'])}; {state}",
            f"  provenance: {sig.get('builder')} of {man.get('name')} (sha256 {str(man.get('sha256'))[:16]}), "
            f"profile {sig.get('profile')}, toolchain {str(sig.get('toolchain_digest'))[:16]}, gemmar-aot "
            f"{ga.get('version')} (source {str(ga.get('source_digest'))[:16]}), finished {sig.get('finished')}"
            + (f", expires {sig['expires']}" if sig.get("expires") else ""),
            "  remote cache: " + ("not recorded (signed apart from the build)" if audit is None else
                                  "not used" if not audit.get("remote") else
                                  f"{audit.get('remote_hits')} hits taken, {audit.get('audited')} of them audited "
                                  f"by recompiling")]


@click.command("keygen")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Directory to write NAME.key and NAME.pub.pem into.")
@click.option("--name", default="gemmar-aot-signing", show_default=True, help="File name stem.")
@click.option("--algorithm", type=click.Choice(["ed25519", "ecdsa-p256"]), default="ed25519", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def keygen(out: Path, name: str, algorithm: str, as_json: bool) -> None:
    """Make a signing key pair: NAME.key (private, mode 0600: put it in CI's secret store) and
    NAME.pub.pem (public: give it to the pods, in $GEMMAR_AOT_TRUSTED_KEYS)."""
    from gemmar_aot.trust.signing_keys import generate_key

    priv, pub, keyid = generate_key(out, name, algorithm)
    if as_json:
        click.echo(json.dumps({"private_key": str(priv), "public_key": str(pub), "keyid": keyid,
                               "algorithm": algorithm}, indent=2, sort_keys=True))
        return
    click.echo(f"private key {priv} (keep it secret: CI's secret store)\npublic key  {pub} (the pods' "
               f"trusted keys)\nkey id      {keyid}")


@click.command("sign")
@click.argument("lock", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@sign_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sign_cmd(lock: Path, sign_keys: tuple[str, ...], sign_expires: str | None, as_json: bool) -> None:
    """Sign (or re-sign) a built LOCK file: its envelope is written beside it. For a packaging job
    that signs what a build job built; `gemmar-aot build --sign-key` signs as it builds."""
    from datetime import datetime, timedelta, timezone

    from gemmar_aot.trust.envelope import sign_lock_file
    from gemmar_aot.trust.signing_keys import SignatureError

    signers, expires_s = resolve_signing(sign_keys, sign_expires)
    if not signers:
        raise SignatureError("nothing to sign with: give --sign-key KEY or set $GEMMAR_AOT_SIGN_KEY")
    expires = None if expires_s is None else datetime.now(timezone.utc) + timedelta(seconds=expires_s)
    env = sign_lock_file(lock, signers, expires=expires, builder="gemmar-aot sign")
    out = {"lock": str(lock), "envelope": str(env), "keyids": [s.keyid for s in signers],
           "expires": None if expires is None else expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if as_json:
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        click.echo(f"signed {lock} by {', '.join(k[:16] for k in out['keyids'])} -> {env}")
    sys.exit(0)


@click.command("audit")
@click.argument("lock", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--sample", "n", type=click.IntRange(min=1), default=None, metavar="N",
              help="Audit N kernels, picked at random (seeded, reported). Default: all of them.")
@click.option("--all", "all_", is_flag=True, help="Audit every kernel the lock names (the default).")
@click.option("--seed", type=int, default=None, help="Seed of the sample (to replay an audit).")
@click.option("--store", "store", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The store whose entries are audited (default: the lock's own, <store>/locks/LOCK).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Compile workers.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def audit_cmd(lock: Path, n: int | None, all_: bool, seed: int | None, store: Path | None, jobs: int | None,
              as_json: bool, quiet: bool) -> None:
    """Recompile the kernels LOCK names (or a sample) in a scratch store and compare their bytes and
    records with the store's: a cache entry that is not what its key compiles to is reported as
    poisoned (key, both digests, where it came from) and quarantined. Exit code 1 on a finding."""
    from gemmar_aot.builder.audit import audit_lock

    if n is not None and all_:
        raise click.UsageError("--sample N and --all exclude each other")
    r = audit_lock(lock, store=store, n=n, seed=seed, jobs=jobs, progress=not (quiet or as_json))
    if as_json:
        click.echo(json.dumps(r, indent=2, sort_keys=True))
    else:
        click.echo(f"audited {r['audited']} of {r['kernels']} kernels of {r['lock']} (sample seed {r['seed']}) "
                   f"in {r['seconds']:.1f}s")
        for f in r["findings"]:
            from gemmar_aot.builder.audit import Finding

            click.echo(Finding(**f).describe())
        click.echo("every audited entry is what its key compiles to" if r["ok"] else
                   f"{len(r['findings'])} entr{'y' if len(r['findings']) == 1 else 'ies'} not what their keys compile "
                   f"to (or not comparable), quarantined in "
                   f"{r['store']}: the next build compiles them; find who could write them (the remote cache's "
                   f"access log) before trusting the cache again")
    sys.exit(0 if r["ok"] else 1)


COMMANDS = (keygen, sign_cmd, audit_cmd)
