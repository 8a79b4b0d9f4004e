"""Store commands: ls, show, stats, verify, gc, export, import, explain. ``--json`` on each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gemmar_aot.store import dictionaries, gc, inventory, transfer
from gemmar_aot.store.backend import record_blob

STORE_OPT = click.option("--store", "store", type=click.Path(file_okay=False, path_type=Path),
                         default=None, help="Store root (default: $GEMMAR_AOT_STORE, else artifacts/).")
JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _open(store: Path | None, *, must_exist: bool = True):
    from gemmar_aot.util.errors import GemmarError
    from gemmar_aot.store import Store, default_store_root

    root = default_store_root(str(store) if store is not None else None)
    st = Store(root)
    if must_exist and not st.exists():
        raise GemmarError(f"no artifact store at {root}; build a manifest into it first "
                          f"(gemmar-aot build MANIFEST --store {root})")
    return st


def _read_only_remote(remote: str):
    """The remote cache a ``--remote [URL]`` option names (the URL, or ``$GEMMAR_AOT_REMOTE`` when
    given alone), opened read-only."""
    from gemmar_aot.store.remote.remote_backend import HttpBackend, remote_url

    url = remote_url(remote or None)
    if url is None:
        raise click.UsageError("--remote needs a URL (or $GEMMAR_AOT_REMOTE)")
    try:
        return HttpBackend(url, writable=False)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _emit(data, as_json: bool, text) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        text(data)


def _summary(rec: dict) -> dict:
    spec = rec.get("spec", {})
    p = spec.get("params", {})
    cfg = p.get("cfg", {}) if isinstance(p.get("cfg"), dict) else {}
    return {
        "key": rec["key"], "recipe": spec.get("recipe"), "kind": spec.get("kind"),
        "rank": spec.get("rank"), "m": cfg.get("m_pad"), "n": cfg.get("n") or p.get("n"),
        "k": (p.get("builder") or {}).get("K"), "world": cfg.get("world_size"),
        "blob": (blob := record_blob(rec)).hash, "size": blob.size,
        "kernel": (rec.get("launch") or {}).get("kernel"),
    }


@click.command("ls")
@STORE_OPT
@JSON_OPT
@click.option("--kind", multiple=True, help="Kernel kind (gemm, drain, reduce, ...); repeatable.")
@click.option("--rank", type=int, multiple=True, help="Rank; repeatable.")
@click.option("--m", "m", type=int, multiple=True, help="Padded M; repeatable.")
@click.option("--n", "n", type=int, default=None)
@click.option("--k", "k", type=int, default=None)
@click.option("--lock", "lock", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Only what this lock file references.")
def ls_cmd(store, as_json, kind, rank, m, n, k, lock):
    """List the store's kernels."""
    from gemmar_aot.model.lock import read_lock

    st = _open(store)
    keys = read_lock(lock).check_parts().action_keys() if lock else None

    def keep(rec: dict) -> bool:
        s = _summary(rec)
        return ((keys is None or s["key"] in keys) and (not kind or s["kind"] in kind)
                and (not rank or s["rank"] in rank) and (not m or s["m"] in m)
                and (n is None or s["n"] == n) and (k is None or s["k"] == k))

    rows = sorted((_summary(r) for r in inventory.ls(st, keep)),
                  key=lambda s: (s["recipe"] or "", s["kind"] or "", s["m"] or 0, s["k"] or 0, s["rank"] or 0))

    def text(rows):
        for s in rows:
            click.echo(f"{s['key'][:16]}  {s['recipe']:<10} {s['kind']:<14} r{s['rank']:<2} "
                       f"M={s['m'] or '-':<6} N={s['n'] or '-':<6} K={s['k'] or '-':<5} "
                       f"{s['size']:>8,d} B  {s['kernel']}")
        click.echo(f"{len(rows)} kernel(s)")

    _emit(rows, as_json, text)


