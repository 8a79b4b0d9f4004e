"""``gemmar-aot mori-patch install|remove``: the .pth hook that serves mori's op names and JIT entry
points from gemmar-aot (:mod:`gemmar_aot.mori_patch`)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("mori-patch")
def mori_patch() -> None:
    """Serve mori's run-time compiled kernels from gemmar-aot artifacts in a server that changes no code.

    Opt-in: GEMMAR_AOT_PATCH_MORI=1. mori.ops.gemm_ar's GemmAllReduceOp and
    mori.ops.dispatch_combine_v2's EpDispatchCombineOp become gemmar-aot's ops; mori's hipcc JIT
    (compile_genco: EP v1, collectives, shmem, IO) and its JIT v2 (every mori.jit.v2 plan: EP v2's HIP
    backend) get prebuilt, verified code objects. Nothing compiles; a kernel without artifacts raises
    ArtifactMissingError.
    """


@mori_patch.command("install")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write the .pth hook (default: this environment's site-packages).")
def mori_patch_install(site_dir: Path | None) -> None:
    """Write the .pth hook; it does nothing unless GEMMAR_AOT_PATCH_MORI=1 is set."""
    from gemmar_aot.mori_patch import ENV_VAR, write_pth

    p = write_pth(site_dir)
    click.echo(f"wrote {p}; processes started with {ENV_VAR}=1 now get gemmar-aot's GemmAllReduceOp "
               f"from mori.ops.gemm_ar and EpDispatchCombineOp from mori.ops.dispatch_combine_v2, and "
               f"prebuilt code objects from mori's hipcc JIT (mori.jit.core) and JIT v2 (mori.jit.v2)")


@mori_patch.command("remove")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def mori_patch_remove(site_dir: Path | None) -> None:
    """Remove the .pth hook."""
    from gemmar_aot.mori_patch import remove_pth

    click.echo("removed" if remove_pth(site_dir) else "no hook was installed")


COMMANDS = (mori_patch,)
