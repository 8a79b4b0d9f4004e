"""The ``gemmar-aot`` command line (console script ``gemmar-aot = gemmar_aot.cli:main``).

One module per command group, each a list of plain click commands (``COMMANDS``) that this
package registers on :data:`main`; no command module imports this package back:

- :mod:`.build_commands`: ``doctor``, ``plan``, ``build``;
- :mod:`.store_commands`: ``ls``, ``show``, ``cat``, ``stats``, ``verify``, ``gc``, ``export``,
  ``import``, ``explain``;
- :mod:`.runtime_commands`: ``coverage``;
- :mod:`.wheel_commands`: ``wheel``, ``inspect``;
- :mod:`.trust_commands`: ``keygen``, ``sign``, ``audit``;
- :mod:`.profile_commands`: ``profile-move``;
- :mod:`.mori_patch_commands`: ``mori-patch install``, ``mori-patch remove``.

Each command imports what it runs lazily, so ``gemmar-aot --help`` stays fast.
"""

from __future__ import annotations

import sys

import click

from gemmar_aot.util.errors import GemmarError

from . import (build_commands, mori_patch_commands, profile_commands, runtime_commands, store_commands,
               trust_commands, wheel_commands)

__all__ = ["main"]


class _Group(click.Group):
    """Turn our own errors into one clean message and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GemmarError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="gemmar-aot")
def main() -> None:
    """Ahead-of-time compiler and artifact cache for every kernel AMD's mori compiles at run time.

    Builds, on a CPU-only host, and serves to pods with no compiler: mori's FlyDSL ops on gfx950
    (MI355X) -- GEMM + all-reduce (gemm_ar, [[tuple]]) and EP v2's FlyDSL backend ([[ep]]); mori's
    hipcc-JIT kernels -- EP v1, collectives, shmem, IO ([[hipcc]]) -- and its JIT v2 kernels -- EP v2's
    HIP backend, multi-node included ([[ep]] with kernel_backend = "hip") -- on gfx950 and gfx942
    (MI355X, MI300X).
    """


for _module in (build_commands, store_commands, runtime_commands, wheel_commands, trust_commands, profile_commands,
                mori_patch_commands):
    for _command in _module.COMMANDS:
        main.add_command(_command)
