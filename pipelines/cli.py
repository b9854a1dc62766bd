"""The `rl-assets` command (also `python -m pipelines`, which `make run` and the DVC stages call).

    rl-assets run [--all] [--set section.key=value ...]   what is missing or stale (--all: every asset), one Dagster run
    rl-assets materialize r01/rollouts            one asset (each DVC stage's command)
    rl-assets dvc-sync [--check]                  write (or check) dvc.yaml from the graph
    rl-assets status                              JSON health summary; exit 1 when the latest run failed
    rl-assets push | pull                         to and from the remote (storage.remote; pipelines/storage/remote.py)
    rl-assets retire --keep N [--dry-run]         retention of round checkpoints (pipelines/storage/retention.py)

and the library's commands that read, sample or serve the outputs without Dagster (rl_assets/cli.py):
lineage, report, query, generate, rollback, track, serve, import-model. Dagster is imported only by the
commands above that need it.
"""

import argparse
import contextlib
import functools
import logging
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from rl_assets.core.paths import data_dir, flow_order, output_key


def use_project_instance() -> None:
    """Point DAGSTER_HOME at .dagster/ in the project, linked to the project's dagster.yaml."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if Path("dagster.yaml").is_file() and not config.exists():
        config.symlink_to(Path("dagster.yaml").resolve())


def rl_pipeline_job():
    from pipelines.definitions.code_location import defs

    return defs().resolve_job_def("rl_pipeline")


def execute(command: str, selection: list[str] | None, everything: bool = False) -> tuple[bool, list[str]]:
    """Execute the job, or a selection of its assets, on the project instance: (success, what a failed run reports).

    `run` materializes only the assets that are not up to date (pipelines/records/outdated.py), every asset with
    `everything`; `materialize` the keys it names. Either holds the project's writer lock (pipelines/records/writer.py).
    """
    from dagster import DagsterInstance, execute_job, reconstructable

    from pipelines.records.dvc import record_journal
    from pipelines.records.outdated import outdated_assets
    from pipelines.launch.params import asset_key, load_project_params, project_params, run_tags
    from pipelines.records.writer import cli_tags, exclusive_writer

    params = load_project_params()

    say = functools.partial(print, file=sys.stderr)
    log = SimpleNamespace(warning=lambda text: say(f"warning: {text}"), info=say)
    with DagsterInstance.get() as instance, exclusive_writer(instance, command, log=say):
        if recorded := record_journal(log):
            say(f"dvc.lock: recorded {len(recorded)} stages an earlier run wrote and was stopped before recording "
                f"({', '.join(recorded)})")
        keys = [asset_key(k) for k in selection] if selection else None  # output keys, e.g. r01/rollouts, of the params' experiment
        if command == "run" and not everything:
            from pipelines.definitions.code_location import defs

            specs = defs().resolve_all_asset_specs()
            from pipelines.records.dvc_outputs import adopt_dvc_outputs

            adopt_dvc_outputs(instance, specs, params, data_dir(params.experiment), say)  # after a plain `dvc pull`
            reasons = outdated_assets(instance, specs, data_dir(params.experiment), models=Path(params.promotion.directory),
                                      run_state=params.train.carry_optimizer_state or params.train.checkpoint_dtype != "float32",
                                      params=params)
            if params.experiment == "default":  # retired checkpoints a step that runs reads: from the remote, or made again
                from pipelines.storage.retention import needed_again

                reasons = needed_again(reasons, specs, params, say)
            total = len(specs)
            if not reasons:
                say(f"nothing to do: all {total} assets are up to date (`rl-assets run --all` reruns every one)")
                return True, []
            first, why = next(iter(reasons.items()))
            say(f"running {len(reasons)} of {total} assets, from {output_key(first.path)} ({why}); "
                f"the other {total - len(reasons)} are up to date (`--all` reruns every one)")
            for key, why in list(reasons.items())[1:]:  # every reason of its own; "X runs first" follows from those
                if not why.endswith("runs first"):
                    say(f"  also {output_key(key.path)}: {why}")
            keys = list(reasons)
        from pipelines.definitions.code_location import start_step_server
        from pipelines.launch.warm_child import warm_child_for

        quiet = {"loggers": {"brief_console": {"config": {"log_level": "INFO"}}}}  # step-level events, not engine debug
        with warm_child_for(params, keys, say), _one_line_per_skip():  # the compute child imports torch while the run starts
            start_step_server(params)
            result = execute_job(reconstructable(rl_pipeline_job), instance=instance, asset_selection=keys, run_config=quiet,
                                 tags={**run_tags(project_params()), **cli_tags()})
        if recorded := record_journal(log):  # what a run stopped before its compute step left (pipelines.launch.steps.compute_step_follows)
            say(f"dvc.lock: recorded {len(recorded)} stages the run wrote before it stopped ({', '.join(recorded)})")
        finish_storage(instance, params, command, say)
        if result.success:
            say(f"dagster run {result.run_id}: success")
            return True, []
        run = instance.get_run_by_id(result.run_id)
        if run.tags.get("dagster/failure_reason") == "UNEXPECTED_TERMINATION":  # Dagster's word for an interrupt: SIGTERM, SIGINT
            instance.report_run_canceled(run, message="stopped by a signal to `rl-assets` (SIGTERM or SIGINT); the step being "
                                                      "written was dropped, and the next `rl-assets run` continues from it")
        return False, failure_report(instance, result.run_id)


def finish_storage(instance, params, command: str, say) -> None:
    """At a run's end, failed or not: push what the remote lacks (waiting), say what is not there, then retire
    (storage.keep_rounds). Under `dvc repro` DVC records each stage after its command: `dvc push` after it."""
    from pipelines.storage import remote
    from pipelines.records.dvc import recording_enabled

    if params.storage.push == "manual" or not recording_enabled():
        return
    try:
        say(remote.summary(remote.push(instance, params, wait=True)))
    except remote.RemoteError as error:
        say(f"warning: storage: nothing pushed ({error}); `rl-assets push` tries again")
        return
    if command == "run" and params.storage.keep_rounds and params.experiment == "default":
        from pipelines.storage.retention import retire

        retire(params, params.storage.keep_rounds, from_remote=params.storage.retire_from_remote, instance=instance, say=say)


@contextlib.contextmanager
def _one_line_per_skip():
    """Drop the console's "Dependencies for step … Not executing." line per step downstream of a failure (the run
    coordinator logs them, in this process); the event log keeps them and `failure_report` counts the steps."""
    default = logging.getLoggerClass()

    class Console(default):  # Dagster's console logger is an instance of the current logger class
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.addFilter(lambda record: not str(record.getMessage()).rstrip().endswith("Not executing."))

    logging.setLoggerClass(Console)
    try:
        yield
    finally:
        logging.setLoggerClass(default)


def _step_names() -> dict[str, str]:
    """Step key -> what a user calls it: the asset key(s) it materializes, or `checks of <asset>`."""
    from pipelines.definitions.code_location import defs

    names = {}
    for assets_def in defs().resolve_asset_graph().assets_defs:
        if not assets_def.is_executable:
            continue
        keys = [output_key(key.path) for key in assets_def.keys]
        try:
            keys = flow_order(keys)  # the compute step's outputs in the order it writes them
        except ValueError:  # not all model outputs (raw_data, prompts): one key each anyway
            pass
        checked = sorted({output_key(check.asset_key.path) for check in assets_def.check_keys})
        names[assets_def.node_def.name] = ", ".join(keys) if keys else f"checks of {', '.join(checked)}"
    return names


def _error_text(failure, max_lines: int = 3) -> str:
    """The error's own message from a STEP_FAILURE event: a Failure's description, else the user exception's message."""
    data = failure.dagster_event.event_specific_data
    if data.user_failure_data is not None and data.user_failure_data.description:
        text = data.user_failure_data.description
    elif data.error is not None:
        error = data.error
        while error.cls_name in ("DagsterExecutionStepExecutionError", "DagsterUserCodeExecutionError") and error.cause is not None:
            error = error.cause  # Dagster's wrapper around the exception the asset raised
        text = error.message
    else:
        text = "failed (no error recorded)"
    lines = [line.strip()[:500] for line in text.strip().splitlines() if line.strip()]
    return "\n    ".join(lines[:max_lines] + (["..."] if len(lines) > max_lines else []))


