"""The ``gemmar-aot`` command line (console script ``gemmar-aot = gemmar_aot.cli:main``).

One module per command group, each a list of plain click commands (``COMMANDS``) that this
package registers on :data:`main`; no command module imports this package back:

- :mod:`.build`: ``doctor``, ``plan``, ``build``;
- :mod:`.store`: ``ls``, ``show``, ``cat``, ``stats``, ``verify``, ``gc``, ``export``,
  ``import``, ``explain``;
- :mod:`.runtime`: ``coverage``;
- :mod:`.wheel`: ``wheel``, ``inspect``;
- :mod:`.trust`: ``keygen``, ``sign``, ``audit``;
- :mod:`.profiles`: ``profile-move``;
- :mod:`.mori_patch`: ``mori-patch install``, ``mori-patch remove``.

Each command imports what it runs lazily, so ``gemmar-aot --help`` stays fast.
"""

from __future__ import annotations

import sys

import click

from gemmar_aot.util.errors import GemmarError

from . import build, mori_patch, profiles, runtime, store, trust, wheel

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
    """Ahead-of-time compiler and artifact cache for mori's gemm_ar kernels (gfx950)."""


for _module in (build, store, runtime, wheel, trust, profiles, mori_patch):
    for _command in _module.COMMANDS:
        main.add_command(_command)
