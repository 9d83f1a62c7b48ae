"""One of several processes that open the same fresh store at once (tests/tracking/test_store.py)."""

import sys

from forge_exp.tracking.mlflow import Tracker

uri, i = sys.argv[1], int(sys.argv[2])
with Tracker(uri, "forge-exp", run_name=f"run-{i}") as t:
    t.log_params({"i": i})
    for step in range(1, 31):
        t.log_metrics({"reward/mean": step / 30, "job": i}, step=step)
        if step % 10 == 0:
            t.flush()