def _log_path(instance, run_id: str, step_key: str, captures) -> str | None:
    """The captured stderr file of the step's last attempt, when the instance keeps compute logs on local disk."""
    manager = instance.compute_log_manager
    keys = [e.dagster_event.event_specific_data.file_key for e in captures if step_key in e.dagster_event.event_specific_data.step_keys]
    if not keys or not hasattr(manager, "get_captured_local_path"):
        return None
    path = Path(manager.get_captured_local_path([run_id, "compute_logs", keys[-1]], "err"))
    if not path.is_file():
        return None
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def flow_sorted(keys: list[str]) -> list[str]:
    """Asset keys in the order the flow writes them (raw_data, prompts, r00 ... evaluation, promoted_model)."""

    head = [key for key in ("raw_data", "prompts") if key in keys]
    return head + flow_order([key for key in keys if key not in head])


def failure_report(instance, run_id: str, names: dict[str, str] | None = None) -> list[str]:
    """The lines that end a failed run: each failed step with its error, one line for what was skipped, where the logs are."""
    from dagster import DagsterEventType

    events = instance.all_logs(run_id, of_type={DagsterEventType.STEP_FAILURE, DagsterEventType.STEP_RESTARTED,
                                                DagsterEventType.LOGS_CAPTURED})
    of = lambda kind: [e for e in events if e.dagster_event.event_type == kind]  # noqa: E731
    names = _step_names() if names is None else names
    lines, logs = [], []
    for failure in of(DagsterEventType.STEP_FAILURE):
        step = failure.dagster_event.step_key
        attempts = 1 + sum(e.dagster_event.step_key == step for e in of(DagsterEventType.STEP_RESTARTED))
        tried = f" (after {attempts} attempts)" if attempts > 1 else ""
        data = failure.dagster_event.event_specific_data.user_failure_data
        meta = {k: getattr(v, "value", v) for k, v in (data.metadata if data is not None else {}).items()}
        lines.append(f"failed: {meta.get('output') or names.get(step, step)}{tried}: {_error_text(failure)}")
        rest = [key for key in meta.get("not_written") or [] if key != meta.get("output")]
        if rest:
            lines.append(f"not written: {', '.join(rest)} (same step, after the failure)")
        if path := _log_path(instance, run_id, step, of(DagsterEventType.LOGS_CAPTURED)):
            logs.append(f"log of {meta.get('output') or names.get(step, step)}: {path}")
    run = instance.get_run_by_id(run_id)
    started = {e.dagster_event.step_key for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)}
    planned = run.step_keys_to_execute or [step.key for step in instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id).steps]
    skipped = [names.get(step, step) for step in planned if step not in started]
    selected = {output_key(key.path) for key in run.asset_selection} if run.asset_selection else None
    assets = [asset for name in skipped if not name.startswith("checks of ") for asset in name.split(", ")  # a step can write several
              if selected is None or asset in selected]
    if skipped:
        shown = ", ".join(assets[:6]) + (f", ... ({len(assets) - 6} more)" if len(assets) > 6 else "")
        checks = sum(name.startswith("checks of ") for name in skipped)  # not len(skipped) - len(assets): one step may write several
        lines.append(f"skipped: {len(assets)} assets after the failure ({shown or 'none'})"
                     + (f" and {checks} check step{'s' if checks > 1 else ''}" if checks else ""))
    if not lines:
        written = sorted({output_key(e.dagster_event.asset_key.path)
                          for e in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)})
        how = "stopped" if run.status.value == "CANCELED" else "failed"
        lines.append(f"{how} after writing {len(written)} outputs ({', '.join(flow_sorted(written)) or 'none'}); "
                     "`rl-assets run` continues from the first one not written" if started else f"{how} before any step ran (see the output above)")
    return [*lines, *logs, f"dagster run {run_id}: make ui, then http://127.0.0.1:3000/runs/{run_id}"]


