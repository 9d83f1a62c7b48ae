"""SFT data and the SFT step, without a process: loss only on assistant tokens, packing that keeps examples apart
(packed logits == each example alone), the token mean whatever grad_accum is, the lr schedule."""

from __future__ import annotations

import copy
import json
import math
import warnings

import pytest
import torch

from forge_exp.trainers.sft import sft_eval, sft_update, token_logprobs
from forge_exp.data.arithmetic import ArithmeticTask
from forge_exp.data.hf import FileProblems
from tests.models.helpers import build_tiny
from forge_exp.data import hf
from forge_exp.data.sft import (
    Example,
    Packer,
    SFTData,
    describe,
    encode_conversation,
    encode_prompt_completion,
    encode_row,
)
from forge_exp.models.tokenizer import build_char_tokenizer
from tests.models.test_real_model_path import QWEN3_TEMPLATE, byte_bpe_tokenizer, tiny_family

CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 6 + 7?"},
    {"role": "assistant", "content": "6 + 7 = 13"},
    {"role": "user", "content": "And 13 + 29?"},
    {"role": "assistant", "content": "13 + 29 = 42"},
]


def target_runs(ex: Example, tokenizer) -> list[str]:
    """The decoded text of each contiguous run of target tokens."""
    runs, current = [], []
    for i, t in zip(ex.ids, ex.targets):
        if t:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(r) for r in runs]


# ---------------------------------------------------------------------------------------------- loss masks
def test_prompt_completion_trains_on_the_completion_and_eos_after_the_prompt_grpo_sees():
    tok = build_char_tokenizer()
    cfg = FileProblems(train_path="x/train.jsonl", system_prompt="none", use_chat_template=False, template="{question}")
    ex = encode_row({"question": "6+7=", "answer": "13"}, cfg, tok, "row 1")
    grpo_prompt = hf.ProblemMaker(cfg, tok)("6+7=", "13").prompt  # what the generator is given in RL
    prompt_ids = tok(grpo_prompt)["input_ids"]  # ... and how it encodes it
    assert ex.ids == prompt_ids + tok("13", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ex.targets == [False] * len(prompt_ids) + [True] * 3
    assert target_runs(ex, tok) == ["13<eos>"]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_conversation_trains_on_every_assistant_turn_and_nothing_else(family):
    _, tok = tiny_family(family)
    ex = encode_conversation(CONVERSATION, tok)
    runs = target_runs(ex, tok)
    if family == "qwen3":  # the last turn as its template renders it (with the empty think block), then <|im_end|>
        assert runs == ["6 + 7 = 13<|im_end|>", "<think>\n\n</think>\n\n13 + 29 = 42<|im_end|>\n"]
    else:
        assert runs == ["6 + 7 = 13<|eot_id|>", "13 + 29 = 42<|eot_id|>"]
    assert tok.decode(ex.ids) == tok.decode(tok(tok.apply_chat_template(CONVERSATION, tokenize=False))["input_ids"])


def test_eos_is_added_when_the_template_ends_turns_with_another_token():
    """A base model's tokenizer (eos <|endoftext|>) with a chat template whose turns end in <|im_end|>: the
    generator stops only at eos, so the last turn is taught to end with it."""
    tok = byte_bpe_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>", "<|endoftext|>",
                             None, QWEN3_TEMPLATE)
    ex = encode_conversation(CONVERSATION[:3], tok)
    assert target_runs(ex, tok) == ["<think>\n\n</think>\n\n6 + 7 = 13<|im_end|>\n<|endoftext|>"]
    assert ex.ids.count(tok.eos_token_id) == 1


def test_rows_that_cannot_be_trained_on_are_one_clear_error():
    cfg = FileProblems(train_path="x/train.jsonl", system_prompt="none", use_chat_template=False)
    with pytest.raises(ValueError, match=r"data.jsonl row 3: no 'messages' list and no 'question' field"):
        encode_row({"prompt": "hi", "answer": "1"}, cfg, build_char_tokenizer(), "data.jsonl row 3")
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        encode_row({"messages": CONVERSATION}, cfg, build_char_tokenizer(), "row 1")
    _, tok = tiny_family("qwen3")
    with pytest.raises(ValueError, match=r"messages\[1\] must be"):
        encode_row({"messages": [CONVERSATION[0], {"role": "bot", "content": "x"}]}, cfg, tok, "row 1")
    with pytest.raises(ValueError, match="no assistant message"):
        encode_conversation(CONVERSATION[:2], tok)


