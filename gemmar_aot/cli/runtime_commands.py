"""Runtime commands: ``gemmar-aot coverage``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gemmar_aot.model.types import COLLECTIVE_MODES, FUSED_SDMA



def _token_range(value: str | None, lo: int | None, hi: int | None) -> tuple[int, int]:
    if value is not None:
        text = value.strip()
        try:
            if ".." in text:
                a, b = text.split("..", 1)
                return int(a), int(b)
            return int(text), int(text)
        except ValueError:
            raise click.BadParameter(f"{value!r}: use MIN..MAX (e.g. 1..16384) or one number",
                                     param_hint="--tokens") from None
    if hi is None:
        raise click.UsageError("give the token range: --tokens MIN..MAX, or --max-tokens (and --min-tokens)")
    return (1 if lo is None else lo), hi


@click.command()
@click.argument("lock", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--store", "store", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Store directory holding locks/*.lock.json (default: $GEMMAR_AOT_ARTIFACTS, installed "
                   "artifact packages, else the default store).")
@click.option("--tokens", "tokens", default=None, help="Token range the server pads, MIN..MAX (e.g. 1..16384).")
@click.option("--min-tokens", type=click.IntRange(min=1), default=None)
@click.option("--max-tokens", type=click.IntRange(min=1), default=None)
@click.option("--world", type=click.IntRange(min=1), required=True)
@click.option("--n", "n", type=click.IntRange(min=1), required=True)
@click.option("--k", "k", type=click.IntRange(min=1), required=True)
@click.option("--quant", type=click.Choice(["blockscale", "mxfp8"]), default="blockscale", show_default=True)
@click.option("--gather-dtype", type=click.Choice(["bf16", "fp8"]), default="bf16", show_default=True)
@click.option("--gather-transport", type=click.Choice(["lsa", "sdma"]), default="lsa", show_default=True)
@click.option("--block-m", type=click.IntRange(min=1), default=None)
@click.option("--sdma-queues", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Check one rank (default: every rank).")
@click.option("--transport", type=click.Choice(COLLECTIVE_MODES), default=FUSED_SDMA, show_default=True,
              help="The collective mode the server runs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def coverage(lock, store, tokens, min_tokens, max_tokens, world, n, k, quant, gather_dtype, gather_transport,
             block_m, sdma_queues, rank, transport, as_json):
    """List the padded M values a GEMM + all-reduce server could request that the artifacts lack. Exit 1 if any.

    Every token count in the range pads to some M (a multiple of world*block_m);
    each of those needs built kernels. Prints the missing ones and the manifest
    lines that would add them.
    """
    from gemmar_aot.util.errors import GemmarError
    from gemmar_aot.runtime.artifacts import load_artifacts
    from gemmar_aot.runtime.coverage import coverage as run_coverage
    from gemmar_aot.runtime.artifact_errors import ArtifactNotFoundError

    lo, hi = _token_range(tokens, min_tokens, max_tokens)
    if lock is not None and store is not None:
        spec = (lock, store)
    elif lock is not None or store is not None:
        spec = lock if lock is not None else store
    else:
        try:
            spec = load_artifacts(None)
        except ArtifactNotFoundError:
            from gemmar_aot.store import default_store_root

            spec = default_store_root()
    try:
        report = run_coverage(spec, tokens=(lo, hi), world=world, n=n, k=k, quant=quant,
                              gather_dtype=gather_dtype, gather_transport=gather_transport, block_m=block_m,
                              sdma_queues=sdma_queues, rank=rank, transport=transport)
    except ValueError as exc:
        raise GemmarError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        click.echo(report.format())
    sys.exit(0 if report.ok else 1)


COMMANDS = (coverage,)