@click.command()
@click.argument("key")
@STORE_OPT
@JSON_OPT
def show(key, store, as_json):
    """Show one kernel's record: spec, metadata, launch record (KEY may be a unique prefix)."""
    from gemmar_aot.util.errors import GemmarError

    st = _open(store)
    matches = [r for r in inventory.ls(st, lambda r: r["key"].startswith(key))]
    if len(matches) != 1:
        raise GemmarError(f"{len(matches)} keys start with {key!r}; give more of the key "
                          f"(see gemmar-aot ls)")
    rec = matches[0]
    rec = {k: v for k, v in rec.items() if k != "ingredients"} | {"ingredients": "see gemmar-aot explain"}

    def text(r):
        s = _summary(r)
        md = r.get("metadata", {})
        click.echo(f"key      {r['key']}\nblob     {s['blob']} ({s['size']:,d} bytes)\n"
                   f"kernel   {s['kernel']}\nspec     {s['recipe']}:{s['kind']} rank {s['rank']} "
                   f"M={s['m']} N={s['n']} K={s['k']}")
        click.echo(f"regs     vgpr {md.get('vgpr_count')} sgpr {md.get('sgpr_count')} agpr "
                   f"{md.get('agpr_count')}, spills {md.get('vgpr_spill_count')}+{md.get('sgpr_spill_count')}, "
                   f"LDS {md.get('lds_bytes')}, scratch {md.get('scratch_bytes')}, kernarg {md.get('kernarg_size')}")
        ln = r.get("launch", {})
        click.echo(f"launch   grid {ln.get('grid')} block {ln.get('block')} args "
                   f"{[(a['name'], a['kind']) for a in ln.get('args', [])]}")
        click.echo("params   " + json.dumps(r.get("spec", {}).get("params", {}), sort_keys=True))
        click.echo(f"get it   gemmar-aot cat {s['blob']} -o {s['kernel'] or 'kernel'}.co"
                   f"   (symbol {s['kernel']})")

    _emit(rec, as_json, text)


_HEX = frozenset("0123456789abcdef")


def _resolve_blob(st, ref: str) -> tuple[str, int | None, str]:
    """(blob digest, size or None, what matched) for a unique prefix of an action key or a blob digest."""
    from gemmar_aot.util.errors import GemmarError

    if not (4 <= len(ref) <= 64 and set(ref) <= _HEX):
        raise GemmarError(f"{ref!r} is not a key or blob digest: give at least 4 of its lowercase hex "
                          f"digits (gemmar-aot ls and show print them)")
    found: dict[str, tuple[int | None, str]] = {}
    for key, _p in st.local.iter_record_files():
        if key.startswith(ref):
            rec = st.read_record_file(key)
            if rec is not None:
                blob = record_blob(rec)
                found.setdefault(blob.hash, (blob.size, f"key {key}"))
    dicts = None
    for digest, _p in st.local.iter_blob_files():
        if digest.startswith(ref) and digest not in found:
            dicts = inventory.dictionary_digests(st) if dicts is None else dicts
            if digest not in dicts:  # a zstd dictionary is not a code object
                found[digest] = (None, f"blob {digest}")
    if not found:
        raise GemmarError(f"no action key or blob digest in {st.root} starts with {ref!r} (see gemmar-aot ls)")
    if len(found) > 1:
        raise GemmarError(f"{ref!r} is ambiguous: " + "; ".join(w for _s, w in found.values())
                          + "; give more digits")
    digest, (size, what) = next(iter(found.items()))
    return digest, size, what


@click.command("cat")
@click.argument("ref", metavar="KEY-or-DIGEST")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the code object to this file (default: standard output).")
@STORE_OPT
def cat_cmd(ref, output, store):
    """Write the raw, verified code object of an action KEY or a blob DIGEST (a unique prefix of
    either), e.g. for llvm-objdump, rocprofv3 or roc-obj. `gemmar-aot show KEY` prints both."""
    from gemmar_aot.util.atomic_write import atomic_write_bytes
    from gemmar_aot.util.errors import GemmarError

    st = _open(store)
    digest, size, what = _resolve_blob(st, ref)
    data = st.load_blob(digest, size)  # decoded and verified; a corrupt blob raises, nothing is written
    if output is not None:
        atomic_write_bytes(output, data, mode=0o644)
        click.echo(f"wrote {len(data):,d} bytes ({what}, sha256 {digest}) to {output}", err=True)
        return
    out = sys.stdout.buffer
    if out.isatty():
        raise GemmarError("a code object is binary: give -o FILE or redirect standard output")
    out.write(data)
    out.flush()


