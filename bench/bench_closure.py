"""A fresh runner far from the cache: the manifest's closure against today's per-key path (issue 22).

Usage::

    python bench/bench_closure.py [--store artifacts] [--manifest manifests/dsv4-pro-wo_b.toml]
                                  [--delay 0.05] [--rounds 3] [--json-out FILE]

Starts a real nginx (tests/nginx_server.py) on loopback, fills it from ``--store`` (a warm
store of the manifest: a build with the remote writable uploads every entry and the closure),
and puts the fault proxy in front of it with ``--delay`` seconds on every request. Then, per
round, interleaved, three builds of the manifest, each in a process of its own:

* ``warm_local``: a copy of the warm store, no remote (**the anchor**);
* ``closure``: an empty store, the remote through the proxy: the closure entry and its pack;
* ``per_key``: an empty store, the remote through the proxy, the closure entries taken off the
  server for the run (and put back after): one look-up per kernel, as before the closure.

Reported per arm: wall seconds of the whole build (median), requests, bytes down, and for the
closure the pack's bytes; beside them the speed reference of ``bench_runtime.py``.

And what a fed store is worth afterwards (issue 31): ``gemmar-aot verify`` on each fed store
(exit code, damage and degraded counts), then, offline, a build of the manifest by a copy of
the code whose derive code changed (``tests/tree_copy.rewrite_parser``): how many kernels it
compiles and how many it derives again. ``pack_bytes_without_launchers`` is the same closure
pack encoded without the launchers, for the bytes they add.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path[:0] = [str(ROOT / "tests")]
from _fresh_runner import arg_parser, arm, build, closure_taken_off  # noqa: E402
from _results import commit, emit  # noqa: E402


def verify(store: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "verify", "--store", str(store), "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    v = json.loads(p.stdout)
    return {"exit": p.returncode, "damage": len(v["problems"]),
            "degraded_records": sum(g["count"] for g in v["degraded"])}


def fed_store_report(manifest: Path, store: Path, tree_dir: Path) -> dict:
    """verify on a fed store, then an offline build by a copy whose derive code changed."""
    import tree_copy

    out = {"verify": verify(store)}
    tree = tree_copy.rewrite_parser(tree_copy.copy_tree(tree_dir))
    s = tree_copy.build(tree, manifest, store)
    out["derive_code_change_offline"] = {"compiled": s["compiled"], "rederived": s["rederived"], "hits": s["hits"]}
    return out


def pack_without_launchers(store: Path, name: str) -> int:
    """The bytes of the manifest's closure pack as encoded without the launchers."""
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.model.types import Digest
    from gemmar_aot.store import Store
    from gemmar_aot.store.pack_encode import pack_closure

    lock = read_lock(store / "locks" / f"{name}.lock.json").check_parts()
    st = Store(store, readonly=True)
    lock_bytes, index_bytes = lock.to_bytes(), (store / "locks" / f"{name}.records.zst").read_bytes()
    raws = {e.blob.hash: st.load_blob(e.blob.hash) for e in lock.kernels().values()}
    extra = {Digest.of(b).hash: b for b in (lock_bytes, index_bytes)}
    return len(pack_closure(raws, extra))


def main() -> int:
    a = arg_parser(__doc__).parse_args()

    from bench_runtime import python_speed_ms
    from nginx_server import FaultProxy, Nginx

    speed_before = python_speed_ms()
    runs: dict[str, list[dict]] = {"warm_local": [], "closure": [], "per_key": []}
    with tempfile.TemporaryDirectory(prefix="bench-closure-") as tmp:
        tmp = Path(tmp)
        server = Nginx(tmp / "nginx").start()
        try:
            warm = tmp / "warm"
            shutil.copytree(a.store, warm, ignore=shutil.ignore_patterns("quarantine", "*.claim"))
            seed = build(a.manifest, warm, server.url)
            with FaultProxy(server.port, delay=a.delay) as px:
                for i in range(a.rounds):
                    copy = tmp / f"warm{i}"
                    shutil.copytree(warm, copy)
                    runs["warm_local"].append(build(a.manifest, copy, None))
                    runs["closure"].append(build(a.manifest, tmp / f"closure{i}", px.url, "--remote-read-only"))
                    with closure_taken_off(server.data, seed["closure"]["key"]):
                        runs["per_key"].append(build(a.manifest, tmp / f"perkey{i}", px.url, "--remote-read-only"))
            fed = {"closure": tmp / f"closure{a.rounds - 1}", "per_key": tmp / f"perkey{a.rounds - 1}"}
            after_fill = {name: fed_store_report(a.manifest, store, tmp / f"tree-{name}") for name, store in fed.items()}
            without = pack_without_launchers(warm, a.manifest.stem)
        finally:
            server.stop()
    speed_after = python_speed_ms()

    out = {"manifest": str(a.manifest), "delay_s": a.delay, "rounds": a.rounds,
           **{name: arm(rs) for name, rs in runs.items()},
           "python_speed_ms": {"before": speed_before, "after": speed_after},
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "commit": commit()}
    out["after_fill"] = after_fill
    out["pack_bytes_without_launchers"] = without
    c = out["closure"]
    out["launcher_bytes_in_pack"] = c["closure"]["pack_bytes"] - without
    out["closure_vs_warm_local_wall"] = round(c["wall_s_median"] / out["warm_local"]["wall_s_median"], 2)
    out["closure_bytes_vs_pack"] = round(c["bytes_down"] / max(1, c["closure"]["pack_bytes"]), 3)
    return emit(out, a.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
