"""Symbolic math answers through Hugging Face's `math-verify` (the checker behind TRL's `accuracy_reward`).

`math_answers.math_answer` compares numbers exactly and fast, but knows nothing of `2\\sqrt{2}`,
`[1, 2)` or `\\{1, 2\\}`. This reward parses both answers to SymPy and compares them as math, for
LaTeX / symbolic references (MATH-style datasets); it is slower, so keep `math_answer` for numbers.
"""

from __future__ import annotations

import re
import threading

_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed")
# A word of two or more letters that is not a LaTeX command (`\frac`, `\infty`): the text is prose.
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
# GSM8K's format: the last non-empty line is `#### value` (a `####` anywhere else may be a Markdown heading).
_FINAL_LINE = re.compile(r"(?m)^[ \t]*####[ \t]*([^\n]*\S)\s*\Z")


def _parse_value(text: str, timeout: int | None) -> list:
    """What math-verify's parse makes of `text`, without its raw-string fallback: [] when nothing parses.

    A bare formula (one line, no `$`/`\\(`/`\\[`/`\\boxed`, no words) is read whole as LaTeX, since
    math-verify alone reads `[1, 2)` as `2` and `\\sqrt{8}` as nothing; other text is searched for its answer.
    """
    from math_verify import parse  # imported when used: it brings SymPy, which `import rl_assets.rewards` need not load

    text = text.strip()
    if text and "\n" not in text and not _DELIMITED.search(text) and not _WORD.search(text):
        text = f"${text}$"
    return parse(text, fallback_mode="no_fallback", parsing_timeout=timeout)


def math_verify(completions: list[str], answer: list[str | None], *, float_rounding: int = 6,
                timeout_seconds: int | None = 5, **kwargs) -> list[float | None]:
    """1.0 when the completion's final answer equals the reference mathematically, else 0.0.

    The completion goes through math-verify's default extraction (`\\boxed{}`, `$...$`, "the answer
    is", plain expressions), except that one ending in GSM8K's `#### value` line is read from that
    line. The reference can be a bare value (`\\frac{1}{2}`, `[1, 2)`), `$...$`, a worked solution or
    GSM8K's `#### 72` (what follows the last `####`). A row without a reference, or whose reference
    math-verify cannot parse, scores None (does not apply) rather than 0: it is not the policy's fault.

    `float_rounding`: decimal places floats are rounded to before comparing. `timeout_seconds`: whole
    seconds allowed for each parse and comparison, through math-verify's `signal.alarm`, which only
    works in the main thread; from any other thread (a TRL or Dagster worker) this runs without a
    limit instead of failing, so a pathological expression can then take long. None or 0: no limit.

    >>> math_verify(["so $x = 2\\\\sqrt{2}$", "\\\\boxed{(1, 2)}", "1/2", "#### 1,200", "7", "7"],
    ...             answer=["\\\\sqrt{8}", "[1, 2)", "0.5", "1200", "\\\\frac{", None])
    [1.0, 0.0, 1.0, 1.0, None, None]
    """
    from math_verify import parse, verify

    if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int)):
        raise ValueError(f"math_verify: timeout_seconds must be whole seconds or None, not {timeout_seconds!r}")
    timeout = timeout_seconds if threading.current_thread() is threading.main_thread() else None
    references: dict[str, list] = {}  # a group's samples share their reference: parse it once
    scores = []
    for completion, reference in zip(completions, answer):
        if reference is None:
            scores.append(None)
            continue
        if reference not in references:
            references[reference] = _parse_value(reference.rpartition("####")[2], timeout)  # the whole text when no `####`
        gold = references[reference]
        if not gold:
            scores.append(None)
            continue
        final_line = _FINAL_LINE.search(completion)
        found = (final_line and _parse_value(final_line[1], timeout)) or parse(completion, parsing_timeout=timeout)
        scores.append(1.0 if verify(gold, found, float_rounding=float_rounding, timeout_seconds=timeout) else 0.0)
    return scores
