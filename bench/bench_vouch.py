"""A fresh runner that takes only what a trusted builder signed, beside today's (issue 41).

Usage::

    python bench/bench_vouch.py [--store artifacts] [--manifest manifests/dsv4-pro-wo_b.toml]
                                [--delay 0.05] [--rounds 3] [--json-out FILE]

Starts two real nginx caches (tests/nginx_server.py) on loopback, each behind the fault proxy
(``--delay`` seconds on every request), and fills them from copies of ``--store`` (a warm store
of the manifest; a build with the remote writable uploads every entry and the closure):

* **today's** cache, from the store as it is: no entry signed;
* the **signed** cache, from a copy whose records a compile key signed first, as a builder with
  ``--compile-key`` signs each record it compiles (``builder.compile_vouch.vouch``, the same call).

Then, per round, interleaved (the order reversed every other round), each build in a process
of its own:

* ``warm_local``: a copy of the warm store, no remote (the speed anchor);
* ``closure``: an empty store, today's cache, no trusted compile keys (**today's fresh runner**:
  the anchor of this issue, 2 requests);
* ``closure_vouched``: an empty store, the signed cache, ``--trusted-compile-keys``: every
  record's signature checked;
* ``per_key`` and ``per_key_vouched``: the same two with the closure entries taken off the
  servers for the run (and put back after): one look-up per kernel.

Reported per arm: wall seconds of the whole build (median), requests, bytes down, who vouched
(every arm must compile nothing); beside them the speed reference of ``bench_runtime.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
from _fresh_runner import arg_parser, arm, build, closure_taken_off  # noqa: E402
from _results import commit, emit  # noqa: E402


def sign_store(store: Path, manifest_name: str, key_file: Path) -> int:
    """Every record the manifest's lock names, signed with the compile key (what the builder that
    compiled them with ``--compile-key`` would hold)."""
    from gemmar_aot.builder.compile_vouch import vouch
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.store import Store
    from gemmar_aot.trust.signing_keys import load_signing_key

    signer = load_signing_key(key_file)
    st = Store(store)
    keys = read_lock(store / "locks" / f"{manifest_name}.lock.json").check_parts().action_keys()
    for k in keys:
        st.put_record(k, vouch(k, st.get_record(k), signer))
    return len(keys)


class _Cache:
    """One nginx filled from ``store`` by a writable build, behind a fault proxy."""

    def __init__(self, workdir: Path, store: Path, manifest: Path, delay: float):
        from nginx_server import FaultProxy, Nginx

        self.server = Nginx(workdir).start()
        try:
            self.closure_key = build(manifest, store, self.server.url)["closure"]["key"]
            self.proxy = FaultProxy(self.server.port, delay=delay).__enter__()
        except BaseException:
            self.server.stop()
            raise
        self.url = self.proxy.url

    def per_key(self, run):
        with closure_taken_off(self.server.data, self.closure_key):
            return run()

    def stop(self) -> None:
        self.proxy.__exit__(None, None, None)
        self.server.stop()


def main() -> int:
    a = arg_parser(__doc__).parse_args()

    from bench_runtime import python_speed_ms

    from gemmar_aot.trust.signing_keys import generate_key

    speed_before = python_speed_ms()
    arms = ("warm_local", "closure", "closure_vouched", "per_key", "per_key_vouched")
    runs: dict[str, list[dict]] = {k: [] for k in arms}
    ro = "--remote-read-only"
    with tempfile.TemporaryDirectory(prefix="bench-vouch-") as tmp:
        tmp = Path(tmp)
        priv, pub, keyid = generate_key(tmp / "keys", "builder")
        trust = ("--trusted-compile-keys", str(pub))  # a PEM file of public keys serves as well as a directory
        warm, signed_warm = tmp / "warm", tmp / "signed-warm"
        for d in (warm, signed_warm):
            shutil.copytree(a.store, d, ignore=shutil.ignore_patterns("quarantine", "*.claim"))
        signed = sign_store(signed_warm, a.manifest.stem, priv)
        caches: list[_Cache] = []
        try:
            today = _Cache(tmp / "nginx-today", warm, a.manifest, a.delay)
            caches.append(today)
            vouched = _Cache(tmp / "nginx-signed", signed_warm, a.manifest, a.delay)
            caches.append(vouched)
            for i in range(a.rounds):
                copy = tmp / f"warm{i}"
                shutil.copytree(warm, copy)
                order = [("warm_local", lambda: build(a.manifest, copy, None)),
                         ("closure", lambda: build(a.manifest, tmp / f"c{i}", today.url, ro)),
                         ("closure_vouched", lambda: build(a.manifest, tmp / f"v{i}", vouched.url, ro, *trust)),
                         ("per_key", lambda: today.per_key(lambda: build(a.manifest, tmp / f"k{i}", today.url, ro))),
                         ("per_key_vouched", lambda: vouched.per_key(
                             lambda: build(a.manifest, tmp / f"kv{i}", vouched.url, ro, *trust)))]
                for name, run in (order if i % 2 == 0 else order[::-1]):
                    runs[name].append(run())
        finally:
            for c in caches:
                c.stop()
    speed_after = python_speed_ms()

    out = {"manifest": str(a.manifest), "delay_s": a.delay, "rounds": a.rounds, "signed_records": signed,
           "compile_key": keyid, **{name: arm(rs) for name, rs in runs.items()},
           "python_speed_ms": {"before": speed_before, "after": speed_after},
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit()}
    local = out["warm_local"]["wall_s_median"]
    for name in arms[1:]:
        out[f"{name}_vs_warm_local_wall"] = round(out[name]["wall_s_median"] / local, 2)
    out["closure_vouched_vs_closure_wall"] = round(out["closure_vouched"]["wall_s_median"]
                                                   / out["closure"]["wall_s_median"], 3)
    out["closure_vouched_vs_closure_bytes"] = round(out["closure_vouched"]["bytes_down"]
                                                    / out["closure"]["bytes_down"], 3)
    return emit(out, a.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
