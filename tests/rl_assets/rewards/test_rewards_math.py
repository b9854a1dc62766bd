"""rewards/math_answers.py: number parsing, exact verification, and every GSM8K reference solution."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from rl_assets.rewards.math_answers import arithmetic_answer, extract_answer, math_answer

GSM8K = Path(__file__).resolve().parents[3] / ".." / "shared" / "datasets" / "gsm8k" / "train.jsonl"


@pytest.mark.parametrize("text,expected", [
    ("42", Fraction(42)),
    ("-7", Fraction(-7)),
    ("−7", Fraction(-7)),  # unicode minus
    ("it costs $1,234,567.50 total", Fraction(123456750, 100)),
    ("0.125", Fraction(1, 8)),
    (".5", Fraction(1, 2)),
    ("3/4 of it", Fraction(3, 4)),
    ("answer: -3/6", Fraction(-1, 2)),
    ("1/0", None),  # not a number
    ("\\frac{3}{4}", Fraction(3, 4)),
    ("\\dfrac{10}{4}", Fraction(5, 2)),
    ("-\\frac{1}{2}", Fraction(-1, 2)),
    ("1{,}000", Fraction(1000)),
    ("first 3 then \\boxed{17} then 9", Fraction(17)),
    ("\\boxed{x = \\frac{2}{3}}", Fraction(2, 3)),
    ("\\boxed{\\text{{nested}} 12}", Fraction(12)),
    ("\\boxed{}", None),
    ("step 1: 3 + 4 = 7\n#### 1,200", Fraction(1200)),
    ("#### -5\nmore 9", Fraction(-5)),
    ("#### 1 #### 2", Fraction(2)),
    ("5,6", Fraction(6)),  # not a thousands group: two numbers, the last counts
    ("10000000000000001", Fraction(10000000000000001)),
    ("no number", None),
    ("", None),
])
def test_extract_answer_final(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("completion,reference,expected", [
    ("The answer is 1,200.", "1200", 1.0),
    ("\\boxed{1200}", "1,200", 1.0),
    ("so 2.50", "5/2", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("-4", "-4", 1.0),
    ("4", "-4", 0.0),
    ("I get 3 then 5", "5", 1.0),  # the last number is the final answer
    ("I get 5 then 3", "5", 0.0),
    ("#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),  # a whole worked solution as the reference
    ("10000000000000001", "10000000000000000", 0.0),
    ("nothing", "3", 0.0),
    ("3", "three", 0.0),  # a reference without a number never matches
])
def test_math_answer(completion, reference, expected):
    assert math_answer([completion], answer=[reference]) == [expected]


def test_math_answer_pick_first_and_no_reference():
    assert math_answer(["7 then 42"], answer=["7"], pick="first") == [1.0]
    assert math_answer(["7", "7"], answer=[None, "7"], prompt=["a", "b"]) == [None, 1.0]


@pytest.mark.parametrize("completion,expected", [
    ("42", 1.0), ("42 apples", 1.0), ("x=42", 1.0), ("42.0", 1.0), ("7 then 42", 0.0), ("#### 42", 1.0),
    ("5 #### 42", 0.0), ("\\boxed{42} 5", 1.0), ("", 0.0), ("-42", 0.0),
])
def test_arithmetic_answer_keeps_the_first_number_rule(completion, expected):
    assert arithmetic_answer([completion], answer=["42"]) == [expected]


@pytest.mark.skipif(not GSM8K.is_file(), reason=f"{GSM8K} is not there")
def test_every_gsm8k_reference_solution_scores_one_and_a_wrong_number_zero():
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines() if line.strip()]
    assert len(rows) > 7000
    solutions = [row["answer"] for row in rows]
    finals = [s.rpartition("####")[2].strip() for s in solutions]
    assert math_answer(solutions, answer=finals) == [1.0] * len(rows)
    assert math_answer(solutions, answer=solutions) == [1.0] * len(rows)  # the whole solution as the reference
    wrong = [str(extract_answer(f) + 1) for f in finals]
    assert math_answer(solutions, answer=wrong) == [0.0] * len(rows)
    with_commas = [f for f in finals if "," in f]
    assert with_commas, "GSM8K has answers with thousands separators; this test should cover them"


def test_strict_math_answer_is_not_fooled_by_a_stray_number():
    """Issue 31: 'the last number' scored prose that merely ended in the right digit; strict wants an answer given as one."""
    from rl_assets.rewards import math_answer

    prose = "4 means 'thirty-four' in Java Math."
    assert math_answer([prose], answer=["4"]) == [1.0]  # the lenient default reads the last number anywhere
    assert math_answer([prose, "Adding them:\n4", "so #### 4", "\\boxed{4} is it"], answer=["4"] * 4, pick="strict") == [0.0, 1.0, 1.0, 1.0]
