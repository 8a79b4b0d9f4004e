"""Wheel commands: ``gemmar-aot wheel`` (build one artifact wheel) and ``gemmar-aot inspect``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .trust_commands import (compile_key_options, resolve_compile_keys, resolve_signing, sign_options,
                             signature_lines)


def _mib(n: int) -> str:
    return f"{n:,d} B ({n / 2**20:.2f} MiB)"


def _coverage_lines(cov: list[dict]) -> list[str]:
    lines = []
    for g in cov:
        if g["transport"] == "ep":
            dt = g["dispatch_dtype"] + ("" if g["combine_dtype"] == g["dispatch_dtype"] else f"->{g['combine_dtype']}")
            lines.append(f"  ep         hidden={g['hidden']} max_tokens={g['max_tokens']} experts={g['experts']} "
                         f"topk={g['topk']} world={g['world']} {dt} {g['combine_mode']} {g['device']} "
                         f"ranks={len(g['ranks'])}")
            continue
        if g["transport"] == "hipcc":
            lines.append(f"  hipcc      {g['arch']} NIC {g['nic']}" + (" host proxy" if g["host_proxy"] else "")
                         + f": {', '.join(g['sources'])}")
            continue
        if g["transport"] == "jitv2":
            lines.append(f"  jitv2      {g['arch']} NIC {g['nic']}: mori JIT v2 {', '.join(g['plans'])}")
            continue
        wire = f" wire={g['wire']}" if g.get("wire") else ""
        mmax = f" m_max={g['m_max']}" if g.get("m_max") else ""
        lines.append(f"  {g['transport']:<10} M={','.join(map(str, g['m']))} N={g['n']} K={g['k']} "
                     f"world={g['world']} {g['quant']}{wire}{mmax} ranks={len(g['ranks'])}")
    return lines


@click.command("wheel")
@click.argument("manifest", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("dist"),
              show_default=True, help="Directory to write the wheel into.")
@click.option("--store", "store", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Artifact store to build into / reuse (default: $GEMMAR_AOT_STORE, else artifacts/).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compile workers for the kernels the store misses (default: the number of cores).")
@click.option("--version", "version", default=None,
              help="Wheel version (normalized PEP 440). Default: 1.0.0+<first 12 hex of the lock's sha256>.")
@click.option("--remote", "remote", metavar="URL", envvar="GEMMAR_AOT_REMOTE", default=None,
              help="Shared remote cache to fetch from (and upload to), as for build. [env: GEMMAR_AOT_REMOTE]")
@click.option("--remote-read-only", is_flag=True, help="Fetch from the remote cache, never upload.")
@click.option("--remote-required", is_flag=True, help="A failing remote cache is an error (exit 2).")
@click.option("--toolchain", "toolchain", default=None, metavar="PROFILE",
              help="Toolchain profile to build and package (default: $GEMMAR_AOT_TOOLCHAIN_PROFILE, else "
                   "'default'); a wheel holds one profile's lock, for pods with that profile's mori.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@sign_options
@compile_key_options
def wheel_cmd(manifest: Path, out: Path, store: Path | None, jobs: int | None, version: str | None,
              remote: str | None, remote_read_only: bool, remote_required: bool, toolchain: str | None,
              as_json: bool, quiet: bool, sign_keys: tuple[str, ...], sign_expires: str | None,
              compile_key: str | None, trusted_compile_keys: str | None) -> None:
    """Build MANIFEST (compiling only what the store misses) and write ONE installable wheel.

    The wheel holds the lock file and exactly the code objects it names, as a read-only
    store inside the package gemmar_artifacts_<manifest>; installing it makes the runtime
    find the kernels (entry-point group gemmar_aot.artifacts). Same lock -> same bytes.
    With --sign-key the lock is signed and the wheel carries its envelope (lock.intoto.jsonl);
    without, it carries the envelope beside the store's lock when that one vouches for it.
    """
    from .build_commands import compile_key_lines, format_summary
    from gemmar_aot.package.wheel import WheelBuildFailed, build_wheel

    signers, expires = resolve_signing(sign_keys, sign_expires)
    vouch_key, vouch_trust = resolve_compile_keys(compile_key, trusted_compile_keys)
    try:
        s = build_wheel(manifest, out, store=store, jobs=jobs, version=version,
                        progress=not (quiet or as_json), remote=(remote or "").strip() or None,
                        remote_read_only=remote_read_only, remote_required=remote_required,
                        toolchain_profile=toolchain, signers=signers, sign_expires=expires,
                        compile_key=vouch_key, trusted_compile_keys=vouch_trust)
    except WheelBuildFailed as exc:
        if as_json:
            click.echo(json.dumps({"wheel": None, "error": str(exc), "build": exc.summary}, indent=2,
                                  sort_keys=True))
        else:
            click.echo(format_summary(exc.summary))
            click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(s, indent=2, sort_keys=True))
        return
    b = s["build"]
    click.echo(f"built {b['manifest']}: {b['distinct_specs']} distinct specs, {b['hits']} in the store, "
               f"{b['compiled']} compiled ({b['wall_seconds']:.1f}s) -> {b['store']}")
    for line in compile_key_lines(b):
        click.echo(f"  {line}")
    click.echo(f"wheel: {s['wheel']}")
    click.echo(f"  {s['distribution']} {s['version']} (import {s['package']}), {s['arch']}, "
               f"toolchain {s['toolchain_profile']} {str(s['toolchain'])[:12]}")
    click.echo(f"  {s['kernels']} kernels, {s['code_objects']} code objects: raw {_mib(s['raw_bytes'])}, "
               f"blobs {_mib(s['blob_bytes'])}"
               + (f" + dictionary {s['dictionary_file_bytes']:,d} B" if s["dictionary"] else "")
               + f", wheel {_mib(s['wheel_bytes'])}")
    click.echo(f"  sha256 {s['wheel_sha256']}")
    sig = s.get("signature")
    click.echo(f"  signed by {', '.join(k[:16] for k in sig['signers'])}" if sig else "  unsigned")


@click.command("inspect")
@click.argument("wheel", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-manifest", is_flag=True, help="Do not print the manifest text.")
@click.option("--trusted-keys", "trusted_keys", default=None, metavar="PATH", envvar="GEMMAR_AOT_TRUSTED_KEYS",
              help="Also verify the lock's signature against these public keys (a PEM file or a directory), "
                   "as a pod would. [env: GEMMAR_AOT_TRUSTED_KEYS]")
def inspect_cmd(wheel: Path, as_json: bool, no_manifest: bool, trusted_keys: str | None) -> None:
    """Show what an artifact WHEEL holds and verify it (RECORD hashes, every blob's digest), who
    signed its lock and with which provenance.

    Exit code 1 when anything was modified after the wheel was built, or (with trusted keys) when
    its signature does not verify against them; 3 when it is intact as far as this gemmar-aot can
    tell but its lock is of a schema this one does not read (an older or a newer gemmar-aot built
    it), so its kernels were not checked.
    """
    from gemmar_aot.toolchain.profiles import DEFAULT_PROFILE
    from gemmar_aot.package.inspect import inspect_wheel

    r = inspect_wheel(wheel, trusted_keys=trusted_keys or None)
    status = 0 if r["ok"] else 1 if r["problems"] else 3  # (2 is click's usage error)
    if as_json:
        click.echo(json.dumps(r, indent=2, sort_keys=True))
        sys.exit(status)
    tc = r.get("toolchain") or {}
    inner = tc.get("toolchain") or {}
    man = r["manifest"]
    sz = r["sizes"]
    click.echo(f"{r['wheel']}")
    click.echo(f"  {r['distribution']} {r['version']} [{r['tag']}] package {r['package']}; "
               f"requires {', '.join(r['requires_dist']) or '-'}")
    click.echo(f"  entry points: {'; '.join(r['entry_points']) or 'NONE (the runtime will not find it)'}")
    click.echo(f"  arch {r['arch']} (code object v{r['code_object_version']}), built by {r['generator']}")
    click.echo(f"  toolchain {tc.get('profile') or DEFAULT_PROFILE} {tc.get('digest')}")
    if inner:
        click.echo("    " + ", ".join(f"{k}={inner[k]}" for k in sorted(inner)
                                      if k in ("flydsl_version", "linker", "python", "opt_level")))
    click.echo(f"  manifest {man['name']} ({man['file']}) sha256 {man['sha256']}")
    if r["other_schema"]:
        click.echo(f"  size: wheel {_mib(sz['wheel_bytes'])}; kernels, code objects and tuples covered not read: "
                   f"the lock is of another schema")
    else:
        click.echo(f"  {r['kernels']} kernels, {r['code_objects']} code objects")
        click.echo(f"  size: wheel {_mib(sz['wheel_bytes'])}, compressed blobs {_mib(sz['blob_bytes'])}"
                   + (f" + dictionary {sz['dictionary_file_bytes']:,d} B" if sz["dictionary_file_bytes"] else "")
                   + f", raw code objects {_mib(sz['raw_bytes'])}")
    for line in signature_lines(r.get("signature")):
        click.echo("  " + line)
    if not r["other_schema"]:
        click.echo("  tuples covered:")
        for line in _coverage_lines(r["coverage"]):
            click.echo("  " + line)
    if not no_manifest and man.get("text"):
        click.echo("  manifest text:")
        for line in man["text"].rstrip("\n").splitlines():
            click.echo(f"    | {line}")
    if r["ok"]:
        click.echo(f"verified: {r['files_checked']} files match RECORD, every blob matches its digest")
    for p in r["problems"]:
        click.echo(f"TAMPERED {p}")
    if r["problems"]:
        click.echo(f"{len(r['problems'])} problem(s): this wheel was modified after it was built; "
                   f"do not install it")
    elif r["other_schema"]:
        click.echo(f"OTHER SCHEMA {r['other_schema']}")
        click.echo(f"not damaged as far as this gemmar-aot can tell ({r['files_checked']} files match RECORD), "
                   f"but its kernels were not checked: inspect it with the gemmar-aot that built it, or build "
                   f"the wheel again with this one (gemmar-aot wheel MANIFEST)")
    sys.exit(status)


COMMANDS = (wheel_cmd, inspect_cmd,)
