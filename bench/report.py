"""BENCHMARKS.md's table of today's numbers, generated from the result files it points at.

    python bench/report.py           # rewrite the table between the two marker lines
    python bench/report.py --check   # exit 1 if BENCHMARKS.md is not what it would write

The rows come from ``bench/results/index.toml``, one ``[[metric]]`` each:

    name, unit, better       what is measured, its unit, "lower" or "higher" (is better)
    file                     the result file (JSON, in bench/results/) holding both numbers
    ours, anchor             where in it: a path (below)
    anchor_is                what the anchor is, in a few words
    command                  the command that wrote the file
    anchor_file, anchor_command   when the anchor was measured beside it into another file
    ours_scale, anchor_scale      multiply the number into ``unit`` (e.g. 1000: s -> ms)
    date, commit             only when the file carries neither (keys ``date``/``when`` and
                             ``commit``, or a name ``<name>-YYYY-MM-DD-<commit>.json``)

A path is a dotted string (``per_call_us.bucket_4096``; a part made of digits indexes a list)
or, for keys that hold dots or slashes, a list of keys and list indexes
(``["arms", "/work/main", "big_cpu_s_median"]``). The ratio is ours / anchor. Rows are
listed newest first; the rest of BENCHMARKS.md is left byte for byte (the history of how each
number was measured is ``bench/HISTORY.md``, written by hand).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
FIX = "run python bench/report.py"
REQUIRED = ("name", "unit", "better", "file", "ours", "anchor", "anchor_is", "command")
OPTIONAL = ("anchor_file", "anchor_command", "ours_scale", "anchor_scale", "date", "commit")
STAMPED = re.compile(r"-(\d{4}-\d{2}-\d{2})-([0-9a-f]{7,40})\.json$")
DAY = re.compile(r"^\d{4}-\d{2}-\d{2}")


class ReportError(Exception):
    """A problem with the index, a result file or BENCHMARKS.md; the message names the fix."""


def load_index(root: Path) -> list[dict]:
    """The index's entries, each checked for its fields."""
    path = root / "bench/results/index.toml"
    try:
        entries = tomllib.loads(path.read_text()).get("metric", [])
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read as TOML ({exc}); fix the file") from exc
    if not entries:
        raise ReportError(f"{path}: no [[metric]] entries; add one per headline number")
    for i, entry in enumerate(entries):
        label = f"bench/results/index.toml entry {i + 1} ({entry.get('name', 'no name')!r})"
        missing = [k for k in REQUIRED if k not in entry]
        unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
        if missing or unknown:
            raise ReportError(f"{label}: missing {missing}, unknown {unknown}; "
                              f"the fields are {list(REQUIRED)} and optionally {list(OPTIONAL)}")
        if entry["better"] not in ("lower", "higher"):
            raise ReportError(f"{label}: better = {entry['better']!r}; write \"lower\" or \"higher\"")
        for key in ("ours", "anchor"):
            if not isinstance(entry[key], (str, list)):
                raise ReportError(f"{label}: {key} = {entry[key]!r}; write a dotted string or a list of keys")
        for key in ("ours_scale", "anchor_scale"):
            if isinstance(entry.get(key, 1), bool) or not isinstance(entry.get(key, 1), (int, float)):
                raise ReportError(f"{label}: {key} = {entry[key]!r}; write a number (e.g. 1000 for s -> ms)")
    return entries


def parse_path(path: str | list) -> list:
    """A path's parts: dict keys (str) and list indexes (int)."""
    if isinstance(path, list):
        return path
    return [int(part) if part.isdigit() else part for part in path.split(".")]


def resolve(data, path: str | list, where: str) -> float:
    """The number at ``path`` in ``data``; ``where`` names the entry and file for errors."""
    node = data
    for part in parse_path(path):
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            keys = list(node) if isinstance(node, dict) else f"a {type(node).__name__}"
            raise ReportError(f"{where}: path {path!r} does not resolve at {part!r} (here: {keys}); "
                              "fix the path in bench/results/index.toml (a list form takes keys "
                              "with dots or slashes)") from None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ReportError(f"{where}: path {path!r} is {node!r}, not a number; point it at one")
    return node


def read_result(root: Path, name: str, label: str) -> dict:
    """A result file's JSON."""
    path = root / "bench/results" / name
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{label}: result file {path} does not exist; fix `file` in "
                          "bench/results/index.toml or restore the file") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{label}: result file {path} is not JSON ({exc})") from None


