"""Per-token log-probabilities and entropies of responses under a causal LM (the trainer's side of the ratio).

Layout follows `rl.types.TrainBatch`: prompts left-padded to P, responses right-padded to R, so every response
starts at column P of `[prompt | response]`. Position ids count real tokens only, which makes them equal to the
generator's positions for the same row (see models/generate.py), so the recomputed logprobs match the behaviour
logprobs for the same weights. Logprobs and entropies are of the temperature-scaled distribution
`softmax(logits / T)`; T == 0 (greedy) is treated as T = 1, as in the generator.

The LM head runs in `head_logprobs`, on the responses' own tokens alone (`response_logprobs`: a batch is padded to
its longest completion): chunks of rows through `hidden @ W.T`, so the [N, V] logits of a 152k-token
vocabulary never exist at once (forward or backward) — the backward recomputes each chunk's logits instead of
keeping them, one extra head matmul for a [chunk, V] peak instead of [N, V]. Both trainers use it (the HF one
through `sequence_logprobs`, the TorchTitan one in trainers/titan.py); with tensor parallelism the head's weight is
split over the vocabulary and `group` combines the partial softmax sums (vocab-parallel cross-entropy, as in
Megatron-LM's `VocabParallelCrossEntropy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from forge_exp.models.generate import positions_from_mask
from forge_exp.models.packing import dense_mask, pack_groups

if TYPE_CHECKING:  # only annotations here: the modeling code loads with the model (models/hf.py)
    from transformers import PreTrainedModel

CHUNK_ROWS = 4096  # rows of logits alive at once: 4096 x 151936 x 4 bytes = 2.5 GB per float32 temporary


def sequence_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [B, P] long, left-padded
    prompt_mask: torch.Tensor,  # [B, P] bool
    response_ids: torch.Tensor,  # [B, R] long, right-padded
    response_mask: torch.Tensor,  # [B, R] bool
    temperature: float = 1.0,
    chunk_rows: int = CHUNK_ROWS,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(logprobs [B, R], entropy [B, R])` in float32; both are 0 where response_mask is False.

    Differentiable (call under torch.no_grad() for reference/old-policy logprobs). Only the positions that predict
    response tokens go through the LM head, chunked (`response_logprobs`). `share_prompts`: the rows that share a
    prompt run it once, as one sequence under a mask (models/packing.py; the same values up to rounding).
    """
    R = response_ids.shape[1]
    P = prompt_ids.shape[1]
    head = model.get_output_embeddings()
    plain = _plain_linear_head(model, head)  # else a head with a bias or logit soft-capping: the model applies it
    if share_prompts:
        if not plain:
            raise ValueError(f"trainer.share_prompts=true: {type(model).__name__} applies its own LM head (a bias or "
                             f"logit soft-capping), which the shared layout does not run; set it false")
        packed = pack_groups(prompt_ids, prompt_mask, response_ids, response_mask)
        hidden = model.get_decoder()(input_ids=packed.ids, attention_mask=_custom_mask(model, packed.segments),
                                     position_ids=packed.positions, use_cache=False).last_hidden_state
        h = packed.per_row(hidden)  # [B, R, D]
        return response_logprobs(h, head.weight, response_ids, response_mask, temperature, chunk_rows)
    # The last response token predicts nothing and, attention being causal, changes no earlier position: it is
    # left out of the forward (one column fewer: 1/(P+R) of the trainer's compute).
    ids = torch.cat([prompt_ids, response_ids[:, :-1]], dim=1)  # [B, P+R-1]
    mask = torch.cat([prompt_mask, response_mask[:, :-1]], dim=1).bool()
    if _causal_is_enough(prompt_mask, response_mask):  # no mask to build: the causal kernel, positions 0..P+R-2
        mask = positions = None
    else:
        positions = positions_from_mask(mask)
    if plain:
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        # The hidden state at column t predicts token t+1: columns P-1 .. P+R-2 predict the R response tokens.
        h = hidden.last_hidden_state[:, P - 1 :]  # [B, R, D]
        return response_logprobs(h, head.weight, response_ids, response_mask, temperature, chunk_rows)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=R)
    logits = out.logits.float() / (temperature if temperature > 0 else 1.0)
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, R, V]
    token_logprobs = log_probs.gather(-1, response_ids[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    keep = response_mask.bool()
    return token_logprobs.masked_fill(~keep, 0.0), entropy.masked_fill(~keep, 0.0)


def response_logprobs(
    hidden: torch.Tensor,  # [B, R, D] the final hidden states that predict the R response tokens
    weight: torch.Tensor,  # the LM head's weight (see head_logprobs)
    response_ids: torch.Tensor,  # [B, R] long
    response_mask: torch.Tensor,  # [B, R] bool
    temperature: float = 1.0,
    chunk_rows: int = CHUNK_ROWS,
    group: dist.ProcessGroup | None = None,
    vocab_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logprobs [B, R], entropy [B, R])` float32, 0 off the response mask: the head runs on the response's own
    tokens alone, not on the padding after the shorter ones (GRPO's completions differ in length, and a batch is
    padded to its longest). Every rank of `group` must hold the same rows."""
    keep = response_mask.bool()
    lp, ent = head_logprobs(hidden[keep], weight, response_ids[keep], temperature, chunk_rows, group, vocab_start)
    return _placed(lp, keep), _placed(ent, keep)


def _placed(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """values [keep.sum()] at keep's True places of a zero [B, R] tensor (differentiable)."""
    out = values.new_zeros(keep.shape)
    out[keep] = values
    return out


def _custom_mask(model: PreTrainedModel, segments: torch.Tensor) -> torch.Tensor:
    """The [G, 1, L, L] mask of `pack_groups`'s sequences as the model's attention takes a ready 4D mask: bool for
    SDPA (and forge-exp's own Qwen3, models/qwen3.py, either way), additive for transformers' eager attention."""
    mask = dense_mask(segments)
    attention = getattr(model.config, "_attn_implementation", None)  # transformers' (forge-exp's Qwen3 has none)
    if attention in (None, "sdpa"):
        return mask
    if attention == "eager":  # the scores' dtype: autocast's, or the model's
        device = segments.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else model.dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    raise ValueError(f"trainer.share_prompts=true: attention {attention!r} takes no mask of its own; use "
                     f"model.attn_implementation=sdpa or eager")


def _causal_is_enough(
    prompt_mask: torch.Tensor,  # [B, P] bool
    response_mask: torch.Tensor,  # [B, R] bool
) -> bool:
    """True when no row has left padding and every response's real tokens come first: each real token then sees
    only real tokens under the causal mask alone, and the padding after them is masked out of the result."""
    prompt_mask, response_mask = prompt_mask.bool(), response_mask.bool()
    return bool(prompt_mask.all()) and not bool((response_mask[:, 1:] & ~response_mask[:, :-1]).any())


def _plain_linear_head(model: PreTrainedModel, head: torch.nn.Module | None) -> bool:
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and getattr(model.config, "final_logit_softcapping", None) is None
        and hasattr(model, "get_decoder")
    )


def head_logprobs(
    hidden: torch.Tensor,  # [N, D] final hidden states (after the last norm)
    weight: torch.Tensor,  # [V_local, D] LM head weight (this rank's vocabulary rows when `group` is set)
    targets: torch.Tensor,  # [N] long, token ids in the full vocabulary
    temperature: float = 1.0,
    chunk_rows: int = CHUNK_ROWS,
    group: dist.ProcessGroup | None = None,
    vocab_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logprobs [N], entropy [N])` float32 of `softmax(hidden @ weight.T / T)` at `targets`, `chunk_rows` rows of
    logits at a time. With `group`, `weight` holds vocabulary rows [vocab_start, vocab_start + V_local) of the head
    and the softmax spans every rank's rows; `hidden` must be the same on every rank of the group.

    The matmuls run in the autocast dtype when autocast is on, otherwise in `hidden`'s dtype; softmax sums in float32.
    """
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
    else:
        dtype = hidden.dtype
    scale = 1.0 / temperature if temperature > 0 else 1.0
    return _ChunkedHead.apply(hidden, weight, targets, scale, chunk_rows, group, vocab_start, dtype)


class _ChunkedHead(torch.autograd.Function):
    """Saves only hidden, weight, the log-normaliser and the entropy per row; logits are recomputed per chunk.

    With z = logits * scale, p = softmax(z), lp = z_y - lse and H = lse - sum(p z):
        d lp / d z = onehot(y) - p,      d H / d z = -p (log p + H)
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale, chunk_rows, group, vocab_start, dtype):
        n, v_local = hidden.shape[0], weight.shape[0]
        w = weight.to(dtype)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(lse)
        target_logit = torch.empty_like(lse)
        local = (targets >= vocab_start) & (targets < vocab_start + v_local)  # [N] this rank holds the target
        local_targets = (targets - vocab_start).clamp(0, v_local - 1)
        row_sums = _kernel(_row_sums, hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for rows in _chunks(n, chunk_rows):
                logits = hidden[rows].to(dtype) @ w.t()  # [n, V_local] in the matmul dtype
                m = logits.max(-1).values.float() * scale  # scale > 0: the max of the scaled logits
                if group is not None:
                    dist.all_reduce(m, dist.ReduceOp.MAX, group=group)
                s, pz, zt = row_sums(logits, m, local_targets[rows], local[rows], scale)
                if group is not None:
                    stats = torch.stack([s, pz, zt])
                    dist.all_reduce(stats, group=group)
                    s, pz, zt = stats
                lse[rows] = m + torch.log(s)
                entropy[rows] = lse[rows] - pz / s
                target_logit[rows] = zt
        ctx.save_for_backward(hidden, weight, local_targets, local, lse, entropy)
        ctx.scale, ctx.chunk_rows, ctx.group, ctx.dtype = scale, chunk_rows, group, dtype
        return target_logit - lse, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, local_targets, local, lse, entropy = ctx.saved_tensors
        dtype, scale = ctx.dtype, ctx.scale
        w = weight.to(dtype)
        g_lp = grad_logprobs.float() if grad_logprobs is not None else torch.zeros_like(lse)
        g_h = grad_entropy.float() if grad_entropy is not None else torch.zeros_like(lse)
        grad_hidden = torch.empty(hidden.shape, dtype=dtype, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        logit_grad = _kernel(_logit_grad, hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for rows in _chunks(hidden.shape[0], ctx.chunk_rows):
                h = hidden[rows].to(dtype)
                logits = h @ w.t()  # [n, V_local], recomputed
                gz = logit_grad(logits, lse[rows], entropy[rows], g_lp[rows], g_h[rows], local_targets[rows],
                                local[rows], scale)
                grad_hidden[rows] = gz @ w
                grad_weight += (gz.t() @ h).float()
        if ctx.group is not None:  # every rank's vocabulary rows contribute to d hidden
            grad_hidden = grad_hidden.float()
            dist.all_reduce(grad_hidden, group=ctx.group)
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), None, None, None, None, None, None


def _row_sums(logits, m, local_targets, local, scale):
    """Per row: sum(exp(z - m)), sum(exp(z - m) z), z[target] (0 where another rank holds the target); z = scaled
    float32 logits. One pass over the chunk once compiled."""
    z = logits.float() * scale  # [n, V]
    e = torch.exp(z - m[:, None])
    zt = z.gather(-1, local_targets[:, None]).squeeze(-1) * local
    return e.sum(-1), (e * z).sum(-1), zt


def _logit_grad(logits, lse, entropy, g_lp, g_h, local_targets, local, scale):
    """d loss / d logits of one chunk, in the logits' dtype (see _ChunkedHead)."""
    z = logits.float() * scale  # [n, V]
    logp = z - lse[:, None]
    p = torch.exp(logp)
    gz = -p * (g_lp[:, None] + g_h[:, None] * (logp + entropy[:, None]))
    gz = gz.scatter_add(-1, local_targets[:, None], (g_lp * local)[:, None])
    return (gz * scale).to(logits.dtype)


_COMPILED: dict = {}


def _kernel(fn, device: torch.device):
    """`fn` compiled on CUDA (the elementwise work over a [chunk, V] block fuses into one pass instead of ~10),
    plain elsewhere (CPU tests need no compiler)."""
    return compiled(fn) if device.type == "cuda" else fn


def compiled(fn):
    """`fn` through torch.compile, once per process."""
    if fn not in _COMPILED:
        # dynamic: the row count of a chunk changes with every batch (the last chunk; short batches), and a static
        # kernel per size would recompile past dynamo's limit (a hard failure with fullgraph) on real, varied data
        _COMPILED[fn] = torch.compile(fn, fullgraph=True, dynamic=True)
    return _COMPILED[fn]


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]