def latest_run(experiment: str | None = None) -> dict | None:
    """The latest rl_pipeline run on the project instance (of `experiment`, when given): status, times, the checks that failed in it."""
    from dagster import DagsterEventType, DagsterInstance, RunsFilter

    with DagsterInstance.get() as instance:
        records = instance.get_run_records(RunsFilter(job_name="rl_pipeline", tags={"rl_assets/experiment": experiment} if experiment else {}), limit=1)
        if not records:
            return None
        record = records[0]
        checks = [e.dagster_event.event_specific_data for e in instance.all_logs(record.dagster_run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)]
        tags = record.dagster_run.tags
        return {"run_id": record.dagster_run.run_id, "status": record.dagster_run.status.value,
                "started": local_time(record.start_time), "ended": local_time(record.end_time),
                "failed_checks": [f"{output_key(c.asset_key.path)}:{c.check_name}" for c in checks if not c.passed],
                "experiment": tags.get("rl_assets/experiment"), "params_file": tags.get("rl_assets/params_file"),
                "overrides": [o for o in tags.get("rl_assets/overrides", "").split(";") if o], "params_hash": tags.get("rl_assets/params_hash"),
                "run_spec": tags.get("rl_assets/run_spec")}


def local_time(seconds: float | None) -> str | None:
    """A Dagster timestamp (seconds since the epoch) as this machine's local time, ISO 8601 with its UTC offset.

    >>> local_time(1700000000.5)[:10] in ("2023-11-14", "2023-11-15"), local_time(None)  # 22:13:20 UTC, any zone's date
    (True, None)
    """
    return None if seconds is None else datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def _latest_run_id() -> str | None:
    use_project_instance()
    return (latest_run() or {}).get("run_id")


