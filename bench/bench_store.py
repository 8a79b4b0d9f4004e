"""Measure how to compress code objects in the store: zstd level, and a trained dictionary or not.

Usage::

    python bench/bench_store.py DIR            # DIR holds *.co files (searched recursively)
    python bench/bench_store.py DIR --json     # the same numbers as JSON
    python bench/bench_store.py --synthetic 96 # no corpus at hand: near-identical fake ELF blobs

Every number is per blob (the store compresses each code object on its own so any
one can be loaded without the others):

- plain zstd at levels 1, 3, 9, 19: total compressed size, ratio, compress and
  decompress throughput (best of ``--repeat`` runs), median decompress time per blob;
- a dictionary trained with ``zstandard.train_dictionary`` on the corpus, at a few
  dictionary sizes, counted WITH the dictionary's own size. Measured twice: trained on
  all blobs (what a repack of a finished store would see) and trained on half of them,
  applied to the other half (what a store that trained its dictionary on an earlier
  build sees for new kernels);
- a solid archive (all blobs in one long-mode frame) as the bound per-blob access gives up;
- sha256 throughput (the verification every load pays);
- ``--store``: end-to-end put and verified load of the corpus through ``gemmar_aot.store``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zstandard


def load_corpus(root: Path) -> list[tuple[str, bytes]]:
    files = sorted(p for p in root.rglob("*.co") if p.is_file())
    return [(str(p.relative_to(root)), p.read_bytes()) for p in files]


def synthetic_corpus(n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """Near-identical blobs: a shared body with a few rank/M-dependent constants patched in."""
    rng = random.Random(seed)
    families = [bytes(rng.getrandbits(8) for _ in range(size)) for size in (28000, 6000, 4600, 5400)]
    out = []
    for i in range(n):
        body = bytearray(families[i % len(families)])
        for _ in range(40):  # immediates that differ between ranks and M
            off = rng.randrange(len(body) - 4)
            body[off:off + 4] = rng.getrandbits(32).to_bytes(4, "little")
        out.append((f"synthetic/{i:04d}.co", b"\x7fELF" + bytes(body)))
    return out


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6 if seconds > 0 else float("inf")


def bench_plain(blobs: list[bytes], level: int, repeat: int) -> dict:
    raw = sum(len(b) for b in blobs)
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    dctx = zstandard.ZstdDecompressor()
    comp = [cctx.compress(b) for b in blobs]
    t_c = _best(lambda: [cctx.compress(b) for b in blobs], repeat)
    t_d = _best(lambda: [dctx.decompress(c) for c in comp], repeat)
    per = []
    for c in comp:
        t0 = time.perf_counter()
        dctx.decompress(c)
        per.append(time.perf_counter() - t0)
    total = sum(len(c) for c in comp)
    return {
        "level": level,
        "compressed_bytes": total,
        "ratio": raw / total,
        "compress_MBps": _mbps(raw, t_c),
        "decompress_MBps": _mbps(raw, t_d),
        "median_decompress_us": statistics.median(per) * 1e6,
    }


def _train(train: list[bytes], dict_size: int | str) -> tuple[zstandard.ZstdCompressionDict | None, float]:
    t0 = time.perf_counter()
    if dict_size == "auto":  # what the store does (gemmar_aot.store.dictionaries.train_best_dictionary)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from gemmar_aot.store.dictionaries import train_best_dictionary

        raw, _ = train_best_dictionary(train, min_gain=0.0)
        d = zstandard.ZstdCompressionDict(raw) if raw else None
    else:
        d = zstandard.train_dictionary(int(dict_size), train, level=3)
    return d, time.perf_counter() - t0


def bench_dict(train: list[bytes], test: list[bytes], level: int, dict_size: int | str, repeat: int) -> dict:
    d, t_train = _train(train, dict_size)
    if d is None:
        return {"level": level, "dict_size_asked": dict_size, "error": "no dictionary trained"}
    dict_bytes = d.as_bytes()
    # The store keeps the dictionary as a blob: zstd level 19, no dictionary.
    dict_stored = len(zstandard.ZstdCompressor(level=19).compress(dict_bytes))
    cctx = zstandard.ZstdCompressor(level=level, dict_data=d, write_content_size=True)
    dctx = zstandard.ZstdDecompressor(dict_data=d)
    comp = [cctx.compress(b) for b in test]
    assert all(dctx.decompress(c) == b for c, b in zip(comp, test))
    t_c = _best(lambda: [cctx.compress(b) for b in test], repeat)
    t_d = _best(lambda: [dctx.decompress(c) for c in comp], repeat)
    raw = sum(len(b) for b in test)
    blobs_only = sum(len(c) for c in comp)
    plain = sum(len(c) for c in (zstandard.ZstdCompressor(level=level).compress(b) for b in test))
    return {
        "level": level,
        "dict_size_asked": dict_size,
        "dict_bytes": len(dict_bytes),
        "dict_stored_bytes": dict_stored,
        "train_blobs": len(train),
        "test_blobs": len(test),
        "train_seconds": t_train,
        "compressed_bytes": blobs_only,
        "compressed_bytes_with_dict": blobs_only + dict_stored,
        "ratio_with_dict": raw / (blobs_only + dict_stored),
        "ratio_blobs_only": raw / blobs_only,
        "plain_same_level_bytes": plain,
        "gain_vs_plain": plain / (blobs_only + dict_stored),
        "compress_MBps": _mbps(raw, t_c),
        "decompress_MBps": _mbps(raw, t_d),
    }


def bench_solid(blobs: list[bytes], level: int) -> dict:
    raw = b"".join(blobs)
    params = zstandard.ZstdCompressionParameters.from_level(level, enable_ldm=True, window_log=27)
    cctx = zstandard.ZstdCompressor(compression_params=params)
    t0 = time.perf_counter()
    c = cctx.compress(raw)
    t = time.perf_counter() - t0
    return {"level": level, "compressed_bytes": len(c), "ratio": len(raw) / len(c), "compress_MBps": _mbps(len(raw), t)}


def bench_store(corpus: list[tuple[str, bytes]], level: int) -> dict:
    """Put every blob through ``claim``, optimize (train + repack), then load all of them verified."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gemmar_aot.store import Store, dictionaries, inventory

    def load_all(root: str, keys: list[str]) -> float:
        fresh = Store(root)  # a new process's view: cold dictionary cache
        t0 = time.perf_counter()
        for key in keys:
            rec = fresh.get_record(key)
            fresh.load_blob(rec["blob"]["hash"], rec["blob"]["size"])
        return time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(tmp, level=level)
        t0 = time.perf_counter()
        keys = []
        for i, (name, data) in enumerate(corpus):
            key = hashlib.sha256(f"bench:{name}".encode()).hexdigest()
            with store.claim(key) as claim:
                claim.put(data, {"metadata": {"name": name}, "launch": {}, "ingredients": {"i": i}})
            keys.append(key)
        t_put = time.perf_counter() - t0
        t_load_plain = load_all(tmp, keys)
        st_plain = inventory.stats(store)
        t0 = time.perf_counter()
        opt = dictionaries.optimize(store)
        t_opt = time.perf_counter() - t0
        t_load_dict = load_all(tmp, keys)
        st = inventory.stats(store)
    n = len(corpus)
    return {
        "level": level,
        "blobs": n,
        "put_ms_per_kernel": t_put / n * 1e3,
        "load_us_per_kernel_plain": t_load_plain / n * 1e6,
        "load_us_per_kernel_dict": t_load_dict / n * 1e6,
        "optimize_seconds": t_opt,
        "optimize": opt,
        "raw_bytes": st["raw_bytes"],
        "plain_bytes": st_plain["compressed_bytes"],
        "dict_bytes": st["compressed_bytes"] + st["dictionary_bytes"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", help="directory holding *.co files")
    ap.add_argument("--synthetic", type=int, default=0, help="use N synthetic blobs instead of a corpus")
    ap.add_argument("--levels", default="1,3,9,19")
    ap.add_argument("--dict-levels", default="3,9,19")
    ap.add_argument("--dict-sizes", default="auto,16384,32768,65536",
                    help="dictionary sizes to train; 'auto' is the store's own choice")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--store", action="store_true", help="also time put/load through gemmar_aot.store")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    if a.synthetic:
        corpus = synthetic_corpus(a.synthetic)
    elif a.corpus:
        corpus = load_corpus(Path(a.corpus))
    else:
        ap.error("give a corpus directory or --synthetic N")
    if len(corpus) < 8:
        ap.error(f"{len(corpus)} code objects: too few to measure (need >= 8)")
    n_files = len(corpus)
    # The store keeps identical outputs once: measure the unique ones.
    seen: set[str] = set()
    unique = []
    for name, b in corpus:
        d = hashlib.sha256(b).hexdigest()
        if d not in seen:
            seen.add(d)
            unique.append((name, b))
    corpus = unique
    blobs = [b for _, b in corpus]
    raw = sum(len(b) for b in blobs)

    # Held-out split by name hash: stable across runs, independent of file order.
    train = [b for n, b in corpus if hashlib.sha256(n.encode()).digest()[0] % 2 == 0]
    test = [b for n, b in corpus if hashlib.sha256(n.encode()).digest()[0] % 2 == 1]

    t0 = time.perf_counter()
    for b in blobs:
        hashlib.sha256(b).digest()
    sha_mbps = _mbps(raw, time.perf_counter() - t0)

    levels = [int(x) for x in a.levels.split(",") if x]
    dict_levels = [int(x) for x in a.dict_levels.split(",") if x]
    dict_sizes = [x if x == "auto" else int(x) for x in a.dict_sizes.split(",") if x]
    res: dict = {
        "corpus": {"files": n_files, "unique": len(blobs), "raw_bytes": raw,
                   "mean_bytes": raw / len(blobs), "source": a.corpus or f"synthetic:{a.synthetic}"},
        "sha256_MBps": sha_mbps,
        "plain": [bench_plain(blobs, lv, a.repeat) for lv in levels],
        "dict_in_sample": [], "dict_held_out": [],
        "solid": [bench_solid(blobs, lv) for lv in (3, 19)],
        "zstandard": zstandard.__version__,
    }
    for lv in dict_levels:
        for ds in dict_sizes:
            try:
                res["dict_in_sample"].append(bench_dict(blobs, blobs, lv, ds, a.repeat))
            except zstandard.ZstdError as e:
                res["dict_in_sample"].append({"level": lv, "dict_size_asked": ds, "error": str(e)})
            if len(train) >= 4 and test:
                try:
                    res["dict_held_out"].append(bench_dict(train, test, lv, ds, a.repeat))
                except zstandard.ZstdError as e:
                    res["dict_held_out"].append({"level": lv, "dict_size_asked": ds, "error": str(e)})
    if a.store:
        res["store"] = bench_store(corpus, 19 if 19 in levels else levels[-1])

    if a.json:
        print(json.dumps(res, indent=2, sort_keys=True))
        return 0
    c = res["corpus"]
    print(f"corpus: {c['files']} code objects, {c['unique']} unique: {raw:,} bytes, "
          f"mean {c['mean_bytes']:,.0f} B; sha256 {sha_mbps:,.0f} MB/s")
    print("\nplain zstd, one frame per blob")
    print(f"{'level':>5} {'bytes':>12} {'ratio':>7} {'comp MB/s':>10} {'decomp MB/s':>12} {'decomp us/blob':>15}")
    for r in res["plain"]:
        print(f"{r['level']:>5} {r['compressed_bytes']:>12,} {r['ratio']:>7.2f} {r['compress_MBps']:>10.1f} "
              f"{r['decompress_MBps']:>12.0f} {r['median_decompress_us']:>15.1f}")
    for title, rows in (("dictionary, trained on all blobs (in-sample)", res["dict_in_sample"]),
                        ("dictionary, trained on half, applied to the other half (held-out)", res["dict_held_out"])):
        print(f"\n{title}; bytes include the dictionary as stored (zstd -19)")
        print(f"{'level':>5} {'asked':>6} {'dict':>8} {'bytes':>12} {'ratio':>7} {'vs plain':>9} {'train s':>8} "
              f"{'comp MB/s':>10} {'decomp MB/s':>12}")
        for r in rows:
            if "error" in r:
                print(f"{r['level']:>5} {str(r['dict_size_asked']):>6} error: {r['error']}")
                continue
            print(f"{r['level']:>5} {str(r['dict_size_asked']):>6} {r['dict_bytes']:>8,} "
                  f"{r['compressed_bytes_with_dict']:>12,} {r['ratio_with_dict']:>7.2f} {r['gain_vs_plain']:>8.2f}x "
                  f"{r['train_seconds']:>8.2f} {r['compress_MBps']:>10.1f} {r['decompress_MBps']:>12.0f}")
    print("\nsolid archive (no per-blob access; for reference)")
    for r in res["solid"]:
        print(f"{r['level']:>5} {r['compressed_bytes']:>12,} {r['ratio']:>7.2f} {r['compress_MBps']:>10.1f} MB/s")
    if "store" in res:
        s = res["store"]
        print(f"\nstore (level {s['level']}, {s['blobs']} blobs): put {s['put_ms_per_kernel']:.2f} ms/kernel "
              f"(claim + fsynced writes); plain {s['raw_bytes']:,} -> {s['plain_bytes']:,} B, record + verified "
              f"load {s['load_us_per_kernel_plain']:.0f} us/kernel; optimize() {s['optimize_seconds']:.2f} s -> "
              f"{s['dict_bytes']:,} B incl. dictionary ({s['raw_bytes'] / s['dict_bytes']:.1f}x), load "
              f"{s['load_us_per_kernel_dict']:.0f} us/kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
