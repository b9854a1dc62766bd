"""The rewards side of the graph in Dagster: rescoring without resampling, and the optional reward_model asset.

Changing only the `rewards` params section changes the code version of every rNN/rewards, so the UI
marks them (and what follows) changed while rNN/rollouts stay up to date; test_dvc.py checks that
`dvc status` says the same. Runs in a temporary project with stand-in rollouts (no model sampling).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, DataVersion, MaterializeResult, PipesSubprocessClient, asset, materialize

from conftest import REPO, import_pipelines, micro_params
from rl_assets.core.schemas import ROLLOUTS, read_table, write_table
from rl_assets.core.storage import file_hash

pytestmark = pytest.mark.e2e  # runs a benchmark or a pipeline end to end: not in `make test-fast`

ROLLOUTS_KEY, REWARDS_KEY, CHECKPOINT_KEY = AssetKey(["r01", "rollouts"]), AssetKey(["r01", "rewards"]), AssetKey(["r01", "checkpoint"])


def write_params(project, **sections) -> None:
    params = micro_params()
    params["rewards"] = {"functions": [{"name": "arithmetic_answer", "weight": 1.0}]}
    params.update(sections)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with params.yaml, data/raw and a stored r01/rollouts table; cwd is inside it."""
    modules = {m.rpartition(".")[2]: import_pipelines(f"pipelines.{m}")  # imported from the repo, as the code location is
               for m in ("definitions.compute", "definitions.reward_model", "launch.params", "records.outdated")}
    shutil.copytree(REPO / "data" / "raw", tmp_path / "data" / "raw")
    write_params(tmp_path)
    rows = [{"round": 1, "prompt_id": f"p{i // 2}", "sample_idx": i % 2, "prompt": "2+2=", "answer": "4", "extra": "{}",
             "completion": c, "prompt_ids": [1], "completion_ids": [2], "logprobs": [-1.0], "truncated": False, "policy_id": "x",
             "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4, "seed": 0, "prompts_hash": "h"}
            for i, c in enumerate(["4", "5", "4 4", "four"])]
    write_table(pa_table(rows), tmp_path / "data" / "r01" / "rollouts.parquet", ROLLOUTS, "rollouts")
    monkeypatch.chdir(tmp_path)
    for name in ("RL_ASSETS_PARAMS", "RL_ASSETS_SET", "DVC_STAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RL_ASSETS_DVC_COMMIT", "0")  # DVC recording is test_dvc's business
    return tmp_path, modules


def pa_table(rows):
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=ROLLOUTS)


def stored_rollouts(project, code_version: str | None = None):
    """A stand-in for the rollouts asset: records the stored table's hash as its data version (and the real asset's code version)."""

    @asset(key=ROLLOUTS_KEY, deps=[AssetKey(["r00", "checkpoint"]), AssetKey("prompts")], code_version=code_version)  # the real asset's deps
    def rollouts() -> MaterializeResult:
        return MaterializeResult(data_version=DataVersion(file_hash(project / "data" / "r01" / "rollouts.parquet")))

    return rollouts


def trained_checkpoint(code_version: str | None = None):
    """A stand-in for r01/checkpoint (no training): what follows the rewards, with the real asset's deps."""

    @asset(key=CHECKPOINT_KEY, deps=[REWARDS_KEY, ROLLOUTS_KEY, AssetKey(["r00", "checkpoint"])], code_version=code_version)
    def checkpoint() -> MaterializeResult:
        return MaterializeResult(data_version=DataVersion("weights"))

    return checkpoint


def stale(instance, assets, key, modules, named: bool = False):
    """Why `key` is stale against the specs of `assets` (None: up to date), as `rl-assets run` decides (pipelines.records.outdated);
    `named`: a changed code version names what changed, from what the output on disk recorded (as `run` passes its params)."""
    specs = {spec.key: spec for a in assets for spec in a.specs}
    events = instance.get_latest_materialization_events([*specs, ROLLOUTS_KEY])
    current = {k: e.asset_materialization.tags.get("dagster/data_version") if e else None for k, e in events.items()}
    outdated = modules["outdated"]
    changed = (lambda: outdated.what_changed("/".join(key.path), modules["params"].load_project_params(), Path("data"))) if named else None
    return outdated.stale_reason(specs[key], dict(events[key].asset_materialization.tags), current, changed)


def resources(modules):
    return {"params": modules["params"].project_params(), "pipes": PipesSubprocessClient()}


