"""Trainer → generator weights, by the fastest path the two placements allow.

    same process   (services=single_gpu, or colocated on CPU)  "local": the generator copies straight from the
                   trainer's parameters, found in a process-local registry (device to device, no serialisation)
    same host, other process, CUDA   (multi_gpu, three_gpu)    "ipc": the trainer copies each version into one
                   persistent GPU buffer whose CUDA IPC handle it shares once (torch.multiprocessing reductions);
                   the generator copies it out, GPU to GPU (NVLink / PCIe peer copy)
    same host, other process, CPU    (services=cpu)            "shm": the trainer copies each version into one
                   shared-memory buffer (a memfd the generator maps once through /proc/<pid>/fd); the generator
                   copies it out. A push is then two memcpys and a small message (~1/5 of the message path at the
                   tiny default's 2.4 MB); the memory goes when both processes have ended, however they end
    anything else  (other hosts, or where the above fail)     "message": CPU tensors inside the Monarch message

Version stamp: `push(publisher, generators, v)` returns once every generator holds a private snapshot of version v
(its staging buffer), so the trainer may train on at once; a generator swaps the snapshot into its model before its
next batch (`WeightReceiver.load`), and stamps the completions of that batch with v. A newer snapshot that arrives
before the swap simply replaces the older one.

The transport is agreed on the first push: the trainer offers what it has (its process id and host, and nothing
heavy); each generator takes the local path or says what it needs ("ipc?" / "shm?" / "state?"); the trainer then adds
the IPC handle, the shared buffer and/or the CPU state dict to every later push. A generator that cannot open the IPC
handle or the shared buffer asks for the state instead, so a push always ends with every replica loaded.

Sharded trainers (trainer=titan): `ShardedWeightPublisher` (runtime/sharded_weights.py) reads full weights from anything with
`weight_layout(dtype)` and `named_full_weights(dtype)` (trainers/titan.py) — the small interface a torchstore-backed
publisher would implement instead. `capture()` runs on every trainer rank: each tensor in turn is all-gathered
(each rank receives (W-1)/W of its bytes, then drops it) and rank 0 copies it into one persistent snapshot buffer
on its device, so no rank ever holds the whole model beyond that snapshot; rank 0 then pushes the snapshot by the
paths above (it is itself the CUDA IPC buffer). docs/titan.md counts the bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch

from forge_exp.models.device import wait_for

log = logging.getLogger(__name__)

ALIGN = 256  # bytes: every tensor of the flat buffer starts aligned, so each view is a plain aligned copy
TAKEN = ("local", "ipc", "shm", "message")  # what receive() returns once it holds the version
NEEDS = ("ipc?", "shm?", "state?")  # what it returns when the trainer must send more

# Process-local registry: key → {name: parameter} of a trainer's model in this process.
_LOCAL: dict[str, dict[str, torch.Tensor]] = {}


@dataclass
class Slot:
    """Where one parameter sits in the flat byte buffer."""

    name: str
    offset: int  # bytes
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass
class WeightRef:
    """What one push sends: small unless it carries the CPU state (message path)."""

    version: int
    pid: int
    host: str
    key: str  # the trainer's entry in _LOCAL of its process
    device_type: str  # "cuda" | "cpu": where the trainer's weights live
    layout: list[Slot]
    ipc: tuple | None = None  # (rebuild function, args) of the flat GPU buffer, and the GPU's UUID
    gpu_uuid: str | None = None
    shm: tuple[int, int, int] | None = None  # (pid, fd, bytes) of the shared CPU buffer: /proc/<pid>/fd/<fd>
    state: dict[str, torch.Tensor] | None = None  # name → CPU tensor


def layout_of(params: dict[str, torch.Tensor]) -> tuple[list[Slot], int]:
    """Slots of `params` in one flat byte buffer, each start aligned to ALIGN; and the buffer's size."""
    slots, offset = [], 0
    for name, p in params.items():
        slot = Slot(name, offset, tuple(p.shape), p.dtype)
        slots.append(slot)
        offset += -(-slot.nbytes // ALIGN) * ALIGN
    return slots, offset


def views(buffer: torch.Tensor, slots: list[Slot]) -> list[torch.Tensor]:
    """Typed, shaped views of the uint8 `buffer` for each slot."""
    return [buffer[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in slots]


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by name, tied ones once (named_parameters drops duplicates)."""
    return {name: p for name, p in model.named_parameters()}


class WeightPublisher:
    """The trainer's side. Holds the model's parameters in the process-local registry and, once a generator in
    another process asks for it, a persistent flat GPU buffer shared through CUDA IPC."""

    def __init__(self, model: torch.nn.Module | dict[str, torch.Tensor]):
        self.params = parameters(model) if isinstance(model, torch.nn.Module) else model
        self.key = f"{os.getpid()}:{id(model)}"
        _LOCAL[self.key] = self.params
        self.device = next(iter(self.params.values())).device
        self.layout, self.nbytes = layout_of(self.params)
        self.offer_ipc = False  # set once a generator asked for it ("ipc?")
        self.offer_shm = False  # set once a generator asked for it ("shm?")
        self.send_state = False  # set once a generator asked for it ("state?")
        self._buffer: torch.Tensor | None = None
        self._ipc: tuple | None = None
        self._shm: tuple[int, int, int] | None = None

    @property
    def payload_bytes(self) -> int:
        """Bytes of one version (the tensors themselves, without the buffer's alignment)."""
        return sum(s.nbytes for s in self.layout)

    def capture(self) -> dict[str, float]:
        """Take this version's weights (collective for a sharded trainer: ShardedWeightPublisher); the parameters
        themselves are what a single-process trainer publishes, so there is nothing to take here."""
        return {}

    def publish(self, version: int) -> WeightRef:
        """The ref for `version` (the parameters as they are now), with what the generators asked for so far."""
        ref = WeightRef(version, os.getpid(), socket.gethostname(), self.key, self.device.type, self.layout)
        with torch.no_grad():
            if self.device.type == "cuda":
                if self.offer_ipc:
                    ref.ipc, ref.gpu_uuid = self._fill_buffer(), gpu_uuid(self.device)
                wait_for(self.device)  # the optimizer step (and the buffer copy) is done
            elif self.offer_shm:
                ref.shm = self._fill_shm()
            if self.send_state:
                ref.state = {name: p.detach().to("cpu", copy=True) for name, p in self.params.items()}
        return ref

    def update(self, replies: list[str]) -> bool:
        """Record what the generators asked for; True when every replica holds the version."""
        unknown = [r for r in replies if r not in TAKEN + NEEDS]
        if unknown:
            raise RuntimeError(f"generator replied {unknown[0]!r} to receive_weights; expected one of {TAKEN + NEEDS}")
        self.offer_ipc |= "ipc?" in replies
        self.offer_shm |= "shm?" in replies
        self.send_state |= "state?" in replies
        return all(r in TAKEN for r in replies)

    def _fill_buffer(self) -> tuple:
        if self._buffer is None:
            from torch.multiprocessing.reductions import reduce_tensor

            self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self._views = views(self._buffer, self.layout)
            self._ipc = reduce_tensor(self._buffer)  # shared once; every later version reuses the allocation
        torch._foreach_copy_(self._views, [p.detach() for p in self.params.values()])
        return self._ipc

    def _fill_shm(self) -> tuple[int, int, int]:
        if self._shm is None:  # an anonymous memfd: nothing in /dev/shm outlives the processes that map it
            fd = os.memfd_create("forge-exp-weights")
            os.ftruncate(fd, self.nbytes)
            self._shm_buffer = map_shared(os.getpid(), fd, self.nbytes)
            self._shm_views = views(self._shm_buffer, self.layout)
            self._shm = (os.getpid(), fd, self.nbytes)  # fd stays open for the process's life: generators open it
        torch._foreach_copy_(self._shm_views, [p.detach() for p in self.params.values()])
        return self._shm


async def push(publisher: WeightPublisher, generators: Any, version: int) -> list[str]:
    """Publish `version` to every generator replica (a Monarch actor mesh with `receive_weights`) and wait until
    each holds it. Returns the transports used. At most three rounds: the first push may learn that a replica needs
    the IPC handle and then, if it cannot open it, the state."""
    replies: list[str] = []
    for _ in range(3):
        replies = list((await generators.receive_weights.call(publisher.publish(version))).values())
        if publisher.update(replies):
            return replies
    raise RuntimeError(f"generators could not load weight version {version}: replies {replies}")


class WeightReceiver:
    """The generator's side: takes a snapshot of each published version into a private staging buffer (on a side
    stream, so it does not wait for a batch in flight), and loads it into the model between batches."""

    def __init__(self, model: torch.nn.Module | dict[str, torch.Tensor], device: torch.device):
        """`model`: the generator's model, or its parameters by HF name (a generation engine's parameters())."""
        self.params = dict(model) if isinstance(model, dict) else parameters(model)
        self.device = torch.device(device)
        self.layout, self.nbytes = layout_of(self.params)
        self._staging: list[torch.Tensor] | None = None
        self._staging_flat: torch.Tensor | None = None
        self._ipc_key: bytes | None = None
        self._ipc_buffer: torch.Tensor | None = None
        self._ipc_broken = False
        self._shm_key: tuple[int, int, int] | None = None
        self._shm_buffer: torch.Tensor | None = None
        self._shm_broken = False
        self._stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        self._read_by: torch.cuda.Event | None = None  # a sink still reading staging until this completes
        self.transport: str | None = None  # of the last snapshot taken

    def receive(self, ref: WeightRef) -> str:
        """Snapshot `ref`'s weights into staging and return the transport ("local" | "ipc" | "message"), or what is
        missing to do so ("ipc?" | "state?")."""
        self._check_layout(ref.layout)
        if [s.dtype for s in ref.layout] != [s.dtype for s in self.layout]:
            # the trainer keeps float32 master weights while this model holds bf16: stage in the trainer's dtype,
            # convert on load()
            self.layout, self.nbytes = ref.layout, ref.layout[-1].offset + -(-ref.layout[-1].nbytes // ALIGN) * ALIGN
            self._staging = self._staging_flat = None
        if ref.pid == os.getpid() and ref.key in _LOCAL:
            got = self._copy(lambda: [p.detach() for p in _LOCAL[ref.key].values()], "local")
        elif self._ipc_possible(ref):
            if ref.ipc is None:
                return "ipc?"
            try:
                src = self._open_ipc(ref)
            except Exception as e:  # e.g. IPC refused inside a container: fall back to the message path
                log.warning("CUDA IPC weight sync unavailable (%s: %s); using the message path", type(e).__name__, e)
                self._ipc_broken = True
                return self.receive(ref)
            got = self._copy(lambda: [src], "ipc", flat=True)
        elif self._shm_possible(ref):
            if ref.shm is None:
                return "shm?"
            try:
                src = self._open_shm(ref.shm)
            except (OSError, RuntimeError) as e:  # /proc/<pid>/fd not readable here: fall back to the message path
                log.warning("shared-memory weight sync unavailable (%s: %s); using the message path", type(e).__name__, e)
                self._shm_broken = True
                return self.receive(ref)
            got = self._copy(lambda: [src], "shm", flat=True)
        elif ref.state is not None:
            got = self._copy(lambda: [ref.state[s.name] for s in self.layout], "message")
        else:
            return "state?"
        return got

    def load(self, sink=None) -> None:
        """Hand the last snapshot to `sink` (a generation engine's load_weights or queue_weights: an iterable of
        (name, tensor)), or copy it into the model's parameters. Called between batches: the last batch ended with a
        device sync, so no kernel still reads the parameters. On the side stream and waited for there alone, so a
        colocated trainer's kernels queued on the default stream (services=single_gpu) are not waited for. A sink
        that returns a CUDA event reads staging until it completes: the next snapshot waits for it on the GPU."""
        with torch.no_grad(), _on(self._stream, self.device):
            if sink is None:
                torch._foreach_copy_([p.detach() for p in self.params.values()], self._staging, non_blocking=True)
            else:
                read = sink(zip([s.name for s in self.layout], self._staging))
                self._read_by = read if isinstance(read, torch.cuda.Event) else None
        if self._stream is not None:
            self._stream.synchronize()

    # ---------------------------------------------------------------------------------------------- internals
    def _ipc_possible(self, ref: WeightRef) -> bool:
        return (
            not self._ipc_broken
            and ref.device_type == "cuda"
            and self.device.type == "cuda"
            and ref.host == socket.gethostname()
            and ref.pid != os.getpid()  # CUDA cannot open a process's own IPC handle
        )

    def _shm_possible(self, ref: WeightRef) -> bool:
        return not self._shm_broken and ref.device_type == "cpu" and ref.host == socket.gethostname()

    def _open_shm(self, shm: tuple[int, int, int]) -> torch.Tensor:
        if shm != self._shm_key:  # mapped once, reused for every version
            self._shm_buffer, self._shm_key = map_shared(*shm), shm
        return self._shm_buffer

    def _open_ipc(self, ref: WeightRef) -> torch.Tensor:
        fn, args = ref.ipc
        key = args[7]  # the allocation's handle: opened once, reused for every version
        if key != self._ipc_key:
            args = list(args)
            args[6] = device_with_uuid(ref.gpu_uuid, args[6])  # the same GPU may have another index here
            self._ipc_buffer, self._ipc_key = fn(*args), key
        return self._ipc_buffer

    def _copy(self, sources, transport: str, flat: bool = False) -> str:
        if self._staging is None:
            self._staging_flat = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self._staging = views(self._staging_flat, self.layout)
        with torch.no_grad(), _on(self._stream, self.device):
            if self._read_by is not None:  # the engine may still be copying the last snapshot in
                self._stream.wait_event(self._read_by)
            src = sources()
            if flat:  # one peer copy of the whole buffer
                self._staging_flat.copy_(src[0], non_blocking=True)
            else:
                torch._foreach_copy_(self._staging, src, non_blocking=True)
        if self._stream is not None:
            self._stream.synchronize()
        self.transport = transport
        return transport

    def _check_layout(self, layout: list[Slot]) -> None:
        """Same parameters in the same order and shapes; dtypes may differ (converted on load)."""
        if [(s.name, s.shape) for s in layout] != [(s.name, s.shape) for s in self.layout]:
            theirs = {(s.name, s.shape) for s in layout}
            diff = next((s.name for s in self.layout if (s.name, s.shape) not in theirs), "(order)")
            raise ValueError(
                f"trainer and generator models differ (first at parameter {diff!r}): they must be built from the "
                "same model config"
            )


def _on(stream, device: torch.device) -> contextlib.AbstractContextManager:
    """`with torch.cuda.stream(stream)` on `device`; nothing on CPU."""
    if stream is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.cuda.device(device))
    stack.enter_context(torch.cuda.stream(stream))
    return stack


def map_shared(pid: int, fd: int, nbytes: int) -> torch.Tensor:
    """The uint8 [nbytes] tensor over process `pid`'s file descriptor `fd`, mapped shared (writes are seen by every
    process that maps it)."""
    return torch.from_file(f"/proc/{pid}/fd/{fd}", shared=True, size=nbytes, dtype=torch.uint8)


def gpu_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def device_with_uuid(uuid: str | None, fallback: int) -> int:
    """This process's index of the GPU with `uuid` (CUDA_VISIBLE_DEVICES may renumber GPUs between processes)."""
    if uuid is not None:
        for i in range(torch.cuda.device_count()):
            if str(torch.cuda.get_device_properties(i).uuid) == uuid:
                return i
    return fallback


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
