"""Rewards on the shape of the text: a format regex, required tags, a length penalty, a repetition penalty.

Each takes its settings as keyword-only options (`rewards.functions[i].options` in params.yaml),
so a missing or misspelled setting stops at load time, not in the middle of a round.
"""

from __future__ import annotations

import re
from typing import Literal


def format_regex(completions: list[str], *, pattern: str, search: bool = False, **kwargs) -> list[float]:
    """1.0 when the completion matches `pattern` (the whole stripped text, or anywhere with `search`).

    `.` matches newlines too, so one pattern covers a multi-line answer.

    >>> format_regex(["<think>a\\nb</think> 7", "7", " <think></think>x "], pattern=r"<think>.*</think>.*")
    [1.0, 0.0, 1.0]
    >>> format_regex(["the answer is 7.", "no"], pattern=r"answer is \\d+", search=True)
    [1.0, 0.0]
    """
    compiled = re.compile(pattern, re.DOTALL)
    match = compiled.search if search else compiled.fullmatch
    return [1.0 if match(c if search else c.strip()) else 0.0 for c in completions]


def required_tags(completions: list[str], *, tags: tuple[str, ...] = ("think", "answer"), **kwargs) -> list[float]:
    """The share of `tags` that appear exactly once as an opening tag followed by its closing tag.

    >>> required_tags(["<think>x</think><answer>7</answer>", "<answer>7</answer>", "</think>x<think>", "<think><think>x</think>"])
    [1.0, 0.5, 0.0, 0.0]
    """
    scores = []
    for completion in completions:
        present = 0
        for tag in tags:
            opening, closing = f"<{tag}>", f"</{tag}>"
            if completion.count(opening) == 1 and completion.count(closing) == 1 and completion.index(opening) < completion.index(closing):
                present += 1
        scores.append(present / len(tags))
    return scores


def _lengths(completions: list[str], completion_ids: list[list[int]] | None, unit: str) -> list[int]:
    if unit == "chars":
        return [len(c) for c in completions]
    if completion_ids is None:
        raise ValueError("unit='tokens' needs the completion_ids column; use unit: chars to count characters")
    return [len(ids) for ids in completion_ids]


def length_penalty(completions: list[str], completion_ids: list[list[int]] | None = None, *, target: int, max_length: int,
                   unit: Literal["tokens", "chars"] = "tokens", **kwargs) -> list[float]:
    """0 up to `target` length, falling linearly to -1 at `max_length` and beyond.

    Lengths count tokens (`completion_ids`) or characters (`unit="chars"`).

    >>> length_penalty(["ab", "abcd", "abcdef", "abcdefghij"], target=2, max_length=6, unit="chars")
    [0.0, -0.5, -1.0, -1.0]
    >>> length_penalty(["x", "y"], completion_ids=[[1, 2], [1, 2, 3, 4]], target=2, max_length=4)
    [0.0, -1.0]
    """
    if max_length <= target:
        raise ValueError(f"length_penalty: max_length ({max_length}) must exceed target ({target})")
    return [0.0 - min(max(n - target, 0) / (max_length - target), 1.0) for n in _lengths(completions, completion_ids, unit)]


def repetition_penalty(completions: list[str], *, ngram_size: int = 3, max_penalty: float = -1.0,
                       unit: Literal["words", "chars"] = "words", **kwargs) -> list[float]:
    """`max_penalty` times the share of repeated n-grams: 0 for no repeats, `max_penalty` when all repeat.

    n-grams of words (whitespace-split) or of characters (`unit="chars"`, for a character-level
    policy). A completion shorter than one n-gram scores 0.

    >>> repetition_penalty(["a b c d e", "a b a b a b a b", "a b"], ngram_size=2)
    [0.0, -0.7142857142857143, 0.0]
    >>> repetition_penalty(["1212", "1234"], ngram_size=2, unit="chars")
    [-0.33333333333333337, 0.0]
    """
    if max_penalty > 0:
        raise ValueError(f"repetition_penalty: max_penalty must be <= 0, got {max_penalty}")
    scores = []
    for completion in completions:
        units = completion.split() if unit == "words" else list(completion)
        ngrams = [tuple(units[i : i + ngram_size]) for i in range(len(units) - ngram_size + 1)]
        scores.append(max_penalty * (1 - len(set(ngrams)) / len(ngrams)) + 0.0 if ngrams else 0.0)  # + 0.0: no -0.0
    return scores
