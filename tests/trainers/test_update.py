"""A step whose loss is not finite is skipped and named, even when the loss's gradient is finite (a loss of +inf
plus a constant has the gradient of the loss): training on it would go on as if nothing were wrong."""

import copy

import pytest
import torch

from forge_exp.data.collate import collate_episodes
from forge_exp.rl.losses import GRPOLoss
from forge_exp.trainers.update import Policy, policy_update
from tests.models.helpers import TOK, peaky_model
from tests.rl.test_loss_mask import behaviour, episodes


class Shifted(torch.nn.Module):
    """GRPO's loss plus a constant: the gradient is GRPO's whatever the constant."""

    def __init__(self, shift: float):
        super().__init__()
        self.grpo, self.shift = GRPOLoss(beta=0.0), shift

    def forward(self, logprobs, behavior_logprobs, advantages, padding_mask):
        value, metrics = self.grpo(logprobs=logprobs, behavior_logprobs=behavior_logprobs, advantages=advantages,
                                   padding_mask=padding_mask)
        return value + self.shift, metrics


@pytest.mark.parametrize("shift", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_loss_skips_the_step_and_names_the_loss(shift):
    model = peaky_model()
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    policy = Policy(torch.device("cpu"), model, TOK, optimizer, Shifted(shift))
    batch = collate_episodes(episodes(behaviour(0.0, 0.0)), pad_id=0)
    with pytest.raises(FloatingPointError, match=rf"^algorithm\.loss \(tests\.trainers\.test_update\.Shifted\) is "
                                                 rf"{shift} on this step's batch: the step was skipped"):
        policy_update(policy, batch, grad_accum=2, max_grad_norm=1.0, temperature=1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not optimizer.state
    policy.loss = Shifted(0.0)  # the same step with a finite loss moves the weights
    assert policy_update(policy, batch, grad_accum=2, max_grad_norm=1.0, temperature=1.0)["train/grad_norm"] > 0
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())
