"""``python -m gemmar_aot.toolchain {setup [--profile P],doctor [--profile P] [--json],profiles}``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemmar_aot.util.errors import GemmarError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gemmar_aot.toolchain", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help="toolchain root (default: $GEMMAR_AOT_TOOLCHAIN or <checkout>/.toolchain)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_setup = sub.add_parser("setup", help="install or verify the toolchain (idempotent)")
    p_setup.add_argument("--profile", default=None,
                         help="a profile, a comma-separated list, or 'all' (default: $GEMMAR_AOT_TOOLCHAIN_PROFILE "
                              "or 'default'); see `profiles`")
    p_doc = sub.add_parser("doctor", help="report what is installed; exit 1 if anything is missing")
    p_doc.add_argument("--profile", default=None, help="the profile to check (default: as for setup)")
    p_doc.add_argument("--json", action="store_true", help="print the checks as JSON")
    sub.add_parser("profiles", help="list the toolchain profiles and whether each is installed")
    args = parser.parse_args(argv)

    from . import doctor, setup
    from .diagnose import format_table

    try:
        if args.cmd == "setup":
            setup(args.root, log=lambda s: print(s, flush=True), profiles=args.profile)
            return 0
        if args.cmd == "profiles":
            from .profiles import PROFILES
            from .paths import Layout, toolchain_root

            root = args.root.resolve() if args.root else toolchain_root()
            for p in PROFILES.values():
                lay = Layout(root, p)
                state = "installed" if lay.toolchain_json.is_file() else "not installed"
                print(f"{p.describe():<60} {state:<14} {p.summary}")
            return 0
        checks = doctor(args.root, args.profile)
        if args.json:
            print(json.dumps([c.to_dict() for c in checks], indent=2))
        else:
            print(format_table(checks))
        return 0 if all(c.ok for c in checks) else 1
    except GemmarError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