def stamp(name: str, data: dict, entry: dict, label: str) -> tuple[str, str]:
    """The date and commit of a result: from the file's keys, its name, else the entry."""
    named = STAMPED.search(name)
    when = str(data.get("date") or data.get("when") or "")
    date = when[:10] if DAY.match(when) else (named[1] if named else entry.get("date"))
    commit = data.get("commit") or (named[2] if named else entry.get("commit"))
    if not date or not commit:
        raise ReportError(f"{label}: {name} carries no date or commit; name it "
                          "<name>-YYYY-MM-DD-<commit>.json or add date and commit to the entry")
    return date, commit


def number(value: float) -> str:
    """A number as the table shows it: 4 significant digits, thousands separated."""
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:,.4g}"


def row(root: Path, entry: dict, index: int) -> dict:
    """One table row's cells, with its date for the ordering."""
    label = f"bench/results/index.toml entry {index + 1} ({entry['name']!r})"
    ours_data = read_result(root, entry["file"], label)
    anchor_name = entry.get("anchor_file", entry["file"])
    anchor_data = read_result(root, anchor_name, label)
    ours = resolve(ours_data, entry["ours"], f"{label}, {entry['file']}") * entry.get("ours_scale", 1)
    anchor = (resolve(anchor_data, entry["anchor"], f"{label}, {anchor_name}")
              * entry.get("anchor_scale", 1))
    if anchor == 0:
        raise ReportError(f"{label}: the anchor {entry['anchor']!r} is 0; a ratio needs another anchor")
    date, commit = stamp(entry["file"], ours_data, entry, label)
    when = f"{date} {commit}"
    if anchor_name != entry["file"]:
        anchor_date, anchor_commit = stamp(anchor_name, anchor_data, entry, label)
        if (anchor_date, anchor_commit) != (date, commit):
            when += f" (anchor: {anchor_date} {anchor_commit})"
    command = f"`{entry['command']}`"
    if "anchor_command" in entry:
        command = f"ours: {command}; anchor: `{entry['anchor_command']}`"
    unit = entry["unit"]
    cells = [entry["name"], f"**{number(ours)} {unit}**", f"{number(anchor)} {unit}: {entry['anchor_is']}",
             f"{ours / anchor:,.3g}x", entry["better"], command, when]
    return {"date": date, "cells": [c.replace("|", "\\|") for c in cells]}


def render(root: Path) -> str:
    """The Markdown that goes between the markers."""
    rows = [row(root, entry, i) for i, entry in enumerate(load_index(root))]
    rows.sort(key=lambda r: r["date"], reverse=True)
    lines = [
        "## Today's numbers",
        "",
        "Generated by `python bench/report.py` from `bench/results/index.toml` and the result files",
        "it names (edit those, not this table; `python bench/report.py --check` fails when they",
        "differ). Newest first; the ratio is ours / the anchor, and \"better\" says which way is",
        "good. A row's command reproduces it (it writes the result file the row reads); how each was",
        "measured, and every earlier number, is in [bench/HISTORY.md](bench/HISTORY.md), in the",
        "section that names its result file.",
        "",
        "| metric | ours | the anchor, measured beside it | ours / anchor | better | command | date, commit |",
        "|---|---:|---|---:|---|---|---|",
    ]
    lines += ["| " + " | ".join(r["cells"]) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def splice(text: str, block: str, name: str) -> str:
    """``text`` with what lies between the marker lines replaced by ``block``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ReportError(f"{name}: needs exactly one {BEGIN} line and one {END} line (found "
                          f"{text.count(BEGIN)} and {text.count(END)}); put them where the table goes")
    start = text.index(BEGIN) + len(BEGIN)
    stop = text.index(END)
    if stop < start:
        raise ReportError(f"{name}: {END} comes before {BEGIN}; swap them")
    return text[:start] + "\n" + block + text[stop:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if BENCHMARKS.md is not what this would write")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="the checkout holding BENCHMARKS.md and bench/results/ (default: this one)")
    args = ap.parse_args(argv)
    target = args.root / "BENCHMARKS.md"
    try:
        current = target.read_text()
        wanted = splice(current, render(args.root), str(target))
    except (OSError, ReportError) as exc:
        print(f"report.py: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if current != wanted:
            print(f"report.py: {target} is not what bench/report.py writes from "
                  f"bench/results/index.toml; {FIX}", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        target.write_text(wanted)
        print(f"report.py: wrote the table in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
