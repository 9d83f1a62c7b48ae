"""`trainer.share_prompts`: the rows of a micro-batch that share a prompt run it once, as one sequence
(models/packing.pack_groups), the batch's rows first ordered by prompt. The layout, and the TorchTitan engine
with it against the engine without it on the batches in that order (gloo, CPU, float32): the same loss, gradients and updated weights over 3 AdamW steps (<= 1e-5
relative) in one process (Qwen3, Llama 3), FSDP over 2 and TP over 2, and a frozen engine's scores (SDPA's dense
mask, and flex's BlockMask: forward only, flex has no backward on CPU)."""

from __future__ import annotations

import pytest
import torch

from forge_exp.models.packing import PAD, PROMPT, dense_mask, pack_groups, prompt_groups
from forge_exp.trainers.update import by_prompt

pytest.importorskip("torchtitan", reason="trainer=titan needs the titan extra")

from tests.trainers.titan_cases import (  # noqa: E402
    assert_same_steps, rel, run_world, saved_case, transformers_scores,
)


def test_titan_shares_prompts_by_default_on_cuda_with_flex_and_not_on_cpu():
    from forge_exp.trainers.titan import shared_layout

    assert shared_layout("cuda", None, None) == (True, "flex")
    assert shared_layout("cpu", None, None) == (False, "sdpa")
    assert shared_layout("cuda", False, None) == (False, "sdpa")
    assert shared_layout("cpu", True, None) == (True, "sdpa")  # SDPA's dense mask (flex has no backward on CPU)
    assert shared_layout("cuda", True, "sdpa") == (True, "sdpa")
    assert shared_layout("cpu", None, "flex") == (False, "flex")


def test_pack_groups_puts_a_prompts_responses_after_it_at_their_own_positions():
    prompt_ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11], [0, 5, 6, 7]])  # rows 0 and 2: one prompt, left-padded
    response_ids = torch.tensor([[20, 21, 22], [30, 0, 0], [40, 41, 0]])
    p = pack_groups(prompt_ids, prompt_ids != 0, response_ids, response_ids != 0)
    assert p.ids.tolist() == [[5, 6, 7, 20, 21, 22, 40, 41], [8, 9, 10, 11, 30, 0, 0, 0]]
    assert p.positions.tolist() == [[0, 1, 2, 3, 4, 5, 3, 4], [0, 1, 2, 3, 4, 0, 0, 0]]
    assert p.segments.tolist() == [[PROMPT] * 3 + [1] * 3 + [2] * 2, [PROMPT] * 4 + [1] + [PAD] * 3]
    assert p.rows.tolist() == [0, 1, 0]
    # index[i, j]: the column whose hidden state predicts response token j (past a row's end: its last token)
    assert p.index.tolist() == [[2, 3, 4], [3, 4, 4], [2, 6, 7]]
    for i, j in [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1)]:  # that column: the token before j in row i
        before = prompt_ids[i, -1] if j == 0 else response_ids[i, j - 1]
        assert p.ids[p.rows[i], p.index[i, j]] == before
        assert p.positions[p.rows[i], p.index[i, j]] == 2 + (i == 1) + j  # at its position in its own row


def test_prompt_groups_number_prompts_by_first_appearance_whatever_their_padding_holds():
    prompt_ids = torch.tensor([[0, 5, 6], [1, 2, 3], [9, 5, 6], [4, 4, 4], [1, 2, 3], [7, 5, 6]])
    prompt_mask = torch.tensor([[False, True, True], [True] * 3, [False, True, True], [True] * 3, [True] * 3,
                                [True] * 3])  # rows 0 and 2: one prompt under different pad ids; row 5 another
    groups = prompt_groups(prompt_ids, prompt_mask)
    assert groups.tolist() == [0, 1, 0, 2, 1, 3]
    assert groups.argsort(stable=True).tolist() == [0, 2, 1, 4, 3, 5]  # each prompt's rows adjacent, in their order
    assert prompt_groups(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.bool)).tolist() == [0] * 3


def test_rows_without_a_prompt_read_only_their_own_columns():
    no_prompt = torch.zeros(2, 2, dtype=torch.long)
    responses = torch.tensor([[7, 8], [9, 10]])
    p = pack_groups(no_prompt, no_prompt.bool(), responses, responses != 0)
    assert p.ids.tolist() == [[7, 8, 9, 10]] and p.rows.tolist() == [0, 0]
    assert p.index.tolist() == [[0, 0], [2, 2]]  # token 0 has no predictor: its own column, never the other row's


