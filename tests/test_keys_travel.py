"""Keys travel across Pythons: the same spec compiled under CPython 3.11 and 3.12 gets the
same action key and the same code object (issue 11 item 4).

What differs between the two sides is real: another interpreter, another FlyDSL wheel
(cp311 vs cp312, whose native libraries differ byte-wise), another torch build (the pinned
2.13.0 CPU build for cp311 vs PyPI's 2.13.0 CUDA build for cp312, the only 2.13.0 for
cp312 on the package index). Both toolchains link the same cco bitcode (its sha256 is a
key ingredient; how it was built is not). The oracle is the compiler's own output: the
code objects' sha256 as each side wrote them, not anything our key code says.

Needs a Python 3.12 build environment next to the usual one: ``make setup-py312``
(``.venv312`` and ``.toolchain312``; about 4 GB, most of it the CUDA libraries PyPI's
torch for cp312 depends on). ``$GEMMAR_AOT_TEST_PYTHON312`` and
``$GEMMAR_AOT_TEST_TOOLCHAIN312`` point elsewhere. Skipped, with the reason, without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lock_docs import read_doc
from gemmar_aot.store import Store

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent
PY312 = Path(os.environ.get("GEMMAR_AOT_TEST_PYTHON312") or ROOT / ".venv312" / "bin" / "python")
TC312 = Path(os.environ.get("GEMMAR_AOT_TEST_TOOLCHAIN312") or ROOT / ".toolchain312")


def _py312_problem() -> str | None:
    if not PY312.is_file():
        return (f"no Python 3.12 build environment at {PY312} (run `make setup-py312`, ~4 GB: "
                f"PyPI's torch 2.13.0 for cp312 is the CUDA build)")
    if not (TC312 / "toolchain.json").is_file():
        return f"no Python 3.12 toolchain at {TC312} (run `make setup-py312`)"
    p = subprocess.run([str(PY312), "-c", "import sys, flydsl, torch; print(sys.version_info[:2])"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0 or p.stdout.strip() != "(3, 12)":
        return f"{PY312} is not a Python 3.12 with FlyDSL and torch: {(p.stderr or p.stdout).strip()[-300:]}"
    return None


def _build(python: str, toolchain: str, manifest: Path, store: Path) -> dict:
    env = {**os.environ, "GEMMAR_AOT_TOOLCHAIN": toolchain}
    for var in ("GEMMAR_AOT_REMOTE", "GEMMAR_AOT_STORE", "GEMMAR_AOT_TOOLCHAIN_PROFILE"):
        env.pop(var, None)
    p = subprocess.run([python, "-m", "gemmar_aot", "build", str(manifest), "--store", str(store), "-j", "1",
                        "--json", "-q"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def _entries(store: Path) -> dict[str, dict]:
    st = Store(store, readonly=True)
    return {key: st.get_record(key, verify=True) for key, _ in st.local.iter_record_files()}


def test_the_same_spec_under_python_3_11_and_3_12_has_the_same_key_and_code_object(tmp_path, tiny_manifest):
    problem = _py312_problem()
    if problem:
        pytest.skip(problem)
    from gemmar_aot.toolchain.paths import toolchain_root

    manifest = tiny_manifest
    sides = {"3.11": (sys.executable, str(toolchain_root())), "3.12": (str(PY312), str(TC312))}
    summary, entries = {}, {}
    for name, (python, toolchain) in sides.items():
        summary[name] = _build(python, toolchain, manifest, tmp_path / name)
        entries[name] = _entries(tmp_path / name)
        assert summary[name]["compiled"] == summary[name]["distinct_specs"] == len(entries[name]) >= 3
        assert summary[name]["failed"] == 0

    # The two sides really are different environments ...
    fps = {name: json.loads((Path(tc) / "toolchain.json").read_text()) for name, (_, tc) in sides.items()}
    assert sys.version_info[:2] == (3, 11) and fps["3.11"]["python"].startswith("3.11.")
    assert fps["3.12"]["python"].startswith("3.12.")
    assert fps["3.11"]["flydsl"]["package_digest"] != fps["3.12"]["flydsl"]["package_digest"]
    assert fps["3.11"]["digest"] != fps["3.12"]["digest"]
    assert summary["3.11"]["toolchain"] != summary["3.12"]["toolchain"]
    # ... with the same cco bitcode (a key ingredient), and every kernel gets the same key ...
    assert fps["3.11"]["cco_bitcode"]["sha256"] == fps["3.12"]["cco_bitcode"]["sha256"]
    assert set(entries["3.11"]) == set(entries["3.12"])
    # ... and the same bytes, as each compiler wrote and the store verified them.
    def same_parts(rec: dict) -> dict:
        return {k: v for k, v in rec.items() if k != "compile_seconds"}  # a timing, not an output

    for key, rec in entries["3.11"].items():
        assert rec["blob"] == entries["3.12"][key]["blob"], key
        assert same_parts(rec) == same_parts(entries["3.12"][key]), key
    lock = {name: [p["kernels"] for p in read_doc(tmp_path / name / "locks" / "tiny.lock.json")["parts"]]
            for name in sides}
    assert lock["3.11"] == lock["3.12"]
