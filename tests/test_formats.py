"""FORMATS.md, the one table of formats, held to the code: each row's version is its constant's,
its read versions the reader's constant's, and every version constant of the package has a row."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Module-level names that are a format's version (or the versions read).
VERSION_NAME = re.compile(r"^(?:[A-Z0-9_]*_)?(?:SCHEMA|SCHEMAS|FORMAT|FORMATS|FORMAT_VERSIONS|FORM_VERSION|MIGRATABLE)$")


def _rows() -> list[list[str]]:
    lines = [ln for ln in (ROOT / "FORMATS.md").read_text().splitlines() if ln.startswith("| ")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    assert rows[0][:4] == ["format", "written (constant)", "read", "version"], rows[0]
    return rows[1:]


def _value(ref: str):
    m = re.fullmatch(r"`([\w.]+):(\w+)(\[-1\])?`", ref)
    assert m, f"not a `module:NAME` reference: {ref}"
    v = getattr(importlib.import_module(m.group(1)), m.group(2))
    return v[-1] if m.group(3) else v


def test_every_row_is_the_code():
    for fmt, written, read, version, *_ in _rows():
        w = _value(written)
        assert w == int(version), f"{fmt}: FORMATS.md says {version}, {written} is {w}"
        if read != "=":
            r = _value(read)
            assert w in r or read.endswith("MIGRATABLE`"), f"{fmt}: {read} ({r}) does not read {w}"


def test_every_version_constant_has_a_row():
    named = {re.sub(r"\[-1\]$", "", ref.strip("`")) for row in _rows() for ref in row[1:3] if ref != "="}
    found = set()
    for p in sorted((ROOT / "gemmar_aot").rglob("*.py")):
        mod = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(p.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and VERSION_NAME.match(t.id) and isinstance(
                        getattr(node, "value", None), (ast.Constant, ast.Tuple)):
                    v = node.value
                    if isinstance(v, ast.Constant) and not isinstance(v.value, int):
                        continue  # a name, e.g. INDEX_FORMAT = "gemmar-aot blob index"
                    found.add(f"{mod}:{t.id}")
    assert found - named == set(), f"version constants FORMATS.md does not list: {sorted(found - named)}"
    assert named - found == set(), f"FORMATS.md names constants that are not there: {sorted(named - found)}"


#: Where canonical JSON is spelled: the one helper, and the key's own modules until the next key
#: move (their source is in every action key; FORMATS.md says why).
CANONICAL_JSON_HOMES = {"gemmar_aot/util/canonical_json.py", "gemmar_aot/model/spec.py",
                        "gemmar_aot/compiler/derive.py", "gemmar_aot/compiler/launcher.py"}


def test_canonical_json_is_spelled_in_its_homes_only():
    spelled = {str(p.relative_to(ROOT)) for d in ("gemmar_aot", "kernels") for p in (ROOT / d).rglob("*.py")
               if 'sort_keys=True, separators=(",", ":")' in p.read_text()}
    assert spelled <= CANONICAL_JSON_HOMES, sorted(spelled - CANONICAL_JSON_HOMES)
