"""The reasoning-gym problem source: disjoint train and held-out sets, the weighted mix, task options, few-shot
examples, resuming a stream where it was, and one-line errors for names and options reasoning-gym does not know."""

import collections
import itertools

import pytest

from forge_exp.data.reasoning_gym import CHUNK, HELDOUT, ReasoningGymProblems, check_tasks
from tests.data.test_prompts import make_tokenizer

SMALL = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},  # 200 distinct questions
         "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+", "-"],
                              "allow_parentheses": False, "allow_negation": False}}


def source(**kw) -> ReasoningGymProblems:
    kw.setdefault("tasks", ("chain_sum", "basic_arithmetic"))
    kw.setdefault("task_options", SMALL)
    kw.setdefault("eval_size", 40)
    kw.setdefault("use_chat_template", False)  # the plain template: no tokenizer needed
    return ReasoningGymProblems(**kw)


def draw(stream, n: int) -> list:
    return list(itertools.islice(stream, n))


def test_heldout_questions_never_reach_the_train_stream_even_in_a_small_task():
    train, heldout = source().problems(None)
    held = {p.question for p in heldout}
    assert len(heldout) == 80 and len(held) >= 60  # 40 per task (small tasks repeat a few questions)
    seen = draw(train(), 3000)
    assert not held & {p.question for p in seen}
    assert train.skipped > 0  # chain_sum's 200 questions: some of its train draws were held-out ones, left out


def test_held_out_items_come_from_their_own_seed_range():
    s = source()
    assert all(s.base(t) + HELDOUT + s.eval_size < 2**32 for t in s.tasks)  # numpy-seeded tasks need 32 bits
    assert s.base("chain_sum") != s.base("basic_arithmetic")
    assert source(seed=1).base("chain_sum") != s.base("chain_sum")
    # the train stream reads chunks from base upward; the held-out dataset starts HELDOUT above it
    assert HELDOUT > 1000 * CHUNK


def test_the_mix_follows_the_weights_and_the_stream_is_deterministic():
    s = source(weights=(3, 1))
    a = draw(s.problems(None)[0](), 2000)
    b = draw(s.problems(None)[0](), 2000)
    assert [p.question for p in a] == [p.question for p in b]
    counts = collections.Counter(p.task for p in a)
    assert 0.70 < counts["chain_sum"] / 2000 < 0.80


def test_task_options_and_the_entry_travel_with_each_problem():
    p = next(iter(source(tasks=("basic_arithmetic",)).problems(None)[0]()))
    assert p.task == "basic_arithmetic" and p.info["metadata"]["source_dataset"] == "basic_arithmetic"
    assert p.target == p.info["answer"] and p.info["question"] == p.question
    expr = p.info["metadata"]["expression"]
    assert "*" not in expr and "(" not in expr and len(expr.split()) == 3  # two terms, + or - only


def test_a_resumed_stream_continues_where_the_first_was():
    s = source(weights=(1, 2))
    train, _ = s.problems(None)
    first = train()
    draw(first, 123)
    position = train.position
    rest = draw(first, 50)
    again = s.problems(None)[0](*position)
    assert [p.question for p in draw(again, 50)] == [p.question for p in rest]


def test_fewshot_examples_are_solved_turns_before_the_question_and_never_train_or_eval_items():
    tok = make_tokenizer()
    s = source(tasks=("chain_sum",), fewshot=2, use_chat_template=None, system_prompt="answer")
    train, heldout = s.problems(tok)
    shots = s.examples("chain_sum")
    assert len(shots) == 2 and all(a.startswith("<answer>") and a.endswith("</answer>") for _, a in shots)
    prompt = heldout[0].prompt
    assert prompt.startswith("<|im_start|>system\nAnswer the question. Write the final answer inside <answer>")
    assert prompt.count("<|im_start|>user") == 3 and prompt.count("<|im_start|>assistant") == 3
    assert prompt.index(shots[1][1]) < prompt.index(heldout[0].question) and prompt.endswith("<|im_start|>assistant\n")
    questions = {q for q, _ in shots}
    assert not questions & {p.question for p in heldout} and not questions & {p.question for p in draw(train(), 500)}


def test_prompts_longer_than_the_budget_are_left_out():
    s = source(tasks=("chain_sum",), max_prompt_tokens=5)
    tok = make_tokenizer()
    assert s.eval_problems(tok) == []  # every chat-formatted prompt is longer than 5 words
    with pytest.raises(ValueError, match="max_prompt_tokens=5"):
        next(iter(s.problems(tok)[0]()))


@pytest.mark.parametrize("tasks, options, weights, message", [
    (["basic_arithmetc"], {}, None, r"dataset.tasks: 'basic_arithmetc' is not a reasoning-gym task; did you mean "
                                    r"basic_arithmetic"),
    (["chain_sum"], {"chain_sum": {"max_term": 3}}, None, r"dataset.task_options.chain_sum.max_term: chain_sum "
                                                          r"takes no option 'max_term'; did you mean 'max_terms'\?"),
    (["chain_sum"], {"chain_sum": {"min_terms": 5, "max_terms": 2}}, None,
     r"dataset.task_options.chain_sum: chain_sum refuses .*max_terms must be >= min_terms"),
    (["chain_sum"], {"leg_counting": {}}, None, r"dataset.task_options.leg_counting: 'leg_counting' is not one of"),
    (["chain_sum", "gcd"], {}, [1.0], r"dataset.weights: 1 weights for 2 tasks"),
])
def test_names_and_options_are_checked_against_reasoning_gym(tasks, options, weights, message):
    with pytest.raises(ValueError, match=message) as e:
        check_tasks(tasks, options, weights)
    assert "\n" not in str(e.value)


def test_reasoning_gym_missing_is_one_line_with_the_install_command(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what an environment without it imports
    with pytest.raises(ValueError, match=r"^dataset=reasoning_gym needs reasoning-gym, which is not installed: pip "
                                         r"install 'forge-exp\[gym\]'$"):
        source().check()
