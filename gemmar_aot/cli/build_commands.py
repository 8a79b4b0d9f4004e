"""Build commands: ``doctor``, ``plan``, ``build``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .trust_commands import compile_key_options, resolve_compile_keys, resolve_signing, sign_options

@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """Check every piece of the build toolchain; say how to fix what is missing."""
    from gemmar_aot.toolchain import doctor as run_doctor

    checks = run_doctor()
    if as_json:
        click.echo(json.dumps([{"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix}
                               for c in checks], indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            mark = "ok " if c.ok else "MISSING"
            click.echo(f"{mark:7} {c.name:<{width}}  {c.detail}")
            if not c.ok and c.fix:
                click.echo(f"{'':7} {'':<{width}}  fix: {c.fix}")
    sys.exit(0 if all(c.ok for c in checks) else 1)


@click.command()
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--verbose", "-v", is_flag=True, help="List every rank's kernel sequence.")
@click.option("--toolchain", "toolchain", default=None, metavar="PROFILE",
              help="Plan for this toolchain profile (its mori's EP factory keywords) [default: "
                   "$GEMMAR_AOT_TOOLCHAIN_PROFILE, else 'default'].")
def plan(manifest: Path, as_json: bool, verbose: bool, toolchain: str | None) -> None:
    """Show what MANIFEST expands to, without compiling."""
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan
    from gemmar_aot.toolchain.profiles import get_profile

    p = make_plan(load_manifest(manifest), mori_version=get_profile(toolchain).mori.version, profile=toolchain)
    if as_json:
        click.echo(json.dumps(p.to_json(), indent=2, sort_keys=True))
        return
    _echo_warnings(p.warnings)
    click.echo(f"manifest {p.manifest} ({p.arch}): {len(p.tuples)} tuples")
    for t in p.tuples:
        w = t.workload
        wire = f" wire={w.gather_dtype}/{w.gather_transport}" if w.collective else ""
        lay = "" if t.layout is None else f" m_max={t.layout.m_max} slot={t.layout.slot}"
        seq = " -> ".join(s.kind for s in t.ranks[0].launches)
        click.echo(f"  {w.transport:<10} M={w.m:<6} N={w.n} K={w.k} world={w.world} {w.quant}{wire}"
                   f"{lay}: {len(t.ranks)} rank(s) x [{seq}]"
                   + (f" + self-test [{' -> '.join(s.kind for s in t.ranks[0].self_test)}]"
                      if t.ranks[0].self_test else ""))
        if verbose:
            for r in t.ranks:
                click.echo(f"      rank {r.rank}: " + ", ".join(f"{s.kind}={s.spec_id[:12]}" for s in r.launches))
    if p.eps:
        click.echo(f"{len(p.eps)} EP entries (mori's dispatch/combine v2, FlyDSL):")
    for e in p.eps:
        c, j = e.entry.config, e.to_json()
        dt = c.dispatch_dtype if c.combine_dtype == c.dispatch_dtype else f"{c.dispatch_dtype}->{c.combine_dtype}"
        click.echo(f"  ep world={c.world} hidden={c.hidden} max_tokens={c.max_tokens} experts={c.experts} "
                   f"topk={c.topk} {dt} {c.combine_mode}" + (f" quant={c.quant_type}" if c.quant_type != "none" else "")
                   + f" {c.device}: window {e.arena.total:,} B; dispatch {j['variants']['dispatch']}, combine "
                   f"{j['variants']['combine']}; {len(e.ranks)} rank(s) x {len(e.ranks[0].launches)} kernels")
        if verbose:
            for r in e.ranks:
                click.echo(f"      rank {r.rank}: " + ", ".join(f"{s.kind}={s.spec_id[:12]}" for s in r.launches))
    for h in p.hipcc:
        vs = h.entry.variants
        click.echo(f"  hipcc ({h.entry.source}): {len(vs)} code object(s) of mori's hipcc-JIT kernels: "
                   + ", ".join(sorted({v.source for v in vs})) + f" for {'/'.join(sorted({v.arch for v in vs}))}, "
                   f"NIC {'/'.join(sorted({v.nic for v in vs}))}" + (" with the host proxy" if vs[0].host_proxy else ""))
    for j in p.jitv2:
        e = j.entry
        click.echo(f"  ep (HIP backend, mori's JIT v2; {e.source}): "
                   + ("internode" if e.internode else "intranode") + f" on {e.device} ({e.arch}): "
                   f"{len(j.units)} translation unit(s) for NIC {'/'.join(e.nics)}: "
                   + ", ".join(f"{u['plan']} {u['launch']['grid']}x{u['launch']['block']}" for u in j.units
                               if u["nic"] == e.nics[0]))
        if verbose:
            for u, s in zip(j.units, j.specs):
                click.echo(f"      {u['nic']} {u['entry']} -> {u['cache_entry']} = {s.spec_id[:12]}")
    click.echo(f"kernel instances: {p.instances}; distinct specs: {len(p.specs)}; "
               f"dedup ratio {p.dedup_ratio:.2f}")
    for kind, n in p.distinct_by_kind().items():
        click.echo(f"  {kind:<26} {n}")


@click.command()
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--store", "--out", "store", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Artifact store (default: $GEMMAR_AOT_STORE, else artifacts/ "
                                 "in the checkout).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compile workers (default: the number of cores).")
@click.option("--debug-locations", is_flag=True,
              help="Keep FlyDSL's source-location capture (readable compile errors, ~7x slower).")
@click.option("--only", "only", multiple=True,
              help="Compile only specs of this kind (gemm, drain, reduce, ...); repeatable.")
@click.option("--shard", "shard", metavar="I/N", default=None,
              help="Compile only share I of N (1-based) of the distinct specs, balanced by expected "
                   "compile cost; for CI matrices sharing a remote cache. Writes no lock file: a final "
                   "build of the whole manifest does.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where compiles run: worker processes here, or tasks on a Ray cluster "
                   "(needs the 'ray' extra and the same toolchain on every node).")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="The Ray cluster for --executor ray (default: $RAY_ADDRESS, else a cluster "
                   "running on this machine).")
@click.option("--remote", "remote", metavar="URL", envvar="GEMMAR_AOT_REMOTE", default=None,
              help="Shared cache speaking Bazel's HTTP protocol (bazel-remote, nginx+WebDAV), behind "
                   "the local store: hits are fetched and verified, new kernels uploaded. Credentials "
                   "from ~/.netrc or $GEMMAR_AOT_REMOTE_TOKEN, never in the URL. [env: GEMMAR_AOT_REMOTE]")
@click.option("--remote-read-only", is_flag=True, help="Fetch from the remote cache, never upload "
                                                         "(pull requests from forks).")
@click.option("--remote-required", is_flag=True, help="A failing remote cache is an error (exit 2), "
                                                        "not one warning.")
@click.option("--json", "as_json", is_flag=True, help="Print the build summary as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--toolchain", "toolchain", default=None, metavar="PROFILE",
              help="Toolchain profile (default: $GEMMAR_AOT_TOOLCHAIN_PROFILE, else 'default'); "
                   "`python -m gemmar_aot.toolchain profiles` lists them.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the build's timeline (per worker: import, trace, compile, store) as "
                   "Chrome-trace/Perfetto JSON to this file.")
@click.option("--audit-remote", "audit_remote", type=click.IntRange(min=0), default=0, metavar="N",
              help="Recompile N random remote hits in a scratch store and compare bytes before trusting the "
                   "rest; a poisoned entry distrusts every remote hit of the build (all compiled here).")
@click.option("--audit-seed", "audit_seed", type=int, default=None, help="Seed of --audit-remote's sample.")
@sign_options
@compile_key_options
def build(manifest: Path, store: Path | None, jobs: int | None, debug_locations: bool,
          only: tuple[str, ...], shard: str | None, executor: str, ray_address: str | None,
          remote: str | None, remote_read_only: bool, remote_required: bool,
          as_json: bool, quiet: bool, trace_path: Path | None, toolchain: str | None,
          audit_remote: int, audit_seed: int | None, sign_keys: tuple[str, ...], sign_expires: str | None,
          compile_key: str | None, trusted_compile_keys: str | None) -> None:
    """Compile every kernel MANIFEST needs into code objects in the store.

    mori's FlyDSL ops (gemm_ar's [[tuple]] and EP v2 FlyDSL [[ep]] entries) for gfx950; mori's
    hipcc-JIT kernels ([[hipcc]]) and JIT v2 kernels (HIP-backend [[ep]] entries) for gfx950 and
    gfx942, each arch and NIC variant the manifest names.

    Kernels already in the store (same action key, blob verified) are not
    compiled again. Writes the lock file <store>/locks/<manifest>.lock.json
    (<manifest>.<profile>.lock.json for a toolchain profile other than the default).
    With --executor ray, every kernel compiles on the Ray cluster's nodes (FlyDSL's in a worker,
    mori's hipcc-JIT and JIT v2 kernels as a clang process each) and this process alone writes
    the store.
    """
    from gemmar_aot.builder.pipeline import run_build
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.shard import parse_shard

    if ray_address and executor != "ray":
        raise click.UsageError("--ray-address needs --executor ray")
    if executor == "ray" and jobs is not None:
        raise click.UsageError("-j/--jobs is for the local executor; a Ray build uses every CPU of the cluster")
    shard_ix = parse_shard(shard) if shard is not None else None
    if audit_remote and not (remote or "").strip():
        raise click.UsageError("--audit-remote N audits remote hits: give --remote URL (or $GEMMAR_AOT_REMOTE)")
    signers, expires = resolve_signing(sign_keys, sign_expires)
    vouch_key, vouch_trust = resolve_compile_keys(compile_key, trusted_compile_keys)
    if signers and (shard_ix is not None or only):
        raise click.UsageError("--sign-key signs the lock, and a --shard or --only build writes none: sign the "
                               "final build of the whole manifest")
    loaded = load_manifest(manifest)  # read once: the build takes it as read
    _echo_warnings(loaded.warnings)  # before the long part (the summary repeats them)
    ex = None
    try:
        if executor == "ray":
            from gemmar_aot.compiler.ray_executor import RayExecutor

            ex = RayExecutor(ray_address, debug_locations=debug_locations, toolchain_profile=toolchain)
        summary = run_build(loaded, store=store, jobs=jobs, debug_locations=debug_locations,
                            only=only, shard=shard_ix, remote=(remote or "").strip() or None,
                            remote_read_only=remote_read_only, remote_required=remote_required,
                            progress=not quiet, trace_path=trace_path, executor=ex,
                            toolchain_profile=toolchain, signers=signers, sign_expires=expires,
                            audit_remote=audit_remote, audit_seed=audit_seed, compile_key=vouch_key,
                            trusted_compile_keys=vouch_trust)
    except KeyboardInterrupt:
        click.echo("\ninterrupted: every kernel that finished is in the store (each write is "
                   "atomic); run the same command again to compile the rest", err=True)
        sys.exit(130)
    finally:
        if ex is not None:
            ex.close()
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        click.echo(format_summary(summary), err=False)
    sys.exit(0 if summary["failed"] == 0 else 1)


def _echo_warnings(warnings) -> None:
    """The manifest's warnings (merged duplicates, off-grid range stops), on stderr."""
    for w in warnings:
        click.echo(f"warning: {w}", err=True)


