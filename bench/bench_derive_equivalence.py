"""Whether this checkout's derive code reads what another revision's read: a behaviour check for
a derive-code change meant to be faster only.

A derive-code change (``gemmar_aot.compiler.keys.DERIVE_CODE``) compiles nothing but re-derives every
record of every store. One that is meant only to be faster must give what the code it replaces
gave, error messages included. This compares the two on the same inputs:

* the code-object parser (``gemmar_aot/model/codeobject.py``): every code object of a lock, halves of
  them, shorter than an ELF header, a header only, and ``--flips`` copies of each with one byte
  changed (most in the first 4 KiB, where the headers, the section table and the notes are);
  results compared field by field over the fields both versions have, errors by message;
* the launch-program evaluator (``gemmar_aot/model/launch.py``): every launch record of the lock with
  random parameters, and ``--programs`` random programs of every op, width and operand kind
  (some malformed), with edge values (0, +-1, 2^31, 2^63, 2^64 - 1, ...).

The other revision's two files are read with ``git show REV:PATH`` and imported alone (both
depend on the standard library and msgpack only). Exit status 1 when anything differs.

    python bench/bench_derive_equivalence.py --against REV [--lock artifacts/locks/dsv4-pro-wo_b.lock.json]
                                             [--flips 20] [--programs 3000] [--seed 0] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gemmar_aot.model.codeobject as new_codeobject  # noqa: E402
import gemmar_aot.model.launch as new_launch  # noqa: E402
from gemmar_aot.model.lock import read_lock  # noqa: E402
from gemmar_aot.runtime.artifacts import load_artifacts  # noqa: E402


def module_at(rev: str, path: str, name: str, tmp: Path):
    """``path`` as it was at ``rev``, imported alone as module ``name``."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True,
                         text=True).stdout
    file = tmp / f"{name}.py"
    file.write_text(src)
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def outcome(call, errors: tuple) -> tuple:
    try:
        return ("ok", call())
    except errors as exc:
        return ("error", str(exc))
    except Exception as exc:  # noqa: BLE001 - an unexpected exception is an outcome to compare too
        return ("raised", type(exc).__name__, str(exc))


def parsed(mod, data: bytes) -> tuple:
    def fields():
        co = mod.parse_code_object(data)
        return {f: v for f, v in zip(co._fields, co)}
    return outcome(fields, (mod.CodeObjectError,))


def same_parse(a: tuple, b: tuple) -> bool:
    if a[0] == b[0] == "ok":
        common = a[1].keys() & b[1].keys()
        return all(a[1][f] == b[1][f] for f in common)
    return a == b


def code_object_inputs(blobs: list[bytes], flips: int, rng: random.Random):
    for data in blobs:
        yield data
        yield data[: len(data) // 2]
        yield data[:63]
        yield data[:200]
        for _ in range(flips):
            b = bytearray(data)
            i = rng.randrange(min(len(data), 4096)) if rng.random() < 0.7 else rng.randrange(len(data))
            b[i] = rng.randrange(256)
            yield bytes(b)


def random_program(rng: random.Random, nparams: int, ops: list[str], widths: list[str]):
    names, prog = [f"p{i}" for i in range(nparams)], []
    for j in range(rng.randrange(1, 25)):
        op, width = rng.choice(ops), rng.choice(widths)

        def operand():
            return rng.choice(names) if rng.random() < 0.7 else rng.randrange(-300, 300)

        xs = ([operand(), operand(), operand()] if op == "select" else [operand()] if op in ("sext", "trunc")
              else [operand(), rng.choice(widths)] if op == "zext" else [operand(), operand()])
        if rng.random() < 0.03:
            xs = xs[:-1]  # malformed: an operand short
        prog.append([f"v{j}", op, *xs, width])
        names.append(f"v{j}")
    return prog, names


EDGES = (0, 1, -1, 127, 128, 2**31 - 1, 2**31, -2**31, 2**63 - 1, 2**64 - 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the revision whose derive code to compare with")
    ap.add_argument("--lock", default="artifacts/locks/dsv4-pro-wo_b.lock.json")
    ap.add_argument("--flips", type=int, default=20)
    ap.add_argument("--programs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        old_codeobject = module_at(args.against, "gemmar_aot/model/codeobject.py", "old_codeobject", Path(tmp))
        old_launch = module_at(args.against, "gemmar_aot/model/launch.py", "old_launch", Path(tmp))

    lock = read_lock(args.lock)
    arts = load_artifacts(args.lock)
    kernels = lock.kernels()
    info = arts.locks[0]
    blobs = [arts.load_blob(info, e.blob.hash, e.blob.size) for e in {e.blob.hash: e for e in kernels.values()}.values()]
    report: dict = {"against": args.against, "lock": args.lock, "code_objects": len(blobs)}
    firsts: list[str] = []

    n = bad = 0
    for data in code_object_inputs(blobs, args.flips, rng):
        n += 1
        a, b = parsed(old_codeobject, data), parsed(new_codeobject, data)
        if not same_parse(a, b):
            bad += 1
            firsts.append(f"parse: {str(a)[:200]} | {str(b)[:200]}")
    report["parser"] = {"inputs": n, "differences": bad}

    def resolved(mod, rec_json, params):
        return outcome(lambda: mod.LaunchRecord.from_json(rec_json).resolve(params), (mod.LaunchRecordError,))

    records = list({id(e.launch): e.launch for e in kernels.values()}.values())
    ops = [*new_launch._BINARY, *("icmp_" + k for k in new_launch._ICMP), "select", "sext", "trunc", "zext"]
    widths = list(new_launch._WIDTH)
    n = bad = 0
    for rec in records:
        for _ in range(200):
            params = [rng.randrange(-2**33, 2**33) for _ in rec.params]
            n += 1
            a, b = resolved(old_launch, rec.to_json(), params), resolved(new_launch, rec.to_json(), params)
            if a != b:
                bad += 1
                firsts.append(f"record {rec.kernel}: {a} | {b}")
    base = records[0].to_json()
    for _ in range(args.programs):
        nparams = rng.randrange(1, 6)
        prog, names = random_program(rng, nparams, ops, widths)
        rec_json = {**base, "params": ["i64"] * nparams, "args": [], "kernel_args": [rng.choice(names) for _ in range(3)],
                    "kernel_arg_types": ["i64"] * 3, "program": prog, "grid": [rng.choice(names), 1, 1],
                    "block": [64, 1, 1], "stream_param": 0}
        for _ in range(5):
            params = [rng.choice(EDGES + (rng.randrange(-2**40, 2**40),)) for _ in range(nparams)]
            n += 1
            a, b = resolved(old_launch, rec_json, params), resolved(new_launch, rec_json, params)
            if a != b:
                bad += 1
                firsts.append(f"program {prog} {params}: {a} | {b}")
    report["launch_programs"] = {"cases": n, "records": len(records), "differences": bad}
    report["first_differences"] = firsts[:5]
    report["seconds"] = round(time.perf_counter() - t0, 2)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 1 if firsts else 0


if __name__ == "__main__":
    sys.exit(main())
