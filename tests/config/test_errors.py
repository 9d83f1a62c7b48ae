"""A mistake in the config is one line naming the key (and the closest valid key), before any process starts."""

from __future__ import annotations

import os
import sqlite3

import pytest

from forge_exp.config.validate import ConfigError, validate
from tests.config.helpers import compose_cfg, error_lines, run_cli


@pytest.mark.parametrize(
    "override,message",
    [
        ("algorithm.beta=-0.1", r"^algorithm\.loss\.beta must be >= 0"),
        ("algorithm.clip_low=1.0", r"^algorithm\.loss\.clip_low must be in \[0, 1\)"),
        ("algorithm.dual_clip=0.5", r"^algorithm\.loss\.dual_clip must be in \(1, inf\]"),
        ("algorithm.group_size=1", r"^algorithm\.group_size must be >= 2"),
        ("algorithm.top_p=0", r"^algorithm\.top_p must be in \(0, 1\]"),
        ("algorithm.temperature=0", r"^algorithm\.temperature must be > 0"),
        ("algorithm=sapo algorithm.tau_neg=0", r"^algorithm\.loss\.tau_neg must be > 0"),
        ("algorithm.rollout_cap=1", r"^algorithm\.loss\.rollout_cap must be in \(1, inf\] or null, got 1"),
        ("algorithm=gspo algorithm.rollout_correction=tis", r"^algorithm\.loss\.rollout_correction must be none or "
                                                           r"seq_mask for GSPO, got tis"),
        ("algorithm=sft algorithm.max_seq_len=1", r"^algorithm\.max_seq_len must be >= 2"),
        ("dataset.max_new_tokens=0", r"^dataset\.max_new_tokens must be >= 1"),
        ("dataset.digits=0", r"^dataset\.digits must be in \[1, 18\]"),
        ("dataset.ops=+%", r"^dataset\.ops must be distinct operators"),
        ("dataset.eval_size=null", r"^dataset\.eval_size must be a number"),
        ("dataset.eval_size=100000", r"^dataset\.eval_size must be <= "),
        ("dataset=gsm8k dataset.question_key=", r"^dataset\.question_key must be set"),
        ("dataset=jsonl dataset.template=x", r"^dataset\.template must contain a \{question\}"),
        ("model.num_heads=3", r"^model\.num_heads \(3\) must be a multiple"),
        ("model.head_dim=31", r"^model\.head_dim must be even"),
        ("model.warmstart.target_accuracy=0", r"^model\.warmstart\.target_accuracy must be in \(0, 1\]"),
        ("model=hf", r"^model\.path or model\.hf_id must be set"),
        ("services.generator.gpus=2", r"^services\.generator\.gpus must be 0 or 1"),
        ("services.trainer.replicas=2", r"^services\.trainer\.replicas must be 1"),
        ("services.trainer.procs=2", r"^services\.trainer\.procs must be 1 for trainer=hf"),
        ("services.reward.procs=2", r"^services\.reward\.procs must be 1"),
        ("parallelism.tensor_parallel=2", r"^parallelism\.tensor_parallel must be 1"),
        ("generator.slots=0", r"^generator\.slots must be >= 1"),
        ("env=calculator env.max_turns=0", r"^env\.max_turns must be in \[1, 1000\]"),
        ("env=calculator env.max_total_tokens=1", r"^env\.max_total_tokens must be in \[2, "),
        ("env=calculator env.tool_timeout_s=0", r"^env\.tool_timeout_s must be in \(0, 3600\]"),
        ("env=calculator env.direct_fraction=2", r"^env\.direct_fraction must be in \[0, 1\]"),
        ("env=calculator env.demonstrations=8", r"^env\.demonstrations must be 0 unless "
                                                r"env\.chat_format=tiny"),
        ("eval.pass_k=1", r"^eval\.pass_k must be 0 \(off\) or >= 2"),
        ("eval.temperature=-1", r"^eval\.temperature must be in \(0, inf\]"),
        ("checkpoint.keep=0", r"^checkpoint\.keep must be >= 1"),
        ("steps=0", r"^steps must be >= 1"),
        ("seed=99999999999999999999999", r"^seed must be in \[0, 9223372036854775807\]"),
        ("model.seed=-1", r"^model\.seed must be in \[0, "),
        ("algorithm.lr=inf", r"^algorithm\.lr must be finite, got inf"),
        ("model.warmstart.lr=inf", r"^model\.warmstart\.lr must be in \(0, inf\)"),
        ("algorithm.loss=null", r"^algorithm\.loss must be a node with _target_ \(the option's default, "
                                r"conf/algorithm/grpo\.yaml\)"),
        ("tracking.experiment=", r"^tracking\.experiment must be a name \(MLflow refuses an empty one\)"),
        ("reward.failure_value=inf", r"^reward\.failure_value must be finite"),
        ("reward.functions.exact.weight=0", r"^reward\.functions have every weight 0"),
        ("+reward.functions.extra.weight=1", r"^reward\.functions\.extra\._target_ is missing"),
        ("+algorithm.bta=0.04", r"^algorithm\.bta is not a config key; did you mean algorithm\.beta \(= algorithm\.loss\.beta\)\?"),
        ("+algorithm.loss.clip_hi=0.3", r"^algorithm\.loss\.clip_hi is not a config key; did you mean algorithm\.clip_high"),
        ("+foo=1", r"^foo is not a config key"),
        ("cluster=slurm cluster.hosts.trainer=0", r"^cluster\.hosts\.trainer must be >= 1 \(nodes of the allocation\)"),
        ("cluster=slurm ~cluster.hosts.trainer", r"^cluster\.hosts must name at least one proc mesh"),
        ("cluster=slurm cluster.port=70000", r"^cluster\.port must be in \[1, 65535\]"),
        ("cluster=slurm cluster.timeout_min=0", r"^cluster\.timeout_min must be >= 1"),
        ("cluster=slurm cluster.job_start_timeout_s=0", r"^cluster\.job_start_timeout_s must be >= 1"),
        ("cluster=slurm cluster.cpus_per_node=0", r"^cluster\.cpus_per_node must be >= 1"),
        ('cluster=slurm cluster.sbatch_args=["mem=4G"]', r"^cluster\.sbatch_args must be sbatch options such as "
                                                      r"--mem=64G, got 'mem=4G'"),
        ("cluster=slurm cluster.python=", r"^cluster\.python must be set"),
        ("+cluster.partition=gpu", r"^cluster\.partition is not a config key"),  # cluster=local has none
        ("model.lora.rank=0", r"^model\.lora\.rank must be >= 1 \(null trains every parameter\), got 0"),
        ("experiment=tiny_lora model.lora.dropout=1", r"^model\.lora\.dropout must be in \[0, 1\)"),
        ("experiment=tiny_lora model.lora.target_modules=[]", r"^model\.lora\.target_modules is empty"),
        ("experiment=tiny_lora trainer=titan", r"^model\.lora\.rank=8: trainer=titan trains every parameter"),
    ],
)
def test_bad_values_are_one_error_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message) as e:
        validate(compose_cfg(*override.split()))
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_errors_are_one_line_with_the_closest_key_and_spawn_nothing(tmp_path):
    cases = {
        ("algorithm.bta=0.04",): "algorithm.bta is not a config key; did you mean algorithm.beta (= algorithm.loss.beta)?",
        ("+algorithm.bta=0.04",): "algorithm.bta is not a config key; did you mean algorithm.beta",
        ("model.hiden_size=3",): "model.hiden_size is not a config key; did you mean model.hidden_size?",
        ("algorithm=grpoo",): "algorithm=grpoo is not an option; did you mean algorithm=grpo?",
        ("algorithm.loss.kl_estimator=k4",): "algorithm.loss.kl_estimator=k4: Invalid value 'k4', expected one of "
                                             "[k1, k2, k3]",
        ("algorithm.clip_low=1.5",): "algorithm.loss.clip_low must be in [0, 1) or null, got 1.5",
        ("algorithm.rollout_correction=is",): "algorithm.loss.rollout_correction=is: Invalid value 'is', expected "
                                              "one of [none, tis, mis, seq_mask]",
        ("env=calculator", "env.chat_format=chatml"): "env.chat_format=chatml: Invalid value 'chatml', expected one "
                                                     "of [tiny, qwen3, llama3]",
        ("dataset=jsonl", "dataset.train_path=data/{split}.jsonl"): "cannot parse the override",
        ("cluster=slurm", "+cluster.hosts.gpu=1"): "cluster.hosts.gpu: this run has no proc mesh 'gpu' (its meshes: "
                                                  "trainer, generator, controller)",
        ("cluster=slurmm",): "cluster=slurmm is not an option; did you mean cluster=slurm?",
        ("experiment=tiny_lora", "model.lora.target_modules=[wq]"): "model.lora.target_modules: the model has no wq; its "
                                                               "linear modules are down_proj, gate_proj, k_proj, "
                                                               "o_proj, q_proj, up_proj, v_proj",
    }
    for args, expected in cases.items():
        r = run_cli(*args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
        err = error_lines(r)
        assert r.returncode == 2, (args, r.stderr)
        assert len(err) == 1 and err[0].startswith(f"forge-exp: error: {expected}"), (args, r.stderr)
    assert not (tmp_path / "mlruns").exists()  # nothing ran: no MLflow store either


@pytest.mark.slow
def test_slurm_without_a_controller_is_one_line_and_creates_no_run(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(os.sys.executable)}  # no sbatch on this PATH
    r = run_cli("-m", "algorithm.beta=0,0.04", "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={tmp_path}/s",
                env=env, cwd=tmp_path)
    err = error_lines(r)
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert "needs SLURM's sbatch on PATH" in err[0] and "launchers/slurm/start.sh" in err[0]
    assert not (tmp_path / "mlruns").exists()
    r = run_cli("cluster=slurm", f"hydra.run.dir={tmp_path}/run", env=env, cwd=tmp_path)  # the meshes' hosts too
    err = error_lines(r)
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith("forge-exp: error: cluster=slurm needs SLURM's sbatch on PATH") and "cluster=local" in err[0]
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.slow
def test_the_used_by_command_prints_and_fails_clearly_without_weights(tmp_path):
    r = run_cli("algorithm=grpo", "model=qwen3_1_7b", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "hf_id: Qwen/Qwen3-1.7B" in r.stdout and "beta: 0.04" in r.stdout and "hidden_size" not in r.stdout
    r = run_cli("algorithm=grpo", "model=qwen3_1_7b", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path,
                env={**os.environ, "HF_HOME": str(tmp_path / "hf")})
    err = error_lines(r)
    assert r.returncode == 2 and len(err) == 1 and "model.path" in err[0] and "Qwen/Qwen3-1.7B" in err[0], r.stderr
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.slow
def test_no_store_schema_is_touched_by_a_bad_run(tmp_path):
    """A run refused by validation leaves an existing store as it was (no new run row)."""
    from forge_exp.tracking.mlflow import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    Tracker(uri, "forge-exp").close()
    r = run_cli("algorithm.group_size=1", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 2
    assert sqlite3.connect(tmp_path / "mlflow.db").execute("select count(*) from runs").fetchone()[0] == 1
