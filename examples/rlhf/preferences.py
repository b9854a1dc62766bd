"""Preference pairs for examples/rlhf: for a seeded draw of the default task's problems, the right answer (chosen)
against a near miss (rejected), the kind of pair a labeller would write.

    .venv/bin/python examples/rlhf/preferences.py [--count 4000] [--seed 1] [--out examples/rlhf/preferences.jsonl]

The problems come from data/raw/math_problems.json (the default task's templates) with another seed than the
pipeline's raw data, so the pairs are a labelled sample of the task, not its held-out prompts. A near miss is the
answer moved by 1 to 3 either way: the reward model has to read the arithmetic, not the format.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from rl_assets.data.raw_generators import generate_problems

REPO = Path(__file__).resolve().parents[2]


def pairs(count: int, seed: int) -> list[dict]:
    """`count` pairs {prompt, chosen, rejected}, reproducible for a seed.

    >>> [sorted(pair) for pair in pairs(2, seed=1)] == [["chosen", "prompt", "rejected"]] * 2
    True
    >>> all(p["chosen"] != p["rejected"] for p in pairs(200, seed=1))
    True
    """
    rng = random.Random(seed)
    out = []
    for problem in generate_problems(REPO / "data/raw/math_problems.json", count, seed):
        answer = int(problem["answer"])
        miss = answer + rng.choice([-3, -2, -1, 1, 2, 3])
        out.append({"prompt": problem["prompt"], "chosen": str(answer), "rejected": str(miss)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("preferences.jsonl"))
    args = parser.parse_args()
    args.out.write_text("".join(json.dumps(pair) + "\n" for pair in pairs(args.count, args.seed)))
    print(f"wrote {args.count} pairs to {args.out}")


if __name__ == "__main__":
    main()
