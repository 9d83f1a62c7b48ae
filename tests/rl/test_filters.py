"""DAPO filters: dynamic sampling (predicate + refill state), overlong mask, soft overlong punishment."""

from __future__ import annotations

import pytest
import torch

from forge_exp.rl.filters import (
    DynamicSampling,
    apply_soft_overlong_penalty,
    count_zero_variance,
    has_mixed_rewards,
    is_zero_variance,
    mask_rows,
    overlong_keep_mask,
    soft_overlong_penalty,
)
from forge_exp.rl.types import Completion, Episode, Group, Problem, TrainBatch


def completion(n_tokens=3, stop="eos"):
    return Completion(prompt_ids=[1], token_ids=list(range(n_tokens)), logprobs=[-0.1] * n_tokens,
                      stop_reason=stop, policy_version=0)


def group(rewards, lengths=None):
    lengths = lengths or [3] * len(rewards)
    return Group(problem=Problem(prompt="1+1=", target="2"), completions=[completion(n) for n in lengths],
                 rewards=list(rewards))


def test_mixed_rewards_predicate():
    assert has_mixed_rewards(group([1, 0, 0, 1])) and not has_mixed_rewards(group([1, 1, 1, 1]))
    assert is_zero_variance([0.0, 0.0]) and is_zero_variance(torch.tensor([0.5, 0.5]))
    assert count_zero_variance([group([1, 1]), group([0, 1]), group([0, 0])]) == 2
    with pytest.raises(ValueError, match="no rewards"):
        is_zero_variance(group([]))


def test_dynamic_sampling_refills_until_full():
    s = DynamicSampling(target=3, max_attempts=5)
    rounds = [[group([1, 1]), group([0, 1])], [group([0, 0]), group([1, 0])], [group([0, 1]), group([1, 0])]]
    for groups in rounds:
        assert not s.done and s.needed > 0
        s.add(groups)
    assert s.done and not s.exhausted and len(s.take()) == 3  # the 4th mixed group is dropped
    m = s.metrics()
    assert m["filter/groups_seen"] == 6 and m["filter/zero_variance_groups"] == 2
    assert m["filter/sampling_attempts"] == 3 and m["filter/groups_kept"] == 3 and m["filter/sampling_exhausted"] == 0


def test_dynamic_sampling_stops_at_the_cap():
    s = DynamicSampling(target=2, max_attempts=2)
    s.add([group([1, 1])])
    s.add([group([0, 1]), group([0, 0])])
    assert s.done and s.exhausted and len(s.take()) == 1 and s.metrics()["filter/sampling_exhausted"] == 1.0


def test_dynamic_sampling_disabled_keeps_everything_but_counts():
    s = DynamicSampling(target=2, max_attempts=3, enabled=False)
    s.add([group([1, 1]), group([0, 1])])
    assert s.done and len(s.take()) == 2 and s.zero_variance == 1
    with pytest.raises(ValueError, match="algorithm.max_sampling_attempts"):
        DynamicSampling(target=2, max_attempts=0)


def test_overlong_keep_mask_from_types_and_tensors():
    comps = [completion(stop="eos"), completion(stop="length"), completion(stop="eos")]
    assert overlong_keep_mask(comps).tolist() == [True, False, True]
    episodes = [Episode(completion=c, reward=0.0, advantage=0.0) for c in comps]
    assert overlong_keep_mask(episodes).tolist() == [True, False, True]
    batch = TrainBatch(
        prompt_ids=torch.zeros(3, 1, dtype=torch.long), prompt_mask=torch.ones(3, 1, dtype=torch.bool),
        response_ids=torch.zeros(3, 2, dtype=torch.long), response_mask=torch.ones(3, 2, dtype=torch.bool),
        behavior_logprobs=torch.zeros(3, 2), advantages=torch.zeros(3), truncated=torch.tensor([False, True, False]),
        policy_versions=torch.zeros(3, dtype=torch.long),
    )
    keep = overlong_keep_mask(batch)
    assert keep.tolist() == [True, False, True]
    assert mask_rows(batch.response_mask, keep).tolist() == [[True, True], [False, False], [True, True]]
    assert mask_rows(torch.ones(3, 2), keep).tolist() == [[1, 1], [0, 0], [1, 1]]


def test_soft_overlong_penalty_by_hand():
    # L_max = 10, L_cache = 4 → no penalty up to 6 tokens, then (6 − |y|)/4 down to −1 at 10, −1 beyond
    expected = {3: 0.0, 6: 0.0, 7: -0.25, 8: -0.5, 10: -1.0, 11: -1.0}
    for length, value in expected.items():
        assert soft_overlong_penalty(length, 10, 4) == pytest.approx(value), length
    lengths = torch.tensor(list(expected))
    assert soft_overlong_penalty(lengths, 10, 4).tolist() == pytest.approx(list(expected.values()))
    with pytest.raises(ValueError, match="algorithm.overlong_buffer"):
        soft_overlong_penalty(5, 10, 0)


def test_apply_soft_overlong_penalty_shapes_rewards_without_mutating():
    g = group([1.0, 1.0, 0.0], lengths=[5, 8, 10])
    shaped = apply_soft_overlong_penalty(g, max_len=10, buffer_len=4)
    assert shaped.rewards == pytest.approx([1.0, 0.5, -1.0]) and g.rewards == [1.0, 1.0, 0.0]