@click.command()
@STORE_OPT
@JSON_OPT
@click.option("--remote", "remote", metavar="URL", is_flag=False, flag_value="", default=None,
              help="Also report on the remote cache (URL, or $GEMMAR_AOT_REMOTE when given alone): "
                   "reachable, latency, how many of this store's entries and of each lock's kernels it holds.")
def stats(store, as_json, remote):
    """Entries, raw and compressed bytes, and the last build's hits and misses."""
    st = _open(store)
    data = inventory.stats(st)
    data["last_build"] = st.last_build_stats()
    if remote is not None:
        from gemmar_aot.builder.remote_session import remote_stats

        backend = _read_only_remote(remote)
        data["remote"] = remote_stats(st, backend)
        backend.close()

    def text(d):
        for k in sorted(d):
            click.echo(f"{k:<22} {json.dumps(d[k], sort_keys=True)}")

    _emit(data, as_json, text)


@click.command()
@STORE_OPT
@JSON_OPT
def optimize(store, as_json):
    """Train the zstd dictionaries (code objects, records) and re-encode what does not use them.

    Every build does this after compiling; run it by hand on an imported or migrated store.
    Digests and keys do not change."""
    st = _open(store)
    data = dictionaries.optimize(st)

    def text(d):
        click.echo(f"{d['blobs']} code objects: dictionary {d['dictionary'] or 'none'}"
                   f"{' (trained now)' if d['trained'] else ''}, {d['repacked']} re-encoded "
                   f"({d['bytes_before']:,} -> {d['bytes_after']:,} bytes)")
        click.echo(f"{d['records']} records: dictionary {d['record_dictionary'] or 'none'}"
                   f"{' (trained now)' if d['trained_records'] else ''}, {d['records_repacked']} re-encoded "
                   f"({d['record_bytes_before']:,} -> {d['record_bytes_after']:,} bytes)")

    _emit(data, as_json, text)


@click.command()
@STORE_OPT
@JSON_OPT
@click.option("--trusted-keys", "trusted_keys", default=None, metavar="PATH", envvar="GEMMAR_AOT_TRUSTED_KEYS",
              help="Also verify each lock's signature against these public keys (a PEM file or a directory), as "
                   "a pod would. [env: GEMMAR_AOT_TRUSTED_KEYS]")
@click.option("--strict", is_flag=True,
              help="Fail (exit 1) on a degraded store too: entries that cannot be derived again offline.")
@click.option("--remote", "remote", metavar="URL", is_flag=False, flag_value="", default=None,
              help="Mend what the network can: fetch the launchers this store lacks from this remote cache "
                   "(URL, or $GEMMAR_AOT_REMOTE when given alone), each checked against its digest.")
def verify(store, as_json, trusted_keys, strict, remote):
    """Decompress and check every blob and record; quarantine what is bad. Show who signed each
    lock (and, with trusted keys, whether the signature verifies). Every record, in the action
    cache and in each lock's record index, is derived again from its own code object and
    launcher: one that contradicts them is damage.

    Two kinds of finding: damage (corrupt, mismatched, foreign or missing code; exit 1) and
    degraded (entries served as they are that cannot be derived again without the network;
    printed with their cost and fix, exit 0 unless --strict)."""
    from .trust_commands import signature_lines

    from gemmar_aot.compiler.derive_check import RecordCheck

    st = _open(store)
    health = inventory.verify(st, RecordCheck())
    fetched = None
    if remote is not None and health.degraded:
        fetched = _fetch_launchers(st, health, remote)
        health = inventory.verify(st, RecordCheck())
    locks = _lock_signatures(st.root, trusted_keys or None)
    bad_sigs = [lk for lk in locks if lk["problem"]]
    ok = not health.damage and not bad_sigs and not (strict and health.degraded)

    def text(d):
        for p in d["problems"]:
            click.echo(f"BAD {p['kind']} {p['path']}: {p['problem']}")
        if d["fetched"] is not None:
            f = d["fetched"]
            click.echo(f"fetched {f['fetched']} launcher(s) from {f['url']}"
                       + (f"; {len(f['absent'])} no longer there" if f["absent"] else "")
                       + (f"; {len(f['failed'])} failed (first: {f['failed'][0]})" if f["failed"] else ""))
        for g in d["degraded"]:
            click.echo(f"DEGRADED {g['kind']}: {g['problem']}\n  fix: {g['fix']}")
        for lk in d["locks"]:
            click.echo(f"lock {lk['lock']}")
            for line in signature_lines(lk["signature"]):
                click.echo("  " + line)
            if lk["problem"]:
                click.echo(f"  NOT VOUCHED FOR: {lk['problem']}")
        ps = d["problems"]
        if ps:
            click.echo(f"{len(ps)} problem(s); bad entries were quarantined and the next build recompiles them")
        elif d["degraded"]:
            click.echo("store verified: no damage; degraded as said above"
                       + (" (--strict: a failure)" if strict else ""))
        else:
            click.echo("store verified: no problems")

    _emit({"problems": health.damage, "degraded": health.degraded, "fetched": fetched, "locks": locks,
           "ok": ok}, as_json, text)
    sys.exit(0 if ok else 1)


