"""Toolchain-profile commands: ``gemmar-aot profile-move`` and ``gemmar-aot mori-patch``."""

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
    from gemmar_aot.build.profile_move import format_report, profile_move

    report = profile_move(manifest, to, frm=frm, store=store)
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else format_report(report))


@click.group("mori-patch")
def mori_patch() -> None:
    """Serve `from mori.ops.gemm_ar import GemmAllReduceOp` from gemmar-aot (opt-in: GEMMAR_AOT_PATCH_MORI=1)."""


@mori_patch.command("install")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write the .pth hook (default: this environment's site-packages).")
def mori_patch_install(site_dir: Path | None) -> None:
    """Write the .pth hook; it does nothing unless GEMMAR_AOT_PATCH_MORI=1 is set."""
    from gemmar_aot.mori_patch import ENV_VAR, write_pth

    p = write_pth(site_dir)
    click.echo(f"wrote {p}; processes started with {ENV_VAR}=1 now get gemmar-aot's GemmAllReduceOp "
               f"from mori.ops.gemm_ar")


@mori_patch.command("remove")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def mori_patch_remove(site_dir: Path | None) -> None:
    """Remove the .pth hook."""
    from gemmar_aot.mori_patch import remove_pth

    click.echo("removed" if remove_pth(site_dir) else "no hook was installed")


COMMANDS = (profile_move_cmd, mori_patch)
