"""examples/demo/params.yaml, the one-minute try (`make demo`): it validates, keeps the one-minute shape, and runs.

The shape test pins what makes the demo fast (few rounds, a small embedded model, a short warm
start, bounded rollouts and evaluation) and that it trains on the default task's own data. The end
to end test runs the file as `make demo` does, its sizes cut, in a temp project; it asserts evaluation
rows for every checkpoint, never an accuracy (runs differ across machines).
"""

from __future__ import annotations


import pytest
import yaml

from conftest import REPO, python
from rl_assets.core.params_file import load_params
from rl_assets.data.raw_data import check_sources
from rl_assets.core.schemas import read_table

DEMO = REPO / "examples" / "demo" / "params.yaml"
RELATIVE = DEMO.relative_to(REPO)


def test_demo_params_validate_and_have_the_one_minute_shape(monkeypatch):
    monkeypatch.chdir(REPO)  # reward names and source paths resolve from the project root, as in a run
    demo, default = load_params(RELATIVE), load_params("params.yaml")
    check_sources(demo, str(RELATIVE), REPO)  # every data source is there
    assert demo.raw_data.sources == default.raw_data.sources  # the default task's data, only a smaller run of it
    assert [f.name for f in demo.rewards.functions] == [f.name for f in default.rewards.functions]
    assert 2 <= demo.rounds <= 3 and demo.rounds < default.rounds  # r00 -> last round is a visible change, not many steps
    assert demo.model.name_or_path == "tiny" and demo.model.tiny.num_layers * demo.model.tiny.hidden_size <= 256
    assert demo.sft.enabled and demo.sft.max_steps <= 600
    assert demo.rollouts.prompts_per_round * demo.rollouts.samples_per_prompt <= 8192
    assert demo.evaluation.max_prompts * demo.evaluation.samples_per_prompt <= 4000
    assert demo.compute.nproc == 1 and demo.compute.executor == "multiprocess"
    header = DEMO.read_text().split("\nseed:")[0]
    assert f"RL_ASSETS_PARAMS={RELATIVE}" in header and "make demo" in header  # the file says how to run it


@pytest.mark.e2e
def test_demo_runs_end_to_end(micro_copy):
    """The demo file, run as `make demo` runs it with its sizes cut by `--set` (the suite's time; the shape test above
    pins the real sizes): every checkpoint r00..rR is evaluated, greedy and sampled."""
    project = micro_copy
    (project / RELATIVE).parent.mkdir(parents=True)
    (project / RELATIVE).write_text(DEMO.read_text())
    params = yaml.safe_load(DEMO.read_text())
    smaller = ["sft.max_steps=20", "rollouts.prompts_per_round=32", "evaluation.max_prompts=40"]
    done = python(["-m", "pipelines", "run", *(f for s in smaller for f in ("--set", s))], project, timeout=600,
                  RL_ASSETS_PARAMS=str(RELATIVE), RL_ASSETS_DVC_COMMIT="0")

    rounds = params["rounds"]
    checkpoints = [f"r{n:02d}/checkpoint" for n in range(rounds + 1)]
    data = project / "data/experiments/examples-demo-params"  # the demo is an experiment of its own: its own data folder
    evaluation = read_table(data / "evaluation.parquet", "evaluation").to_pylist()
    assert sorted((r["checkpoint"], r["mode"]) for r in evaluation) == sorted((c, m) for c in checkpoints for m in ("greedy", "sampled"))
    assert all(r["n_prompts"] > 0 and 0 <= r["accuracy"] <= 1 for r in evaluation)
    assert {r["n_samples"] for r in evaluation if r["mode"] == "sampled"} == {params["evaluation"]["samples_per_prompt"]}
    for n in range(1, rounds + 1):
        assert read_table(data / f"r{n:02d}/rewards.parquet", "rewards").num_rows > 0
        assert (data / f"r{n:02d}/checkpoint" / "lineage.json").is_file()
    assert not (project / "data/r01").exists()  # nothing of the default experiment's
    assert all(c in done.stdout for c in checkpoints)  # the accuracy table the run ends with