# ---------------------------------------------------------------------------------------------- packing
def ex(n: int, first_target: int) -> Example:
    return Example(list(range(10, 10 + n)), [i >= first_target for i in range(n)])


def test_packing_fills_rows_greedily_with_positions_that_restart_per_example():
    packer = Packer(max_seq_len=10, rows=2, pad_id=0)
    batch, rest = list(packer.batches([ex(5, 2), ex(4, 1), ex(7, 3), ex(3, 0), ex(12, 11), ex(12, 1)]))
    # rows: [5 + 4 + pad 1], [7 + 3], then the 12-token examples: one dropped (its targets are all past 10), one cut
    assert batch.input_ids.shape == (2, 10) and batch.attention_mask is None and batch.examples == 4
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0]
    assert batch.position_ids[1].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]
    assert batch.targets[0].tolist() == [False, False, True, True, True, False, True, True, True, False]
    assert batch.targets[1].tolist() == [False] * 3 + [True] * 4 + [False, True, True]  # first token: never
    assert batch.input_ids[0, 9] == 0
    assert rest.input_ids.shape == (1, 10) and rest.examples == 1 and rest.position_ids[0].tolist() == list(range(10))
    assert packer.metrics() == {"data/examples": 5, "data/truncated": 2, "data/dropped": 1}


def test_without_packing_each_example_is_a_right_padded_row_with_an_attention_mask():
    (batch,) = list(Packer(10, 3, 0, packing=False).batches([ex(5, 2), ex(3, 1)]))
    assert batch.input_ids.shape == (2, 5) and batch.examples == 2
    assert batch.attention_mask.tolist() == [[True] * 5, [True] * 3 + [False] * 2]


@pytest.mark.parametrize("family", ["tiny", "qwen3", "llama"])
def test_a_packed_row_gives_every_example_the_logits_it_has_alone(family):
    model, tok = build_tiny() if family == "tiny" else tiny_family(family)
    examples = [encode_prompt_completion(p, c, tok)
                for p, c in (("12+7=", "19"), ("3*4=", "12"), ("99-1=", "98"))]
    (packed,) = list(Packer(max_seq_len=64, rows=1, pad_id=0).batches(examples))
    with torch.no_grad():
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits[0]
        col = 0
        for e in examples:
            alone = model(input_ids=torch.tensor([e.ids])).logits[0]
            assert torch.allclose(logits[col : col + len(e.ids)], alone, atol=1e-5), family
            col += len(e.ids)
        # the check has teeth: with positions running on across the row, later examples see the earlier ones
        flat = model(input_ids=packed.input_ids, use_cache=False).logits[0]
        assert not torch.allclose(flat[len(examples[0].ids) :col], logits[len(examples[0].ids) : col], atol=1e-3)
        # and the SFT step's logprobs are those of each example alone
        lp, _ = token_logprobs(model, packed)
        first = torch.log_softmax(model(input_ids=torch.tensor([examples[0].ids])).logits[0, :-1], -1)
        expected = first.gather(-1, torch.tensor(examples[0].ids[1:])[:, None]).squeeze(-1)
        assert torch.allclose(lp[0, 1 : len(examples[0].ids)], expected, atol=1e-5)


def test_describe_shows_each_example_and_its_trained_part():
    tok = build_char_tokenizer()
    examples = [encode_prompt_completion("1+2=", "3", tok), encode_prompt_completion("2+2=", "4", tok)]
    (batch,) = list(Packer(32, 1, tok.pad_token_id).batches(examples))
    assert describe(batch, tok) == {"text": ["<bos>1+2=3<eos>", "<bos>2+2=4<eos>"], "target": ["3<eos>", "4<eos>"]}


