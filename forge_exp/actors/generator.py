"""Generator service: samples groups of completions with the latest weights it has received."""

from __future__ import annotations

import asyncio
import time

import torch
from monarch.actor import Actor, concurrent_endpoint, endpoint

from forge_exp.actors.placement import place
from forge_exp.config.model import ModelConfig, build_model
from forge_exp.models.generate import generate
from forge_exp.rl.types import Completion, Group, Problem


class Generator(Actor):
    def __init__(self, model: ModelConfig, init_path: str | None, seed: int, *, devices, threads):
        self.device = place(devices, threads, seed)
        if init_path:
            model = ModelConfig(**{**model.__dict__, "path": init_path})
        self.model, self.tokenizer = build_model(model, self.device)
        self.model.eval()
        self.version = 0
        self._pending: tuple[int, dict] | None = None
        self._sync_seconds = 0.0
        self._lock = asyncio.Lock()
        self._rng = torch.Generator(device=self.device).manual_seed(seed)

    @concurrent_endpoint
    async def receive_weights(self, ref) -> str:
        """Snapshot the trainer's weights (version ref.version, a runtime.weight_sync.WeightRef) into a private
        buffer; they are loaded before the next batch (concurrent: does not wait for a batch in flight). Returns the
        path taken ("local" | "ipc" | "message") or what the trainer must add ("ipc?" | "state?")."""
        from forge_exp.runtime.weight_sync import TAKEN, WeightReceiver

        if getattr(self, "_receiver", None) is None:
            self._receiver = WeightReceiver(self.model, self.device)
        got = self._receiver.receive(ref)
        if got in TAKEN:
            self._pending = (ref.version, self._receiver)
        return got

    def _load_pending(self) -> None:
        if self._pending is None:
            return
        t0 = time.perf_counter()
        version, receiver = self._pending
        self._pending = None
        receiver.load()
        self.version = version
        self._sync_seconds = time.perf_counter() - t0

    @concurrent_endpoint
    async def generate(
        self, problems: list[Problem], n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> tuple[list[Group], dict[str, float]]:
        """n completions of each problem, sampled in one batch. Returns the groups and generation metrics."""
        async with self._lock:
            self._load_pending()
            return await asyncio.to_thread(self._generate, problems, n, temperature, top_p, max_new_tokens)

    def _generate(self, problems, n, temperature, top_p, max_new_tokens):
        t0 = time.perf_counter()
        prompts = [self.tokenizer.encode(p.prompt) for p in problems]
        rows = [ids for ids in prompts for _ in range(n)]
        outs = generate(
            self.model,
            rows,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            eos_id=self.tokenizer.eos_token_id,
            pad_id=self.tokenizer.pad_token_id,
            generator=self._rng,
        )
        groups = []
        for i, problem in enumerate(problems):
            completions = [
                Completion(
                    prompt_ids=prompts[i],
                    token_ids=o.token_ids,
                    logprobs=o.logprobs,
                    stop_reason=o.stop_reason,
                    policy_version=self.version,
                    text=self.tokenizer.decode(o.token_ids, skip_special_tokens=True),
                )
                for o in outs[i * n : (i + 1) * n]
            ]
            groups.append(Group(problem=problem, completions=completions))
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.token_ids) for o in outs)
        return groups, {
            "generator/seconds": seconds,
            "generator/tokens": tokens,
            "generator/tokens_per_s": tokens / max(seconds, 1e-9),
            "generator/sync_seconds": self._sync_seconds,
            "generator/version": self.version,
        }

    @endpoint
    async def pad_id(self) -> int:
        return self.tokenizer.pad_token_id