def _observe(experiment: str, key: str, metadata: dict) -> None:
    """Record `metadata` on an output's asset in the UI (an observation: it changes no data version)."""
    from dagster import AssetKey, AssetObservation, DagsterInstance

    from rl_assets.core.paths import asset_key_path

    use_project_instance()
    with DagsterInstance.get() as instance:
        instance.report_runless_asset_event(AssetObservation(asset_key=AssetKey(asset_key_path(key, experiment)), metadata=metadata))


def run_params(run: dict | None):
    """The params the latest run used (its params file and overrides, from its tags), and a note when they cannot be had.

    Falls back to the project's params ($RL_ASSETS_PARAMS or params.yaml) for a run without those tags or before any run.
    """
    from pipelines.launch.params import load_project_params
    from rl_assets.core.config import Params, ParamsError
    from rl_assets.core.params_file import load_params

    if not run or not run.get("params_file"):
        return load_project_params(), None
    spec = run.get("run_spec")
    if spec and Path(spec).is_file():  # exactly what the run used (rl_assets.core.run_spec), whatever the file says now
        from rl_assets.core.run_spec import read_run_spec

        used = read_run_spec(spec).params
        try:
            same = load_params(run["params_file"], run["overrides"]).section_hash(*Params.model_fields) == run["params_hash"]
        except ParamsError:
            same = False
        return used, None if same else f"{run['params_file']} has changed since the latest run; showing what it ran with ({spec})"
    try:
        params = load_params(run["params_file"], run["overrides"])
    except ParamsError as error:
        return load_project_params(), f"the latest run's params can no longer be read ({error}); showing the project's"
    if params.section_hash(*Params.model_fields) != run["params_hash"]:
        return params, f"{run['params_file']} has changed since the latest run (params hash {run['params_hash']} then)"
    return params, None


def print_status() -> int:
    import json

    from rl_assets.run.status import project_status

    from pipelines.launch.params import load_project_params

    # The experiment of the params in effect ($RL_ASSETS_PARAMS, else params.yaml's): the one `serve` and `generate` use
    experiment = load_project_params().experiment
    run = latest_run(experiment)
    healthy = None if run is None else run["status"] not in ("FAILURE", "CANCELED")  # None: nothing ran to be healthy or not
    params, note = run_params(run)
    status = {"healthy": healthy, "latest_run": run, "experiment": params.experiment, **project_status(Path("."), params)}
    if run is None:
        status["never_ran"] = f"experiment {experiment!r} has no run yet: `rl-assets run` starts one"
    newest = latest_run()
    if newest is not None and newest["experiment"] != experiment:  # what ran last is not what this command describes
        status["latest_run_of_another_experiment"] = {
            "experiment": newest["experiment"], "run_id": newest["run_id"], "started": newest["started"],
            "shown_by": f"RL_ASSETS_PARAMS={newest['params_file'] or '<its params file>'} rl-assets status"}
    from dagster import DagsterInstance

    from pipelines.records.outdated import changed_outputs

    with DagsterInstance.get() as instance:  # outputs truncated, overwritten or deleted since they were recorded
        status["changed_outputs"] = changed_outputs(instance, params.rounds, params.experiment, data_dir(params.experiment),
                                                    Path(params.promotion.directory))
    if any(step["stale"] for step in status["running_steps"]) or status["changed_outputs"] or status["other_experiment_outputs"]:
        status["healthy"] = False  # a hung step, an output changed on disk, another experiment's outputs: whether or not a run was made
    if note:
        status["params_note"] = note
    from pipelines.storage.remote import last_push

    status["storage"] = last_push()  # the last push to the remote: where, when, what is not there
    print(json.dumps(status, indent=2, default=str))
    return 1 if status["healthy"] is False else 0


