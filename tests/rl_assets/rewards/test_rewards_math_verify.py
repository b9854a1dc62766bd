"""rewards/symbolic.py: LaTeX/symbolic answers through math-verify, from any thread, and every early GSM8K solution."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rl_assets.core.config import RewardsParams
from rl_assets.rewards import BUILT_IN, resolve_reward_function, score_rollouts
from rl_assets.rewards.symbolic import math_verify
from rl_assets_support import rollouts_table

GSM8K = Path(__file__).resolve().parents[3] / ".." / "shared" / "datasets" / "gsm8k" / "train.jsonl"

COT = ("Let me think step by step. First 3 + 4 = 7, then 7 * 2 = 14. Maybe it is 15? No: the remainder is 1, "
       "so the total is 14 - 1 = 13.\nTherefore the answer is \\boxed{13}.\nCheck: 2 + 2 = 4.")


@pytest.mark.parametrize("completion,reference,expected", [
    # fractions
    ("$\\frac{1}{2}$", "0.5", 1.0),
    ("The answer is 0.5", "\\frac{1}{2}", 1.0),
    ("1/2", "$\\frac{1}{2}$", 1.0),
    ("\\boxed{\\dfrac{2}{4}}", "1/2", 1.0),
    ("$\\frac{1}{3}$", "0.5", 0.0),
    # roots
    ("so $x = 2\\sqrt{2}$", "\\sqrt{8}", 1.0),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{8}", 0.0),
    # intervals: the brackets matter
    ("\\boxed{[1, 2)}", "[1,2)", 1.0),
    ("\\boxed{(1,2)}", "[1,2)", 0.0),
    ("$[1,2)$", "(1,2)", 0.0),
    ("\\boxed{(-\\infty, 3]}", "$(-\\infty, 3]$", 1.0),
    # sets: the order does not
    ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", 1.0),
    ("$\\{1,3\\}$", "\\{1,2\\}", 0.0),
    # negatives
    ("\\boxed{-3}", "-3", 1.0),
    ("\\boxed{3}", "-3", 0.0),
    ("The answer is $-\\frac{3}{4}$", "-0.75", 1.0),
    # a boxed answer after a long chain of thought, numbers before and after it
    (COT, "13", 1.0),
    (COT, "14", 0.0),
    # GSM8K references and completions
    ("The total is 1,200 dollars.", "#### 1,200", 1.0),
    ("1200", "Step 1: 600 * 2 = <<600*2=1200>>1200\n#### 1,200", 1.0),
    ("600 * 2 = 1200\n#### 1,200", "#### 1,200", 1.0),
    ("1,201", "#### 1,200", 0.0),
    ("answer = 48 points, so\n#### 66", "#### 66", 1.0),  # the final `####` line wins over "answer = 48"
    # a symbolic expression and a worked solution with $...$
    ("$x^2 + 1$", "1 + x^2", 1.0),
    ("\\boxed{14}", "Add them: $7 + 7 = 14$, so the sum is $\\boxed{14}$.", 1.0),
    ("no answer at all", "5", 0.0),
    ("", "5", 0.0),
    # no reference, or one math-verify cannot parse: does not apply
    ("5", None, None),
    ("5", "\\frac{", None),
    ("5", "", None),
    ("5", "no answer here", None),
])
def test_math_verify(completion, reference, expected):
    assert math_verify([completion], answer=[reference]) == [expected]


def test_float_rounding_option_and_bad_timeout():
    assert math_verify(["3.14159"], answer=["3.14158"], float_rounding=6) == [0.0]
    assert math_verify(["3.14159"], answer=["3.14158"], float_rounding=4) == [1.0]
    with pytest.raises(ValueError, match="timeout_seconds"):
        math_verify(["1"], answer=["1"], timeout_seconds=2.5)


def test_works_from_a_worker_thread():
    """math-verify's timeout uses signal.alarm, which raises outside the main thread; the reward turns it off there."""
    results, errors = [], []

    def work():
        try:
            results.append(math_verify(["\\boxed{\\frac{1}{2}}", "$[1,2)$", "7"], answer=["0.5", "(1,2)", "\\frac{"]))
        except BaseException as error:  # noqa: BLE001 - reported by the assert below
            errors.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not errors and results == [[1.0, 0.0, None]]


def test_registered_as_a_built_in_and_scores_a_rollouts_table():
    assert BUILT_IN["math_verify"] is math_verify
    assert resolve_reward_function("math_verify", {"float_rounding": 4})(["3.14159"], answer=["3.14158"]) == [1.0]
    rollouts = rollouts_table([
        {"prompt_id": "p1", "sample_idx": 0, "answer": "\\sqrt{8}", "completion": "so \\boxed{2\\sqrt{2}}"},
        {"prompt_id": "p1", "sample_idx": 1, "answer": "\\sqrt{8}", "completion": "\\boxed{2}"},
        {"prompt_id": "p2", "sample_idx": 0, "answer": None, "completion": "3"},
        {"prompt_id": "p2", "sample_idx": 1, "answer": "#### 1,200", "completion": "#### 1200"},
    ])
    table = score_rollouts(rollouts, RewardsParams(functions=[{"name": "math_verify", "weight": 2.0}]), rollouts_hash="h")
    assert table["score_math_verify"].to_pylist() == [1.0, 0.0, None, 1.0]
    assert table["reward"].to_pylist() == [2.0, 0.0, 0.0, 2.0]


@pytest.mark.skipif(not GSM8K.is_file(), reason=f"{GSM8K} is not there")
def test_gsm8k_reference_solutions_score_one_and_a_wrong_number_zero():
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:500] if line.strip()]
    solutions = [row["answer"] for row in rows]
    finals = [s.rpartition("####")[2].strip() for s in solutions]
    assert math_verify(solutions, answer=solutions) == [1.0] * len(rows)  # the whole solution as the reference
    assert math_verify(solutions, answer=finals) == [1.0] * len(rows)
    wrong = [str(int(f.replace(",", "")) + 1) for f in finals]
    assert math_verify(solutions, answer=wrong) == [0.0] * len(rows)
    assert any("," in f for f in finals), "the first 500 rows have answers with thousands separators; this test should cover them"
