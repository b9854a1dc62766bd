"""The run spec: a run's params resolved once into an immutable file that its steps, children and dvc.lock records read."""

import json
import os

import pytest
import yaml

from conftest import REPO, python
from rl_assets.core.config import ParamsError
from rl_assets.core.run_spec import read_run_spec, write_run_spec


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["train"]["learning_rate"] = "${LR:-1e-4}"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    for name in [k for k in os.environ if k.startswith("RL_ASSETS_")]:
        monkeypatch.delenv(name)
    return tmp_path


def test_a_spec_is_resolved_once_content_addressed_and_never_rewritten(project, monkeypatch):
    monkeypatch.setenv("LR", "3e-4")
    path = write_run_spec("params.yaml", ["rounds=2"])
    assert path.parent.resolve() == (project / ".rl_assets" / "runs").resolve()
    assert write_run_spec("params.yaml", ["rounds=2"]) == path  # the same resolution, the same file
    before = path.stat().st_mtime_ns
    monkeypatch.setenv("LR", "1e-3")  # the environment and the file change after the run started ...
    (project / "params.yaml").write_text((project / "params.yaml").read_text().replace("seed: 0", "seed: 7"))
    spec = read_run_spec(path)
    assert (spec.params.train.learning_rate, spec.params.rounds, spec.params.seed) == (3e-4, 2, 0)  # ... the run's params do not
    assert spec.written["train"]["learning_rate"] == "3e-4" and spec.written["rounds"] == 2  # as written (YAML 1.1: a string) and spec.overrides == ("rounds=2",)
    assert path.stat().st_mtime_ns == before
    other = write_run_spec("params.yaml", ["rounds=2"])
    assert other != path and read_run_spec(other).params.train.learning_rate == 1e-3


def test_a_broken_spec_is_named(project):
    bad = project / "spec.json"
    bad.write_text("{not json")
    with pytest.raises(ParamsError, match="spec.json: not a readable run spec"):
        read_run_spec(bad)


def test_the_params_resource_and_dvc_records_read_the_spec_not_the_file(project, monkeypatch):
    from pipelines.launch import params as launch_params
    from pipelines.records.dvc import effective_dvc_params

    monkeypatch.setenv("LR", "3e-4")
    spec = write_run_spec("params.yaml", ["rollouts.top_p=0.9"])
    monkeypatch.setenv(launch_params.RUN_SPEC_ENV, str(spec))
    monkeypatch.setenv("LR", "5e-2")
    (project / "params.yaml").write_text("rounds: [\n")  # broken now: nothing of the run may read it again
    resource = launch_params.project_params()
    assert resource.spec == str(spec) and resource.overrides == ["rollouts.top_p=0.9"]
    assert resource.load().train.learning_rate == 3e-4 and launch_params.load_project_params().rollouts.top_p == 0.9
    assert launch_params.written_keys(["train", "rollouts.top_p", "rollouts.tools"]) == ["train", "rollouts.top_p"]
    assert launch_params.run_tags(resource)["rl_assets/run_spec"] == str(spec)
    values = effective_dvc_params(["train", "rollouts.top_p"], "params.yaml", ["rollouts.top_p=0.9"], str(spec))
    assert values["train"]["learning_rate"] == 3e-4 and values["rollouts.top_p"] == 0.9
    with pytest.raises(ParamsError):  # without the spec the broken file is read, and refused
        effective_dvc_params(["train"], "params.yaml")


@pytest.mark.e2e
def test_a_cli_run_hands_its_steps_the_spec_and_status_shows_what_it_ran_with(micro_copy):
    """`rl-assets run --set` writes one spec that the run's tags name; after params.yaml changes, status still says what the run used."""
    python(["-m", "pipelines", "run", "--set", "rounds=1", "--set", "train.learning_rate=0.002"], micro_copy, timeout=900)
    specs = list((micro_copy / ".rl_assets" / "runs").glob("spec-*.json"))
    assert len(specs) == 1
    written = json.loads(specs[0].read_text())
    assert written["params"]["rounds"] == 1 and written["params"]["train"]["learning_rate"] == 0.002
    (micro_copy / "params.yaml").write_text((micro_copy / "params.yaml").read_text().replace("seed: 0", "seed: 5"))
    status = json.loads(python(["-m", "pipelines", "status"], micro_copy, timeout=300).stdout)
    text = json.dumps(status)
    assert "has changed since the latest run; showing what it ran with" in text and specs[0].name in text
