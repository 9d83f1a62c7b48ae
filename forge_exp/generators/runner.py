"""The device side of the native engine: per-slot sampling state, prefill, and decode steps (CUDA graphs on GPU).

Everything a decode step needs lives in device tensors indexed by slot — the last token, its position, how many
tokens the slot has drawn, whether it is done, its sampling parameters and noise key, and its output so far — so k
steps run back to back with no host sync; the host reads a chunk's outcome (`launch` queues the steps and a copy of
the state behind them, `outcome` waits for that copy), and may queue the next chunk before it does. A step over a batch
of B slots is one function of a static slot-id buffer, captured once per (batch bucket, top-p on/off) as a CUDA
graph, and a whole chunk of `chunk` steps as one more, so the host launches one graph per chunk (and a thread that
shares the process, a colocated trainer, holds the GIL between them without holding up the decode); padding rows
of a bucket point at the scratch slot, which is always done and so never changes state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge_exp.generators.decoder import StaticDecoder


@dataclass
class Admit:
    """One sequence to start in a slot."""

    slot: int
    prompt: list[int]
    key: int  # sampling.row_key of the row
    temperature: float
    top_p: float
    max_new_tokens: int


@dataclass
class Chunk:
    """Decode steps queued over `slots`, and the slots' state as the last of them left it: (done, step, tokens,
    logprobs), copied to pinned host memory behind the steps on GPU (`ready` marks the copy done); on CPU, where every
    op has run by the time it returns, cloned when a later chunk may run before this one is read (lookahead), else the
    live tensors."""

    slots: list[int]
    steps: int
    state: tuple[torch.Tensor, ...]  # done [S + 1], step [S + 1], out_tok / out_lp [S + 1, max_len]
    ready: torch.cuda.Event | None = None


def buckets(slots: int) -> list[int]:
    """Batch sizes that get their own graph: powers of two below `slots`, and `slots`."""
    sizes, b = [], 1
    while b < slots:
        sizes.append(b)
        b *= 2
    return sizes + [slots]


class DecodeRunner:
    def __init__(self, decoder: StaticDecoder, *, slots: int, max_len: int, eos_ids: tuple[int, ...],
                 cuda_graphs: bool, chunk: int = 1, lookahead: bool = False, share_prompt: bool = False) -> None:
        """`chunk`: the decode steps the engine usually runs between two polls (its sync_every); on GPU they are one
        graph. `lookahead`: the engine may queue a chunk before it reads the last one back. `share_prompt`: the
        samples of a prompt read its K/V from one slot where the kernels can (kernels.SHARED_PREFIX)."""
        self.decoder = decoder
        self.slots, self.max_len, self.scratch = slots, max_len, slots
        device = decoder.embed.device
        self.device = device

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)

        n = slots + 1
        self.tok, self.pos, self.step, self.max_new, self.key = (zeros(n) for _ in range(5))
        # where each slot's prompt K/V is (`shared`): slot `pslot` holds positions below `plen`; a prompt's first
        # sample holds its own (plen 0), the others read it there
        self.shared = share_prompt and decoder.kernels.SHARED_PREFIX
        self.pslot, self.plen = torch.arange(n, device=device), zeros(n)
        self.done = torch.ones(n, dtype=torch.bool, device=device)  # the scratch slot stays done forever
        self.temp = zeros(n, dtype=torch.float32)
        self.top_p = torch.ones(n, dtype=torch.float32, device=device)
        self.out_tok = zeros(n, max_len)  # [S + 1, max_len] tokens drawn by each slot
        self.out_lp = zeros(n, max_len, dtype=torch.float32)
        self.eos = torch.tensor(list(eos_ids) or [-1], dtype=torch.long, device=device)
        self.top_p_host = [1.0] * n
        self.pos_host = [0] * n  # upper bound on each slot's position: the eager path reads only that much cache
        self.prefill_tokens = 0  # prompt tokens run through the model (repeats of a prompt are copied, not run)
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self.chunk, self.lookahead = chunk, lookahead
        self._buckets = buckets(slots)
        self._graphs: dict[tuple[int, bool, int], torch.cuda.CUDAGraph] = {}  # (bucket, top-p on, steps)
        self._ids: dict[int, torch.Tensor] = {}  # static slot-id buffer per bucket
        self._ids_now: dict[int, list[int]] = {}  # what each buffer holds, as last copied
        self._pool = None
        # two pinned copies of the slots' state, one per chunk outstanding (the engine queues at most one ahead)
        self._host = [tuple(torch.empty_like(t, device="cpu").pin_memory() for t in self._state) for _ in range(2)] \
            if device.type == "cuda" else None
        self._turn = 0

    @property
    def _state(self) -> tuple[torch.Tensor, ...]:
        """What a chunk's outcome reads (Chunk.state): done, step, out_tok, out_lp."""
        return self.done, self.step, self.out_tok, self.out_lp

    def _record(self, logits: torch.Tensor, idx: torch.Tensor, truncate: bool) -> None:
        """Draw the next token of rows `idx` [B] from logits [B, V] and advance the live ones (device only)."""
        step, live = self.step[idx], ~self.done[idx]
        new, lp = self.decoder.kernels.sample(logits, self.temp[idx], self.top_p[idx], self.key[idx], step, truncate)
        col = step.clamp(max=self.max_len - 1)
        self.out_tok[idx, col] = torch.where(live, new, self.out_tok[idx, col])
        self.out_lp[idx, col] = torch.where(live, lp, self.out_lp[idx, col])
        stop = (new[:, None] == self.eos).any(-1) | (step + 1 >= self.max_new[idx])
        self.done[idx] = ~live | stop
        advance = live.long()
        self.step[idx] = step + advance
        self.pos[idx] = self.pos[idx] + advance  # the new token's position (a done row stays where it stopped)
        self.tok[idx] = torch.where(live, new, self.tok[idx])

    def _step(self, idx: torch.Tensor, truncate: bool, kv_len: int | None, first_slot: int | None = None) -> None:
        prefix = (self.pslot[idx], self.plen[idx]) if self.shared else None
        logits = self.decoder.decode(self.tok[idx], idx, self.pos[idx], kv_len, first_slot, prefix)
        self._record(logits, idx, truncate)

    def prefill(self, rows: list[Admit]) -> dict[int, int]:
        """Write the prompts' K/V into their slots (one forward over the distinct prompts) and draw each row's
        first token. Returns the slot whose K/V each row's prompt is read from (its own, or when `shared` the slot
        of the first row with the same prompt), by row slot."""
        dev = self.device
        idx = torch.tensor([r.slot for r in rows], device=dev)
        lens = [len(r.prompt) for r in rows]
        self.temp[idx] = torch.tensor([r.temperature for r in rows], device=dev)
        self.top_p[idx] = torch.tensor([r.top_p for r in rows], device=dev)
        self.key[idx] = torch.tensor([r.key for r in rows], device=dev)
        self.max_new[idx] = torch.tensor([r.max_new_tokens for r in rows], device=dev)
        self.pos[idx] = torch.tensor(lens, device=dev) - 1  # _record moves it to the first new token's position
        self.step[idx] = 0
        self.done[idx] = False
        # Each distinct prompt is prefilled once — the n samples of a prompt share it — and its K/V copied to the
        # slots of its repeats; they all draw their first token from its logits (with their own keys).
        first: dict[tuple[int, ...], int] = {}  # prompt -> index of its first row in the prefill batch
        distinct = []
        for r in rows:
            if tuple(r.prompt) not in first:
                first[tuple(r.prompt)] = len(distinct)
                distinct.append(r)
        heads = torch.tensor([r.slot for r in distinct], device=dev)
        logits = self.decoder.prefill([r.prompt for r in distinct], heads)  # [distinct, V]
        src = [first[tuple(r.prompt)] for r in rows]
        if self.shared:  # the repeats read the prompt from its first sample's slot
            self.pslot[idx] = torch.tensor([distinct[j].slot for j in src], device=dev)
            self.plen[idx] = torch.tensor([len(r.prompt) if distinct[j].slot != r.slot else 0
                                           for j, r in zip(src, rows)], device=dev)
        else:  # the repeats get copies
            self.decoder.copy_prefix([(distinct[j].slot, r.slot, len(r.prompt)) for j, r in zip(src, rows)
                                      if distinct[j].slot != r.slot])
        self.prefill_tokens += sum(len(r.prompt) for r in distinct)
        logits = logits[torch.tensor(src, device=dev)] if len(distinct) < len(rows) else logits
        for r, n in zip(rows, lens):
            self.top_p_host[r.slot] = r.top_p
            self.pos_host[r.slot] = n
        self._record(logits, idx, truncate=any(r.top_p < 1 for r in rows))
        return {r.slot: (distinct[j].slot if self.shared else r.slot) for j, r in zip(src, rows)}

    def launch(self, slots: list[int], steps: int) -> Chunk:
        """Queue `steps` decode steps over `slots` and, behind them, the copy of every slot's state that `outcome`
        reads: no host sync on GPU, so the engine can queue the next chunk before it looks at this one."""
        self.decode(slots, steps)
        live = self._state
        if self._host is None:
            return Chunk(list(slots), steps, tuple(t.clone() for t in live) if self.lookahead else live)
        host, self._turn = self._host[self._turn], 1 - self._turn
        for dst, src in zip(host, live):
            dst.copy_(src, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return Chunk(list(slots), steps, host, ready)

    @staticmethod
    def outcome(chunk: Chunk) -> list[tuple[bool, int]]:
        """(done, tokens drawn) of each slot of `chunk` after its steps: the one wait for the device."""
        if chunk.ready is not None:
            chunk.ready.synchronize()
        done, step = chunk.state[0][chunk.slots].tolist(), chunk.state[1][chunk.slots].tolist()
        return [(bool(d), s) for d, s in zip(done, step)]

    @staticmethod
    def completions(chunk: Chunk, slots: list[int], lengths: list[int]) -> list[tuple[list[int], list[float]]]:
        """The tokens and logprobs of finished `slots` (of `chunk`, after `outcome`), `lengths` of each."""
        tokens, logprobs = chunk.state[2], chunk.state[3]
        return [(tokens[s, :n].tolist(), logprobs[s, :n].tolist()) for s, n in zip(slots, lengths)]

    def decode(self, slots: list[int], steps: int) -> None:
        """`steps` decode steps over `slots`, queued back to back (no host sync on GPU)."""
        truncate = any(self.top_p_host[s] < 1 for s in slots)
        if self.cuda_graphs:
            size = next(b for b in self._buckets if b >= len(slots))
            whole, rest = divmod(steps, self.chunk) if self.chunk > 1 else (0, steps)
            graphs = [self._graph(size, truncate, self.chunk)] * whole + [self._graph(size, truncate, 1)] * rest
            # (captured first: capture fills the id buffer with the scratch slot). A changed batch is one copy from
            # pinned memory, queued behind the graphs before it: a pageable copy would wait for them on the host
            ids = slots + [self.scratch] * (size - len(slots))
            if self._ids_now.get(size) != ids:
                self._ids[size].copy_(torch.tensor(ids).pin_memory(), non_blocking=True)
                self._ids_now[size] = ids
            for graph in graphs:
                graph.replay()
        else:
            idx = torch.tensor(slots, device=self.device)
            bound = max(self.pos_host[s] for s in slots) + 1
            contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
            for i in range(steps):
                self._step(idx, truncate, min(bound + i, self.max_len), slots[0] if contiguous else None)
        for s in slots:
            self.pos_host[s] = min(self.pos_host[s] + steps, self.max_len - 1)

    def _graph(self, size: int, truncate: bool, steps: int) -> torch.cuda.CUDAGraph:
        graph = self._graphs.get((size, truncate, steps))
        if graph is not None:
            return graph
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        ids = self._ids.setdefault(size, torch.empty(size, dtype=torch.long, device=self.device))
        ids.fill_(self.scratch)  # warm-up and capture rows all sit on the scratch slot: no state changes
        self._ids_now.pop(size, None)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks its kernels, the allocator settles
            self._step(ids, truncate, None)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            for _ in range(steps):
                self._step(ids, truncate, None)
        self._graphs[(size, truncate, steps)] = graph
        return graph
