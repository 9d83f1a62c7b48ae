"""Small models and prompts shared by the generation and logprob tests."""

import torch

from forge_exp.models.tiny import qwen3
from forge_exp.models.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()
PROMPTS = ["1+2=", "37+48=", "905*12=", "0=", "64-7=", "12/3="]


def peaky_model(seed: int = 0):
    """A small random Qwen3 with large weights (std 0.3), so its next-token distributions are far from uniform and
    depend on the context: a wrong position or mask changes tokens and logprobs visibly."""
    model = qwen3(vocab_size=len(TOK), hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, max_position_embeddings=64, pad_id=0, bos_id=2, eos_id=1, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def encode(prompts):
    return [TOK(p)["input_ids"] for p in prompts]


def right_pad(rows, pad_id):
    """Right-pad token rows into `(ids [B, R] long, mask [B, R] bool)` (the TrainBatch response layout)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return ids, mask


def build_tiny(**sizes):
    """`(model, tokenizer)` of models.tiny.TinyQwen3(**sizes): what model=tiny builds."""
    from forge_exp.models.tiny import TinyQwen3

    spec = TinyQwen3(**sizes)
    return spec.build(), spec.tokenizer()


def build_from(path, dtype: str = "float32"):
    """`(model, tokenizer)` loaded from an HF-format directory, as model.path=<dir> loads it."""
    from forge_exp.models.hf import ModelSpec

    spec = ModelSpec(path=str(path), dtype=dtype)
    return spec.build(), spec.tokenizer()


def train_batch(prompts: list[str], responses: list[list[int]], seed: int = 0):
    """A TrainBatch of `prompts` (left-padded) and `responses` (token ids, right-padded), with behaviour and reference
    logprobs and advantages drawn from `seed`."""
    from forge_exp.models.generate import left_pad
    from forge_exp.rl.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompt_ids, prompt_mask = left_pad(encode(prompts), 0)
    response_ids, response_mask = right_pad(responses, 0)
    n = len(prompts)
    return TrainBatch(prompt_ids, prompt_mask, response_ids, response_mask,
                      behavior_logprobs=-torch.rand(response_ids.shape, generator=g) * response_mask,
                      advantages=torch.randn(n, generator=g), truncated=torch.zeros(n, dtype=torch.bool),
                      policy_versions=torch.zeros(n, dtype=torch.long),
                      ref_logprobs=-torch.rand(response_ids.shape, generator=g) * response_mask)
