"""Eight runs started together on a fresh sqlite store: the store is created once (under a file lock) and every run
finishes with every point."""

from __future__ import annotations

import time

from mlflow.tracking import MlflowClient

from tests.faults.helpers import Run, cli, steps

# Every service in the run's own process (mesh: controller): what is under test is the store, and eight runs' worth
# of proc meshes starting at once on 2 cores tests Monarch's spawn limit instead (twice it ran out on CI machines).
ONE_PROCESS = [f"services.{s}.mesh=controller" for s in ("generator", "trainer")]


def test_eight_runs_on_a_fresh_store_all_finish_with_every_point(tmp_path, warmstart_cache):
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db"
    runs = [Run(cli(tmp_path, warmstart_cache, "steps=3", "dataset.eval_size=8", *ONE_PROCESS, run=f"run{i}",
                    uri=uri)) for i in range(8)]
    results = [r.finish(600) for r in runs]
    assert [rc for rc, _, _ in results] == [0] * 8, [err[-1500:] for rc, _, err in results if rc]
    client = MlflowClient(uri)
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.info.status for r in found) == ["FINISHED"] * 8
    for r in found:
        assert steps(client, r.info.run_id) == [1, 2, 3]
        assert [m.step for m in client.get_metric_history(r.info.run_id, "eval/accuracy")] in ([0, 3], [3, 0])
    assert all(r.orphans() == [] for r in runs)
