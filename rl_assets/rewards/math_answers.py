"""Math answers: find the number a completion gives as its answer and compare it exactly with the reference.

Numbers may carry a sign, decimals, thousands separators (`1,234`), or be fractions (`3/4`,
`\\frac{3}{4}`). Values compare as exact fractions, so `0.5 == 1/2 == \\frac{1}{2}` and two large
integers that differ in the last digit never round to equal.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

# A thousands group needs exactly three digits after each comma, so "5,6" is two numbers, not 56.
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
_NUMBER = re.compile(rf"([-−+]?)({_UNSIGNED})(?:/({_UNSIGNED}))?")
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\{\s*([-−]?)\s*([\d.,]+)\s*\}\{\s*([\d.,]+)\s*\}")
_GSM8K_MARKER = re.compile(r"####\s*")


def _value(match: re.Match) -> Fraction | None:
    sign, numerator, denominator = match.groups()
    value = Fraction(numerator.replace(",", ""))
    if denominator is not None:
        if Fraction(denominator.replace(",", "")) == 0:
            return None
        value /= Fraction(denominator.replace(",", ""))
    return -value if sign in ("-", "−") else value


def _normalize(text: str) -> str:
    """LaTeX spellings of numbers as plain ones: \\frac{a}{b} -> a/b, 1{,}000 -> 1,000."""
    return _LATEX_FRACTION.sub(r"\1\2/\3", text.replace("{,}", ","))


def _numbers(text: str) -> list[Fraction]:
    return [v for v in map(_value, _NUMBER.finditer(_normalize(text))) if v is not None]


def _last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces balanced, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth < 0:
            return text[begin:index]
    return None


_ALONE = re.compile(rf"\s*(?:[-−+]?(?:{_UNSIGNED})(?:/(?:{_UNSIGNED}))?)\s*\.?\s*")
# A last line that states its final number as the answer: "4 + 18 = 22.", "The answer is 22", "answer: 22", "... equals 22".
_STATED = re.compile(rf"(?:=|\banswer\s+is|\banswer\s*:|\bresult\s+is|\bequals)\s*(?:[-−+]?(?:{_UNSIGNED})(?:/(?:{_UNSIGNED}))?)\s*\.?\s*$",
                     re.IGNORECASE)


def extract_answer(text: str, pick: Literal["final", "first", "strict"] = "final") -> Fraction | None:
    """The number `text` gives as its answer, or None.

    `final`: the last \\boxed{...}, else the number after GSM8K's last `####`, else the last number.
    `first`: the first number anywhere (the embedded arithmetic task answers with a bare number).
    `strict`: only an answer given as one: the last \\boxed{...}, the number after the last `####`, or the
    last non-empty line being a number alone or ending with one stated as the result (`= 22`, `the answer is 22`,
    `answer: 22`, `equals 22`); a number that merely comes last in prose is no answer.

    >>> [extract_answer(t) for t in ["so \\\\boxed{-\\\\frac{1}{2}}.", "3 + 4 = 7\\n#### 1,207", "about 2.50 dollars", "none"]]
    [Fraction(-1, 2), Fraction(1207, 1), Fraction(5, 2), None]
    >>> extract_answer("7 then 42", pick="first")
    Fraction(7, 1)
    >>> [extract_answer(t, pick="strict") for t in ["4 means 'thirty-four' in Java Math.", "so it is\\n34.", "#### 34", "\\\\boxed{34}"]]
    [None, Fraction(34, 1), Fraction(34, 1), Fraction(34, 1)]
    >>> [extract_answer(t, pick="strict") for t in ["4 + 18 = 22.", "The answer is 22", "4 + 18 is 22 (9).", "= 22\\nIt is a classic."]]
    [Fraction(22, 1), Fraction(22, 1), None, None]
    """
    if pick == "first":
        numbers = _numbers(text)
        return numbers[0] if numbers else None
    boxed = _last_boxed(text)
    if boxed is not None:
        numbers = _numbers(boxed)
        return numbers[-1] if numbers else None
    marker = list(_GSM8K_MARKER.finditer(text))
    if marker:
        numbers = _numbers(text[marker[-1].end():])
        return numbers[0] if numbers else None
    if pick == "strict":
        lines = [line for line in _normalize(text).splitlines() if line.strip()]
        return _numbers(lines[-1])[-1] if lines and (_ALONE.fullmatch(lines[-1]) or _STATED.search(lines[-1])) else None
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


def math_answer(completions: list[str], answer: list[str | None], *, pick: Literal["final", "first", "strict"] = "final",
                **kwargs) -> list[float | None]:
    """1.0 when the completion's answer equals the reference's answer as a number, else 0.0.

    `pick` (options: {pick: strict} in params) says how the completion gives its answer (see `extract_answer`);
    `strict` cannot be fooled by a stray number at the end of prose.

    The reference is read the same way, so it can be a bare number, `1,200`, `#### 72` or a whole
    worked solution. A row without a reference scores None (not applicable); a reference without a
    number never matches.

    >>> math_answer(["The total is \\\\boxed{1,200}.", "#### 0.5", "-3", "I think 12", "x"], answer=["1200", "1/2", "-3", "13", "4"])
    [1.0, 1.0, 1.0, 0.0, 0.0]
    >>> math_answer(["5"], answer=[None])
    [None]
    """
    scores = []
    for completion, reference in zip(completions, answer):
        if reference is None:
            scores.append(None)
            continue
        expected = extract_answer(reference)  # a reference is read leniently: it may be a whole worked solution
        found = extract_answer(completion, pick)
        scores.append(1.0 if expected is not None and found == expected else 0.0)
    return scores


def arithmetic_answer(completions: list[str], answer: list[str | None], **kwargs) -> list[float | None]:
    """1.0 when the first number in the completion equals the reference answer exactly, else 0.0.

    `math_answer` with `pick="first"`: the embedded arithmetic task's exact-match rule (the policy
    answers with a bare number, and a number after it is noise, not a correction).

    >>> arithmetic_answer(["42", " 42 apples", "41", "no idea", "5", "7 then 42"], answer=["42", "42", "42", "42", "five", "42"])
    [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    """
    return math_answer(completions, answer, pick="first")


def answer_format(completions: list[str], **kwargs) -> list[float]:
    """1.0 when the completion is a bare number, so the policy learns to stop after the answer.

    >>> answer_format(["12", "12 and more", "", "-1,500", "3/4"])
    [1.0, 0.0, 0.0, 1.0, 1.0]
    """
    return [1.0 if _NUMBER.fullmatch(c.strip()) else 0.0 for c in completions]
