"""stage_code.py: the code that shapes each stage, found by reading imports, and its content hashes."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO, import_pipelines, in_repo
from rl_assets.config import load_params
from rl_assets.stage_code import STAGE_ENTRIES, code_hashes, project_code, stage_code, stage_version


@pytest.fixture
def params(tmp_path, monkeypatch):
    """Micro params with a user reward module in the project (cwd)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text("def exact(completions, answer, **kwargs):\n    return [1.0 for _ in completions]\n")
    raw = yaml.safe_load((REPO / "tests" / "micro_params.yaml").read_text())
    raw["rewards"]["functions"].append({"name": "my_rewards:exact", "weight": 1.0})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    return load_params("params.yaml")


def test_each_stage_lists_its_own_modules_and_what_they_import():
    with in_repo():
        rollouts, train = project_code(STAGE_ENTRIES["rollouts"]), project_code(STAGE_ENTRIES["train"])
    assert {"rl_assets/rollouts.py", "rl_assets/rollouts_vllm.py", "rl_assets/models.py", "rl_assets/stages.py", "rl_assets/loaded.py"} <= set(rollouts)
    assert "rl_assets/train.py" not in rollouts and "rl_assets/losses.py" not in rollouts
    assert {"rl_assets/train.py", "rl_assets/losses.py", "rl_assets/advantages.py"} <= set(train)  # imported by train.py


def test_a_validation_import_inside_config_does_not_make_raw_data_depend_on_rewards():
    with in_repo():
        raw_data = project_code(STAGE_ENTRIES["raw_data"])
    assert "rl_assets/config.py" in raw_data
    assert not any(path.startswith("rl_assets/rewards/") for path in raw_data)


def test_user_reward_modules_count_for_the_stages_that_call_them(params):
    assert "my_rewards.py" in stage_code("rewards", params) and "my_rewards.py" in stage_code("evaluation", params)
    assert "my_rewards.py" not in stage_code("rollouts", params) and "my_rewards.py" not in stage_code("train", params)


def test_the_stage_version_follows_the_code_content_and_the_sections(params, tmp_path):
    before = {stage: stage_version(stage, params, ["rewards"]) for stage in ("rewards", "rollouts")}
    hashes = code_hashes(stage_code("rewards", params))
    (tmp_path / "my_rewards.py").write_text((tmp_path / "my_rewards.py").read_text().replace("1.0", "0.5"))
    assert stage_version("rewards", params, ["rewards"]) != before["rewards"]
    assert stage_version("rollouts", params, ["rewards"]) == before["rollouts"]
    assert code_hashes(stage_code("rewards", params))["my_rewards.py"] != hashes["my_rewards.py"]
    assert stage_version("rollouts", params, ["seed"]) != before["rollouts"]


def test_an_unknown_entry_function_is_an_error_naming_it():
    with pytest.raises(ValueError, match="no top-level function 'no_such_stage'"):
        project_code(["rl_assets/stages.py:no_such_stage"])


def test_dvc_records_the_params_a_run_used_typed_as_dvc_reads_them(tmp_path, monkeypatch):
    dvc = import_pipelines("pipelines.dvc")
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((REPO / "tests" / "micro_params.yaml").read_text())
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(raw).replace("learning_rate: 0.01", "learning_rate: 1e-2"))
    monkeypatch.setenv("MICRO_MODEL", "tiny")
    (tmp_path / "other.yaml").write_text((tmp_path / "other.yaml").read_text().replace("name_or_path: tiny", "name_or_path: ${MICRO_MODEL}"))
    values = dvc.effective_dvc_params(["train", "model.name_or_path", "seed"], "other.yaml", ["train.epochs=3"])
    assert values["train"]["learning_rate"] == 0.01 and isinstance(values["train"]["learning_rate"], float)  # YAML 1.1 reads 1e-2 as text
    assert values["train"]["epochs"] == 3 and set(values["train"]) == set(raw["train"]) | {"epochs"}  # only the keys written, as DVC records
    assert values["model.name_or_path"] == "tiny" and values["seed"] == 0
