"""Reading results back from a GPU that other threads of the process are using at the same time.

On `services=single_gpu` the trainer, the reference model and the generator's worker thread share one process and
one GPU. A plain host read of a CUDA tensor (`.item()`, `.tolist()`, `float()`) is a copy to pageable memory that
waits for the stream to drain while holding the CUDA driver's lock, so the other threads cannot launch a kernel
meanwhile (pytorch#143825): a read at the end of 16 decode steps stalls the trainer's launches for their length,
and each of the trainer's reads stalls the generator. Waiting on an event first releases the GIL and takes no such
lock; the read after it finds the work done and takes microseconds.
"""

from __future__ import annotations

import torch


def wait_for(on: torch.Tensor | torch.device) -> None:
    """Block until the work queued so far on this thread's current stream of the device (`on`, or the device of the
    tensor `on`) is done: not the work of other streams, such as a colocated generator's decode (a device-wide
    `torch.cuda.synchronize` would wait for its queued steps too). A no-op on CPU."""
    device = on.device if isinstance(on, torch.Tensor) else torch.device(on)
    if device.type == "cuda":
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        event.synchronize()


def host_floats(values: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Every value as a Python float, the tensors (0-d, one device) read back in one copy after `wait_for`."""
    tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in values.items() if k not in tensors}
    if tensors:
        stacked = torch.stack([v.detach().reshape(()).double() for v in tensors.values()])
        wait_for(stacked)
        out.update(zip(tensors, stacked.tolist()))
    return {k: out[k] for k in values}
