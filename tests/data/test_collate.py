import torch

from forge_exp.data.collate import collate_episodes
from forge_exp.rl.types import Completion, Episode


def test_prompts_left_padded_responses_right_padded():
    eps = [
        Episode(Completion([5, 6, 7], [8, 9], [-0.5, -0.25], "eos", 3), reward=1.0, advantage=0.7,
                ref_logprobs=[-0.4, -0.3]),
        Episode(Completion([5], [8, 9, 10], [-1.0, -2.0, -3.0], "length", 2), reward=0.0, advantage=-0.7,
                ref_logprobs=[-1.1, -2.1, -3.1]),
    ]
    b = collate_episodes(eps, pad_id=0)
    assert b.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 5]]
    assert b.prompt_mask.tolist() == [[True] * 3, [False, False, True]]
    assert b.response_ids.tolist() == [[8, 9, 0], [8, 9, 10]]
    assert b.response_mask.tolist() == [[True, True, False], [True] * 3]
    assert torch.allclose(b.behavior_logprobs, torch.tensor([[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]))
    assert torch.allclose(b.ref_logprobs, torch.tensor([[-0.4, -0.3, 0.0], [-1.1, -2.1, -3.1]]))
    assert b.advantages.tolist() == [0.699999988079071, -0.699999988079071]
    assert b.truncated.tolist() == [False, True]
    assert b.policy_versions.tolist() == [3, 2]
    first, swapped = b.rows(slice(0, 1)), b.rows(torch.tensor([1, 0]))  # a slice of rows, or rows in an order
    assert len(first) == 1 and first.ref_logprobs.tolist() == b.ref_logprobs[:1].tolist()
    assert swapped.response_ids.tolist() == [[8, 9, 10], [8, 9, 0]] and swapped.policy_versions.tolist() == [2, 3]


def test_reference_logprobs_absent_unless_every_episode_has_them():
    eps = [Episode(Completion([1], [2], [-0.1], "eos", 0), 1.0, 0.0, ref_logprobs=None)]
    assert collate_episodes(eps, pad_id=0).ref_logprobs is None
