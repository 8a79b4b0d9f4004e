"""What every benchmark ends with: its result as JSON on stdout and, with ``--json-out``, in a file,
stamped with the commit measured."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The short hash of the checkout measured."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def emit(result: dict, json_out: Path | None) -> int:
    """Print ``result`` and write it to ``json_out`` when given; returns the exit code 0."""
    text = json.dumps(result, indent=2)
    print(text)
    if json_out:
        Path(json_out).write_text(text + "\n")
    return 0
