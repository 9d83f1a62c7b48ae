"""The shared sampler: counter-based noise, draws that follow the distribution, and rows independent of their batch."""

import torch

from forge_exp.models.sampling import row_key, sample, uniform


def draw(logits, temperature=1.0, top_p=1.0, keys=None, steps=None, truncate=None):
    b = logits.shape[0]
    keys = torch.tensor([row_key(7, r) for r in range(b)]) if keys is None else keys
    steps = torch.zeros(b, dtype=torch.long) if steps is None else steps
    t, p = torch.full((b,), temperature), torch.full((b,), top_p) if not torch.is_tensor(top_p) else top_p
    return sample(logits, t, p, keys, steps, top_p < 1 if truncate is None else truncate)


def test_keys_are_distinct_per_row_and_the_noise_is_uniform():
    keys = [row_key(3, r) for r in range(10_000)]
    assert len(set(keys)) == len(keys) and row_key(3, 0) != row_key(4, 0)
    assert row_key(-1, 5) == row_key(-1, 5) and row_key(2**40 + 3, 0) != row_key(3, 0)
    u = uniform(torch.tensor(keys), torch.zeros(10_000, dtype=torch.long))
    assert 0 <= u.min() and u.max() < 1
    counts = torch.histc(u, bins=10, min=0, max=1)
    assert ((counts - 1000).abs() < 150).all()  # about 5 standard deviations
    later = uniform(torch.tensor(keys), torch.ones(10_000, dtype=torch.long))
    assert abs(torch.corrcoef(torch.stack([u, later]))[0, 1]) < 0.05  # steps of one row are not correlated


def test_draws_follow_the_temperature_scaled_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20_000, 1)
    tokens, logprobs = draw(logits, temperature=0.5)
    want = torch.softmax(logits[0] / 0.5, -1)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert (freq - want).abs().max() < 0.015
    assert torch.allclose(logprobs, torch.log_softmax(logits / 0.5, -1).gather(-1, tokens[:, None]).squeeze(-1))


def test_top_p_draws_from_the_nucleus_but_logprobs_stay_full():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20_000, 1)
    tokens, logprobs = draw(logits, top_p=0.7)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert freq[2:].sum() == 0  # 0.5 + 0.3 reach 0.7: the tail is cut
    assert abs(freq[0] - 0.5 / 0.8) < 0.015
    assert torch.allclose(logprobs.exp(), torch.tensor([0.5, 0.3, 0.15, 0.05])[tokens])


def test_a_row_does_not_depend_on_its_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 3
    keys = torch.tensor([row_key(1, r) for r in range(6)])
    steps = torch.arange(6)
    top_p = torch.tensor([1.0, 0.8, 1.0, 0.5, 1.0, 1.0])
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.9])
    together = sample(logits, temperature, top_p, keys, steps, truncate=True)
    for i in range(6):  # alone, with its own keys and parameters: the same token and logprob
        alone = sample(logits[i : i + 1], temperature[i : i + 1], top_p[i : i + 1], keys[i : i + 1], steps[i : i + 1],
                       truncate=bool(top_p[i] < 1))
        assert together[0][i] == alone[0][0] and torch.allclose(together[1][i], alone[1][0])
    assert together[0][2] == logits[2].argmax()  # temperature 0: greedy