def storage_command(args, params) -> int:
    """`rl-assets push`, `pull` and `retire` (pipelines/storage/remote.py, pipelines/storage/retention.py)."""
    from dagster import DagsterInstance

    from pipelines.storage import remote
    from pipelines.records.writer import AnotherWriter, exclusive_writer

    say = functools.partial(print, file=sys.stderr)
    try:
        with DagsterInstance.get() as instance:
            if args.command == "push":
                pushed = remote.push(instance, params, wait=True)
                say(remote.summary(pushed))
                return 0 if pushed is not None and not pushed["failed"] else 1
            with exclusive_writer(instance, args.command, log=say):
                if args.command == "pull":
                    return 0 if remote.pull(instance, params, say)["dvc_pull_ok"] else 1
                from pipelines.storage.retention import retire

                if args.keep < 1:
                    say("error: --keep must be at least 1 (the next round trains from the last one)")
                    return 2
                retire(params, args.keep, dry_run=args.dry_run, from_remote=args.from_remote, instance=instance, say=say)
                return 0
    except AnotherWriter as error:
        say(f"error: {error}")
        return 3
    except (remote.RemoteError, ValueError, RuntimeError) as error:
        say(f"error: {error}")
        return 1


def refuse_params_under_dvc() -> str | None:
    """Under `dvc repro`, DVC records params.yaml: a run steered to other params would be recorded falsely."""
    if not os.environ.get("DVC_STAGE"):
        return None
    steered = [f"RL_ASSETS_PARAMS={os.environ['RL_ASSETS_PARAMS']}"] if os.environ.get("RL_ASSETS_PARAMS", "params.yaml") != "params.yaml" else []
    steered += [f"RL_ASSETS_SET={os.environ['RL_ASSETS_SET']}"] if os.environ.get("RL_ASSETS_SET") else []
    if not steered:
        return None
    stage = os.environ["DVC_STAGE"]
    # DVC removed the stage's outputs before it ran this command; its cache still holds the ones dvc.lock records
    return (f"dvc repro reproduces params.yaml, and dvc.lock records its values, but {' and '.join(steered)} would make this stage "
            "from other params; unset it, or run `rl-assets run` with it (that run records the params it used in dvc.lock). "
            f"DVC removed {stage}'s outputs before running it: `dvc checkout {stage}` brings back the ones dvc.lock records")


