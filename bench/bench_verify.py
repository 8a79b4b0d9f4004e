"""What checking a lock's signature adds to a rank's startup (issue 19: at most 1 ms).

Usage::

    python bench/bench_verify.py [--store artifacts] [--manifest dsv4-pro-wo_b] [--rounds 8] [--repeat 10]
                                 [--json-out FILE]

Copies the store's lock and record index into a scratch ``locks/`` directory, signs the copy
with a fresh Ed25519 key (the store itself is not written), and constructs ``GemmAllReduceOp``
for rank 0 of the reference manifest up to ready, as ``bench_startup_ab.py`` does (the
benchmark driver, without its stand-in code-object parse: our own host work), alternating
without trusted keys (A) and with them (B), A B A B ..., ``--rounds`` x ``--repeat`` pairs after
one warm-up of each. Reported: process-CPU and wall medians of A and B, the median of the pairs'
differences B - A, the check alone (keys, envelope, hash, signature), the machine
speed reference of ``bench_runtime.py`` before and after, and, measured apart in fresh
interpreters, the one-time cost of importing ``cryptography`` (a pod pays it once per
process, at its first verified construction; a pod without trusted keys never imports it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _results import commit, emit  # noqa: E402
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

IMPORT = ("from cryptography.hazmat.primitives import serialization, hashes\n"
          "from cryptography.hazmat.primitives.asymmetric import ed25519, ec\n")


def import_cost_ms(n: int = 5) -> list[float]:
    code = ("import time, gemmar_aot.runtime\nt = time.perf_counter()\n" + IMPORT +
            "print((time.perf_counter() - t) * 1e3)")
    out = []
    for _ in range(n):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
        out.append(float(p.stdout.strip()))
    return out


def verify_step_ms(lock: Path, trusted: Path, n: int = 200) -> dict:
    """The check alone, as the runtime runs it: read the trusted keys and the envelope, hash the
    lock's bytes, verify the signature (medians of ``n``)."""
    from gemmar_aot.model.bundle import LockBundle
    from gemmar_aot.trust.trust_set import load_trust

    ts = []
    for _ in range(n):
        t = time.perf_counter()
        load_trust(trusted).verify(LockBundle(lock).envelope.read_bytes(), lock.read_bytes(), str(lock), "envelope")
        ts.append((time.perf_counter() - t) * 1e3)
    return {"median": round(statistics.median(ts), 3), "min": round(min(ts), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--manifest", default="dsv4-pro-wo_b")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()

    from bench_runtime import M_MAX, WORLD, BenchDriver, K, N, python_speed_ms
    from fakes import FakeCommunicator

    from gemmar_aot.runtime import GemmAllReduceOp
    from gemmar_aot.trust.envelope import sign_lock_file
    from gemmar_aot.trust.signing_keys import generate_key, load_signing_key
    from gemmar_aot.model.bundle import LockBundle

    src = a.store / "locks" / f"{a.manifest}.lock.json"
    if not src.is_file():
        print(f"no lock at {src}: build the manifest first (make build)", file=sys.stderr)
        return 2
    speed_before = python_speed_ms()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        tmp = Path(tmp)
        locks = tmp / "locks"
        locks.mkdir()
        lock = locks / src.name
        shutil.copyfile(src, lock)
        shutil.copyfile(LockBundle(src).record_index, LockBundle(lock).record_index)
        priv, pub, keyid = generate_key(tmp / "keys", "bench")
        sign_lock_file(lock, [load_signing_key(priv)])
        trusted = tmp / "keys"
        (trusted / "bench.key").unlink()  # a pod holds public keys only

        def construct(trust):
            op = GemmAllReduceOp(FakeCommunicator(0, WORLD, lazy=True), n=N, k=K, m_max=M_MAX,
                                 artifacts=(lock, a.store), driver=BenchDriver(False), self_test=False,
                                 trusted_keys=trust)
            op.close()

        construct(None)
        construct(trusted)  # imports cryptography: its cost is measured apart below
        runs = {"unsigned": {"cpu_ms": [], "wall_ms": []}, "verified": {"cpu_ms": [], "wall_ms": []}}
        for _ in range(a.rounds * a.repeat):  # A B A B ...: each pair shares the machine's moment
            for arm, trust in (("unsigned", None), ("verified", trusted)):
                t, c = time.perf_counter(), time.process_time()
                construct(trust)
                runs[arm]["cpu_ms"].append((time.process_time() - c) * 1e3)
                runs[arm]["wall_ms"].append((time.perf_counter() - t) * 1e3)
        verify_alone = verify_step_ms(lock, trusted)
    imports = import_cost_ms()
    speed_after = python_speed_ms()

    def med(xs):
        return round(statistics.median(xs), 3)

    result = {
        "lock": str(src), "lock_bytes": src.stat().st_size, "rounds": a.rounds, "repeat": a.repeat,
        "unsigned": {k: med(v) for k, v in runs["unsigned"].items()},
        "verified": {k: med(v) for k, v in runs["verified"].items()},
        # the median of the pairs' differences (B - A), each pair measured back to back
        "verify_cost_cpu_ms": med([b - x for x, b in zip(runs["unsigned"]["cpu_ms"], runs["verified"]["cpu_ms"])]),
        "verify_cost_wall_ms": med([b - x for x, b in zip(runs["unsigned"]["wall_ms"],
                                                          runs["verified"]["wall_ms"])]),
        "verify_step_alone_ms": verify_alone,
        "cryptography_import_ms_once_per_process": {"median": med(imports), "min": round(min(imports), 3)},
        "python_speed_ms": {"before": speed_before, "after": speed_after},
        "loadavg": {"before": load_before[0], "after": os.getloadavg()[0]},
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(),
    }
    return emit(result, a.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
