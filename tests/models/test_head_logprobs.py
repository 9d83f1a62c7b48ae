"""The chunked LM head (models/logprobs.head_logprobs) against the plain [N, V] computation in float64: logprobs,
entropies and their gradients (with respect to hidden states and head weight), for chunk sizes that do and do not
divide the rows, at temperatures 1 and 0.7."""

import pytest
import torch

from forge_exp.models.logprobs import head_logprobs


def reference(hidden, weight, targets, temperature):
    logp = torch.log_softmax(hidden @ weight.t() / temperature, dim=-1)  # [N, V]
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk_rows", [3, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_the_full_logits(chunk_rows, temperature):
    g = torch.Generator().manual_seed(chunk_rows)
    n, d, v = 13, 8, 50
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, d, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    g_lp, g_h = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)

    lp, ent = head_logprobs(hidden, weight, targets, temperature, chunk_rows)
    assert lp.dtype == ent.dtype == torch.float32  # softmax sums run in float32 whatever the matmul dtype
    ((lp.double() * g_lp).sum() + (ent.double() * g_h).sum()).backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    ref_lp, ref_ent = reference(hidden, weight, targets, temperature)
    ((ref_lp * g_lp).sum() + (ref_ent * g_h).sum()).backward()
    assert torch.allclose(lp.double(), ref_lp, atol=1e-5, rtol=0)
    assert torch.allclose(ent.double(), ref_ent, atol=1e-5, rtol=0)
    assert torch.allclose(got[0], hidden.grad, atol=1e-5, rtol=1e-5)
    assert torch.allclose(got[1], weight.grad, atol=1e-5, rtol=1e-5)


def test_temperature_zero_is_greedy_scale_one():
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(4, 8, generator=g), torch.randn(20, 8, generator=g)
    targets = torch.randint(0, 20, (4,), generator=g)
    assert torch.equal(head_logprobs(hidden, weight, targets, 0.0)[0], head_logprobs(hidden, weight, targets, 1.0)[0])


@pytest.mark.slow  # Inductor compiles C++ on this CPU (~1 min on 2 cores)
def test_the_compiled_chunk_kernels_take_every_row_count_without_recompiling():
    """On CUDA the chunk kernels run compiled with fullgraph=True. Real batches give the last chunk a different row
    count every step; a static kernel per size hit dynamo's recompile limit (8), a hard failure, on the ninth size.
    Compiled here as there (one process-wide kernel per function), over more sizes than the limit."""
    import torch._dynamo

    from forge_exp.models import logprobs

    torch._dynamo.reset()
    logprobs._COMPILED.clear()
    row_sums, logit_grad = logprobs.compiled(logprobs._row_sums), logprobs.compiled(logprobs._logit_grad)
    g = torch.Generator().manual_seed(0)
    for n in (7, 13, 64, 3, 100, 5, 9, 11, 17, 21, 33):
        logits = torch.randn(n, 300, generator=g)
        m, targets, local = logits.max(-1).values, torch.randint(0, 300, (n,), generator=g), torch.ones(n)
        for a, b in zip(row_sums(logits, m, targets, local, 0.7), logprobs._row_sums(logits, m, targets, local, 0.7)):
            torch.testing.assert_close(a, b)
        lse, ent, g_lp, g_h = torch.randn(4, n, generator=g)
        torch.testing.assert_close(logit_grad(logits, lse, ent, g_lp, g_h, targets, local, 0.7),
                                   logprobs._logit_grad(logits, lse, ent, g_lp, g_h, targets, local, 0.7))
    logprobs._COMPILED.clear()
