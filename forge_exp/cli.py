"""`forge-exp`: validate the config → check what can be checked → build the actor mesh → run the app → close.

`main()` is the command: it writes out the command line's short aliases (config/aliases.py), runs Hydra, and turns
a mistake in the command line into one line naming the key, with the closest valid key, before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import forge_exp.launch.resources  # noqa: F401 — the resolvers conf/hydra/launcher/*.yaml use
from forge_exp.driver.faults import EXIT_CONFIG, EXIT_FAILED, NOT_STARTED, STOP, RunFailed, Stopped, stop_signals
from forge_exp.apps.rundir import claim_given, held, own_dirs
from forge_exp.config.aliases import expand
from forge_exp.config.enums import plain
from forge_exp.config.store import register
from forge_exp.config.validate import ConfigError, suggest, unknown_to_base, validate
from forge_exp.runtime.supervision import ServiceFailed
from forge_exp.tracking.store import TrackingRefused

register()
log = logging.getLogger("forge_exp")
# conf/hydra/launcher/submitit_{slurm,local}.yaml extend the submitit plugin's schema of the same name on purpose
# (typed launcher keys, our defaults under the name users know); Hydra 1.3 warns about such name matching.
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema")
CONFIG = {"version_base": None, "config_path": "pkg://forge_exp.conf", "config_name": "config"}


def _register_launchers() -> None:
    """Our submitit launchers (hydra_plugins/forge_exp_launcher): Hydra's plugin scan finds them in a regular
    install but not through an editable install's import hook."""
    from hydra.core.plugins import Plugins

    try:
        from hydra_plugins.forge_exp_launcher import launcher
    except ImportError:
        return
    plugins = Plugins.instance()
    for name in ("SlurmLauncher", "LocalLauncher"):
        cls = getattr(launcher, name, None)  # absent without hydra-submitit-launcher
        if cls is not None and f"{cls.__module__}.{cls.__name__}" not in plugins.class_name_to_class:
            plugins.register(cls)


_FORK_SERVER = False  # main() sets it for a single run (not a sweep, --help or --cfg)
VERBOSE = False  # --verbose: a failure's traceback or report on stderr too, not only in the file the line names