# ---------------------------------------------------------------------------------------------- sources
def test_jsonl_stream_is_endless_seeded_and_the_eval_split_is_fixed(tmp_path):
    rows = [{"question": f"what is {i}+1?", "answer": f"{i + 1}"} for i in range(5)]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = FileProblems(train_path=str(tmp_path / "train.jsonl"), eval_path=str(tmp_path / "test.jsonl"),
                       system_prompt="none", use_chat_template=False, eval_size=3)
    tok = build_char_tokenizer()

    def first_examples(data: SFTData, n: int) -> list[list[int]]:
        stream = data.train_batches()
        return [next(stream).input_ids[0].tolist() for _ in range(n)]

    one = SFTData(cfg, tok, max_seq_len=64, rows=1, packing=False)
    assert first_examples(one, 12) == first_examples(SFTData(cfg, tok, 64, 1, packing=False), 12)
    assert one.epoch == 2  # 12 examples of a 5-row split: the third epoch
    assert sum(b.examples for b in one.eval_batches()) == 3
    resumed = SFTData(cfg, tok, 64, 1, packing=False).train_batches(skip=4)
    assert next(resumed).input_ids[0].tolist() == first_examples(one, 5)[4]


def test_the_arithmetic_task_is_sft_data_too():
    data = SFTData(ArithmeticTask(eval_size=10), build_char_tokenizer(), max_seq_len=128, rows=2)
    batch = next(data.train_batches())
    assert batch.input_ids.shape == (2, 128) and batch.examples > 10
    assert sum(b.examples for b in data.eval_batches()) == 10


# ---------------------------------------------------------------------------------------------- the step
def test_sft_update_minimises_the_token_mean_whatever_grad_accum():
    from forge_exp.rl.losses.sft import SFTLoss

    model, tok = build_tiny(num_layers=1)
    examples = [encode_prompt_completion(p, c, tok) for p, c in
                (("1+1=", "2"), ("12+30=", "42"), ("7*8=", "56"), ("100-1=", "99"))]
    (batch,) = list(Packer(16, 4, tok.pad_token_id).batches(examples))  # rows with 2, 3, 3, 3 target tokens
    grads, losses = [], []
    for accum in (1, 2, 4):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=0.0)
        metrics = sft_update(m, opt, SFTLoss(), batch, grad_accum=accum, max_grad_norm=1e9)
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
        losses.append(metrics["loss/total"])
    # float64 reference: mean over all target tokens of -log softmax
    with torch.no_grad():
        logits = model.double()(input_ids=batch.input_ids, position_ids=batch.position_ids).logits[:, :-1]
    lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    reference = float(-lp[batch.targets[:, 1:]].mean())
    assert losses == pytest.approx([reference] * 3, rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)
    assert sft_eval(model.float(), [batch])["eval/loss"] == pytest.approx(reference, rel=1e-5)


def test_sft_loss_hand_numbers():
    from forge_exp.rl.losses.sft import SFTLoss

    loss, metrics = SFTLoss()(torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, -1.5]]),
                              torch.tensor([[False, True, True], [True, False, True]]))
    assert float(loss) == pytest.approx((2 + 3 + 0.5 + 1.5) / 4)
    assert float(metrics["loss/target_tokens"]) == 4


def test_lr_warms_up_linearly_then_decays_by_cosine_to_a_tenth_and_resumes_at_its_step():
    """transformers' cosine schedule with a 10% floor, as the HF trainer sets it up for SFT."""
    from forge_exp.models.tiny import TinyQwen3
    from forge_exp.rl.losses.sft import SFTLoss
    from forge_exp.trainers.hf import HFTrainer
    from forge_exp.trainers.sft import SFT_INPUTS

    def trainer(step: int = 0) -> HFTrainer:
        t = HFTrainer(TinyQwen3(num_layers=1), SFTLoss(), device=torch.device("cpu"), lr=1.0, weight_decay=0.0,
                      loss_inputs=SFT_INPUTS)
        t.step = step
        t.lr_schedule(warmup_steps=2, total_steps=12)
        return t

    t = trainer()
    lr = []
    with warnings.catch_warnings():  # stepping the schedule alone, without optimizer steps
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(13):
            lr.append(t.optimizer.param_groups[0]["lr"])
            t.schedule.step()
    assert lr[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert lr[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr[12] == pytest.approx(0.1) and all(a >= b for a, b in zip(lr[2:], lr[3:]))
    assert trainer(step=7).optimizer.param_groups[0]["lr"] == pytest.approx(lr[7])  # a resumed run goes on