def compile_key_lines(s: dict) -> list[str]:
    """What a build summary ``s`` says about compile keys: who signed what it compiled, who vouched
    for what it took from the remote and what it refused (none without compile keys)."""
    ck, lines = s.get("compile_keys"), []
    if ck and ck.get("signer"):
        lines.append(f"compile key {ck['signer'][:16]}: signed the {ck['signed']} kernels compiled here")
    if ck and "trusted_keys" in ck:
        refused = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in ck["refused"].items()) or "none"
        by = ", ".join(f"{k[:16]} {n}" for k, n in ck["vouched_by"].items()) or "none"
        lines.append(f"trusted compile keys ({len(ck['trusted_keys'])}): {ck['vouched']} remote entries vouched for "
                     f"({by}); refused, compiled here: {refused}")
    return lines


def format_summary(s: dict) -> str:
    share = (f" (shard {s['shard']}: {s['selected_specs']} of them)" if s.get("shard") else "")
    ex = s.get("executor") or {}
    where = (f"Ray at {ex['address']}: {s['jobs']} CPU(s)" if ex.get("name") == "ray"
             else f"{s['jobs']} worker(s)")
    r = s.get("remote")
    found = (f"{s['local_hits']} in the store, {s['remote_hits']} from the remote cache"
             if r else f"{s['hits']} in the store")
    lines = [f"built {s['manifest']} with toolchain {s.get('toolchain_profile', 'default')}: "
             f"{s['distinct_specs']} distinct specs{share} for "
             f"{s['kernel_instances']} kernel instances: {found}, "
             f"{s['compiled']} compiled, {s['failed']} failed, in {s['wall_seconds']:.1f}s "
             f"({where}) -> {s['store']}"]
    for bad in s.get("contradicted") or ():
        lines.append(f"DAMAGED record {bad['key'][:16]} (quarantined, compiled again): {bad['problem']}")
    for node, n in (ex.get("specs_by_node") or {}).items():
        lines.append(f"  {n:4d} compiled on {node}")
    if r:
        mode = "read-only" if r["read_only"] else f"{r['uploads']} uploaded"
        lines.append(f"remote {r['url']}: {r['hits']} hits, {mode}, {r['bytes_down']:,d} bytes down, "
                     f"{r['bytes_up']:,d} up, {r['requests']} requests"
                     + (f", {r['errors']} failed (built locally; first: {r['first_problem']})" if r["errors"] else "")
                     + (f", {r['corrupt_refused']} corrupt entries refused (see quarantine/)"
                        if r["corrupt_refused"] else ""))
    c = s.get("closure")
    if c and c["status"] != "local":
        what = {"hit": "the manifest's closure", "partial": "the latest closure of this manifest name",
                "miss": "no closure", "refused": "a closure, refused"}[c["status"]]
        lines.append(f"closure: {what}: {c['entries']} kernels from one pack ({c['pack_bytes']:,d} bytes); "
                     f"{c.get('per_key_lookups', 0)} looked up per key ({c.get('per_key_requests', 0)} requests, "
                     f"{c.get('per_key_bytes', 0):,d} bytes)" + ("; uploaded the closure" if c.get("uploaded") else "")
                     + (f"; {c['problem']}" if c.get("problem") and c["status"] == "refused" else ""))
    elif c and c.get("uploaded"):
        lines.append("closure: uploaded the manifest's closure")
    lines += compile_key_lines(s)
    a = s.get("audit")
    if a:
        lines.append(f"audit: {a['audited']} of {a['of']} remote hits recompiled and compared (seed {a['seed']}), "
                     f"{len(a['findings'])} poisoned" + (f"; every remote hit distrusted and compiled here "
                                                         f"({a['distrusted']})" if a["distrusted"] else ""))
        from gemmar_aot.builder.audit import Finding

        for f in a["findings"]:
            lines.append("  " + Finding(**f).describe())
    if s["lock_file"]:
        lines.append(f"lock file: {s['lock_file']}")
    sig = s.get("signature")
    if sig:
        lines.append(f"signed by {', '.join(k[:16] for k in sig['keyids'])}"
                     + (f", expires {sig['expires']}" if sig["expires"] else "") + f": {sig['envelope']}")
    for kind, k in sorted(s["by_kind"].items()):
        lines.append(f"  {kind:<26} {k['count']:4d} kernels  {k['mean_seconds']:6.2f}s mean  "
                     f"{k['bytes']:>10,d} bytes")
    for f in s["failures"]:
        lines.append(f"FAILED {f['label']} ({f['spec_id'][:12]}):\n    " + f["error"].replace("\n", "\n    "))
    return "\n".join(lines)


