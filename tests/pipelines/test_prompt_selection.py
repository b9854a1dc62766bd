"""rollouts.selection in a run: the rounds' choice follows the stored pass rates, is recorded, and reruns only what it shapes."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from conftest import copy_project, python
from rl_assets.core.schemas import table_lineage
from rl_assets.core.storage import file_hash

pytestmark = pytest.mark.e2e

BAND = ["--set", "rollouts.selection.kind=band", "--set", "rollouts.prompts_per_round=64", "--set", "rounds=2"]


@pytest.fixture(scope="module")
def banded(micro_template, tmp_path_factory):
    """Two micro rounds of 64 of the 105 rl prompts with the band selection (the micro model never answers right, so every
    prompt r01 sampled is never solved so far)."""
    project = copy_project(micro_template, tmp_path_factory.mktemp("selection") / "project")
    python(["-m", "pipelines", "run", *BAND], project, timeout=900)
    return project


def rl_prompts(project) -> set[str]:
    prompts = pq.read_table(project / "data" / "prompts.parquet").to_pylist()
    return {p["prompt_id"] for p in prompts if p["split"] == "rl"}


def test_the_band_samples_every_prompt_not_yet_seen_before_any_never_solved_and_records_why(banded):
    data = banded / "data"
    first, second = (pq.read_table(data / f"r0{n}" / "rollouts.parquet") for n in (1, 2))
    seen, unseen = set(first["prompt_id"].to_pylist()), rl_prompts(banded) - set(first["prompt_id"].to_pylist())
    assert len(unseen) < 64 < len(seen | unseen)  # r02 takes all of the unseen, then fills up with never-solved ones
    assert unseen <= set(second["prompt_id"].to_pylist())  # a uniform draw of 64 of 105 would miss some: ~1e-10 it would not
    rewards = pq.read_table(data / "r01" / "rewards.parquet")
    correct: dict[str, list[float]] = {}
    for prompt_id, score in zip(rewards["prompt_id"].to_pylist(), rewards["score_arithmetic_answer"].to_pylist()):
        correct.setdefault(prompt_id, []).append(score == 1.0)
    rates = {p: sum(c) / len(c) for p, c in correct.items()}  # what the stored r01 rewards say of each prompt
    why = dict(zip(second["prompt_id"].to_pylist(), zip(second["prior_pass_rate"].to_pylist(), second["prior_samples"].to_pylist())))
    assert {p: why[p] for p in unseen} == {p: (None, 0) for p in unseen}
    assert {p: w for p, w in why.items() if p in seen} == {p: (rates[p], 4) for p in why if p in seen}
    assert {p for p in seen if 0 < rates[p] < 1} <= set(why)  # every seen prompt inside the band is taken too
    assert table_lineage(data / "r02" / "rollouts.parquet")["selection_history"] == {"data/r01/rewards.parquet": file_hash(data / "r01" / "rewards.parquet")}


def test_the_choice_is_reproduced_and_changing_it_reruns_only_the_rounds(banded, tmp_path):
    project = copy_project(banded, tmp_path / "project")
    again = python(["-m", "pipelines", "run", *BAND], project, timeout=900)
    assert "nothing to do: all 11 assets are up to date" in again.stderr, again.stderr[-2000:]
    before = {name: file_hash(project / "data" / name) for name in ("raw_data.parquet", "prompts.parquet")}
    r00 = (project / "data" / "r00" / "checkpoint" / "lineage.json").read_text()
    python(["-m", "pipelines", "run", "--set", "rollouts.selection.kind=priority", "--set", "rollouts.prompts_per_round=64",
            "--set", "rounds=2"], project, timeout=900)
    assert {name: file_hash(project / "data" / name) for name in before} == before
    assert (project / "data" / "r00" / "checkpoint" / "lineage.json").read_text() == r00
    assert table_lineage(project / "data" / "r02" / "rollouts.parquet")["params"]["rollouts"]["selection"]["kind"] == "priority"