def _fetch_launchers(st, health, remote: str) -> dict:
    """``verify --remote``: fetch the launchers of ``health``'s degraded finding from the remote."""
    backend = _read_only_remote(remote)
    try:
        out = inventory.fetch_launchers(st, health.degraded[0], backend)
    finally:
        backend.close()
    return {"url": backend.name, **out}


def _lock_signatures(root: Path, trusted_keys: str | None) -> list[dict]:
    """Every lock of the store with its signature (:func:`gemmar_aot.trust.trust_set.describe_signature`)."""
    from gemmar_aot.model.lock_codec import plain_lock_bytes
    from gemmar_aot.model.bundle import LOCK_SUFFIX, LockBundle
    from gemmar_aot.trust.trust_set import describe_signature, trust_from

    trust = trust_from(trusted_keys) if trusted_keys is not None else None
    out = []
    for lp in sorted((root / "locks").glob("*" + LOCK_SUFFIX)):
        env = LockBundle(lp).envelope
        sig, problem = describe_signature(env.read_bytes() if env.is_file() else None,
                                          plain_lock_bytes(lp.read_bytes(), str(lp)), str(lp), str(env), trust)
        out.append({"lock": str(lp), "signature": sig, "problem": problem})
    return out


@click.command("gc")
@STORE_OPT
@JSON_OPT
@click.option("--keep", "keep", type=click.Path(dir_okay=False, path_type=Path), multiple=True,
              help="Keep everything this lock file references; repeatable.")
@click.option("--max-bytes", type=int, default=None, help="Cap the store's compressed size (LRU).")
@click.option("--max-age-days", type=float, default=None, help="Drop entries unused this long.")
@click.option("--all-locks", is_flag=True, help="Keep everything the store's own locks/ reference.")
def gc_cmd(store, as_json, keep, max_bytes, max_age_days, all_locks):
    """Remove entries no given lock file references (or cap size / age)."""
    from gemmar_aot.util.errors import GemmarError
    from gemmar_aot.model.lock import read_lock

    st = _open(store)
    locks = [read_lock(p).check_parts() for p in keep]
    if all_locks:
        locks += [read_lock(p).check_parts() for p in sorted((st.root / "locks").glob("*.lock.json"))]
    if not locks and max_bytes is None and max_age_days is None:
        raise GemmarError("gc needs something to keep or a cap: --keep LOCK, --all-locks, "
                          "--max-bytes or --max-age-days")
    keep_blobs, keep_keys = set(), set()
    for lk in locks:
        keep_blobs |= lk.blob_digests()
        keep_keys |= lk.action_keys()
    res = gc.gc(st, keep_blobs=keep_blobs, keep_keys=keep_keys if locks else None,
                max_bytes=max_bytes, max_age_days=max_age_days)
    _emit(res, as_json, lambda d: click.echo(json.dumps(d, indent=1, sort_keys=True)))


@click.command("export")
@click.argument("lock", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@STORE_OPT
@JSON_OPT
def export_cmd(lock, dest, store, as_json):
    """Copy what LOCK needs (records, blobs, the lock itself) into DEST, a portable store."""
    import shutil

    from gemmar_aot.model.lock import read_lock

    st = _open(store)
    res = transfer.export(st, read_lock(lock).check_parts(), dest)
    (Path(dest) / "locks").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lock, Path(dest) / "locks" / Path(lock).name)
    from gemmar_aot.model.bundle import LockBundle

    envelope = LockBundle(lock).envelope
    if envelope.is_file():  # the signature travels with its lock
        shutil.copyfile(envelope, LockBundle(Path(dest) / "locks" / Path(lock).name).envelope)
    _emit(res, as_json, lambda d: click.echo(json.dumps(d, indent=1, sort_keys=True)))


