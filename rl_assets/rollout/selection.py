"""Which prompts a round samples: uniformly, or by each prompt's pass rate over the rounds so far (`rollouts.selection`).

Every earlier round's rewards are stored, so each prompt's pass rate so far is known: the share of its completions
that the task's check (`evaluation.correctness`) scored 1, over every round of this experiment before this one (and
of the experiments named in `rollouts.selection.experiments`, matched by `prompt_id`). A prompt always solved or
never solved gives a group of equal rewards: no GRPO advantage, a round's sampling spent on nothing.

- `uniform`: a seeded draw without replacement from the `rl` split (pass rates are not read).
- `band`: the same draw among the prompts whose pass rate lies strictly between `low` and `high` (or that were seen
  fewer than `min_samples` times); when fewer than B are in the band, the rest are those nearest to it.
- `priority`: a seeded draw weighted by p(1 - p) (0.25, the largest, for a prompt not yet seen), so prompts near
  50% come first and solved ones rarely (weight floor 0.01).

The draw is seeded by (seed, round), so the same history gives the same choice; the rollouts table records each
prompt's pass rate and sample count at the time of the choice (`prior_pass_rate`, `prior_samples`).
"""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute  # noqa: F401  - pa.compute

FLOOR = 0.01  # priority: the weight of a prompt always or never solved, so it can still come back


def pass_counts(rewards: list[pa.Table], correctness: str) -> dict[str, tuple[int, int]]:
    """{prompt_id: (completions scored correct, completions)} over rewards tables, correct = `score_<correctness>` == 1.

    >>> t = pa.table({"prompt_id": ["a", "a", "b"], "score_check": [1.0, 0.0, 0.0]})
    >>> pass_counts([t, t], "check")
    {'a': (2, 4), 'b': (0, 2)}
    """
    counts: dict[str, list[int]] = {}
    for table in rewards:
        column = f"score_{correctness}"
        if column not in table.column_names:
            raise ValueError(f"a rewards table has no {column} column (evaluation.correctness {correctness!r}): its pass rates are unknown")
        for prompt_id, score in zip(table["prompt_id"].to_pylist(), table[column].to_pylist()):
            entry = counts.setdefault(prompt_id, [0, 0])
            entry[0] += score == 1.0
            entry[1] += 1
    return {prompt_id: (correct, total) for prompt_id, (correct, total) in counts.items()}


def choose(prompt_ids: list[str], count: int, rng: random.Random, selection, counts: dict[str, tuple[int, int]]) -> list[int]:
    """Indices into `prompt_ids` of the round's prompts, in table order.

    >>> ids = ["a", "b", "c", "d"]
    >>> class Band: kind, low, high, min_samples = "band", 0.0, 1.0, 1
    >>> choose(ids, 2, random.Random(0), Band, {"a": (4, 4), "b": (0, 4), "c": (2, 4)})  # a always, b never solved
    [2, 3]
    """
    n = len(prompt_ids)
    if selection is None or selection.kind == "uniform":
        return sorted(rng.sample(range(n), min(count, n)))
    rate = lambda i: counts[prompt_ids[i]][0] / counts[prompt_ids[i]][1] if counts.get(prompt_ids[i], (0, 0))[1] >= selection.min_samples else None  # noqa: E731
    rates = [rate(i) for i in range(n)]
    if selection.kind == "band":
        inside = [i for i, r in enumerate(rates) if r is None or selection.low < r < selection.high]
        if len(inside) >= count:
            return sorted(rng.sample(inside, count))
        centre = (selection.low + selection.high) / 2  # the rest, nearest the band first; ties in a seeded order
        outside = sorted((i for i, r in enumerate(rates) if not (r is None or selection.low < r < selection.high)),
                         key=lambda i: (abs(rates[i] - centre), rng.random()))
        return sorted(inside + outside[: count - len(inside)])
    weights = [0.25 if r is None else max(r * (1 - r), FLOOR) for r in rates]
    keys = [rng.random() ** (1 / w) for w in weights]  # Efraimidis-Spirakis: the largest keys are a weighted draw without replacement
    return sorted(sorted(range(n), key=lambda i: -keys[i])[:count])


def choose_prompts(prompts: pa.Table, count: int, round_number: int, seed: int, selection=None,
                   counts: dict[str, tuple[int, int]] | None = None) -> pa.Table:
    """The round's B prompts from the `rl` split, with `prior_pass_rate` (null: not seen) and `prior_samples` columns."""
    train = prompts.filter(pa.compute.equal(prompts["split"], "rl"))
    if train.num_rows == 0:
        raise ValueError("prompts table has no 'rl' split rows; lower prompts.sft_fraction or add data")
    counts = counts or {}
    ids = train["prompt_id"].to_pylist()
    chosen = train.take(choose(ids, count, random.Random(seed * 1000 + round_number), selection, counts))
    seen = [counts.get(p, (0, 0)) for p in chosen["prompt_id"].to_pylist()]
    return chosen.append_column("prior_pass_rate", pa.array([c / t if t else None for c, t in seen], pa.float64())) \
                 .append_column("prior_samples", pa.array([t for _, t in seen], pa.int32()))


def selection_metadata(rollouts: pa.Table, samples: int) -> dict:
    """What a round's choice looked like, from its rollouts table: prompts not seen before, and the seen ones' mean pass
    rate and share always or never solved so far.

    >>> t = pa.table({"prior_pass_rate": [None, None, 0.5, 0.5, 1.0, 1.0]})
    >>> selection_metadata(t, 2)
    {'prompts_unseen': 1, 'prior_pass_rate_mean': 0.75, 'prior_solved_or_unsolved_share': 0.5}
    """
    rates = rollouts["prior_pass_rate"].to_pylist()[::samples]
    seen = [r for r in rates if r is not None]
    return {"prompts_unseen": len(rates) - len(seen), "prior_pass_rate_mean": sum(seen) / len(seen) if seen else None,
            "prior_solved_or_unsolved_share": sum(r in (0.0, 1.0) for r in seen) / len(seen) if seen else None}
