"""The compute step's command line (`python -m rl_assets.run.step`, and pipelines.launch.pipes_child's arguments)."""

import pytest
import yaml

from rl_assets.core.config import ParamsError
from rl_assets.core.params_file import load_params
from rl_assets.run.step import parse_args
from rl_assets_support import REPO


def test_resolved_params_are_taken_as_resolved_not_from_this_process_environment(tmp_path, monkeypatch):
    raw = yaml.safe_load((REPO / "tests" / "micro_params.yaml").read_text())
    raw["train"]["learning_rate"] = "${STEP_TEST_LR}"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STEP_TEST_LR", "0.25")
    resolved = load_params("params.yaml", ["rounds=3"])  # what the orchestrator resolved, once
    (tmp_path / "resolved.json").write_text(resolved.model_dump_json())
    monkeypatch.delenv("STEP_TEST_LR")  # the child's environment lacks it: resolving again would fail
    with pytest.raises(ParamsError, match="STEP_TEST_LR is not set"):
        load_params("params.yaml")
    args, params = parse_args(["r01/rollouts", "--resolved-params", "resolved.json"])
    assert params == resolved and params.train.learning_rate == 0.25 and params.rounds == 3 and args.outputs == ["r01/rollouts"]


def test_resolved_params_take_no_overrides(capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(["r01/rollouts", "--resolved-params", "x.json", "--set", "rounds=2"])
    assert stopped.value.code == 2 and "--resolved-params already has the overrides applied" in capsys.readouterr().err
