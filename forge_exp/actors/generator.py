"""Generator service: samples groups of completions with the latest weights it has received, through the engine
`generator=` names (generators/). Several `generate` calls may be in flight at once: the engine batches them."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from monarch.actor import Actor, concurrent_endpoint, endpoint

from forge_exp.actors.placement import own_visible_devices, place
from forge_exp.generators.base import Generation, Sampling
from forge_exp.rl.types import Completion, Group, Problem
from forge_exp.runtime.build import build


def fill_unset(node, values: dict):
    """The generator node with its unset (null) knobs taken from `values` (the app's sizes for this run)."""
    unset = {k: v for k, v in values.items() if hasattr(node, k) and getattr(node, k) is None}
    return dataclasses.replace(node, **unset) if unset else node


class Generator(Actor):
    def __init__(self, generator, model, init_path: str | None, seed: int, sizes: dict | None = None, *,
                 devices, threads):
        """`sizes`: values for the engine's knobs the config leaves null (slots, max_len), from the run's shape."""
        sizes = dict(sizes or {})
        if generator.drives_workers:  # one process per replica; its engine's workers take the replica's devices
            devices, count = own_visible_devices(devices)
            sizes["tensor_parallel_size"] = count
        self.device = place(devices, threads, seed)
        self.engine = build(fill_unset(generator, sizes), "generator",
                            model=build(model, "model").loading(init_path), device=self.device, seed=seed)
        self.tokenizer = self.engine.tokenizer
        self.version = 0
        self._pending: tuple[int, object] | None = None
        self._sync_seconds = 0.0
        self._weights = asyncio.Lock()  # staging a snapshot and loading it never overlap

    @concurrent_endpoint
    async def receive_weights(self, ref) -> str:
        """Snapshot the trainer's weights (version ref.version, a runtime.weight_sync.WeightRef) into a private
        buffer; they are loaded before the next generate call starts (concurrent: does not wait for calls in
        flight). Returns the path taken ("local" | "ipc" | "message") or what the trainer must add."""
        from forge_exp.runtime.weight_sync import TAKEN, WeightReceiver

        async with self._weights:
            if getattr(self, "_receiver", None) is None:
                self._receiver = WeightReceiver(self.engine.parameters(), self.device)
            got = self._receiver.receive(ref)
            if got in TAKEN:
                self._pending = (ref.version, self._receiver)
        return got

    async def _load_pending(self) -> None:
        """Swap in the newest snapshot. Rows already decoding continue under the new weights (their completions
        keep the older version's stamp: the policy age a replay buffer bounds is never understated). An engine that
        can queue the copies (`queue_weights`) does not wait for them: its next rows are prefilled after them."""
        async with self._weights:
            if self._pending is None:
                return
            t0 = time.perf_counter()
            version, receiver = self._pending
            self._pending = None
            await asyncio.to_thread(receiver.load, getattr(self.engine, "queue_weights", self.engine.load_weights))
            self.version = version
            self._sync_seconds = time.perf_counter() - t0

    @concurrent_endpoint
    async def generate(
        self, problems: list[Problem], n: int, temperature: float, top_p: float, max_new_tokens: int,
        seed: int | None = None,
    ) -> tuple[list[Group], dict[str, float]]:
        """n completions of each problem. Returns the groups and generation metrics. `seed` fixes the draws of
        this call whichever replica serves it (the loop derives it from the run's seed and the batch: a resumed run
        samples what the interrupted one would have); None takes the engine's next seed."""
        await self._load_pending()
        version = self.version
        t0 = time.perf_counter()
        prompts = [self.tokenizer.encode(p.prompt) for p in problems]
        outs = await self.engine.generate(prompts, Sampling(n, temperature, top_p, max_new_tokens, seed))
        seconds = time.perf_counter() - t0
        groups = [
            Group(problem=problem, completions=[self._completion(ids, o, version) for o in group])
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

    @concurrent_endpoint
    async def generate_tokens(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Generation]]:
        """The engine's own call, token ids in and out, each Generation stamped with the weights version it started
        under: what the multi-turn episode driver (envs/driver.py, on the environment workers) calls every turn."""
        await self._load_pending()
        version = self.version
        outs = await self.engine.generate(prompts, sampling)
        return [[g._replace(policy_version=version) for g in row] for row in outs]

    def _completion(self, prompt_ids: list[int], o: Generation, version: int) -> Completion:
        return Completion(prompt_ids=prompt_ids, token_ids=o.token_ids, logprobs=o.logprobs, stop_reason=o.stop_reason,
                          policy_version=version, text=self.tokenizer.decode(o.token_ids, skip_special_tokens=True))

    @endpoint
    async def pad_id(self) -> int:
        return self.tokenizer.pad_token_id
