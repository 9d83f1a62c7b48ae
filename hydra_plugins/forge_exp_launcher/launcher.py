"""The launchers behind `hydra/launcher=submitit_slurm` and `submitit_local` (conf/hydra/launcher/): the
hydra-submitit-launcher plugin's, with three changes. (Here, not in forge_exp/, because Hydra instantiates only
launchers from the hydra_plugins package; cli.py registers them for editable installs, whose import hook Hydra's
plugin scan does not see. Without hydra-submitit-launcher installed this module defines nothing and imports
cleanly, so Hydra's scan stays quiet.)

- Every job of the array is waited for. A job that ends without a result (scancel, node failure, time limit,
  killed for memory) becomes a failed job whose error names its overrides, its SLURM id, its state and its log,
  instead of a launcher that waits forever or gives up on the first failure and leaves the others running.
- A job that runs again after a requeue (preemption or time limit through submitit's checkpoint(), or an
  explicit `scontrol requeue`) runs with resume=true: it continues from its newest checkpoint into the same
  MLflow child run, each step logged once (forge_exp/driver/checkpoint.py). Runs that set no checkpoint.every
  start over, in a new child run.
- A job that SLURM is stopping (SIGTERM comes before the requeue or the cancel) reports no result, even if the app
  failed on the way down: a FAILED result would end the job in the launcher's eyes before its requeued run.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from omegaconf import OmegaConf, open_dict

import forge_exp.launch.resources  # noqa: F401 — registers the resolvers the launcher configs use
from forge_exp.launch import sweep

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
except ImportError:  # the optional launcher plugin is not installed: no submitit launchers, and no import error
    plugin = None

log = logging.getLogger("forge_exp.sweep")

POLL_S = 2.0  # how often the launcher looks at its jobs
RESULT_GRACE_S = 10.0  # a job SLURM reports ended may still be writing its result file (shared file systems)
STOPPING_WAIT_S = 600.0  # after SIGTERM, how long a job waits for SLURM's SIGKILL or requeue before giving up


class SweepJobError(RuntimeError):
    """A sweep job that failed; run_status: the MLflow status its child run gets when it ended without a result."""

    def __init__(self, message: str, run_status: str | None = None):
        super().__init__(message)
        self.run_status = run_status


class _ForgeSubmitit:
    _requeued = False  # set on the copy that submitit's checkpoint() resubmits

    # --- in the job's process ----------------------------------------------------------------------------------
    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict[type, Singleton]) -> JobReturn:
        import submitit

        Singleton.set_state(singleton_state)
        setup_globals()
        config = self.hydra_context.config_loader.load_sweep_config(self.config, sweep_overrides)
        with open_dict(config.hydra.job):
            config.hydra.job.id = submitit.JobEnvironment().job_id
            config.hydra.job.num = job_num
        if self._requeued or int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
            # not an override: the child's overrides tag must stay the one its first run had
            config.resume = True
            print(f"forge-exp sweep: job #{job_num} runs again after a requeue: resume=true", flush=True)
        stopping = _watch_sigterm()
        ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=config,
                      job_dir_key=job_dir_key, job_subdir_key="hydra.sweep.subdir")
        if ret.status == JobStatus.FAILED and stopping.is_set():
            print(f"forge-exp sweep: SLURM is stopping job #{job_num} (SIGTERM): no result reported; waiting to be "
                  "requeued or killed", flush=True)
            time.sleep(STOPPING_WAIT_S)  # SIGKILL (cancel, requeue) or submitit's requeue-and-exit ends it first
        return ret

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit on preemption or time-out, before it requeues the job: the next run resumes."""
        import submitit

        again = copy.copy(self)
        again._requeued = True
        return submitit.helpers.DelayedSubmission(again, *args, **kwargs)

    # --- in the launching process ------------------------------------------------------------------------------
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None and len(job_overrides) > 0
        problem = sweep.launcher_problem(self.config)
        if problem:
            from forge_exp.config.validate import ConfigError

            raise ConfigError(problem)
        init_keys = {"submitit_folder", "max_num_timeout"}
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR, folder=self.params["submitit_folder"],
            **{f"{self._EXECUTOR}_{k}": v for k, v in self.params.items() if k == "max_num_timeout"},
        )
        base = set(OmegaConf.structured(plugin.BaseQueueConf).keys())
        executor.update_parameters(**{
            k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in self.params.items() if k not in init_keys
        })
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        args = []
        for i, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + i, " ".join(filter_overrides(overrides)))
            args.append((list(overrides), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}",
                         Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*args))
        ids = sorted({j.job_id.split("_")[0] for j in jobs})
        print(f"forge-exp sweep: submitted {len(jobs)} jobs ({self._EXECUTOR} job {', '.join(ids)}); "
              f"logs in {sweep_dir}/.submitit/", flush=True)
        try:
            return self._wait(jobs, job_overrides, initial_job_idx)
        except KeyboardInterrupt:
            if self._EXECUTOR == "slurm":
                print(f"forge-exp sweep: interrupted; the SLURM jobs keep running (stop them: scancel {' '.join(ids)})",
                      flush=True)
            raise

    def _wait(self, jobs: list, job_overrides: Sequence[Sequence[str]], first: int) -> list[JobReturn]:
        from forge_exp.launch.slurm_fit import PendingWatch

        results: list[JobReturn | None] = [None] * len(jobs)
        pending = set(range(len(jobs)))
        ids = sorted({j.job_id.split("_")[0] for j in jobs})
        watch = PendingWatch(ids) if self._EXECUTOR == "slurm" else None
        while pending:
            for i in sorted(pending):
                if jobs[i].done():
                    results[i] = _result(jobs[i], list(job_overrides[i]), first + i)
                    pending.discard(i)
            if watch is not None and pending and (stuck := watch.poll()):  # SLURM would keep it waiting forever
                from forge_exp.config.validate import ConfigError

                subprocess.run(["scancel", *ids], capture_output=True, timeout=30)
                raise ConfigError(f"sweep {stuck}; the sweep's jobs are cancelled (scancel {' '.join(ids)})")
            if pending:
                time.sleep(POLL_S)
        lost = {" ".join(r.overrides): r._return_value.run_status for r in results
                if isinstance(r._return_value, SweepJobError) and r._return_value.run_status}
        sweep.mark_children_stopped(str(self.config.hydra.sweep.dir), lost)
        failed = [r for r in results if r.status != JobStatus.COMPLETED]
        if failed:
            print(f"forge-exp sweep: {len(failed)} of {len(results)} jobs failed:", flush=True)
            for r in failed:
                print(f"  - {str(r._return_value).splitlines()[0]}", flush=True)
        return results  # type: ignore[return-value]