@click.command("suggest")
@click.argument("reports", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--tokens", "tokens", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Plan buckets instead: a token-count histogram (JSON {\"M\": count} or CSV M,count lines).")
@click.option("--budget", type=click.IntRange(min=1), default=None, help="With --tokens: how many M buckets.")
@click.option("--world", type=click.IntRange(min=1), default=8, show_default=True, help="With --tokens.")
@click.option("--block-m", "block_m", type=click.IntRange(min=1), default=128, show_default=True,
              help="With --tokens: buckets are multiples of world * block_m.")
@click.option("--m-max", "m_max", type=click.IntRange(min=1), default=None, help="With --tokens: the window.")
@click.option("--manifest", "manifest", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The manifest the pods' artifacts were built from: what it already builds is left out.")
@click.option("--write", is_flag=True, help="Append the suggested [[tuple]], [[ep]] and [[hipcc]] blocks to "
                                            "--manifest (comments and layout kept; the result must parse, else "
                                            "nothing is written).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def suggest_cmd(reports: tuple[Path, ...], tokens: Path | None, budget: int | None, world: int, block_m: int,
                m_max: int | None, manifest: Path | None, write: bool, as_json: bool) -> None:
    """Turn miss reports ($GEMMAR_AOT_MISS_REPORT files or directories) into the manifest lines that
    would have served every reported miss ([[tuple]] M values, [[ep]] configs and JIT v2 plans,
    [[hipcc]] variants); or, with --tokens and --budget, pick the GEMM M buckets that pad a
    token-count histogram least."""
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.runtime.misses import read_reports
    from gemmar_aot.builder.suggest import suggest, write_into

    if tokens is not None:
        if reports or write:
            raise click.UsageError("--tokens plans buckets; it takes no REPORTS and no --write")
        if budget is None:
            raise click.UsageError("--tokens needs --budget N (how many M buckets)")
        return _plan_cmd(tokens, budget, world, block_m, m_max, manifest, as_json)
    if not reports:
        raise click.UsageError("give miss reports (files or directories), or --tokens HISTOGRAM --budget N")
    if write and manifest is None:
        raise click.UsageError("--write edits a manifest: give --manifest M.toml")
    lines, problems = read_reports(reports)
    for p in problems:
        click.echo(f"warning: skipped {p}", err=True)
    r = suggest(lines, load_manifest(manifest) if manifest is not None else None)
    r["skipped_lines"] = len(problems)
    if write and r["snippet"]:
        r["written"] = str(write_into(manifest, r["snippet"], [str(x) for x in reports]))
    if as_json:
        click.echo(json.dumps(r, indent=2, sort_keys=True))
        return
    for a in r["already_built"]:
        what = (f"[[ep]] world={a['ep']['world']} hidden={a['ep']['hidden']} max_tokens={a['ep']['max_tokens']}"
                if "ep" in a else f"[[hipcc]] {a['hipcc']['source']} {a['hipcc']['arch']} {a['hipcc']['nic']}"
                if "hipcc" in a else f"{a['tuple']['transport']} N={a['tuple']['n']} K={a['tuple']['k']} M={a['m']}")
        click.echo(f"# already in the manifest (rebuild and redeploy the artifacts): {what}", err=True)
    if not r["snippet"]:
        click.echo(f"# {r['misses']} miss(es) reported; nothing to add", err=True)
        return
    click.echo(r["snippet"])
    if r.get("written"):
        click.echo(f"# appended to {r['written']}", err=True)


def _plan_cmd(tokens: Path, budget: int, world: int, block_m: int, m_max: int | None, manifest: Path | None,
              as_json: bool) -> None:
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.model.manifest_lines import m_field
    from gemmar_aot.builder.suggest import manifest_ms, padded_work, plan_buckets, read_histogram

    hist = read_histogram(tokens)
    buckets = plan_buckets(hist, budget, world * block_m, m_max)
    done, asked = padded_work(hist, buckets)
    out = {"buckets": buckets, "m": m_field(buckets), "rows_computed": done, "rows_asked": asked,
           "overhead": round(done / asked - 1, 6), "step": world * block_m}
    if manifest is not None:
        groups = {g: ms for g, ms in manifest_ms(load_manifest(manifest)).items() if g[3] == world and g[7] == block_m}
        if groups:
            g, ms = max(groups.items(), key=lambda kv: len(kv[1]))
            above = sum(c for m, c in hist.items() if m > max(ms))
            cur = {"tuple": dict(zip(("transport", "n", "k", "world"), g[:4])), "buckets": sorted(ms),
                   "tokens_above_largest": above}
            if not above:
                d, a = padded_work(hist, sorted(ms))
                cur["overhead"] = round(d / a - 1, 6)
            out["manifest"] = cur
    if as_json:
        click.echo(json.dumps(out, indent=2, sort_keys=True))
        return
    click.echo(f"{len(buckets)} bucket(s), multiples of {world * block_m}: {out['m']}")
    click.echo(f"padded work: {done:,d} rows for {asked:,d} asked, +{out['overhead'] * 100:.2f}%")
    cur = out.get("manifest")
    if cur is not None:
        click.echo(f"the manifest's {len(cur['buckets'])} bucket(s) for {cur['tuple']}: "
                   + (f"+{cur['overhead'] * 100:.2f}%" if "overhead" in cur else
                      f"{cur['tokens_above_largest']} calls above its largest M ({max(cur['buckets'])}) miss"))


COMMANDS = (doctor, plan, build, suggest_cmd)
