from forge_exp.rl.replay import ReplayBuffer
from forge_exp.rl.types import Completion, Episode


def episode(version: int, tag: int = 0) -> Episode:
    c = Completion(prompt_ids=[1], token_ids=[2, tag], logprobs=[-0.1, -0.2], stop_reason="eos", policy_version=version)
    return Episode(completion=c, reward=1.0, advantage=0.5)


def test_sample_waits_until_enough_fresh_episodes():
    buf = ReplayBuffer(max_policy_age=1)
    buf.add([episode(0) for _ in range(3)])
    assert buf.sample(4, policy_version=0) is None
    buf.add([episode(1)])
    batch = buf.sample(4, policy_version=1)
    assert batch is not None and len(batch) == 4 and len(buf) == 0


def test_episodes_older_than_max_policy_age_are_evicted():
    buf = ReplayBuffer(max_policy_age=1)
    buf.add([episode(0, 0), episode(1, 1), episode(2, 2)])
    batch = buf.sample(2, policy_version=2)  # version 0 is two behind: evicted
    assert sorted(e.policy_version for e in batch) == [1, 2]
    assert buf.evicted == 1


def test_on_policy_buffer_keeps_only_the_current_version():
    buf = ReplayBuffer(max_policy_age=0)
    buf.add([episode(3), episode(4), episode(4)])
    assert [e.policy_version for e in buf.sample(2, policy_version=4)] == [4, 4]
    assert buf.evicted == 1


def test_capacity_drops_the_oldest():
    buf = ReplayBuffer(max_policy_age=10, capacity=2)
    buf.add([episode(0, 7), episode(0, 8), episode(0, 9)])
    assert len(buf) == 2 and buf.evicted == 1
    assert sorted(e.completion.token_ids[1] for e in buf.sample(2, 0)) == [8, 9]


def test_unsample_puts_the_last_batch_back_as_if_never_taken():
    """The loop takes step s+1's batch while step s trains; a stop in between gives it back before the checkpoint:
    the buffer's state, and what it samples next, are those of a buffer that was never asked."""
    a, b = ReplayBuffer(max_policy_age=1, seed=7), ReplayBuffer(max_policy_age=1, seed=7)
    for buf in (a, b):
        buf.add([episode(1, tag) for tag in range(6)])
    taken = a.sample(4, policy_version=1)
    a.add([episode(2, 10)])  # a rollout lands meanwhile
    b.add([episode(2, 10)])
    assert a.unsample() == 4 and a.unsample() == 0  # once
    assert a.state_dict() == b.state_dict()
    again = a.sample(4, policy_version=1)
    assert [e.completion.token_ids for e in again] == [e.completion.token_ids for e in taken]
    assert [e.completion.token_ids for e in again] == [e.completion.token_ids for e in b.sample(4, policy_version=1)]