def _result(job: Any, overrides: list[str], num: int) -> JobReturn:
    deadline = time.monotonic() + RESULT_GRACE_S
    while not job.paths.result_pickle.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    kind = "SLURM job" if type(job).__name__.startswith("Slurm") else "process"
    what = f"sweep job #{num} ({kind} {job.job_id}: {' '.join(filter_overrides(overrides)) or 'defaults'})"
    if job.paths.result_pickle.exists():
        try:
            ret = job.results()[0]
        except Exception as e:  # the job's process failed outside the app (import, pickling, ...)  # noqa: BLE001
            return JobReturn(overrides=overrides, status=JobStatus.FAILED,
                             _return_value=SweepJobError(f"{what} failed: {e}"))
        if ret.status == JobStatus.FAILED:
            ret._return_value = SweepJobError(f"{what} failed: {ret._return_value!r} (log: {job.paths.stdout})")
        return ret
    state = job.get_info(mode="force").get("State") or job.state
    tail = ""
    for path in (job.paths.stderr, job.paths.stdout):
        if path.exists() and path.stat().st_size:
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            break
    return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=SweepJobError(
        f"{what} ended {state} without a result (cancelled, preempted without requeue, out of time or memory?); "
        f"log: {job.paths.stderr}\n{tail}",
        run_status="KILLED" if (state.split() or ["?"])[0] in ("CANCELLED", "PREEMPTED", "TIMEOUT", "DEADLINE") else "FAILED",
    ))


def _watch_sigterm() -> threading.Event:
    """Remember SIGTERM; keep submitit's handler (it only logs it: submitit acts on its preemption signal)."""
    stopping = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        stopping.set()
        if callable(previous):
            previous(signum, frame)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    return stopping


if plugin is not None:

    class SlurmLauncher(_ForgeSubmitit, plugin.SlurmLauncher):
        pass

    class LocalLauncher(_ForgeSubmitit, plugin.LocalLauncher):
        pass
