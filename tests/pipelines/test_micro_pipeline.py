"""One in-process `dagster.materialize` of the whole micro pipeline, then its outputs and lineage."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch
from dagster import PipesSubprocessClient, materialize
from safetensors.torch import load_file

from conftest import MICRO_OUTPUTS, TABLES, copy_project, import_pipelines, micro_params, python
from rl_assets.core.checkpoints import LINEAGE_FILE, checkpoint_id, read_lineage, weights_hash
from rl_assets.core.schemas import read_table, reward_function_names, rewards_schema, write_table
from rl_assets.core.storage import content_hash, file_hash

pytestmark = pytest.mark.e2e

PARAMS = micro_params()
ROUNDS = PARAMS["rounds"]


@pytest.fixture(scope="module")
def pipeline(micro_template, tmp_path_factory):
    """(project, {asset key: AssetMaterialization}) after one in-process run of every micro asset."""
    assets = import_pipelines("pipelines.definitions.assets")
    compute = import_pipelines("pipelines.definitions.compute")
    from pipelines.launch.params import ParamsResource

    project = copy_project(micro_template, tmp_path_factory.mktemp("materialize") / "project")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        params = ParamsResource(path=str(project / "params.yaml"))
        definitions = [*assets.data_assets(params.load()), *compute.compute_assets(params.load())]
        patch.syspath_prepend(str(project))  # the 'micro_rewards:digit_share' reward runs in this process
        patch.setenv("RL_ASSETS_DVC_COMMIT", "0")  # DVC recording is test_dvc's business
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.delenv("DVC_STAGE", raising=False)
        result = materialize(definitions, selection=list(MICRO_OUTPUTS), resources={"pipes": PipesSubprocessClient(),  # not the promotion
                                                                                     "params": params})
    assert result.success
    events = {e.asset_key.to_user_string(): e.materialization for e in result.get_asset_materialization_events()}
    return project, events


def test_every_output_exists_and_reads_back(pipeline):
    project, events = pipeline
    assert set(events) == set(MICRO_OUTPUTS)
    for key, name in TABLES.items():
        assert read_table(project / MICRO_OUTPUTS[key], name).num_rows > 0, key
    for key in ("r00/checkpoint", "r01/checkpoint"):
        assert (project / MICRO_OUTPUTS[key] / "model.safetensors").is_file()
        assert (project / MICRO_OUTPUTS[key] / LINEAGE_FILE).is_file()
    assert json.loads((project / "data/evaluation.json").read_text())
    assert (project / "data/evaluation.png").stat().st_size > 0
    # the carried AdamW moments are run state: in no checkpoint folder (nor its data version), one file per checkpoint on disk
    assert not list((project / "data").glob("r*/checkpoint/optimizer.pt"))
    r01 = read_lineage(project / MICRO_OUTPUTS["r01/checkpoint"])["checkpoint_id"]
    assert [p.name for p in (project / "data/run_state/optimizer").iterdir()] == [f"{r01}.pt"]
    assert torch.load(project / f"data/run_state/optimizer/{r01}.pt")["checkpoint_id"] == r01
    # outputs are renamed into place: no temporary siblings are left behind
    assert not [p for p in (project / "data").rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


def test_data_versions_are_content_hashes(pipeline):
    """Tables: their MD5 (what DVC records); checkpoints: their id, the weights' hash computed once when saved."""
    project, events = pipeline
    for key, materialization in events.items():
        path = project / MICRO_OUTPUTS[key]
        expected = checkpoint_id(path) if key.endswith("checkpoint") else content_hash(path)
        assert materialization.tags["dagster/data_version"] == expected, key


def test_rollouts_name_the_checkpoint_that_sampled_them(pipeline):
    project, _ = pipeline
    r00 = project / MICRO_OUTPUTS["r00/checkpoint"]
    rollouts = read_table(project / MICRO_OUTPUTS["r01/rollouts"], "rollouts")
    card = read_lineage(r00)
    assert card["checkpoint_id"] == weights_hash(r00)  # the id is the content hash of the weights
    assert set(rollouts["policy_id"].to_pylist()) == {card["checkpoint_id"]}
    assert set(rollouts["prompts_hash"].to_pylist()) == {file_hash(project / MICRO_OUTPUTS["prompts"])}
    assert rollouts.num_rows == PARAMS["rollouts"]["prompts_per_round"] * PARAMS["rollouts"]["samples_per_prompt"]


