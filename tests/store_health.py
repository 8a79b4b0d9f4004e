"""``gemmar-aot verify`` as a user runs it (the CLI, ``--json``), for the tests of every path that fills a
store: the store verifies clean -- no damage, nothing degraded, every record's launcher present."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gemmar_aot.store import Store
from gemmar_aot.store.backend import record_launcher

ROOT = Path(__file__).resolve().parent.parent


def verify_cli(store: Path, *extra: str) -> tuple[int, dict]:
    """``gemmar-aot verify --store STORE --json *extra``: (exit code, its JSON)."""
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "verify", "--store", str(store), "--json", *extra],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def assert_verifies_clean(store: Path) -> None:
    rc, out = verify_cli(store)
    assert (rc, out["problems"], out["degraded"]) == (0, [], []), out
    # every record's launcher is here: the store can derive every entry again offline
    st = Store(store, readonly=True)
    for key, _p in st.local.iter_record_files():
        ln = record_launcher(st.read_record_file(key))
        assert ln is None or st.has_blob(ln.hash), key