def test_changing_only_rewards_makes_rewards_stale_and_leaves_rollouts_alone(project):
    path, modules = project
    instance = DagsterInstance.ephemeral()
    before = modules["compute"].compute_assets(modules["params"].load_project_params())
    versions = {key: version for a in before for key, version in a.code_versions_by_key.items()}
    assert materialize([stored_rollouts(path, versions[ROLLOUTS_KEY])], instance=instance).success
    assert materialize(before, selection=[REWARDS_KEY], instance=instance, resources=resources(modules)).success
    assert materialize([trained_checkpoint(versions[CHECKPOINT_KEY])], instance=instance).success
    rollouts_event = instance.get_latest_materialization_event(ROLLOUTS_KEY)
    assert [stale(instance, before, k, modules) for k in (ROLLOUTS_KEY, REWARDS_KEY, CHECKPOINT_KEY)] == [None, None, None]

    # another section changes: the rewards keep their code version
    write_params(path, rollouts={**micro_params()["rollouts"], "temperature": 0.5})
    other = modules["compute"].compute_assets(modules["params"].load_project_params())
    assert stale(instance, other, REWARDS_KEY, modules) is None

    # only `rewards` changes: rewards is stale because its code version changed; rollouts is not
    write_params(path, rewards={"functions": [{"name": "arithmetic_answer", "weight": 2.0}]})
    after = modules["compute"].compute_assets(modules["params"].load_project_params())
    assert stale(instance, after, REWARDS_KEY, modules).startswith("stale: its code version changed")
    # what `rl-assets run` says: the key and both values, from the params the rewards table recorded
    assert stale(instance, after, REWARDS_KEY, modules, named=True) == "stale: params changed (rewards.functions[0].weight: 1.0 -> 2.0)"
    assert stale(instance, after, ROLLOUTS_KEY, modules) is None

    # rescoring: the rewards are fresh again, with the new weights, and the rollouts were not touched
    assert materialize(after, selection=[REWARDS_KEY], instance=instance, resources=resources(modules)).success
    assert stale(instance, after, REWARDS_KEY, modules) is None
    # what follows is stale once the rescored table is there (a code change flags the asset itself only)
    assert stale(instance, after, CHECKPOINT_KEY, modules) == "stale: r01/rewards has a new data version since"
    assert instance.get_latest_materialization_event(ROLLOUTS_KEY).run_id == rollouts_event.run_id
    assert read_table(path / "data" / "r01" / "rewards.parquet", "rewards")["reward"].to_pylist() == [2.0, 0.0, 2.0, 0.0]
    tags = instance.get_latest_materialization_event(REWARDS_KEY).asset_materialization.tags
    assert tags["dagster/code_version"] == after[0].code_versions_by_key[REWARDS_KEY] != before[0].code_versions_by_key[REWARDS_KEY]


def test_editing_a_user_reward_module_makes_its_rewards_stale_and_nothing_upstream(project):
    path, modules = project
    (path / "my_rewards.py").write_text("def exact(completions, answer, **kwargs):\n"
                                        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n")
    write_params(path, rewards={"functions": [{"name": "my_rewards:exact", "weight": 1.0}]})
    instance = DagsterInstance.ephemeral()
    before = modules["compute"].compute_assets(modules["params"].load_project_params())
    versions = {key: version for a in before for key, version in a.code_versions_by_key.items()}
    assert materialize([stored_rollouts(path, versions[ROLLOUTS_KEY])], instance=instance).success
    assert materialize(before, selection=[REWARDS_KEY], instance=instance, resources=resources(modules)).success
    assert stale(instance, before, REWARDS_KEY, modules) is None

    (path / "my_rewards.py").write_text((path / "my_rewards.py").read_text().replace("c.strip() == a", "a in c"))  # the regex edit of the issue
    after = modules["compute"].compute_assets(modules["params"].load_project_params())
    assert stale(instance, after, REWARDS_KEY, modules).startswith("stale: its code version changed")
    assert stale(instance, after, REWARDS_KEY, modules, named=True) == "stale: code changed (my_rewards.py)"  # the file, not two hashes
    assert stale(instance, after, ROLLOUTS_KEY, modules) is None
    assert after[0].code_versions_by_key[ROLLOUTS_KEY] == versions[ROLLOUTS_KEY]
    assert after[0].code_versions_by_key[CHECKPOINT_KEY] == versions[CHECKPOINT_KEY]  # training code is not the reward's


def test_no_reward_model_asset_unless_configured(project):
    _, modules = project
    assert modules["reward_model"].reward_model_asset(modules["params"].load_project_params()) is None
    rewards = modules["compute"].compute_assets(modules["params"].load_project_params())[0]
    assert {d.asset_key for d in rewards.specs_by_key[REWARDS_KEY].deps} == {ROLLOUTS_KEY}


@pytest.fixture
def preference_file(project):
    """Arithmetic pairs: the right sum is chosen over a wrong one."""
    path, _ = project
    lines = [json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1 + (a * b) % 3)}) for a in range(8) for b in range(8)]
    (path / "data" / "raw" / "preferences.jsonl").write_text("\n".join(lines) + "\n")
    return "data/raw/preferences.jsonl"


def test_reward_model_asset_trains_and_rewards_depend_on_it(project, preference_file):
    path, modules = project
    tiny = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    write_params(path, reward_model={"preference_data": preference_file, "tiny": tiny, "max_steps": 20, "batch_size": 16,
                                     "learning_rate": 1e-2},
                 rewards={"functions": [{"name": "arithmetic_answer"},
                                        {"name": "reward_model", "weight": 0.0, "options": {"path": "data/reward_model", "temperature": 2.0}}]})
    trained = modules["reward_model"].reward_model_asset(modules["params"].load_project_params())
    round_one = modules["compute"].compute_assets(modules["params"].load_project_params())
    assert trained.key == AssetKey("reward_model") and trained.group_names_by_key[trained.key] == "reward_model"
    assert {d.asset_key for d in round_one[0].specs_by_key[REWARDS_KEY].deps} == {ROLLOUTS_KEY, AssetKey("reward_model")}

    instance = DagsterInstance.ephemeral()
    assert materialize([stored_rollouts(path)], instance=instance).success
    result = materialize([trained, *round_one], selection=[trained.key, REWARDS_KEY], instance=instance, resources=resources(modules))
    assert result.success
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert meta["reward_model"]["pairs"].value == 64 and meta["reward_model"]["steps"].value == 20
    assert meta["reward_model"]["loss_last"].value < meta["reward_model"]["loss_first"].value
    assert (path / "data" / "reward_model" / "model.safetensors").is_file()
    rewards = read_table(path / "data" / "r01" / "rewards.parquet", "rewards")
    scores = rewards["score_reward_model"].to_pylist()
    assert len(set(scores)) > 1 and all(isinstance(s, float) for s in scores)
    assert rewards["reward"].to_pylist() == rewards["score_arithmetic_answer"].to_pylist()  # weight 0