def run(cfg: DictConfig) -> float | None:
    """The Hydra task: one experiment. How it can end: driver/faults.py (exit codes, MLflow status, last line)."""
    t0 = time.time()
    try:
        config = validate(cfg)
        own_dirs(config, HydraConfig.get().runtime.output_dir)  # one owner per run dir (apps/rundir.py)
        from forge_exp.apps.preflight import check, resolve_model
        from forge_exp.runtime.zygote_server import quiet_load

        with quiet_load() if _FORK_SERVER else contextlib.nullcontext():  # forkable after (zygote.start)
            for note in resolve_model(config):
                log.info(note)
            check(config)
        if config.cluster.name == "slurm":  # the meshes' hosts come from a SLURM job: its controller must answer
            from forge_exp.launch.sweep import slurm_problem

            if problem := slurm_problem("cluster=slurm", "cluster=local"):
                raise ValueError(problem)
        from forge_exp.driver.checkpoint import config_changes, resume_point, set_aside
        from forge_exp.tracking.answers import check_names
        from forge_exp.tracking.mlflow import default_tracking_uri
        from forge_exp.tracking.store import check_store

        resume, damaged = resume_point(config)
        uri = config.tracking.uri or default_tracking_uri()
        check_store(uri)  # a server that does not answer is one line here, not minutes of retries later
        params = check_names(uri, config.tracking.experiment, *((resume.run_id, resume.tracking_uri) if resume else ()))
        resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        resolved["model"]["dtype"] = plain(config.model.dtype)  # what `auto` became (apps/preflight.resolve_model)
        changes = config_changes(params, resolved) if resume else {}  # what the run was started with: MLflow's params
        for line in set_aside(damaged):  # the input is good: the run resumes from an older checkpoint
            print(f"forge-exp: warning: {line}; resuming from {resume.path.name}", file=sys.stderr)
    except ValueError as e:  # one clear line, before any process is spawned
        print(f"forge-exp: error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except Exception as e:  # noqa: BLE001 — a check that broke: its traceback in a file, one line here
        fail(HydraConfig.get().runtime.output_dir, f"{type(e).__name__}: {e}", _traceback(e))
    if _FORK_SERVER:  # the input is good: the run's procs can be forked from a server forked from here (with what
        from forge_exp.runtime import zygote  # the checks imported), whose imports overlap the tracker's and the
        # mesh's start (runtime/zygote.py)

        zygote.start(own=held())  # (the run dir's lock: not the server's to keep)
    with stop_signals():
        summary, tracker = _track(cfg, config, uri, resume, resolved, changes)
    _print_summary(summary, tracker, time.time() - t0)
    return summary.get("eval/accuracy_end")


def _track(cfg, config, uri, resume, resolved, changes) -> tuple[dict[str, float], object]:
    from forge_exp.apps import run_app  # imports monarch: only after the config is known to be good
    from forge_exp.driver.checkpoint import clean_partial
    from forge_exp.config.logger import extra_loggers
    from forge_exp.runtime.build import build
    from forge_exp.runtime.hosts import hosts_for
    from forge_exp.runtime.layout import plan_for
    from forge_exp.runtime.services import Runtime
    from forge_exp.tracking.mlflow import Tracker
    from forge_exp.tracking.store import reconcile

    for line in filter(None, [reconcile(config.output_dir)]):  # what a controller that died here left open
        print(f"forge-exp: {line}", file=sys.stderr)
    if removed := clean_partial(config.checkpoint.dir):
        log.warning("removed partial checkpoints left by an interrupted save: %s", ", ".join(removed))
    try:
        tracker = Tracker(
            uri,
            config.tracking.experiment,
            run_name=config.tracking.run_name or _default_run_name(config.name),
            tags=_run_tags(),
            # a sweep job: the sweep's parent run, exported by forge_exp.launch.sweep.SweepTracker (hydra.callbacks)
            parent_run_id=config.tracking.parent_run_id or os.environ.get("FORGE_EXP_PARENT_RUN_ID"),
            run_id=resume.run_id if resume else None,
            resume_step=resume.step if resume else None,
            hold=config.checkpoint.every > 0,
            run_dir=config.output_dir,
            close_wait_s=config.tracking.close_wait_s,
            loggers={name: build(node, f"logger.{name}", run_dir=config.output_dir)  # logger=[mlflow,...]: the others
                     for name, node in extra_loggers(config.logger).items()},
        )
        if resume and not resume.flushed:  # the run died between writing the checkpoint and logging its metrics
            if tracker.send(resume.pending_metrics):
                resume.mark_flushed()
        with tracker:
            tracker.log_params(resolved)  # new keys only: MLflow keeps a param's first value
            if changes:  # a resume's changes the params cannot show (steps, eval cadence, ...), recorded
                said = "; ".join(f"{k}: {was} -> {now}" for k, (was, now) in changes.items())
                tracker.set_tags({f"forge_exp.resume.step_{resume.step}": said})
                print(f"forge-exp: resuming from step {resume.step} with {said} (tag forge_exp.resume.step_"
                      f"{resume.step})", file=sys.stderr)
            tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
            meshes = plan_for(config)
            hosts = hosts_for(config.cluster, meshes, config.name, config.output_dir)  # None unless cluster=slurm
            runtime = Runtime(meshes, hosts=hosts)
            summary = asyncio.run(_run(run_app, config, runtime, tracker, resume))
            tracker.log_metrics({f"summary/{k}": v for k, v in summary.items()}, step=config.steps)
    except Stopped as e:
        print(f"forge-exp: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (ServiceFailed, RunFailed, TrackingRefused) as e:  # their own line; the remote traceback or Monarch's
        fail(config.output_dir, str(e), getattr(e, "report", "") or _traceback(e.__cause__))  # report to a file
    except Exception as e:  # noqa: BLE001 — anything else: FAILED in MLflow (the tracker's exit), one line here
        fail(config.output_dir, f"{type(e).__name__}: {e}", _traceback(e))
    return summary, tracker


def fail(run_dir: str, line: str, report: str) -> NoReturn:
    """End a run that failed: its report (a traceback, Monarch's report) in <run dir>/failure.txt, named on stderr
    (and printed too with --verbose), then the one line, and exit 1."""
    first = (line.strip().splitlines() or ["failed"])[0]
    if report:
        path = os.path.join(run_dir, "failure.txt")
        try:
            with open(path, "w") as f:
                f.write(f"{line}\n\n{report}\n")
            where = path
        except OSError as e:
            where = f"not written ({e.strerror}); run with --verbose to see it"
        if VERBOSE:
            print(report, file=sys.stderr)
        print(f"forge-exp: the failure's report and traceback: {where}", file=sys.stderr)
    print(f"forge-exp: error: {first}", file=sys.stderr)
    sys.exit(EXIT_FAILED)


def _traceback(e: BaseException | None) -> str:
    return "".join(traceback.format_exception(e)) if e is not None else ""


async def _run(run_app, config, runtime, tracker, resume) -> dict[str, float]:
    STOP.install(config.checkpoint.stop_grace_s)  # SIGTERM / SIGUSR2 / Ctrl-C: end at a step boundary
    try:
        async with runtime:  # every proc mesh (and a cluster job) is stopped on success, error, stop signal, Ctrl-C
            if runtime.hosts is not None:
                tracker.set_tags({f"forge_exp.hosts.{k}": v for k, v in runtime.hosts.describe.items()})
            summary = await runtime.supervise(run_app(config, runtime, tracker, resume))
            if runtime.hosts is not None:  # where the meshes on the cluster ran, as their processes report it
                tracker.log_text(json.dumps(await runtime.hosts.placement(), indent=1), "runtime/hosts.json")
            return summary
    except asyncio.CancelledError:
        if STOP.requested:  # before the first step, or a second signal, or the step in flight outlived the grace
            if not STOP.steps_started:
                raise Stopped(STOP.requested, None, None, NOT_STARTED) from None
            why = (f"a second {signal.Signals(STOP.again).name} stopped it at once" if STOP.again else
                   f"the step in flight did not end within checkpoint.stop_grace_s={config.checkpoint.stop_grace_s:g}")
            raise Stopped(STOP.requested, None, None, why, _newest(config)) from None
        raise
    except ServiceFailed:
        if STOP.requested:  # SLURM signalled every process of the job and a service went down with it
            raise Stopped(STOP.requested, None, None, "a service process was stopped too", _newest(config)) from None
        raise
    finally:
        STOP.uninstall()


def _newest(config) -> str | None:
    """The newest checkpoint of this run (its dir is this run's alone), without reading its weights to verify
    them: the time between SIGTERM and SLURM's SIGKILL is short."""
    from forge_exp.driver.checkpoint import latest

    newest = latest(config.checkpoint.dir, verify=False)
    return f"{newest.path} (step {newest.step})" if newest else None


def _default_run_name(name: str) -> str:
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return name
    from forge_exp.launch.sweep import SWEPT_ENV, run_name

    swept = [k for k in os.environ.get(SWEPT_ENV, "").split(",") if k]
    return run_name(list(hc.overrides.task), swept) or f"{name}-{hc.job.num}"  # sweep jobs: named by their values


def _run_tags() -> dict[str, str]:
    hc = HydraConfig.get()
    tags = {"forge_exp.overrides": " ".join(hc.overrides.task) or "(defaults)"}
    if hc.mode == RunMode.MULTIRUN:
        tags["forge_exp.sweep.job"] = str(hc.job.num)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip()
        if commit:
            tags["mlflow.source.git.commit"] = commit
    except (OSError, subprocess.SubprocessError):
        pass
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        if os.environ.get(var):
            tags[f"slurm.{var.lower()}"] = os.environ[var]
    return tags


def _print_summary(summary: dict[str, float], tracker, seconds: float) -> None:
    from forge_exp.tracking.mlflow import ui_command

    lines = [f"forge-exp: finished in {seconds / 60:.1f} min"]
    if "eval/accuracy_start" in summary and "eval/accuracy_end" in summary:
        start, end = summary["eval/accuracy_start"], summary["eval/accuracy_end"]
        lines.append(f"  held-out accuracy (greedy): {start:.3f} at the start of RL -> {end:.3f} at the end "
                     f"({end - start:+.3f})")
        for key in sorted(k for k in summary if k.endswith("/accuracy_end") and k != "eval/accuracy_end"):
            task = key.split("/")[1]  # eval/<task>/accuracy_end: a mix of tasks
            start, end = summary.get(f"eval/{task}/accuracy_start", float("nan")), summary[key]
            lines.append(f"    {task}: {start:.3f} -> {end:.3f} ({end - start:+.3f})")
    if "warmstart/accuracy" in summary:
        lines.append(f"  warm start: {summary['warmstart/seconds']:.0f} s")
    lines.append(f"  MLflow run {tracker.run_id} (experiment id {tracker.experiment_id}) in {tracker.uri}")
    lines.append(f"  open the UI: {ui_command(tracker.uri)}, then {tracker.run_url()}")
    print("\n".join(lines))


hydra_main = hydra.main(**CONFIG)(run)


def main() -> None:
    """The `forge-exp` command."""
    global _FORK_SERVER, VERBOSE
    VERBOSE = "--verbose" in sys.argv[1:]
    args = expand([a for a in sys.argv[1:] if a != "--verbose"])
    sys.argv = [sys.argv[0], *args]
    _FORK_SERVER = not any(a.startswith("-") for a in args)  # one run here (not -m, --help, --cfg)
    _register_launchers()
    if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the user asked for Hydra's own tracebacks
        hydra_main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its multi-line report and exiting
    try:
        check_printed_config(args)
        claim_given(args)
        hydra_main()
    except Exception as e:  # noqa: BLE001 — anything not a config mistake is re-raised below
        message = explain(e, args)
        if message is None and VERBOSE:
            raise
        if message is None:  # not a config mistake, outside any run (a launcher, a callback): a file for its traceback
            fail(tempfile.mkdtemp(prefix="forge-exp-"), f"{type(e).__name__}: {e}", _traceback(e))
        print(f"forge-exp: error: {message}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)
    from forge_exp.runtime.bootstrap import fast_exit

    fast_exit(0)  # the run is over and its tracker closed: skip finalizing the interpreter (runtime/bootstrap.py)


def check_printed_config(args: list[str]) -> None:
    """`--cfg job` prints the config instead of running it: it refuses a config the run would refuse (an unknown
    `+key`, a value out of range), in the same words."""
    if not any(a in ("--cfg", "-c") or a.startswith("--cfg=") for a in args) or {"-m", "--multirun"} & set(args):
        return
    from forge_exp.config.compose import compose

    valued = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd"}
    values = {i + 1 for i, a in enumerate(args) if a in valued}
    validate(compose([a for i, a in enumerate(args) if i not in values and not a.startswith(("-", "hydra."))]))


def explain(e: Exception, args: list[str]) -> str | None:
    """One line for a mistake in the command line or a config file; None for anything else."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    if isinstance(e, ConfigError):
        return str(e)
    if isinstance(e, OSError) and (where := _run_dir_problem(e, args)):
        return (f"{where}: cannot write {e.filename} ({e.strerror or type(e).__name__}); give a directory this "
                f"user can write")
    if isinstance(e, MissingConfigException):
        return _missing_option(e)
    if isinstance(e, OverrideParseException):
        bad = next((a for a in args if "{" in a or "}" in a), None) or str(e).splitlines()[0]
        return (f"cannot parse the override {bad!r} ({str(e).splitlines()[0]}); quote a value with special "
                f"characters for Hydra as well as the shell: 'key=\"value\"'")
    if isinstance(e, ConfigCompositionException):
        text = str(e)
        if unchosen := unknown_to_base(text):
            return unchosen
        m = re.search(r"Could not (?:override|append to|delete from) '([^']+)'", text) or re.search(
            r"Key '([^']+)' not in", text)
        if m:
            key = m.group(1)
            rest = [a for a in args if not a.lstrip("+~").startswith(f"{key}=") and a.lstrip("+~") != key]
            return f"{key} is not a config key{suggest(key, _compose(rest))}"
        m = re.search(r"Error merging override (\S+)", text)
        cause = e.__cause__
        if m and cause is not None:
            return f"{m.group(1)}: {str(cause).strip().splitlines()[0]}"
        return text.strip().splitlines()[0]
    return None


def _run_dir_problem(e: OSError, args: list[str]) -> str | None:
    """The key of the directory Hydra could not create or write (the run's, with .hydra/ and the log) before the
    run started, or None when the error came from elsewhere."""
    frames = traceback.extract_tb(e.__traceback__)
    if not e.filename or not any(f.name == "run_job" for f in frames) or any(
            f.filename == __file__ and f.name == "run" for f in frames):
        return None
    key = "hydra.sweep.dir" if {"-m", "--multirun"} & set(args) else "hydra.run.dir"
    given = next((a.split("=", 1)[1] for a in args if a.startswith(f"{key}=")), None)
    return f"{key}={given}" if given else key


def _missing_option(e) -> str:
    import difflib

    from forge_exp.config.compose import group_options

    m = re.search(r"Could not (?:find|load) '([^']+)'", str(e))  # `load`: one of a list (logger=[mlflow,x])
    missing = m.group(1) if m else str(e).splitlines()[0]
    group, _, option = missing.rpartition("/")
    options = sorted(getattr(e, "options", None) or group_options(group))
    close = difflib.get_close_matches(option, options, n=1)
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    listed = f" (options: {', '.join(options)})" if options else ""
    return f"{group}={option} is not an option{hint}{listed}" if group else f"{missing} not found{listed}"


def _compose(args: list[str]) -> DictConfig | None:
    """The config the other overrides compose to (for suggestions), or None if they do not compose either."""
    from hydra import compose, initialize_config_module

    overrides = [a for a in args if not a.startswith("-") and "=" in a and not a.startswith("hydra")]
    try:
        with initialize_config_module(config_module="forge_exp.conf", version_base=None):
            return compose(config_name="config", overrides=overrides)
    except Exception:  # noqa: BLE001 — no suggestion then
        return None


if __name__ == "__main__":
    main()
