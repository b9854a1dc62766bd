"""examples/vision/params.yaml (`make vision`): it validates and keeps its shape; a shrunk copy runs through Dagster with images.

The run end to end is the example's own file with fewer rows, steps and rounds (the full one takes minutes): the pictures
are stored by hash, every rollout shows its picture, each checkpoint is a vision-language model evaluated on the held-out
pictures, and `lineage` walks the last checkpoint back to the image files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, python
from rl_assets.core.params_file import load_params
from rl_assets.core.schemas import read_table

RELATIVE = Path("examples/vision/params.yaml")
EXAMPLE = REPO / RELATIVE


def test_vision_params_validate_and_have_the_example_shape(monkeypatch):
    monkeypatch.chdir(REPO)
    params = load_params(RELATIVE)
    assert params.model.name_or_path == "tiny" and params.model.vision is not None  # the embedded VLM
    (source,) = params.raw_data.sources
    assert source.function == "rl_assets.data.image_tasks:count_shapes" and source.columns.image == "image"
    assert params.sft.enabled and params.train.algorithm == "grpo"
    header = EXAMPLE.read_text().split("\nseed:")[0]
    assert "make vision" in header and "sampled" in header  # the file says how to run it and what it measured


@pytest.mark.e2e
def test_a_shrunk_vision_example_runs_through_dagster_with_its_pictures(micro_copy):
    project = micro_copy
    params = yaml.safe_load(EXAMPLE.read_text())
    params["rounds"] = 2
    params["raw_data"]["sources"][0]["count"] = 120
    params["sft"].update(max_steps=4, batch_size=8)
    params["rollouts"].update(prompts_per_round=8, samples_per_prompt=4)
    params["train"].update(minibatch_size=16, epochs=1)
    params["evaluation"].update(max_prompts=8, samples_per_prompt=2)
    (project / RELATIVE).parent.mkdir(parents=True)
    (project / RELATIVE).write_text(yaml.safe_dump(params))
    python(["-m", "pipelines", "run"], project, timeout=900, RL_ASSETS_PARAMS=str(RELATIVE), RL_ASSETS_DVC_COMMIT="0")

    data = project / "data/experiments/examples-vision-params"
    images = sorted((data / "images").iterdir())
    assert len(images) >= 100  # one file per distinct picture, named by its hash
    for n in (1, 2):
        rollouts = read_table(data / f"r{n:02d}/rollouts.parquet", "rollouts")
        assert all(len(ids) == 1 for ids in rollouts["image_ids"].to_pylist())
        assert all(p.startswith("<image>") for p in rollouts["prompt"].to_pylist())
    evaluation = read_table(data / "evaluation.parquet", "evaluation").to_pylist()
    assert sorted({r["checkpoint"] for r in evaluation}) == ["r00/checkpoint", "r01/checkpoint", "r02/checkpoint"]
    trace = python(["-m", "pipelines", "lineage", str((data / "r02/checkpoint").relative_to(project))], project, timeout=300,
                   RL_ASSETS_PARAMS=str(RELATIVE))
    assert re.search(r"examples-vision-params/images  \d+ images, each named by its SHA-256  \[ok\]", trace.stdout), trace.stdout
