"""`rl-assets rescore`: a finished micro run's rollouts and held-out completions scored by another reward, no sampling."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from conftest import copy_project, python
from rl_assets.core.storage import file_hash

pytestmark = pytest.mark.e2e

LENIENT = '''def any_digit(completions, **kwargs):
    """1 for a completion with any digit in it: a checker that a stray number fools."""
    return [float(any(ch.isdigit() for ch in c)) for c in completions]
'''


@pytest.fixture(scope="module")
def finished(micro_template, tmp_path_factory):
    """One micro run (r00, r01, evaluation, promotion); tests rescore copies of it."""
    project = copy_project(micro_template, tmp_path_factory.mktemp("rescore") / "project")
    python(["-m", "pipelines", "run"], project, timeout=900)
    (project / "lenient.py").write_text(LENIENT)
    return project


def originals(project) -> dict[str, str]:
    data = project / "data"
    files = [*data.glob("r*/*.parquet"), data / "evaluation.parquet", *(data / "evaluations").iterdir()]
    return {path.relative_to(data).as_posix(): file_hash(path) for path in files if path.is_file()}


def report(project, *args: str, check: bool = True):
    done = python(["-m", "pipelines", "rescore", *args], project, timeout=300, check=check)
    return done


def test_the_same_reward_gives_back_every_stored_accuracy_and_touches_no_original(finished, tmp_path):
    project = copy_project(finished, tmp_path / "project")
    before = originals(project)
    done = report(project, "--reward", "arithmetic_answer")
    assert originals(project) == before  # written beside the originals, never over them
    folder = next((project / "data" / "rescored").iterdir())
    result = json.loads((folder / "rescore.json").read_text())
    evaluation = pq.read_table(project / "data" / "evaluation.parquet").to_pylist()
    assert {(c["checkpoint"], mode): c[f"{mode}_after"] for c in result["checkpoints"] for mode in ("greedy", "sampled")} == \
        {(r["checkpoint"], r["mode"]): r["accuracy"] for r in evaluation}
    assert all(c["flipped"] == [] for c in result["checkpoints"]) and result["not_rescored"] == []
    assert result["best_before"] == result["best_after"] and result["promotion_would_change"] is False
    [round_1] = result["rounds"]
    assert round_1["correct_agreement"] == 1.0
    rescored = pq.read_table(folder / "r01" / "rewards.parquet")
    original = pq.read_table(project / "data" / "r01" / "rewards.parquet")
    assert rescored["score_arithmetic_answer"].to_pylist() == original["score_arithmetic_answer"].to_pylist()
    assert rescored["reward"].to_pylist() == original["score_arithmetic_answer"].to_pylist()  # weight 1, the only function now
    assert "unchanged" in done.stdout and "still the best" in done.stdout


def test_a_lenient_checker_flips_prompts_and_says_what_it_would_change(finished, tmp_path):
    project = copy_project(finished, tmp_path / "project")
    done = report(project, "--reward", "lenient:any_digit", "--reward", "arithmetic_answer")
    [folder] = (project / "data" / "rescored").iterdir()
    result = json.loads((folder / "rescore.json").read_text())
    assert result["correctness"] == "any_digit"
    prompts = set(pq.read_table(project / "data" / "prompts.parquet")["prompt_id"].to_pylist())
    for checkpoint in result["checkpoints"]:
        stored = pq.read_table(folder / "evaluations" / f"{checkpoint['checkpoint_id']}.parquet")
        digits = [float(any(ch.isdigit() for ch in text)) for text in stored["completion"].to_pylist()]
        assert stored["score_any_digit"].to_pylist() == digits
        sampled = [d for d, mode in zip(digits, stored["mode"].to_pylist()) if mode == "sampled"]
        assert checkpoint["sampled_after"] == sum(sampled) / len(sampled)
        assert {f["prompt_id"] for f in checkpoint["flipped"]} <= prompts
        # the old check scored none of these right (the micro model never answers), so every flip is 0 -> more
        assert all(f["correct_before"] < f["correct_after"] for f in checkpoint["flipped"])
    assert sum(len(c["flipped"]) for c in result["checkpoints"]) > 0
    assert f"best checkpoint: {result['best_before']} before, {result['best_after']} after" in done.stdout
    again = report(project, "--reward", "lenient:any_digit", "--reward", "arithmetic_answer")
    assert [p.name for p in (project / "data" / "rescored").iterdir()] == [folder.name]  # the same rescoring: the same folder
    assert again.stdout == done.stdout


def test_a_checkpoint_without_stored_completions_is_named_not_rescored(finished, tmp_path):
    project = copy_project(finished, tmp_path / "project")
    for path in (project / "data" / "evaluations").glob("*.parquet"):
        path.unlink()  # as on a machine that pulled the experiment: the evaluation table came, its completions did not
    done = report(project, "--reward", "arithmetic_answer")
    assert "not rescored (no stored held-out completions here): r00/checkpoint, r01/checkpoint" in done.stdout


@pytest.mark.parametrize("args, words", [
    (["--reward", "lenient:any_digt"], "any_digt"),
    ([], "--reward NAME"),
    (["--reward", "arithmetic_answer", "--correctness", "math_answer"], "--correctness 'math_answer'"),
])
def test_a_wrong_request_is_refused_naming_what_to_fix(finished, args, words):
    done = report(finished, *args, check=False)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert not (finished / "data" / "rescored").exists()
