"""A loss that fails inside the trainer actor, to test that a failing service ends the run cleanly."""

import torch


class BoomLoss(torch.nn.Module):
    def forward(self, logprobs, advantages, padding_mask):
        raise RuntimeError("boom at step 1")
