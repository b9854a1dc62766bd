"""rollouts.selection: which prompts a round samples, from the pass rates of the rounds before it."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rl_assets.core.config import SelectionParams
from rl_assets.rollout.selection import choose, choose_prompts, pass_counts

IDS = [f"p{i:02d}" for i in range(20)]
# p00-p04 always solved, p05-p09 never, p10-p14 half the time, p15-p19 not seen yet
COUNTS = {**{p: (8, 8) for p in IDS[:5]}, **{p: (0, 8) for p in IDS[5:10]}, **{p: (4, 8) for p in IDS[10:15]}}


def test_uniform_is_the_seeded_draw_and_reads_no_pass_rate():
    draw = sorted(random.Random(1001).sample(range(20), 6))
    assert choose(IDS, 6, random.Random(1001), SelectionParams(), COUNTS) == draw == choose(IDS, 6, random.Random(1001), None, {})


def test_band_skips_prompts_always_or_never_solved():
    band = SelectionParams(kind="band")
    chosen = choose(IDS, 10, random.Random(0), band, COUNTS)
    assert {IDS[i] for i in chosen} == set(IDS[10:])  # the five at 50% and the five unseen: exactly ten inside the band
    fewer = choose(IDS, 6, random.Random(0), band, COUNTS)
    assert {IDS[i] for i in fewer} <= set(IDS[10:]) and len(fewer) == 6
    # more asked than the band holds: the rest come from outside it, and B stays B
    assert len(choose(IDS, 14, random.Random(0), band, COUNTS)) == 14
    narrow = SelectionParams(kind="band", low=0.6, high=0.9, min_samples=9)  # 8 samples are not enough: every prompt counts as unseen
    assert len(choose(IDS, 20, random.Random(0), narrow, COUNTS)) == 20


def test_priority_favours_prompts_near_half_over_solved_ones():
    priority = SelectionParams(kind="priority")
    picked = [IDS[i] for seed in range(200) for i in choose(IDS, 5, random.Random(seed), priority, COUNTS)]
    half, solved = sum(p in IDS[10:15] for p in picked), sum(p in IDS[:10] for p in picked)
    assert half > 10 * solved  # weight 0.25 against 0.01
    assert solved > 0  # the floor lets a solved prompt come back


def test_choose_prompts_records_why_and_is_deterministic():
    prompts = pa.table({"prompt_id": IDS, "split": ["rl"] * 20, "prompt": IDS})
    chosen = choose_prompts(prompts, 10, round_number=3, seed=0, selection=SelectionParams(kind="band"), counts=COUNTS)
    assert chosen.equals(choose_prompts(prompts, 10, round_number=3, seed=0, selection=SelectionParams(kind="band"), counts=COUNTS))
    rows = dict(zip(chosen["prompt_id"].to_pylist(), zip(chosen["prior_pass_rate"].to_pylist(), chosen["prior_samples"].to_pylist())))
    assert rows["p10"] == (0.5, 8) and rows["p19"] == (None, 0)


def test_pass_counts_need_the_check_column():
    with pytest.raises(ValueError, match="score_check"):
        pass_counts([pa.table({"prompt_id": ["a"], "score_other": [1.0]})], "check")


def test_a_band_that_is_empty_is_refused():
    with pytest.raises(ValueError, match="selection.low"):
        SelectionParams(kind="band", low=0.8, high=0.2)


def test_the_history_is_this_experiment_s_earlier_rounds_and_the_named_experiments(tmp_path):
    from conftest import REPO
    from rl_assets.core.params_file import load_params
    from rl_assets.core.schemas import rewards_schema, write_table
    from rl_assets.core.storage import file_hash
    from rl_assets.run.stages import selection_history

    params = load_params(REPO / "params.yaml")
    band = params.model_copy(update={"rollouts": params.rollouts.model_copy(update={"selection": SelectionParams(kind="band", experiments=["old"])})})
    assert selection_history(params, 3, tmp_path) is None  # uniform reads nothing
    tables = {"data/r01/rewards.parquet": ["a", "b"], "data/r02/rewards.parquet": ["a", "a"], "data/r03/rewards.parquet": ["c", "c"],
              "data/experiments/old/r01/rewards.parquet": ["b", "c"]}
    for path, ids in tables.items():
        write_table(pa.table({"round": [1, 1], "prompt_id": ids, "sample_idx": [0, 1], "policy_id": ["x", "x"], "reward": [1.0, 0.0],
                              "reward_config_hash": ["h", "h"], "rollouts_hash": ["h", "h"], "score_arithmetic_answer": [1.0, 0.0]}),
                    tmp_path / path, rewards_schema(["arithmetic_answer"]), "rewards")
    counts, read = selection_history(band, 3, tmp_path)  # round 3: rounds 1 and 2 of this experiment, every round of "old"
    assert counts == {"a": (2, 3), "b": (1, 2), "c": (0, 1)}
    assert read == {path: file_hash(tmp_path / path) for path in tables if "r03" not in path}
    missing = band.model_copy(update={"rollouts": band.rollouts.model_copy(update={"selection": SelectionParams(kind="band", experiments=["nope"])})})
    with pytest.raises(FileNotFoundError, match="'nope'"):
        selection_history(missing, 2, tmp_path)
