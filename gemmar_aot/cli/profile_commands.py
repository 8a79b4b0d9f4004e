"""Toolchain-profile commands: ``gemmar-aot profile-move``."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("profile-move")
@click.argument("manifest", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--to", "to", required=True, metavar="PROFILE", help="The toolchain profile to move to.")
@click.option("--from", "frm", default=None, metavar="PROFILE",
              help="The profile it is built with now (default: $GEMMAR_AOT_TOOLCHAIN_PROFILE, else 'default').")
@click.option("--store", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Store to check for kernels already built (default: $GEMMAR_AOT_STORE, else artifacts/).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every spec's two keys).")
def profile_move_cmd(manifest: Path, to: str, frm: str | None, store: Path | None, as_json: bool) -> None:
    """What moving MANIFEST to another toolchain profile would recompile, and why."""
    from gemmar_aot.builder.profile_move import format_report, profile_move

    report = profile_move(manifest, to, frm=frm, store=store)
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else format_report(report))


COMMANDS = (profile_move_cmd,)
