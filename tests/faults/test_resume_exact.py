"""Synchronous GRPO (max_policy_age=0) stopped half-way and resumed is the run that was never stopped, bit for bit:
the same metrics at every step and the same weights and optimizer state at the end. The checkpoint carries the
prompt stream's position, the replay buffer and its RNG; rollouts draw with seeds made of (seed, batch, call)."""

from __future__ import annotations

import signal
import time

import pytest

from tests.faults.helpers import Run, cli, last_line, the_run

ARGS = ["steps=12", "checkpoint.every=4", "algorithm.max_policy_age=0"]
VARIES = ("time/", "sync/")  # and every */seconds, */*_seconds, */tokens_per_s: wall-clock measurements
# The warm start's own metrics are logged only by the run that trains it (the first in a fresh cache); the other
# loads it, and must still draw the same prompts after it.
WARM = ("warmstart/", "summary/warmstart/")


def history(uri: str) -> dict[str, list[tuple[int, float]]]:
    client, r = the_run(uri)
    assert r.info.status == "FINISHED"
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
            for k in r.data.metrics if not k.startswith(VARIES + WARM) and "seconds" not in k and not k.endswith("_per_s")}


# LoRA: the checkpoint is the adapter (and its optimizer state); a resumed run puts it back on the base it names.
# kl: the reference model of the KL term is the run's initial policy (the warm start), not the resumed weights.
@pytest.mark.parametrize("extra,weights", [([], "model.safetensors"),
                                           (["algorithm.beta=0.04"], "model.safetensors"),
                                           (["experiment=tiny_lora"], "adapter_model.safetensors")],
                         ids=["full", "full_kl", "lora"])
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, warmstart_cache, extra, weights):
    a = tmp_path / "a"
    rc, _, err = Run(cli(a, warmstart_cache, *ARGS, *extra)).finish(400)
    assert rc == 0, err[-3000:]

    b = tmp_path / "b"
    cmd = cli(b, warmstart_cache, *ARGS, *extra)
    first = Run(cmd)
    first.wait_for(b / "run" / "checkpoints" / "step_0000004" / "metrics_flushed")
    time.sleep(1.0)
    first.signal(signal.SIGTERM)
    rc, _, err = first.finish(120)
    assert rc == 143 and "checkpoint" in last_line(err), err[-3000:]
    rc, _, err = Run([*cmd, "resume=true"]).finish(400)
    assert rc == 0, err[-3000:]

    ha, hb = history(f"sqlite:///{a}/mlflow.db"), history(f"sqlite:///{b}/mlflow.db")
    assert set(ha) == set(hb) and {"loss/total", "reward/mean", "loss/ratio_max", "eval/accuracy"} <= set(ha)
    if "algorithm.beta=0.04" in extra:
        assert any(v != 0 for _, v in ha["loss/kl"]), ha["loss/kl"]
    for key in ha:
        assert ha[key] == hb[key], (key, ha[key], hb[key])
    end_a, end_b = a / "run" / "checkpoints" / "step_0000012", b / "run" / "checkpoints" / "step_0000012"
    for name in (weights, "optimizer.pt", "loop.json"):
        assert (end_a / name).read_bytes() == (end_b / name).read_bytes(), name
