"""Generator service: samples groups of completions with the latest weights it has received, through the engine
`generator=` names (generators/)."""

from __future__ import annotations

import asyncio
import time

from monarch.actor import Actor, concurrent_endpoint, endpoint

from forge_exp.actors.placement import place
from forge_exp.generators.base import Sampling
from forge_exp.rl.types import Completion, Group, Problem
from forge_exp.runtime.build import build


class Generator(Actor):
    def __init__(self, generator, model, init_path: str | None, seed: int, *, devices, threads):
        self.device = place(devices, threads, seed)
        self.engine = build(generator, "generator", model=build(model, "model").loading(init_path),
                            device=self.device, seed=seed)
        self.tokenizer = self.engine.tokenizer
        self.version = 0
        self._pending: tuple[int, object] | None = None
        self._sync_seconds = 0.0
        self._lock = asyncio.Lock()

    @concurrent_endpoint
    async def receive_weights(self, ref) -> str:
        """Snapshot the trainer's weights (version ref.version, a runtime.weight_sync.WeightRef) into a private
        buffer; they are loaded before the next batch (concurrent: does not wait for a batch in flight). Returns the
        path taken ("local" | "ipc" | "message") or what the trainer must add ("ipc?" | "state?")."""
        from forge_exp.runtime.weight_sync import TAKEN, WeightReceiver

        if getattr(self, "_receiver", None) is None:
            self._receiver = WeightReceiver(self.engine.parameters(), self.device)
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
        receiver.load(self.engine.load_weights)
        self.version = version
        self._sync_seconds = time.perf_counter() - t0

    @concurrent_endpoint
    async def generate(
        self, problems: list[Problem], n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> tuple[list[Group], dict[str, float]]:
        """n completions of each problem. Returns the groups and generation metrics."""
        async with self._lock:
            self._load_pending()
            version = self.version
            t0 = time.perf_counter()
            prompts = [self.tokenizer.encode(p.prompt) for p in problems]
            outs = await self.engine.generate(prompts, Sampling(n, temperature, top_p, max_new_tokens))
        seconds = time.perf_counter() - t0
        groups = [
            Group(problem=problem, completions=[
                Completion(prompt_ids=ids, token_ids=o.token_ids, logprobs=o.logprobs, stop_reason=o.stop_reason,
                           policy_version=version, text=self.tokenizer.decode(o.token_ids, skip_special_tokens=True))
                for o in group
            ])
            for problem, ids, group in zip(problems, prompts, outs)
        ]
        tokens = sum(len(o.token_ids) for group in outs for o in group)
        return groups, {
            "generator/seconds": seconds,
            "generator/tokens": tokens,
            "generator/tokens_per_s": tokens / max(seconds, 1e-9),
            "generator/sync_seconds": self._sync_seconds,
            "generator/version": version,
        }

    @endpoint
    async def pad_id(self) -> int:
        return self.tokenizer.pad_token_id
