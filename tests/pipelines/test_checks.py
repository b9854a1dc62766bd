"""Asset checks on a fake two-round graph: the real guards, evaluated the way the real assets do, by stand-in assets.

The stand-in assets write nothing; the files come from ops_support's fake project, so a test sets
up exactly the metric or table it means to break and watches what Dagster runs after it.
"""

from __future__ import annotations

import pytest
from dagster import AssetCheckSeverity, AssetKey, MaterializeResult, asset, materialize

from conftest import import_pipelines
from ops_support import GOOD_METRICS, make_fake_project

ROUNDS = 2


def stand_ins(rounds: int) -> list:
    """Assets with the real graph's keys, dependencies and guards, which write nothing and only run their guards."""
    checks = import_pipelines("pipelines.launch.checks")

    def stand_in(key: str, deps: list[str]):
        @asset(key=AssetKey(key.split("/")), deps=[AssetKey(d.split("/")) for d in deps], check_specs=checks.guard_specs(AssetKey(key.split("/"))),
               required_resource_keys={"params"})
        def _asset(context):
            yield from checks.guarded(key, context.resources.params.load(), MaterializeResult())
        return _asset

    graph = {"raw_data": [], "prompts": ["raw_data"], "r00/checkpoint": ["prompts"]}
    for n in range(1, rounds + 1):
        r, previous = f"r{n:02d}", f"r{n - 1:02d}/checkpoint"
        graph.update({f"{r}/rollouts": [previous, "prompts"], f"{r}/rewards": [f"{r}/rollouts"], f"{r}/checkpoint": [f"{r}/rewards", previous]})
    graph["evaluation"] = [f"r{n:02d}/checkpoint" for n in range(rounds + 1)]
    return [stand_in(key, deps) for key, deps in graph.items()]


def run_checks(root, monkeypatch):
    """(materialized asset keys, {(asset, check): evaluation}) of one in-process run over the fake project."""
    from pipelines.launch.params import ParamsResource

    monkeypatch.chdir(root)
    result = materialize(stand_ins(ROUNDS), resources={"params": ParamsResource(path=str(root / "params.yaml"))},
                         raise_on_error=False)
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    evaluations = {(e.asset_check_evaluation_data.asset_key.to_user_string(), e.asset_check_evaluation_data.check_name): e.asset_check_evaluation_data
                   for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    return result.success, materialized, evaluations


def test_a_healthy_project_passes_every_check(tmp_path, monkeypatch):
    success, materialized, evaluations = run_checks(make_fake_project(tmp_path, rounds=ROUNDS), monkeypatch)
    assert success and "evaluation" in materialized
    failed = {key: e.description for key, e in evaluations.items() if not e.passed}
    assert failed == {}
    assert {check for asset_key, check in evaluations if asset_key == "r02/checkpoint"} == {
        "metrics_finite", "kl_within_limit", "entropy_not_collapsed", "lineage"}
    assert {asset_key for asset_key, _ in evaluations} == {"raw_data", "prompts", "evaluation"} | {
        f"r{n:02d}/{s}" for n in (1, 2) for s in ("rollouts", "rewards", "checkpoint")} | {"r00/checkpoint"}


def test_kl_over_the_limit_fails_the_checkpoint_and_stops_the_rounds_after_it(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, rounds=ROUNDS, metrics={1: {**GOOD_METRICS, "kl": 0.2}})
    success, materialized, evaluations = run_checks(root, monkeypatch)
    kl = evaluations[("r01/checkpoint", "kl_within_limit")]
    assert not success and not kl.passed and kl.severity == AssetCheckSeverity.ERROR and kl.blocking
    assert "kl=0.2 > kl_max=0.03" in kl.description
    assert "r01/checkpoint" in materialized
    assert not materialized & {"r02/rollouts", "r02/rewards", "r02/checkpoint", "evaluation"}


@pytest.mark.parametrize("breakage", [{"metrics": {1: {**GOOD_METRICS, "loss": float("nan")}}},
                                      {"metrics": {1: {**GOOD_METRICS, "entropy": 0.0}}},
                                      {"rewards": {1: [1.0, 1.0, 0.0, 0.0]}}])
def test_nan_metrics_collapsed_entropy_and_signal_free_rewards_also_block(tmp_path, monkeypatch, breakage):
    success, materialized, evaluations = run_checks(make_fake_project(tmp_path, rounds=ROUNDS, **breakage), monkeypatch)
    assert not success and [key for key, e in evaluations.items() if not e.passed][0][0].startswith("r01/")
    assert "r02/rollouts" not in materialized


def test_a_reward_regression_warns_without_stopping_the_run(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, rounds=ROUNDS, rewards={1: [1.0, 0.0, 1.0, 0.0], 2: [0.1, 0.0, 0.1, 0.0]})
    success, materialized, evaluations = run_checks(root, monkeypatch)
    regression = evaluations[("r02/rewards", "reward_not_regressed")]
    assert success and not regression.passed and regression.severity == AssetCheckSeverity.WARN
    assert "evaluation" in materialized


def test_a_stale_table_fails_its_lineage_check(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, rounds=ROUNDS)
    make_fake_project(tmp_path / "other", rounds=ROUNDS, seed=1)
    (root / "data/r01/rollouts.parquet").write_bytes((tmp_path / "other/data/r01/rollouts.parquet").read_bytes())
    success, materialized, evaluations = run_checks(root, monkeypatch)
    assert not success and not evaluations[("r01/rollouts", "lineage")].passed
    assert "r01/rewards" not in materialized
