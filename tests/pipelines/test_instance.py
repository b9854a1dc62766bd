"""dagster.yaml: the instance the UI, schedules and sensors run on watches, retries and serializes runs."""

from __future__ import annotations

import json
import shutil

from conftest import REPO, python


def test_instance_has_run_monitoring_retries_and_limits(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    code = ("import json; from dagster import DagsterInstance; i = DagsterInstance.get(); c = i.get_concurrency_config(); "
            "print(json.dumps({'monitoring': i.run_monitoring_enabled, 'max_runtime': i.run_monitoring_settings.get('max_runtime_seconds'), "
            "'retries': i.run_retries_max_retries, 'retry_on_step_failure': i.run_retries_retry_on_asset_or_op_failure, "
            "'pool_limit': c.pool_config.default_pool_limit, 'run_limits': c.run_queue_config.tag_concurrency_limits}))")
    settings = json.loads(python(["-c", code], tmp_path, timeout=120, DAGSTER_HOME=str(home)).stdout.strip().splitlines()[-1])
    assert settings["monitoring"] and settings["max_runtime"] > 0
    assert settings["retries"] >= 1 and settings["retry_on_step_failure"] is False  # only crashed workers, not failed guards
    assert settings["pool_limit"] == 1  # the gpu pool: one compute step at a time across runs
    assert {"key": "rl_assets/writes", "limit": 1} in settings["run_limits"]
