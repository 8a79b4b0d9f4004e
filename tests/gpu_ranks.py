"""The GPU tier's shared parts: why a machine cannot run it, and one process per GPU.

* :func:`skip_reason` -- None on a node with ``world`` gfx950 GPUs, a ROCm torch and the mori
  modules a test needs; else the reason, which the test's skip shows.
* :func:`run_ranks` -- start ``world`` processes (``spawn``), wait for them with a deadline (a
  wedged SDMA submit hangs rather than fails), stop only the processes it started, and assert
  every rank's outcome, which each worker writes inside :func:`rank_outcome`.
"""

from __future__ import annotations

import importlib.util
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence


def skip_reason(world: int, modules: Sequence[str] = ("mori", "mori.cco"),
                archs: Sequence[str] = ("gfx950",)) -> str | None:
    """Why this machine cannot run a ``world``-GPU test needing ``modules`` on GPUs of one of
    ``archs``, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU: torch.cuda.is_available() is False"
    if getattr(torch.version, "hip", None) is None:
        return "torch is not a ROCm build"
    if torch.cuda.device_count() < world:
        return f"needs {world} GPUs, torch sees {torch.cuda.device_count()}"
    found = {torch.cuda.get_device_properties(i).gcnArchName.split(":")[0] for i in range(world)}
    if len(found) != 1 or not found <= set(archs):
        names = {"gfx950": "MI355X", "gfx942": "MI300X"}
        return (f"needs {' or '.join(f'{a} ({names.get(a, a)})' for a in archs)} devices, all alike; found "
                f"{sorted(found)}")
    for mod in modules:
        try:
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is not installed"
        except Exception as exc:  # noqa: BLE001 - a broken install is also a skip reason
            return f"{mod} cannot be found: {exc!r}"
    return None


@contextmanager
def rank_outcome(out_dir: str | Path, rank: int) -> Iterator[None]:
    """Write ``ok`` for ``rank`` when the block finishes, else its traceback (then re-raise)."""
    status = Path(out_dir) / f"rank{rank}.txt"
    try:
        yield
        status.write_text("ok")
    except BaseException:
        status.write_text(traceback.format_exc())
        raise


def run_ranks(worker: Callable, args: tuple, *, world: int, out_dir: Path, what: str, timeout: float) -> None:
    """``worker(rank, *args)`` in ``world`` spawned processes; every rank must write ``ok``."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: ranks still running after {timeout:.0f}s (hung SDMA submit?)")
    finally:
        for p in ctx.processes:  # only the processes this test started
            if p.is_alive():
                p.terminate()
    for r in range(world):
        text = (Path(out_dir) / f"rank{r}.txt").read_text()
        assert text == "ok", f"rank {r}:\n{text}"


def cco_worker(rank: int, world: int, uid: bytes, module: str, scenario: str, args: tuple, out_dir: str, vmm: int,
               env: dict) -> None:
    """One rank of a GPU scenario: ``env`` set, this rank's GPU, a cco communicator of ``world``
    ranks (``vmm`` bytes of symmetric memory per rank), then ``SCENARIOS[scenario](comm, rank,
    *args)`` of the test module ``module``; its outcome written for :func:`run_ranks`."""
    import importlib
    import os

    os.environ.update(env)
    import torch

    torch.cuda.set_device(rank)
    from mori.cco import Communicator, UniqueId

    scenarios = importlib.import_module(module).SCENARIOS
    with rank_outcome(out_dir, rank), Communicator.init(world, rank, UniqueId.from_bytes(uid), per_rank_vmm=vmm) as comm:
        scenarios[scenario](comm, rank, *args)
        torch.cuda.synchronize()


def run_cco_scenario(module: str, scenario: str, args: tuple, out_dir: Path, *, world: int, vmm: int, timeout: float,
                     env: dict | None = None) -> None:
    """:func:`cco_worker` on ``world`` GPUs, one communicator's unique id for all of them."""
    from mori.cco import Communicator

    uid = bytes(Communicator.get_unique_id())
    run_ranks(cco_worker, (world, uid, module, scenario, args, str(out_dir), vmm, env or {}), world=world,
              out_dir=out_dir, what=scenario, timeout=timeout)