def test_pack_groups_holds_every_row_of_random_batches_as_the_layout_says():
    """Random micro-batches (rows of one prompt apart, prompts of any padding or none, empty responses): each
    sequence is its prompt then its rows' responses in row order, numbered 1, 2, ..., at their own positions, and
    index[i, j] is the column holding the token before response token j."""
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        B, P, R = (int(torch.randint(1, k, (), generator=g)) for k in (10, 7, 7))
        lens = torch.randint(0, P + 1, (3,), generator=g)
        pick = torch.randint(0, 3, (B,), generator=g)
        prompt_mask = torch.arange(P)[None] >= P - lens[pick][:, None]
        prompt_ids = torch.where(prompt_mask, torch.randint(3, 9, (3, P), generator=g)[pick],
                                 torch.randint(0, 3, (B, P), generator=g))  # pads hold anything
        n = torch.randint(0, R + 1, (B,), generator=g)
        response_mask = torch.arange(R)[None] < n[:, None]
        response_ids = torch.where(response_mask, torch.randint(3, 9, (B, R), generator=g), 0)
        p = pack_groups(prompt_ids, prompt_mask, response_ids, response_mask)
        assert p.rows.tolist() == prompt_groups(prompt_ids, prompt_mask).tolist()
        filled = [0] * len(p.ids)
        for i in range(B):
            seq, plen, k = int(p.rows[i]), int(prompt_mask[i].sum()), int(n[i])
            prompt = prompt_ids[i, P - plen:].tolist()
            assert p.ids[seq, :plen].tolist() == prompt and p.positions[seq, :plen].tolist() == list(range(plen))
            assert (p.segments[seq, :plen] == PROMPT).all()
            at = max(filled[seq], plen)  # after the prompt and the responses of the sequence's earlier rows
            assert p.ids[seq, at : at + k].tolist() == response_ids[i, :k].tolist()
            assert p.positions[seq, at : at + k].tolist() == list(range(plen, plen + k))
            if k:
                earlier = p.segments[seq, plen:at]
                assert (p.segments[seq, at : at + k] == (int(earlier.max()) if at > plen else 0) + 1).all()
            for j in range(k):
                column = int(p.index[i, j])
                if j or plen:
                    assert p.ids[seq, column] == (response_ids[i, j - 1] if j else prompt[-1])
                    assert p.positions[seq, column] == plen - 1 + j
            filled[seq] = at + k
        width = max(1, max(filled))
        assert p.ids.shape == p.positions.shape == p.segments.shape == (len(filled), width)
        for seq, end in enumerate(filled):  # past a sequence's end: pads
            assert (p.segments[seq, end:] == PAD).all() and (p.ids[seq, end:] == 0).all()