def main(argv=None) -> int:
    from rl_assets.cli import COMMANDS, add_commands, run_command

    parser = argparse.ArgumentParser(prog="rl-assets", description="RL post-training of language models as versioned assets.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="materialize every asset in one Dagster run, then print the evaluation table")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    run.add_argument("--all", dest="everything", action="store_true", help="rerun every asset, not only those missing or stale")
    one = commands.add_parser("materialize", help="materialize one or more assets by key, e.g. r01/rollouts")
    one.add_argument("keys", nargs="+")
    sync = commands.add_parser("dvc-sync", help="write dvc.yaml from the asset graph")
    sync.add_argument("--check", action="store_true", help="exit 1 if dvc.yaml differs from the generated file")
    commands.add_parser("status", help="JSON health summary: latest rl_pipeline run, current round, last metrics, promoted model")
    commands.add_parser("push", help="send every output, run state and promoted model the remote lacks (storage.remote)")
    commands.add_parser("pull", help="make this project what the remote holds, so `rl-assets run` continues or `serve` serves")
    retire = commands.add_parser("retire", help="remove round checkpoints other than the last N, the promoted and the best")
    retire.add_argument("--keep", type=int, required=True, metavar="N", help="the last N rounds' checkpoints are kept")
    retire.add_argument("--dry-run", action="store_true", help="list what would be retired, change nothing")
    retire.add_argument("--from-remote", action="store_true", help="delete their files from the remote too (storage.retire_from_remote)")
    add_commands(commands)
    args = parser.parse_args(argv)
    if args.command in COMMANDS:  # the library's: what only Dagster knows is handed over, Dagster imported only if asked
        return run_command(args, latest_run_id=_latest_run_id, status_command=[sys.executable, "-m", "pipelines", "status"], observe=_observe)

    if getattr(args, "overrides", None):
        os.environ["RL_ASSETS_SET"] = ";".join(args.overrides)
    from pipelines.launch.params import load_project_params
    from rl_assets.core.config import ParamsError

    if refused := refuse_params_under_dvc():
        print(f"error: {refused}", file=sys.stderr)
        return 2
    try:  # fail on a bad params file, user code that does not load, a missing data source or a model that misfits its tokenizer before a run starts
        params = load_project_params()
        if args.command in ("run", "materialize"):
            from pipelines.launch.params import RUN_SPEC_ENV, project_params
            from rl_assets.core.run_spec import write_run_spec
            from rl_assets.run.preflight import preflight

            resource = project_params()
            preflight(params, resource.path, getattr(args, "keys", None))
            # Resolved once, here: every step, child and later dvc.lock record of this run reads this file, not params.yaml
            os.environ[RUN_SPEC_ENV] = str(write_run_spec(resource.path, resource.overrides))
    except ParamsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.command == "dvc-sync":
        from pipelines.definitions.code_location import defs
        from pipelines.records.dvc import dvc_yaml_text

        text = dvc_yaml_text(defs().resolve_asset_graph())
        current = Path("dvc.yaml").read_text() if Path("dvc.yaml").is_file() else ""
        if args.check:
            if current != text:
                print("dvc.yaml differs from the asset graph; run `rl-assets dvc-sync`", file=sys.stderr)
                return 1
            return 0
        Path("dvc.yaml").write_text(text)
        print(f"wrote dvc.yaml ({text.count('cmd:')} stages)")
        import yaml

        from pipelines.records.dvc import prune_lock

        if dropped := prune_lock(set(yaml.safe_load(text)["stages"])):
            print(f"dvc.lock: dropped {len(dropped)} stages dvc.yaml no longer has ({', '.join(dropped)})")
        return 0

    use_project_instance()
    if args.command == "status":
        return print_status()
    if args.command in ("push", "pull", "retire"):
        return storage_command(args, params)
    from pipelines.records.writer import AnotherWriter

    started = time.perf_counter()
    try:
        ok, report = execute(args.command, args.keys if args.command == "materialize" else None, getattr(args, "everything", False))
    except AnotherWriter as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    if not ok:  # last in the output: what failed, its own error, where the full log is
        stopped = any(line.startswith("stopped ") for line in report)
        print(f"\n{args.command} {'STOPPED' if stopped else 'FAILED'} after {time.perf_counter() - started:.0f} s", file=sys.stderr)
        print("\n".join(report), file=sys.stderr)
        return 1
    if args.command == "run" and set(params.tracking.backends) - {"tensorboard"}:  # one tracker run per pipeline run
        from rl_assets.eval.trackers import log_run

        try:
            print(f"tracked: {log_run(Path('.'), params, latest_run()['run_id'])}", file=sys.stderr)
        except Exception as error:  # noqa: BLE001 - the run succeeded; a tracker that is down or missing is a warning
            print(f"warning: tracking failed ({type(error).__name__}: {error}); `rl-assets track` retries", file=sys.stderr)
    if args.command == "run":
        from rl_assets.eval.reports import summary_text

    
        print(summary_text(data_dir(params.experiment)))
        print(f"\nfinished in {time.perf_counter() - started:.0f} s; outputs under {data_dir(params.experiment)}/; runs and metadata: make ui (http://127.0.0.1:3000)")
    return 0

