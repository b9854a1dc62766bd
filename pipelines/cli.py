"""Run the graph through Dagster from the command line (what `make run` and DVC stages call).

    python -m pipelines run [--set section.key=value ...]   every asset, one Dagster run
    python -m pipelines materialize r01/rollouts            one asset (each DVC stage's command)
    python -m pipelines dvc-sync [--check]                  write (or check) dvc.yaml from the graph
    python -m pipelines status                              JSON health summary; exit 1 when the latest run failed
"""

import argparse
import os
import sys
import time
from pathlib import Path


def use_project_instance() -> None:
    """Point DAGSTER_HOME at .dagster/ in the project, linked to the project's dagster.yaml."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if Path("dagster.yaml").is_file() and not config.exists():
        config.symlink_to(Path("dagster.yaml").resolve())


def rl_pipeline_job():
    from pipelines.definitions import defs

    return defs.resolve_job_def("rl_pipeline")


def execute(selection: list[str] | None) -> bool:
    """Execute the job (or a selection of its assets) on the project instance; True on success."""
    from dagster import AssetKey, DagsterInstance, execute_job, reconstructable

    with DagsterInstance.get() as instance:
        keys = [AssetKey.from_user_string(k) for k in selection] if selection else None
        quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}  # step-level events, not engine debug
        result = execute_job(reconstructable(rl_pipeline_job), instance=instance, asset_selection=keys, run_config=quiet)
        print(f"dagster run {result.run_id}: {'success' if result.success else 'FAILED'}", file=sys.stderr)
        return result.success


def latest_run() -> dict | None:
    """The latest rl_pipeline run on the project instance: status, times, and the checks that failed in it."""
    from dagster import DagsterEventType, DagsterInstance, RunsFilter

    with DagsterInstance.get() as instance:
        records = instance.get_run_records(RunsFilter(job_name="rl_pipeline"), limit=1)
        if not records:
            return None
        record = records[0]
        checks = [e.dagster_event.event_specific_data for e in instance.all_logs(record.dagster_run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)]
        return {"run_id": record.dagster_run.run_id, "status": record.dagster_run.status.value,
                "started": record.start_time, "ended": record.end_time,
                "failed_checks": [f"{c.asset_key.to_user_string()}:{c.check_name}" for c in checks if not c.passed]}


def print_status() -> int:
    import json

    from pipelines.steps import load_project_params
    from rl_assets.status import project_status

    run = latest_run()
    healthy = run is None or run["status"] not in ("FAILURE", "CANCELED")
    print(json.dumps({"healthy": healthy, "latest_run": run, **project_status(Path("."), load_project_params())}, indent=2, default=str))
    return 0 if healthy else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="materialize every asset in one Dagster run, then print the evaluation table")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    one = commands.add_parser("materialize", help="materialize one or more assets by key, e.g. r01/rollouts")
    one.add_argument("keys", nargs="+")
    sync = commands.add_parser("dvc-sync", help="write dvc.yaml from the asset graph")
    sync.add_argument("--check", action="store_true", help="exit 1 if dvc.yaml differs from the generated file")
    commands.add_parser("status", help="JSON health summary: latest rl_pipeline run, current round, last metrics, promoted model")
    args = parser.parse_args(argv)

    if getattr(args, "overrides", None):
        os.environ["RL_ASSETS_SET"] = ";".join(args.overrides)
    from pipelines.steps import load_project_params
    from rl_assets.config import ParamsError

    try:  # fail on a bad params file before Dagster loads the graph or starts a run
        load_project_params()
    except ParamsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.command == "dvc-sync":
        from pipelines.definitions import defs
        from pipelines.dvc import dvc_yaml_text

        text = dvc_yaml_text(defs.resolve_asset_graph())
        current = Path("dvc.yaml").read_text() if Path("dvc.yaml").is_file() else ""
        if args.check:
            if current != text:
                print("dvc.yaml differs from the asset graph; run `rl-assets dvc-sync`", file=sys.stderr)
                return 1
            return 0
        Path("dvc.yaml").write_text(text)
        print(f"wrote dvc.yaml ({text.count('cmd:')} stages)")
        return 0

    use_project_instance()
    if args.command == "status":
        return print_status()
    started = time.perf_counter()
    ok = execute(args.keys if args.command == "materialize" else None)
    if args.command == "run":
        from rl_assets.evaluation import summary_text

        print(summary_text(Path(".")) if ok else "pipeline failed: see the run in the Dagster UI (make ui)")
        print(f"\nfinished in {time.perf_counter() - started:.0f} s; outputs under data/; runs and metadata: make ui (http://127.0.0.1:3000)")
    return 0 if ok else 1

