"""The communicator boundary: tensor views of window memory and dev-comm requirements.

mori's ``Communicator`` hands out raw device pointers. The op sees its window
through tensors made here, in one place:

* a communicator may provide its own ``tensor_at(ptr, shape, dtype)`` (one whose
  memory is not GPU memory, e.g. a host-memory communicator, has to);
* otherwise the pointer is GPU memory and mori's ``from_gpu_ptr``
  (``mori.tensor_utils``: ctypes + ``__cuda_array_interface__``, no kernels) wraps
  it on the communicator's device.

Likewise the dev-comm requirements: a mori communicator gets mori's own
``CCODevCommRequirements`` (imported here, lazily, only then); any other
communicator gets :class:`DevCommRequirements`, a plain object with the same
four fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Stand-in for ``mori.cco.GDA_CONNECTION_NONE`` when the communicator is not mori's.
GDA_CONNECTION_NONE = "none"


def is_mori_communicator(comm: Any) -> bool:
    return type(comm).__module__.split(".", 1)[0] == "mori"


def tensor_at(comm: Any, ptr: int, shape: tuple[int, ...], dtype: Any, device: Any = None):
    """A tensor of ``shape``/``dtype`` over the communicator's memory at ``ptr`` (no copy)."""
    own = getattr(comm, "tensor_at", None)
    if own is not None:
        return own(ptr, tuple(shape), dtype)
    import torch
    from mori.tensor_utils import from_gpu_ptr

    if device is not None and getattr(device, "type", None) == "cuda":
        with torch.cuda.device(device):
            return from_gpu_ptr(ptr, tuple(shape), dtype)
    return from_gpu_ptr(ptr, tuple(shape), dtype)


@dataclass
class DevCommRequirements:
    """The fields of ``CCODevCommRequirements`` the op sets, for non-mori communicators."""

    gda_connection_type: Any = GDA_CONNECTION_NONE
    gda_signal_count: int = 0
    gda_counter_count: int = 0
    sdma_queue_count: int = 1


def dev_comm_requirements(comm: Any, sdma_queues: int):
    """What ``comm.create_dev_comm`` takes: no GDA connections, signals or counters; ``sdma_queues`` queues.

    One queue per (source, destination) pair is all the pipeline uses; asking for
    more creates that many per peer and can exhaust the SDMA engines' queue slots.
    """
    if is_mori_communicator(comm):
        from mori.cco import GDA_CONNECTION_NONE as MORI_NONE
        from mori.cco import CCODevCommRequirements

        reqs = CCODevCommRequirements()
        reqs.gda_connection_type = MORI_NONE
    else:
        reqs = DevCommRequirements()
    reqs.gda_signal_count = 0
    reqs.gda_counter_count = 0
    reqs.sdma_queue_count = int(sdma_queues)
    return reqs


def device_context(device: Any):
    """Make ``device`` current (HIP loads modules and allocates on the current device); no-op off-GPU."""
    import contextlib

    if getattr(device, "type", None) == "cuda":
        import torch

        return torch.cuda.device(device)
    return contextlib.nullcontext()


def resolve_device(device: Any):
    """``device`` as a torch device with its index filled in; None (or a bare "cuda") is torch's current GPU."""
    import torch

    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev
    return torch.device("cuda", torch.cuda.current_device())


def communicator_device(comm: Any):
    """The device the communicator's memory lives on: ``comm.device`` if it says, else torch's current GPU."""
    return resolve_device(getattr(comm, "device", None))
