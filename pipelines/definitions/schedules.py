"""Retraining triggers: a cron schedule and a sensor on the raw data version, both launching rl_pipeline.

Which model a retraining run starts from is `promotion.warm_start` (the promoted model or the base
model); both triggers are off unless params.yaml switches them on (`schedule.enabled`,
`schedule.watch_raw_data`) or someone does in the UI.
"""

import hashlib
from pathlib import Path

from dagster import DefaultScheduleStatus, DefaultSensorStatus, RunRequest, ScheduleDefinition, SensorEvaluationContext, SkipReason, sensor

from pipelines.launch.params import load_project_params
from rl_assets.core.config import Params
from rl_assets.core.storage import content_hash


def raw_data_version(params: Params) -> str:
    """Hash of every file or folder the raw data sources read (the raw_data DVC deps): changes exactly when they do."""
    from rl_assets.data.raw_data import source_inputs

    paths = source_inputs(params.raw_data)
    return hashlib.md5("".join(f"{path}\0{content_hash(path) if Path(path).exists() else 'missing'}\n" for path in paths).encode()).hexdigest()


def retrain_schedule(params: Params) -> ScheduleDefinition:
    on = DefaultScheduleStatus.RUNNING if params.schedule.enabled else DefaultScheduleStatus.STOPPED
    return ScheduleDefinition(name="retrain_schedule", job_name="rl_pipeline", cron_schedule=params.schedule.cron,
                              execution_timezone="UTC", default_status=on,
                              description=f"Retrain on the cron of schedule.cron ({params.schedule.cron}, UTC).")


def raw_data_sensor(params: Params):
    """The sensor on the raw data version, on when `schedule.watch_raw_data` says so; each tick reads the project's params afresh."""

    @sensor(name="raw_data_sensor", job_name="rl_pipeline", minimum_interval_seconds=60,
            default_status=DefaultSensorStatus.RUNNING if params.schedule.watch_raw_data else DefaultSensorStatus.STOPPED,
            description="Retrain when the raw data files change; the first tick records the current version without a run.")
    def tick(context: SensorEvaluationContext):
        version = raw_data_version(load_project_params())
        if context.cursor is None:
            context.update_cursor(version)
            return SkipReason(f"recorded raw data version {version}; a run starts when it changes")
        if context.cursor == version:
            return SkipReason(f"raw data unchanged ({version})")
        context.update_cursor(version)
        return RunRequest(run_key=f"raw-data-{version}", tags={"rl_assets/raw_data_version": version})

    return tick
