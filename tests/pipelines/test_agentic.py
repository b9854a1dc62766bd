"""A micro agentic pipeline end to end: SFT on demonstration episodes, a round of calculator episodes, evaluation in episodes.

The same assets, guards and tables as a plain round: the rollouts hold whole episodes (policy and
tool tokens told apart), the rewards rescore them without resampling, and DuckDB sums them up.
"""

from __future__ import annotations

import shutil

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from conftest import REPO, copy_project, python
from rl_assets.eval.lineage import connect_tables
from rl_assets.core.schemas import read_table
from rl_assets.core.storage import content_hash

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def agentic_project(micro_template, tmp_path_factory):
    project = copy_project(micro_template, tmp_path_factory.mktemp("agentic") / "project")
    shutil.copy(REPO / "examples" / "agentic" / "multiplication.json", project / "data" / "raw" / "multiplication.json")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["raw_data"] = {"sources": [{"kind": "generator", "path": "data/raw/multiplication.json", "count": 200}]}
    params["prompts"] = {**params["prompts"], "template": "{prompt}="}
    # enough for the micro model to start its answers with the call (the micro default, 5 steps, is not)
    params["sft"] = {**params["sft"], "max_steps": 200, "learning_rate": 1.0e-2, "demonstration": ["<call calculator>{problem}</call>", "{answer}"]}
    params["rollouts"] = {**params["rollouts"], "tools": ["calculator"], "max_new_tokens": 32, "max_episode_tokens": 40, "max_turns": 2}
    params["evaluation"] = {**params["evaluation"], "max_new_tokens": 32}
    params["rewards"]["functions"].append({"name": "tool_success", "weight": 0.0})
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    done = python(["-m", "pipelines", "run"], project, timeout=1200)
    return project, done.stdout + done.stderr


def test_rollouts_are_whole_episodes_with_the_tool_tokens_marked(agentic_project):
    project, _ = agentic_project
    rows = read_table(project / "data/r01/rollouts.parquet", "rollouts").to_pylist()
    assert {row["environment"] for row in rows} == {"tools"}
    for row in rows:
        assert len(row["completion_mask"]) == len(row["completion_ids"]) == len(row["logprobs"])
        assert all(value == 0.0 for value, keep in zip(row["logprobs"], row["completion_mask"]) if not keep)
        policy = [t for t in row["turns"] if t["role"] == "assistant"]
        assert len(policy) == row["num_turns"] and all(row["completion_mask"][t["start"]:t["end"]] == [1] * (t["end"] - t["start"]) for t in policy)
    called = [row for row in rows if row["tool_calls"]]
    assert called, "the demonstrations taught no tool call"
    assert any(0 in row["completion_mask"] for row in called)  # the calculator's results are in the episode, not trained on


def test_episodes_show_on_the_materialization_with_their_guards(agentic_project):
    project, _ = agentic_project
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        event = instance.get_latest_materialization_event(AssetKey(["r01", "rollouts"]))
        checks = {e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data
                  for e in instance.all_logs(event.run_id) if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"
                  and e.dagster_event.event_specific_data.asset_key == AssetKey(["r01", "rollouts"])}
    metadata = event.asset_materialization.metadata
    assert {"tool_call_rate", "mean_turns", "tool_error_share", "policy_token_share"} <= set(metadata)
    assert "| turn | role | text |" in metadata["episodes"].value and "<call calculator>" in metadata["episodes"].value
    assert {"tool_errors", "truncated_episodes"} <= set(checks)
    assert not checks["truncated_episodes"].description.startswith("skipped")


def test_evaluation_runs_episodes_and_reports_the_tool_call_rate(agentic_project):
    project, _ = agentic_project
    rows = read_table(project / "data/evaluation.parquet", "evaluation").to_pylist()
    assert all(row["tool_call_rate"] is not None and 0.0 <= row["tool_call_rate"] <= 1.0 for row in rows)
    stats = connect_tables(project / "data").sql("select round, episodes, tool_call_rate, turns_per_episode from episode_stats").fetchall()
    assert [s[:2] for s in stats] == [(1, 32)] and stats[0][3] >= 1.0


def test_episodes_are_rescored_without_resampling(agentic_project):
    project, _ = agentic_project
    rollouts = content_hash(project / "data/r01/rollouts.parquet")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rewards"]["functions"][-1]["weight"] = 1.0  # tool_success now counts
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "materialize", "r01/rewards"], project, timeout=600)
    assert content_hash(project / "data/r01/rollouts.parquet") == rollouts
    rewards = read_table(project / "data/r01/rewards.parquet", "rewards")
    calls = read_table(project / "data/r01/rollouts.parquet", "rollouts")["tool_calls"].to_pylist()
    expected = [sum(c["error"] is None for c in made) / len(made) if made else None for made in calls]
    assert rewards["score_tool_success"].to_pylist() == pytest.approx(expected)


AGENTIC = REPO / "examples" / "agentic"


def test_the_agentic_demo_and_its_baseline_validate_and_differ_only_in_the_tool(monkeypatch):
    from rl_assets.core.params_file import load_params
    from rl_assets.data.raw_data import check_sources

    monkeypatch.chdir(REPO)
    tools, baseline = load_params("examples/agentic/params.yaml"), load_params("examples/agentic/no_tools.yaml")
    for params, name in ((tools, "params.yaml"), (baseline, "no_tools.yaml")):
        check_sources(params, f"examples/agentic/{name}", REPO)
    assert tools.rollouts.episodes == ("tools", {"tools": ["calculator"], "format": "tagged"}) and baseline.rollouts.episodes is None
    assert tools.sft.demonstration and not baseline.sft.demonstration
    same = ("seed", "rounds", "model", "raw_data", "prompts", "rewards", "train", "guards")
    assert all(getattr(tools, section) == getattr(baseline, section) for section in same)
    assert tools.experiment != baseline.experiment  # promoted apart


@pytest.mark.e2e
def test_the_agentic_demo_runs_and_its_rounds_learn_to_use_the_tool(micro_copy):
    """The demo file as `make agentic` runs it, for two of its three rounds and on half its held-out prompts (the suite's
    time): r02 must answer 5 points more often than r00, and call the tool more often."""
    project = micro_copy
    (project / "examples" / "agentic").mkdir(parents=True)
    for name in ("params.yaml", "multiplication.json"):
        shutil.copy(AGENTIC / name, project / "examples" / "agentic" / name)
    python(["-m", "pipelines", "run", "--set", "rounds=2", "--set", "evaluation.max_prompts=150"], project, timeout=900,
           RL_ASSETS_PARAMS="examples/agentic/params.yaml", RL_ASSETS_DVC_COMMIT="0")
    sampled = {r["checkpoint"]: r for r in read_table(project / "data/experiments/agentic/evaluation.parquet", "evaluation").to_pylist()
               if r["mode"] == "sampled"}  # experiment "agentic" (the file names it): its own data folder
    first, last = sampled["r00/checkpoint"], sampled["r02/checkpoint"]
    assert last["accuracy"] > first["accuracy"] + 0.05 and last["tool_call_rate"] > first["tool_call_rate"]
