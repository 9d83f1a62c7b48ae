"""The vLLM generator backend: vLLM's v1 `AsyncLLM` behind the `generators.base.Engine` interface.

Every `generate` call in flight, from any thread or event loop, feeds one engine that batches all their requests
continuously (a group's n samples are one request with `SamplingParams.n`). Token ids go in and come out; vLLM never
tokenizes (its tokenizer is not even loaded), so any HF tokenizer, the tiny model's character one included, works.

Behaviour logprobs. vLLM's default (`logprobs_mode="raw_logprobs"`) returns `log_softmax(logits)` before the
temperature; the trainer recomputes `log_softmax(logits / T)` (forge_exp/models/generate.py). This engine sets
`processed_logprobs`: the log-softmax after temperature and after top-p. With top_p == 1 that is exactly the
trainer's quantity; with top_p < 1 it would be the truncated, renormalised distribution, which no trainer here
recomputes, so top_p < 1 is refused rather than silently skewing the importance ratio. Greedy (T = 0) requests get
the unscaled log-softmax in both places.

In-flight weight updates (`load_weights`): pause the scheduler with the requests in flight frozen ("keep") or
drained ("wait"), reload the weights in place by HF name in every worker, drop the prefix cache and recompute the
KV of the frozen requests (so every token after the swap is sampled from the new weights alone), stamp the new
version, resume. vLLM records per-token weight-version spans; `generate_versioned` returns them, so a caller knows
which version sampled which tokens of a completion. CUDA tensors reach the workers as CUDA IPC handles (the
worker maps the sender's memory and copies from it: no bytes in the message); CPU tensors travel as bytes.

vLLM releases before 0.32 (the GPU build that runs on torch 2.11 is 0.26) lack two things this engine uses where
they exist (`_Features`): per-token weight-version spans and the engine-side version stamp. There a completion's one
span carries the version that was serving when it was submitted: with inflight_update=keep, a completion that
straddled an update is stamped with the older version, so the policy age a replay buffer bounds is overstated, never
understated. Prompts go in as the token-id dict both releases take.

The engine runs on its own event loop in a daemon thread: the AsyncLLM's output handler must keep running while a
caller blocks in the synchronous `load_weights`, and callers may live on any loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import random
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable
from typing import NamedTuple

import torch

from forge_exp.generators.base import Generation, Sampling
from forge_exp.generators.vllm_lora import VllmAdapters
from forge_exp.generators.options import VllmOptions
from forge_exp.generators.vllm_options import check_device, engine_args
from forge_exp.models.lora import adapter_layout
from forge_exp.generators.vllm_worker import pack, share

INSTALL_HINT = (
    "generator=vllm needs vLLM: `pip install 'forge-exp[vllm]'` on a GPU machine, or "
    "`bash launchers/setup.sh --vllm` for the CPU build in .venv-vllm"
)


class VersionSpan(NamedTuple):
    version: int  # the weights version that sampled tokens [start, end) of a completion
    start: int
    end: int


class Versioned(NamedTuple):
    generation: Generation
    spans: tuple[VersionSpan, ...]  # cover all its tokens in order; one span unless weights changed mid-flight

    @property
    def oldest_version(self) -> int:
        """The policy age a replay buffer should use: the oldest weights that contributed a token."""
        return min(s.version for s in self.spans) if self.spans else -1


class _Features(NamedTuple):
    """What this vLLM release offers of the API the engine uses (feature-detected: docs/generators.md)."""

    weight_versions: bool  # AsyncLLM.update_weight_version and CompletionOutput.weight_versions (vLLM >= 0.32)

    @classmethod
    def detect(cls) -> "_Features":
        from vllm.v1.engine.async_llm import AsyncLLM

        return cls(hasattr(AsyncLLM, "update_weight_version"))


class VllmEngine:
    """`Engine(model, device, seed, **knobs)`; knobs are conf/generator/vllm.yaml's keys, parsed into its schema
    (generators/options.py: VllmOptions)."""

    schema = VllmOptions

    @staticmethod
    def check_installed() -> None:
        """ImportError with the install hint when vLLM is not in this environment (the CLI asks before any process
        starts; a service's own import would say so only after the meshes are up)."""
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(f"{INSTALL_HINT} (no module named 'vllm' for {sys.executable})")

    def __init__(self, model, device: str = "cpu", seed: int = 0, **knobs) -> None:
        """`model`: a `forge_exp.models.hf.ModelSpec` (what conf/model/ builds)."""
        self.options = VllmOptions.parse(knobs)
        if importlib.util.find_spec("flashinfer") is None:
            # vLLM 0.26's GPU sampler imports FlashInfer's attention backend just to ask whether to sample top-k/top-p
            # with it, and fails to start without FlashInfer; this engine never samples with top-k/top-p
            os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ImportError(f"{INSTALL_HINT} ({e})") from e
        from forge_exp.models.hf import load_tokenizer

        check_device(self.options, device)
        self._tmp: str | None = None
        self.lora = model.lora_spec  # LoRA: the engine serves the base, each push adds an adapter (vllm_lora.py)
        path = self._path = self._model_dir(model.base() if self.lora else model)
        self._dtype = self.options.dtype or model.dtype
        self._adapters = VllmAdapters(self.lora, self._skeleton()) if self.lora else None
        from transformers import AutoConfig

        self._tied = bool(getattr(AutoConfig.from_pretrained(path, local_files_only=True), "tie_word_embeddings", False))
        self.tokenizer = load_tokenizer(path)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer in {path} has no eos_token_id: generation could never stop on EOS")
        self.version = 0
        # One random seed per request, drawn from the engine's seed: reproducible for a given call order. vLLM seeds
        # the n samples of a request seed, seed + 1, ...; random 48-bit seeds keep those runs from overlapping
        # between requests (consecutive seeds would give different prompts the same noise).
        self._seeds = random.Random(seed)
        self._ids = itertools.count()
        self._update_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        self._engine = None
        try:
            lora_args = self._adapters.engine_args() if self._adapters else {}
            self._engine = self._run(self._start(engine_args(self.options, path, self._dtype, device, seed,
                                                             **lora_args)))
        except BaseException:
            self.close()
            raise

    # ---- construction -------------------------------------------------------------------------------------------
    def _model_dir(self, model) -> str:
        """A local HF directory vLLM can load: model.path, the local HF cache's snapshot of model.hf_id, or a freshly
        initialised model's (or an adapter merged into its base) weights and tokenizer written to a temporary
        directory (removed by close)."""
        if model.path and not model.adapter:
            return model.path
        if getattr(model, "hf_id", None) and not model.adapter:
            from huggingface_hub import snapshot_download

            return snapshot_download(model.hf_id, local_files_only=True)
        self._tmp = tempfile.mkdtemp(prefix="forge-exp-vllm-")
        model.build().save_pretrained(self._tmp)
        model.tokenizer().save_pretrained(self._tmp)
        return self._tmp

    def parameters(self) -> dict[str, torch.Tensor]:
        """The HF model's parameters by name, as meta tensors (shapes and dtypes, no storage): the layout the
        trainer's weights are checked against and staged in. vLLM's own modules use other names (fused QKV)."""
        if self.lora:  # the adapters a push carries (peft's names)
            return adapter_layout(self._skeleton(), self.lora)
        return dict(self._skeleton().named_parameters())

    def _skeleton(self) -> torch.nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(self._path, local_files_only=True)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, self._dtype))

    async def _start(self, args):
        from vllm.v1.engine.async_llm import AsyncLLM

        self.features = _Features.detect()
        engine = AsyncLLM.from_engine_args(args)
        if self.features.weight_versions:
            await engine.update_weight_version(str(self.version))
        return engine

    def _run(self, coro):
        """Run a coroutine on the engine's loop and block until it returns (any thread but the engine's)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # ---- generation ---------------------------------------------------------------------------------------------
    async def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Generation]]:
        """`sampling.n` generations per prompt, `[prompt][sample]`."""
        return [[v.generation for v in row] for row in await self.generate_versioned(prompts, sampling)]

    async def generate_versioned(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Versioned]]:
        """As `generate`, each generation with the weight-version spans of its tokens."""
        if self._engine is None:
            raise RuntimeError("this vLLM engine is closed")
        params = self._params(sampling)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token (encode with a <bos> token)")
        # Sampling.seed fixes the call's draws: prompt i gets its own 48-bit seed from (seed, i), whatever else runs
        seeds = [None if sampling.seed is None else random.Random(sampling.seed * 1_000_003 + i).getrandbits(48)
                 for i in range(len(prompts))]
        work = [self._one(p, params.clone(), seed) for p, seed in zip(prompts, seeds)]
        future = asyncio.run_coroutine_threadsafe(_gather(work), self._loop)
        rows = await asyncio.wrap_future(future)
        if sampling.temperature == 0 and sampling.n > 1:
            # the one greedy request per prompt (see _params), copied: callers may edit one sample's lists
            rows = [[_copy(row[0]) for _ in range(sampling.n)] for row in rows]
        return rows

    def _params(self, sampling: Sampling):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if sampling.top_p < 1:
            raise ValueError(
                f"top_p={sampling.top_p} with generator=vllm: vLLM's logprobs would then be those of the truncated "
                f"distribution, not the full one the trainer recomputes; set algorithm.top_p=1 (the RL default) or "
                f"use the torch generator"
            )
        return SamplingParams(
            # vLLM refuses n > 1 for greedy requests: n greedy samples are one sample, repeated by the caller
            n=1 if sampling.temperature == 0 else sampling.n,
            temperature=sampling.temperature,
            top_p=1.0,
            top_k=0,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # the sampled token's logprob only
            stop_token_ids=[self.tokenizer.eos_token_id],
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def _one(self, prompt: list[int], params, seed: int | None = None) -> list[Versioned]:
        # the engine loop is one thread: no lock needed for the engine's own stream
        params.seed = seed if seed is not None else self._seeds.getrandbits(48)
        adapters = self._adapters
        lora, version = (adapters.request, adapters.version) if adapters else (None, self.version)
        final = None
        request = f"r{next(self._ids)}"
        async for out in self._engine.generate({"prompt_token_ids": prompt}, params, request_id=request,
                                               lora_request=lora):
            final = out
        outs = [self._versioned(c) for c in sorted(final.outputs, key=lambda c: c.index)]
        if adapters or not self.features.weight_versions:
            # every token from the adapter the request was sent with; or, without vLLM's spans, the version serving
            # when the request was sent (the older one, if an update came while it ran)
            outs = [Versioned(v.generation, (VersionSpan(version, 0, len(v.generation.token_ids)),)) for v in outs]
        return outs

    def _versioned(self, c) -> Versioned:
        eos = self.tokenizer.eos_token_id
        if c.finish_reason == "stop" and c.stop_reason == eos:
            stop = "eos"
        elif c.finish_reason == "length":
            stop = "length"
        else:
            raise RuntimeError(f"vLLM ended a request with finish_reason={c.finish_reason!r} ({c.stop_reason!r})")
        token_ids = list(c.token_ids)
        # logprobs=0 still returns the sampled token's entry, keyed by its id, at every position
        logprobs = [step[t].logprob for step, t in zip(c.logprobs, token_ids)]
        spans = tuple(VersionSpan(int(s.version), s.start, s.end) for s in getattr(c, "weight_versions", None) or ())
        return Versioned(Generation(token_ids, logprobs, stop), spans)

    def in_flight(self) -> int:
        """Requests the engine holds now, from every caller (a gauge for metrics; tests use it to see batching)."""
        engine = self._engine
        if hasattr(engine, "get_num_unfinished_requests"):
            return engine.get_num_unfinished_requests()
        return engine.output_processor.get_num_unfinished_requests()  # vLLM < 0.32

    # ---- weights ------------------------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> int:
        """Apply new weights (HF names, e.g. the trainer's `state_dict().items()`) without restarting; requests in
        flight are kept (generator.inflight_update). Returns the new version: `version`, or the current one + 1.
        Blocks until the new weights serve; from async code, `await asyncio.to_thread(engine.load_weights, ...)`.
        With LoRA, `weights` is the adapter (peft's names): added as a new adapter (vllm_lora.py)."""
        if self._adapters:
            return self._load_adapter(weights, version)
        weights = list(weights)
        names = {n for n, _ in weights}
        if "lm_head.weight" not in names and "model.embed_tokens.weight" in names and self._tied:
            # a tied head is sent once, as the embedding (named_parameters drops the duplicate); vLLM's layer-wise
            # reload still wants the head's own entry, or it keeps the old one
            weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))
        with self._update_lock:
            new = self.version + 1 if version is None else int(version)
            # packed before the pause, so requests in flight wait only for the reload itself; CUDA tensors go as
            # IPC handles, and stay referenced here until every worker has copied from them
            if weights and weights[0][1].is_cuda:
                self._run(self._swap("forge_exp_load_shared", share(weights), new))
            else:
                self._run(self._swap("forge_exp_load_weights", pack(weights), new))
            self.version = new
            return new

    def _load_adapter(self, weights: Iterable[tuple[str, torch.Tensor]], version: int | None) -> int:
        with self._update_lock:
            new = self.version + 1 if version is None else int(version)
            request = self._adapters.write(weights, new)
            if not self._run(self._engine.add_lora(request)):
                raise RuntimeError(f"vLLM did not add the LoRA adapter of version {new} ({request.lora_path})")
            self._adapters.serving(request, new)
            self.version = new
            return new

    async def _swap(self, method: str, payload, version: int) -> None:
        engine = self._engine
        await engine.pause_generation(mode=self.options.inflight_update, clear_cache=False)
        try:
            await engine.collective_rpc(method, args=(payload,))
            # Running requests are preempted too: their KV was computed by the old weights, and is recomputed on
            # resume, so the tokens sampled after the swap come from the new weights alone.
            if not await engine.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM could not reset its prefix cache after a weight update")
            if self.features.weight_versions:
                await engine.update_weight_version(str(version))
        finally:
            await engine.resume_generation()

    # ---- memory (colocated layout) ------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory while a colocated trainer runs: level 1 offloads the weights to CPU and drops
        the KV cache; level 2 drops the weights too, so call `load_weights` right after `wake_up`, before any
        request is sent (requests kept from before the sleep would resume on garbage: drain them first). Needs
        generator.enable_sleep_mode; not tested here (vLLM's CPU build has no sleep mode)."""
        if not self.options.enable_sleep_mode:
            raise ValueError("sleep() needs generator.enable_sleep_mode=true (set when the engine starts)")
        self._run(self._engine.sleep(level, mode="keep"))

    def wake_up(self) -> None:
        self._run(self._engine.wake_up())

    # ---- lifetime -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the engine processes and the loop thread; remove the temporary model directory. Idempotent."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            self._run(_shutdown(engine))
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=60)
            self._loop.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if getattr(self, "_adapters", None):
            self._adapters.close()

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _copy(v: Versioned) -> Versioned:
    g = v.generation
    return Versioned(Generation(list(g.token_ids), list(g.logprobs), g.stop_reason), v.spans)


async def _gather(work):
    return await asyncio.gather(*work)


async def _shutdown(engine) -> None:
    """Stop the engine processes, then let the engine's own tasks on this loop (its output handler) finish
    cancelling, so that stopping the loop destroys no pending task."""
    engine.shutdown()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