@click.command("import")
@click.argument("src", type=click.Path(file_okay=False, exists=True, path_type=Path))
@STORE_OPT
@JSON_OPT
def import_cmd(src, store, as_json):
    """Add an exported directory's entries to the store, verifying every blob first."""
    import shutil

    st = _open(store, must_exist=False)
    res = transfer.import_(st, src)
    for lk in sorted((Path(src) / "locks").glob("*.lock.json")):
        (st.root / "locks").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lk, st.root / "locks" / lk.name)
    _emit(res, as_json, lambda d: click.echo(json.dumps(d, indent=1, sort_keys=True)))


@click.command()
@click.argument("what", nargs=-1, required=True)
@STORE_OPT
@JSON_OPT
def explain(what, store, as_json):
    """Why a key is what it is, or why a lookup missed.

    \b
    explain KEY              the ingredients of one key
    explain KEY_A KEY_B      which ingredients differ between two keys
    explain LOCK             LOCK against the current toolchain: which launches are
                             stale and which ingredient moved them
    explain LOCK_A LOCK_B    two builds: which toolchain ingredients and launches changed
    """
    from gemmar_aot.builder import explain as ex
    from gemmar_aot.util.errors import GemmarError
    from gemmar_aot.model.lock import read_lock

    st = _open(store)
    is_lock = [Path(w).is_file() for w in what]
    if len(what) == 1 and not is_lock[0]:
        data = ex.explain_key(st, _full_key(st, what[0]))
        text = lambda d: [click.echo(f"{k:<48} {v}") for k, v in d["ingredients"].items()]  # noqa: E731
    elif len(what) == 2 and not any(is_lock):
        data = ex.diff_keys(st, _full_key(st, what[0]), _full_key(st, what[1]))
        text = lambda d: [click.echo(f"{c['ingredient']}: {c['a']!r} -> {c['b']!r}") for c in d["changed"]] or click.echo("identical ingredients")  # noqa: E731
    elif len(what) == 1:
        from gemmar_aot.toolchain import load_toolchain

        data = ex.check_lock(read_lock(what[0]).check_parts(), st, load_toolchain().fingerprint)

        def text(d):
            for c in d["toolchain_changed"]:
                click.echo(f"toolchain: {c['ingredient']}: {c['locked']!r} -> {c['now']!r}")
            click.echo(f"{d['stale']} of {d['distinct_keys']} kernels are stale; "
                       f"{d['records_missing']} records missing from this store")
            for ing, n in d["stale_by_ingredient"].items():
                click.echo(f"  {n:5d} moved by {ing}")
            if d["up_to_date"]:
                click.echo("up to date: a build would compile nothing")
    elif len(what) == 2 and all(is_lock):
        data = ex.diff_locks(read_lock(what[0]).check_parts(), read_lock(what[1]).check_parts(), st)

        def text(d):
            for c in d["toolchain_changed"]:
                click.echo(f"toolchain: {c['ingredient']}: {c['a']!r} -> {c['b']!r}")
            click.echo(f"{d['launches_changed']} launches changed key, {d['launches_same']} same, "
                       f"{d['only_in_a']} only in A, {d['only_in_b']} only in B")
            for ing, n in d["changed_by_ingredient"].items():
                click.echo(f"  {n:5d} changed by {ing}")
    else:
        raise GemmarError("explain takes KEY, KEY KEY, LOCK or LOCK LOCK (lock files are paths)")
    _emit(data, as_json, text)


def _full_key(st, prefix: str) -> str:
    from gemmar_aot.util.errors import GemmarError

    if len(prefix) == 64:
        return prefix
    keys = [r["key"] for r in inventory.ls(st, lambda r: r["key"].startswith(prefix))]
    if len(keys) != 1:
        raise GemmarError(f"{len(keys)} keys start with {prefix!r}; give more of the key")
    return keys[0]


COMMANDS = (ls_cmd, show, cat_cmd, stats, optimize, verify, gc_cmd, export_cmd, import_cmd, explain,)
