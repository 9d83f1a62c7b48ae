"""The torch-native generation engine (`generator=torch`): static KV cache, continuous batching, CUDA graphs.

    engine = NativeEngine(model_cfg, device="cuda", seed=0, slots=64, max_len=1024)
    groups = await engine.generate(prompt_ids, Sampling(n=8, temperature=1.0, max_new_tokens=512))

A worker thread owns the device. It keeps up to `slots` sequences in a preallocated KV cache and decodes them
together; every `sync_every` steps it looks once at which rows finished (EOS or their own max_new_tokens), hands
those back, and prefills waiting rows into the freed slots, so long and short completions do not hold each other
up and rows of many concurrent `generate` calls share one batch. On GPU each decode step is a CUDA graph per batch
bucket over fused Triton kernels (`triton_ops.py`); elsewhere the same step runs eagerly on the torch ops (`ops.py`).
New weights (`load_weights`, `queue_weights`) land between chunks of steps; rows in flight continue under them. On
GPU the caller queues their copies on the engine's stream itself, behind the chunks already queued, and need not
wait: rows it submits next are prefilled under them (the worker's launches and a load's copies take turns on one
lock, so a load never lands inside a prefill, a graph capture or an eager chunk). Rows
admitted together that share a prompt (the n samples of a group) share its prefill: it runs once and its K/V are
copied to the other slots, or with `share_prompt_kv` read from the first sample's (rows.py: SlotPool).

Exactness: draws come from the shared counter-based sampler (`sampling.py`), keyed by (call seed, row, step), so
each row's tokens do not depend on the schedule, and the eager reference `models.generate.generate` with the same
seed returns the same tokens and logprobs (float32, CPU; see tests/generators).

Models other than Qwen3 / Llama / Qwen2 take a plain path: each call runs alone through that eager reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import Iterable

import torch

from forge_exp.generators.base import Generation, Sampling
from forge_exp.generators.decoder import StaticDecoder, unsupported_reason
from forge_exp.generators.options import NativeKnobs
from forge_exp.generators.rows import Request, Row, SlotPool
from forge_exp.generators.runner import Admit, DecodeRunner
from forge_exp.models.lora import AdapterMerge
from forge_exp.models.sampling import row_key


class NativeEngine:
    schema = NativeKnobs  # its knobs, their defaults and ranges (generators/options.py)

    def __init__(self, model, device: str | torch.device = "cpu", seed: int = 0, **knobs) -> None:
        """`model`: a `forge_exp.models.hf.ModelSpec` (what conf/model/ builds); `knobs`: conf/generator/torch.yaml's
        keys (NativeKnobs)."""
        knobs = NativeKnobs.parse(knobs)
        lora = model.lora_spec  # LoRA: the base, and each push's adapters merged into it (models/lora.py)
        self._setup((model.base() if lora else model).build(device), model.tokenizer(), seed, knobs)
        self._adapter = AdapterMerge(self.model, lora) if lora else None

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer=None, *, seed: int = 0, **knobs) -> "NativeEngine":
        """An engine over an already built HF causal LM (on its device). It takes over the model's weight storage
        (see decoder.py): do not share the model with another engine."""
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, seed, NativeKnobs.parse(knobs))
        engine._adapter = None
        return engine

    def _setup(self, model, tokenizer, seed: int, knobs: NativeKnobs) -> None:
        self.model, self.tokenizer, self.knobs = model.eval(), tokenizer, knobs
        self.device = next(model.parameters()).device
        cfg = model.config
        self.slots = knobs.slots or NativeKnobs.ALONE_SLOTS
        self.max_len = knobs.max_len or min(getattr(cfg, "max_position_embeddings", 1024), 1024)
        eos = knobs.eos_token_ids
        self.eos_ids = tuple(int(t) for t in eos) if eos is not None else _default_eos(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (cfg.pad_token_id or 0)
        self._params = dict(model.named_parameters(remove_duplicate=False))
        self.plain_reason = unsupported_reason(model)  # None: the native decoder runs this model
        on_gpu = self.device.type == "cuda"
        self.sync_every = knobs.sync_every or (16 if on_gpu else 1)
        self.lookahead = knobs.lookahead if knobs.lookahead is not None else on_gpu
        self.gather_s = (knobs.gather_ms if knobs.gather_ms is not None else 2.0 if on_gpu else 0.0) / 1000
        if self.plain_reason is None:
            decoder = StaticDecoder(model, slots=self.slots, max_len=self.max_len, kernels=_kernels(self.device))
            self.runner = DecodeRunner(decoder, slots=self.slots, max_len=self.max_len, eos_ids=self.eos_ids,
                                       cuda_graphs=knobs.cuda_graphs, chunk=self.sync_every, lookahead=self.lookahead,
                                       share_prompt=knobs.share_prompt_kv)
        self._seed, self._calls = seed, 0
        self._cv = threading.Condition()
        self._waiting: deque[Row] = deque()
        self.stream = self._stream()  # the worker's CUDA stream (None on CPU)
        self._device = threading.Lock()  # held to queue device work: the worker's launches, or a load's copies
        self._loaders = 0  # loads waiting for the device lock: the worker lets them go first
        self._active: dict[int, Row] = {}
        self._taken: list[Row] = []  # rows the worker took from the queue and has not yet placed or delivered
        self._slots = SlotPool(self.slots)
        self._ahead = None  # (chunk, its rows): the chunk queued behind the one being read (lookahead)
        self._closed, self._error = False, None
        self.stats = {"admitted": 0, "prefills": 0, "decode_steps": 0, "polls": 0, "ahead": 0}
        self._thread = threading.Thread(target=self._run, name="native-engine", daemon=True)
        self._thread.start()

    # ---- the interface ------------------------------------------------------------------------------------------

    async def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Generation]]:
        self._check_open()
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty: every prompt needs at least one token (encode with <bos>)")
            if len(p) + sampling.max_new_tokens > self.max_len:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens and max_new_tokens is {sampling.max_new_tokens}: more than "
                    f"generator.max_len={self.max_len} together; raise generator.max_len or shorten the prompt")
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def settle(results, error):
            def set_():
                if not done.cancelled():
                    done.set_exception(error) if error is not None else done.set_result(results)
            try:
                loop.call_soon_threadsafe(set_)
            except RuntimeError:  # the caller's event loop is gone: nobody waits for this call any more
                pass

        with self._cv:
            self._check_open()
            self._calls += 1
            seed = sampling.seed if sampling.seed is not None else self._seed * 1_000_003 + self._calls
            n_rows = len(prompts) * sampling.n
            request = Request(seed, sampling, [None] * n_rows, settle, remaining=n_rows)
            self._waiting.extend(Row(request, i, list(prompts[i // sampling.n])) for i in range(n_rows))
            self._cv.notify()
        flat = await done
        return [flat[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """New weights by HF name, or with LoRA the adapters by peft's names (merged into the base here). Returns
        once they are in place (the caller may reuse its tensors)."""
        read = self.queue_weights(weights)
        if read is not None:
            read.synchronize()

    def queue_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> torch.cuda.Event | None:
        """As `load_weights`, but on GPU returns once the copies are queued behind the decode steps already queued
        (a chunk in flight finishes under the old weights); rows submitted after it are prefilled under the new ones.
        Returns an event that completes once the engine has read `weights` (keep them unchanged until then), or
        None when they are already in (CPU)."""
        caller = torch.cuda.current_stream(self.device) if self.stream is not None else None
        if self._adapter is not None:
            weights = self._adapter.merged(weights)  # on the caller's stream, which the copies wait for
        pairs = []
        for name, tensor in weights:
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"load_weights: the model has no parameter named {name!r}")
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(f"load_weights: {name} has shape {tuple(tensor.shape)}, the model's is "
                                 f"{tuple(param.shape)}")
            pairs.append((param, tensor))
        with self._cv:
            self._check_open()
            self._loaders += 1
        try:
            with self._device, torch.no_grad(), torch.cuda.stream(self.stream):
                self._check_open()
                if self.stream is None:  # CPU: the copies run now, between the worker's chunks
                    for param, tensor in pairs:
                        param.copy_(tensor)
                    return None
                self.stream.wait_stream(caller)
                for param, tensor in pairs:
                    param.copy_(tensor, non_blocking=True)
                    if tensor.is_cuda:  # its memory is not reused (a merged adapter's) before the copy has read it
                        tensor.record_stream(self.stream)
                read = torch.cuda.Event()
                read.record(self.stream)
                return read
        finally:
            with self._cv:
                self._loaders -= 1
                self._cv.notify_all()

    @contextlib.contextmanager
    def _queueing(self):
        """The worker's turn to queue device work, once no load waits for it."""
        with self._cv:
            while self._loaders:
                self._cv.wait()
        with self._device:
            yield

    def parameters(self) -> dict[str, torch.Tensor]:
        """The model's parameters by HF name (tied ones once), or with LoRA the adapters it takes (meta tensors):
        the layout weight sync checks against."""
        return dict(self._adapter.layout) if self._adapter is not None else dict(self.model.named_parameters())

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=60)
        self._fail(RuntimeError("the generation engine was closed"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the worker ---------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._error is not None:
            raise RuntimeError("the generation engine failed") from self._error
        if self._closed:
            raise RuntimeError("the generation engine is closed")

    @torch.inference_mode()
    def _run(self) -> None:
        try:
            if self.device.type == "cuda" and self.device.index is not None:
                torch.cuda.set_device(self.device)
            with torch.cuda.stream(self.stream):
                self._serve()
        except BaseException as error:  # the worker must never die silently: every waiting caller hears of it
            self._fail(error)

    def _stream(self) -> torch.cuda.Stream | None:
        """The worker's CUDA stream: with `high_priority`, one the GPU schedules ahead of others' kernels, so a
        colocated trainer's long kernels fill the gaps of the decode steps instead of delaying them; else the
        device's default stream. None on CPU."""
        if self.device.type != "cuda":
            return None
        if not self.knobs.high_priority:
            return torch.cuda.default_stream(self.device)
        return torch.cuda.Stream(self.device, priority=torch.cuda.Stream.priority_range()[1])

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not (self._closed or self._waiting or self._active):
                    self._cv.wait()
                if not self._active:
                    self._gather()
                if self._closed:
                    return
                admit = self._taken = []
                if self.plain_reason is None:
                    while self._waiting and len(admit) < len(self._slots):
                        admit.append(self._waiting.popleft())
            if self.plain_reason is not None:
                self._plain_call()
                continue
            if admit:
                self._admit(admit)
            if self._active:
                self._decode_chunk()

    def _gather(self) -> None:
        """An idle engine's first call: wait while more calls keep arriving within gather_s of each other (or until
        the free slots are spoken for), so that calls made together are admitted together. Holds self._cv."""
        seen = 0
        while self.gather_s and seen < len(self._waiting) < len(self._slots) and not self._closed:  # more came
            seen = len(self._waiting)
            self._cv.wait(self.gather_s)

    def _admit(self, rows: list[Row]) -> None:
        """Prefill `rows` into free slots, in packed groups of at most prefill_tokens prompt tokens."""
        group, tokens = [], 0
        for row in rows + [None]:
            if row is None or (group and tokens + len(row.prompt) > self.knobs.prefill_tokens):
                with self._queueing():
                    prefixes = self.runner.prefill(group)
                for admitted in group:
                    placed = self._active[admitted.slot]
                    placed.prefix = prefixes[placed.slot]
                    self._slots.hold(placed.slot, placed.prefix)
                self.stats["prefills"] += 1
                group, tokens = [], 0
            if row is None:
                break
            row.slot, row.generated, row.queued = self._slots.take(), 1, 1
            self._active[row.slot] = row
            s = row.request.sampling
            group.append(Admit(row.slot, row.prompt, row_key(row.request.seed, row.index), s.temperature, s.top_p,
                               s.max_new_tokens))
            tokens += len(row.prompt)
        self.stats["admitted"] += len(rows)

    def _decode_chunk(self) -> None:
        """A chunk of sync_every decode steps over the active rows (or the one queued ahead), then the rows it finished
        handed back. With `lookahead`, the next chunk is queued before this one is read, so the device never waits for
        the host between chunks (a colocated trainer's thread may hold the GIL then); not while rows wait for a slot,
        which are prefilled between chunks."""
        chunk, rows = self._ahead or self._launch()
        self._ahead = None
        if self.lookahead and not self._waiting:
            self._ahead = self._launch(ahead=True)
            self.stats["ahead"] += self._ahead is not None
        self.stats["polls"] += 1
        finished = []
        for s, row, (done, generated) in zip(chunk.slots, rows, self.runner.outcome(chunk)):
            if self._active.get(s) is not row:
                continue  # handed back after an earlier chunk: a done row the later one only carried along
            row.generated = generated
            if done:
                finished.append(s)
        if not finished:
            return
        lengths = [self._active[s].generated for s in finished]
        for s, (tokens, logprobs) in zip(finished, self.runner.completions(chunk, finished, lengths)):
            row = self._active.pop(s)
            self._slots.release(s, row.prefix)
            reason = "eos" if tokens[-1] in self.eos_ids else "length"
            self._deliver(row, Generation(tokens, logprobs, reason))

    def _launch(self, ahead: bool = False):
        """Queue a chunk over the active rows: (chunk, its rows), or None for a chunk ahead that no row has room
        for (every row reaches its max_new_tokens within the chunks already queued)."""
        slots = sorted(self._active)
        rows = [self._active[s] for s in slots]
        left = max(r.request.sampling.max_new_tokens - r.queued for r in rows)
        if ahead and left <= 0:
            return None
        steps = min(self.sync_every, max(left, 0))
        for r in rows:
            r.queued = min(r.queued + steps, r.request.sampling.max_new_tokens)
        self.stats["decode_steps"] += steps
        with self._queueing():
            return self.runner.launch(slots, steps), rows

    def _plain_call(self) -> None:
        """Models the decoder does not cover: the head call's rows in one eager batch (no continuous batching)."""
        from forge_exp.models.generate import generate

        with self._cv:
            if not self._waiting:
                return
            request = self._waiting[0].request
            rows = self._taken = []
            while self._waiting and self._waiting[0].request is request:
                rows.append(self._waiting.popleft())
        s = request.sampling
        with self._queueing():  # one eager call: weights change only between calls
            outs = generate(self.model, [r.prompt for r in rows], max_new_tokens=s.max_new_tokens,
                            temperature=s.temperature, top_p=s.top_p, eos_id=self.eos_ids or [-1],
                            pad_id=self.pad_id, seed=request.seed)
        for row, out in zip(rows, outs):
            self._deliver(row, out)

    def _deliver(self, row: Row, generation: Generation) -> None:
        request = row.request
        request.results[row.index] = generation
        request.remaining -= 1
        if request.remaining == 0:
            request.settle(request.results, None)

    def _fail(self, error: BaseException) -> None:
        with self._cv:
            if not self._closed:
                self._error = error
            rows = [*self._waiting, *self._taken, *self._active.values()]
            requests = {id(r.request): r.request for r in rows if r.request.remaining > 0}
            self._waiting.clear()
            self._taken = []
            self._active.clear()
        for request in requests.values():
            request.settle(None, error)


def _default_eos(model, tokenizer) -> tuple[int, ...]:
    ids = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = model.config.eos_token_id
    ids.update([eos] if isinstance(eos, int) else (eos or []))
    return tuple(sorted(ids))


def _kernels(device: torch.device):
    """The fused steps for this device: Triton kernels on GPU when Triton is there, else the torch ops."""
    if device.type == "cuda":
        try:
            from forge_exp.generators import triton_ops

            return triton_ops
        except ImportError:
            pass
    from forge_exp.generators import ops

    return ops
