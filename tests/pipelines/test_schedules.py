"""The retraining schedule and the raw-data sensor, evaluated with Dagster's test contexts."""

from __future__ import annotations

from dagster import DefaultScheduleStatus, DefaultSensorStatus, RunRequest, SkipReason, build_schedule_context, build_sensor_context

from conftest import import_pipelines
from ops_support import RAW, make_fake_project
from rl_assets.core.params_file import load_params


def test_sensor_records_the_raw_data_version_then_fires_once_per_change(tmp_path, monkeypatch):
    schedules = import_pipelines("pipelines.definitions.schedules")
    root = make_fake_project(tmp_path)
    monkeypatch.chdir(root)
    monkeypatch.delenv("RL_ASSETS_PARAMS", raising=False)
    monkeypatch.delenv("RL_ASSETS_SET", raising=False)
    sensor = schedules.raw_data_sensor(load_params(root / "params.yaml"))

    with build_sensor_context() as context:
        first = sensor(context)
        version = context.cursor
    assert isinstance(first, SkipReason) and version in first.skip_message

    with build_sensor_context(cursor=version) as context:
        assert isinstance(sensor(context), SkipReason)

    (root / RAW).write_text((root / RAW).read_text() + '{"question": "2+2=", "solution": "4"}\n')
    with build_sensor_context(cursor=version) as context:
        request = sensor(context)
        changed = context.cursor
    assert isinstance(request, RunRequest) and changed != version
    assert request.run_key == f"raw-data-{changed}" and request.tags["rl_assets/raw_data_version"] == changed
    assert schedules.raw_data_version(load_params(root / "params.yaml")) == changed


def test_schedule_takes_cron_and_switch_from_params(tmp_path):
    schedules = import_pipelines("pipelines.definitions.schedules")
    root = make_fake_project(tmp_path)
    off = schedules.retrain_schedule(load_params(root / "params.yaml"))
    assert off.cron_schedule == "0 3 * * 1" and off.default_status == DefaultScheduleStatus.STOPPED and off.job_name == "rl_pipeline"
    on = schedules.retrain_schedule(load_params(root / "params.yaml", ["schedule.enabled=true", "schedule.cron='*/30 * * * *'"]))
    assert on.cron_schedule == "*/30 * * * *" and on.default_status == DefaultScheduleStatus.RUNNING
    with build_schedule_context() as context:
        assert isinstance(on.evaluate_tick(context).run_requests[0], RunRequest)


def test_code_location_has_the_triggers_off_by_default_and_guards_on_every_asset():
    defs = import_pipelines("pipelines.definitions.code_location").defs()
    assert defs.resolve_schedule_def("retrain_schedule").default_status == DefaultScheduleStatus.STOPPED
    assert defs.resolve_sensor_def("raw_data_sensor").default_status == DefaultSensorStatus.STOPPED
    graph = defs.resolve_asset_graph()
    checked = {key.asset_key.to_user_string() for key in graph.asset_check_keys}
    assert checked == {k.to_user_string() for k in graph.get_all_asset_keys()} - {"promoted_model"}
    blocking = {(key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys if graph.get_check_spec(key).blocking}
    assert ("r01/checkpoint", "kl_within_limit") in blocking and ("r01/rewards", "reward_not_regressed") not in blocking
    assert defs.resolve_job_def("rl_pipeline").tags["rl_assets/writes"] == "data"