def test_a_response_sees_its_prompt_and_itself_never_another_response():
    segments = torch.tensor([[PROMPT] * 3 + [1] * 3 + [2] * 2, [PROMPT] * 4 + [1] + [PAD] * 3])
    mask = dense_mask(segments)
    assert mask.shape == (2, 1, 8, 8)
    sees = lambda g, q: mask[g, 0, q].nonzero().flatten().tolist()  # noqa: E731
    assert sees(0, 2) == [0, 1, 2]  # the prompt: causal
    assert sees(0, 5) == [0, 1, 2, 3, 4, 5]  # response 1
    assert sees(0, 7) == [0, 1, 2, 6, 7]  # response 2: the prompt and itself, not response 1
    assert sees(1, 6) == [0, 1, 2, 3, 5, 6]  # a pad: the prompt and the pads up to it (never an empty row)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """Per family: a saved HF checkpoint, batches whose rows share prompts (groups not adjacent), the same batches
    with each prompt's rows adjacent ("grouped"), and `train(parallelism, procs, grad_accum, share_prompts)`: the
    engine's 3 steps, with sharing on the batches as they are, without it on the grouped ones (the order the engine
    with sharing trains in; grad_accum 2: micro-batches of 3 rows)."""
    cache = {}

    def get(family: str) -> dict:
        if family not in cache:
            c = saved_case(tmp_path_factory.mktemp(family), family, shared=True)
            c["grouped"] = str(c["tmp"] / "grouped.pt")
            torch.save([by_prompt(b)[0] for b in torch.load(c["batches"], weights_only=False)], c["grouped"])
            c["train"] = lambda parallelism, procs, grad_accum, share, **knobs: run_world(
                procs, c["tmp"] / "runs", "parity_job", checkpoint=c["checkpoint"],
                batches=c["batches"] if share else c["grouped"], parallelism=parallelism, grad_accum=grad_accum,
                share_prompts=share, **knobs)
            cache[family] = c
        return cache[family]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("family,parallelism,procs,grad_accum", [
    ("qwen3", "single", 1, 2), ("llama3", "single", 1, 2), ("qwen3", "single", 1, 1), ("qwen3", "fsdp", 2, 1),
    ("qwen3", "tp", 2, 2),
])
def test_shared_prompts_train_as_the_separate_rows_do(case, family, parallelism, procs, grad_accum):
    """Against the same engine and parallelism without sharing (TP's own summation order differs from one
    process's by up to ~3e-5 of a gradient on these batches, sharing or not: the comparison is like for like)."""
    c = case(family)
    shared, separate = (c["train"](parallelism, procs, grad_accum, share) for share in (True, False))
    assert_same_steps(shared, separate, f"{family} {parallelism} grad_accum={grad_accum} share_prompts")


@pytest.mark.slow
def test_compiled_sharing_trains_as_the_separate_rows_do(case):
    """Per-block torch.compile (on by default on GPU) traces the masked attention and the per-row positions."""
    c = case("qwen3")
    shared = c["train"]("single", 1, 1, True, compile=True)
    assert_same_steps(shared, c["train"]("single", 1, 1, False), "qwen3 compiled share_prompts")


@pytest.mark.slow
def test_a_group_runs_its_prompt_once(case):
    c = case("qwen3")
    shapes = {share: run_world(1, c["tmp"] / "runs", "frozen_job", checkpoint=c["checkpoint"], batches=c["batches"],
                               share_prompts=share)["shapes"][0] for share in (True, False)}
    batch = torch.load(c["batches"], weights_only=False)[0]
    assert shapes[False] == (6, batch.prompt_ids.shape[1] + batch.response_ids.shape[1])
    # rows 0, 2, 5 and rows 1, 4 share their prompts: 3 sequences, the longest a prompt and its 3 responses
    lengths = batch.response_mask.sum(1)
    assert shapes[True] == (3, int(batch.prompt_mask[0].sum() + lengths[[0, 2, 5]].sum()))


@pytest.mark.slow
def test_a_micro_batch_holds_whole_groups(case):
    """At grad_accum 2 the batch's 6 rows (prompts A B A C B A) train as [A A A] and [B B C]: 1 and 2 sequences,
    where the rows in their own order would give 2 and 2."""
    c = case("qwen3")
    batch = torch.load(c["batches"], weights_only=False)[0]
    lengths, prompt = batch.response_mask.sum(1), batch.prompt_mask.sum(1)
    shapes = run_world(1, c["tmp"] / "runs", "train_shapes_job", checkpoint=c["checkpoint"], batches=c["batches"],
                       grad_accum=2, share_prompts=True)
    assert shapes == [(1, int(prompt[0] + lengths[[0, 2, 5]].sum())),
                      (2, int(max(prompt[1] + lengths[[1, 4]].sum(), prompt[3] + lengths[3])))]


@pytest.mark.slow
@pytest.mark.parametrize("attention,share", [("sdpa", True), ("flex", True), ("flex", False)])  # flex: forward
def test_a_frozen_engine_scores_as_the_rows_do(case, attention, share):  # only on CPU (no backward there)
    """Against the transformers model: with sharing under SDPA's dense mask and flex's BlockMask, and without
    sharing under flex's causal BlockMask."""
    c = case("qwen3")
    got = run_world(1, c["tmp"] / "runs", "frozen_job", checkpoint=c["checkpoint"], batches=c["batches"],
                    share_prompts=share, attention=attention)
    for scores, want in zip(got["scores"], transformers_scores(c["batches"])):
        assert scores.shape == want.shape and rel(scores, want) <= 1e-5
