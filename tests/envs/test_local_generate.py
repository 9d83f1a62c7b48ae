"""Multi-turn episodes sampled by a real model: the trainer's recomputed logprobs of the model's tokens equal the
behaviour logprobs the generator returned, turn after turn (positions and context line up across insertions)."""

import asyncio

import torch

from forge_exp.data.collate import collate_episodes
from forge_exp.envs import EpisodeLimits, Sampling, StepResult, TinyToolFormat, run_episodes
from forge_exp.envs.local import local_generate
from forge_exp.models.logprobs import sequence_logprobs
from forge_exp.models.tiny import qwen3
from forge_exp.models.tokenizer import TOOL_ALPHABET, build_char_tokenizer
from forge_exp.rl.episodes import group_advantages, to_episodes
from forge_exp.rl.types import Problem


class Chatty:
    """Never done: answers every turn with a user message, so every episode interleaves model and env tokens."""

    tools = ()

    def reset(self, problem):
        return [{"role": "user", "content": problem.prompt}]

    def step(self, message):
        return StepResult(messages=[{"role": "user", "content": "12+3="}])


def test_behaviour_logprobs_match_the_trainer_across_turns():
    tok = build_char_tokenizer(TOOL_ALPHABET)
    model = qwen3(vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, max_position_embeddings=128, pad_id=tok.pad_token_id,
                  bos_id=tok.bos_token_id, eos_id=tok.eos_token_id, seed=0).eval()
    with torch.no_grad():  # a peaked distribution, so EOS comes early enough for several turns
        model.lm_head.weight[tok.eos_token_id] += 0.5
    gen = local_generate(model, tok, generator=torch.Generator().manual_seed(0))
    problems = [Problem("37+48=", "85", "37+48"), Problem("9*9=", "81", "9*9")]
    groups = asyncio.run(run_episodes(Chatty, problems, 3, gen, tok, TinyToolFormat(),
                                      Sampling(temperature=1.0, max_new_tokens=6), EpisodeLimits(3, 80)))
    episodes = to_episodes(groups, group_advantages(groups, "group_norm", 1e-6))
    batch = collate_episodes(episodes, tok.pad_token_id)
    assert (~batch.loss_mask & batch.response_mask).any()  # some environment tokens are in there
    assert max(c.completion.info["turns"] for c in episodes) >= 2
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                  batch.response_mask, 1.0)
    torch.testing.assert_close(lp[batch.loss_mask], batch.behavior_logprobs[batch.loss_mask], atol=1e-4, rtol=1e-4)
