"""Paired differences of held-out accuracy: every checkpoint is evaluated on the same prompts with the same seed.

The per-prompt differences cancel what the prompts share (an easy prompt is easy for both), so the paired standard
error is smaller than the two unpaired ones combined, and a held-out set of a given size detects a smaller gain.
No torch or pyarrow here: the guards, `compare` and the evaluation step all use it.
"""

from __future__ import annotations


def paired_rates(first: list[float], later: list[float]) -> tuple[float, float]:
    """Mean of `later - first` over paired per-prompt accuracies, and its standard error: (mean, se).

    >>> paired_rates([0.0, 0.5, 0.5, 0.0], [0.5, 0.5, 1.0, 0.0])
    (0.25, 0.14433756729740643)
    """
    if len(first) != len(later) or not first:
        raise ValueError(f"paired difference needs the same prompts: {len(first)} against {len(later)}")
    differences = [b - a for a, b in zip(first, later)]
    mean = sum(differences) / len(differences)
    variance = sum((d - mean) ** 2 for d in differences) / max(1, len(differences) - 1)
    return mean, (variance / len(differences)) ** 0.5


def paired_difference(first: list[int], later: list[int], samples: int) -> tuple[float, float]:
    """Accuracy of `later` minus that of `first` on the same prompts, and its standard error: (mean, se).

    Both list each prompt's correct completions out of `samples` (the evaluation table's `correct_per_prompt`).

    >>> paired_difference([0, 1, 1, 0], [1, 1, 2, 0], 2)
    (0.25, 0.14433756729740643)
    """
    return paired_rates([a / samples for a in first], [b / samples for b in later])