def test_round_checkpoint_lineage_names_parent_and_training_tables(pipeline):
    project, _ = pipeline
    card = read_lineage(project / MICRO_OUTPUTS["r01/checkpoint"])
    assert card["round"] == 1
    assert card["parent"] == read_lineage(project / MICRO_OUTPUTS["r00/checkpoint"])["checkpoint_id"]
    assert card["trained_on"] == {"rollouts": file_hash(project / MICRO_OUTPUTS["r01/rollouts"]),
                                  "rewards": file_hash(project / MICRO_OUTPUTS["r01/rewards"])}
    assert card["world_size"] == 1
    assert card["checkpoint_id"] == weights_hash(project / MICRO_OUTPUTS["r01/checkpoint"])


def test_training_changed_the_weights(pipeline):
    project, _ = pipeline
    before = load_file(project / MICRO_OUTPUTS["r00/checkpoint"] / "model.safetensors")
    after = load_file(project / MICRO_OUTPUTS["r01/checkpoint"] / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(before[k].shape == after[k].shape for k in before)
    assert max((before[k].float() - after[k].float()).abs().max().item() for k in before) > 0


def test_evaluation_has_every_checkpoint_in_both_modes(pipeline):
    project, _ = pipeline
    table = read_table(project / MICRO_OUTPUTS["evaluation"], "evaluation")
    assert table.num_rows == 2 * (ROUNDS + 1)
    assert sorted(zip(table["checkpoint"].to_pylist(), table["mode"].to_pylist())) == sorted(
        (f"r{n:02d}/checkpoint", mode) for n in range(ROUNDS + 1) for mode in ("greedy", "sampled"))
    ids = dict(zip(table["checkpoint"].to_pylist(), table["checkpoint_id"].to_pylist()))
    for n in range(ROUNDS + 1):
        assert ids[f"r{n:02d}/checkpoint"] == read_lineage(project / f"data/r{n:02d}/checkpoint")["checkpoint_id"]


def test_each_checkpoint_is_evaluated_once_by_the_step_that_made_it(pipeline):
    project, events = pipeline
    table = read_table(project / MICRO_OUTPUTS["evaluation"], "evaluation").to_pylist()
    for n in range(ROUNDS + 1):
        key = f"r{n:02d}/checkpoint"
        shown = {name: getattr(value, "value", value) for name, value in events[key].metadata.items()}
        for row in (r for r in table if r["checkpoint"] == key):  # the same numbers on the checkpoint as in the table
            assert shown[f"heldout_{row['mode']}_accuracy"] == row["accuracy"], key
            assert shown[f"heldout_{row['mode']}_pass_at_k"] == row["pass_at_k"], key
    ids = {read_lineage(project / f"data/r{n:02d}/checkpoint")["checkpoint_id"] for n in range(ROUNDS + 1)}
    kept = sorted((project / "data/evaluations").glob("*.json"))
    assert {path.name.split("-")[0] for path in kept} == ids and len(kept) == ROUNDS + 1
    assert getattr(events["evaluation"].metadata["checkpoints_evaluated_before"], "value", None) == ROUNDS + 1  # none evaluated twice


def test_materialization_metadata(pipeline):
    project, events = pipeline
    meta = {key: {name: getattr(value, "value", value) for name, value in m.metadata.items()} for key, m in events.items()}
    rewards = read_table(project / MICRO_OUTPUTS["r01/rewards"], "rewards")["reward"].to_pylist()

    assert meta["r01/rewards"]["rows"] == len(rewards)
    assert meta["r01/rewards"]["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert {"reward_std", "equal_reward_group_share", "mean_score_arithmetic_answer", "mean_score_digit_share"} <= set(meta["r01/rewards"])
    assert meta["r01/rewards"]["equal_reward_group_share"] < 1, "every group had equal rewards: no training signal"

    assert meta["r01/rollouts"]["rows"] == len(rewards)
    assert {"mean_completion_tokens", "truncated_share", "samples"} <= set(meta["r01/rollouts"])

    train = meta["r01/checkpoint"]
    assert {"loss", "clip_fraction", "grad_norm", "steps", "reward_mean", "reward_std"} <= set(train)
    assert train["reward_mean"] == pytest.approx(meta["r01/rewards"]["reward_mean"], rel=1e-6)
    assert train["grad_norm"] > 0
    # the held-out evaluation, what the step loaded and how it used its device are not training metrics
    trained = {k: v for k, v in train.items() if not k.startswith(("heldout_", "peak_", "busy_")) and k != "models_loaded_from_disk"}
    # each compute step reports its process's peak memory while writing it (a resident process: from what it already held),
    # and its device's busy share (rl_assets.run.hardware)
    steps = ("r00/checkpoint", "r01/rollouts", "r01/checkpoint", "evaluation")
    assert all(0.1 < meta[key]["peak_rss_gb"] < 24 and 0 <= meta[key]["busy_share"] <= 1 and meta[key]["busy_device"] == "cpu" for key in steps)
    assert trained == pytest.approx(read_lineage(project / MICRO_OUTPUTS["r01/checkpoint"])["metrics"])

    assert "parameters" in meta["r00/checkpoint"]
    assert {f"r{n:02d}_{mode}_accuracy" for n in range(ROUNDS + 1) for mode in ("greedy", "sampled")} <= set(meta["evaluation"])
    assert {"accuracy", "plot", "examples"} <= set(meta["evaluation"])


def lineage(project, check=True):
    done = python(["-m", "pipelines", "lineage", "data/r01/checkpoint", "--json"], project, timeout=120, check=check)
    return json.loads(done.stdout) if done.returncode == 0 else done


def lineage_with_problems(project) -> tuple[list[dict], str]:
    """The trace of a project with a changed file: printed in full, and exit 1 with the problems on stderr."""
    done = python(["-m", "pipelines", "lineage", "data/r01/checkpoint", "--json"], project, timeout=120, check=False)
    assert done.returncode == 1, f"lineage exited {done.returncode}: {done.stderr.strip()}"
    return json.loads(done.stdout), done.stderr


def test_lineage_cli_walks_back_to_the_raw_files(pipeline):
    project, _ = pipeline
    steps = lineage(project)
    assert [s["kind"] for s in steps] == ["checkpoint", "checkpoint", "prompts", "raw", "raw"]
    r01, r00, prompts = steps[:3]
    assert (r01["round"], r00["round"]) == (1, 0)
    assert r01["parent"] == r00["checkpoint_id"]
    assert r01["rollouts"]["status"] == r01["rewards"]["status"] == prompts["status"] == "ok"
    assert r01["rollouts"]["hash"] == file_hash(project / MICRO_OUTPUTS["r01/rollouts"])
    assert r01["rollouts"]["sampled_by"] == r00["checkpoint_id"]
    assert {s["path"] for s in steps[3:]} == {"data/raw/math_problems.json", "data/raw/arithmetic_extra.jsonl"}
    assert all(s["status"] == "ok" for s in steps[3:])
    assert sum(s["rows_in_rollouts"] for s in prompts["sources"]) > 0


def test_lineage_cli_reports_a_rescored_rewards_table(pipeline, tmp_path):
    changed = copy_project(pipeline[0], tmp_path / "changed")
    path = changed / MICRO_OUTPUTS["r01/rewards"]
    table = read_table(path, "rewards")
    rewards = table["reward"].to_pylist()
    rewards[0] += 1.0
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(rewards, pa.float64()))
    write_table(table, path, rewards_schema(reward_function_names(table)), "rewards")
    steps, problems = lineage_with_problems(changed)
    assert steps[0]["rewards"]["status"] == "changed since recorded" and steps[0]["rollouts"]["status"] == "ok"
    assert "1 problem(s):\n  data/r01/rewards.parquet: changed since recorded" in problems


def test_lineage_cli_reports_damaged_rewards_bytes(pipeline, tmp_path):
    changed = copy_project(pipeline[0], tmp_path / "changed")
    with open(changed / MICRO_OUTPUTS["r01/rewards"], "ab") as handle:
        handle.write(b"\n")  # a line appended to the Parquet file
    steps, problems = lineage_with_problems(changed)
    assert steps[0]["rewards"]["status"] == "changed since recorded" and steps[0]["rollouts"]["status"] == "ok"
    assert "data/r01/rewards.parquet: changed since recorded" in problems
