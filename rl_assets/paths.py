"""Where each asset lives: data/<asset key>, a `.parquet` file for tables, a folder for models (checkpoints, reward_model).

The asset key, the data path and the DVC stage name are the same words (`r01/rollouts`,
`data/r01/rollouts.parquet`, stage `r01-rollouts`), so one name finds a stage everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

DATA = Path("data")


def round_prefix(round_number: int) -> str:
    return f"r{round_number:02d}"


def checkpoint_key(round_number: int) -> str:
    return f"{round_prefix(round_number)}/checkpoint"


def output_path(key: str, root: Path = Path(".")) -> Path:
    """The file or folder an asset key writes, e.g. 'r01/rollouts' -> data/r01/rollouts.parquet."""
    if key.endswith("checkpoint") or key == "reward_model":  # model folders
        return root / DATA / key
    return root / DATA / f"{key}.parquet"


def dvc_stage_name(key: str) -> str:
    """DVC stage names may not contain '/', so 'r01/rollouts' becomes 'r01-rollouts'."""
    return key.replace("/", "-")


EVALUATION_METRICS = DATA / "evaluation.json"
EVALUATION_PLOT = DATA / "evaluation.png"


def train_state_dir(round_number: int, root: Path = Path(".")) -> Path:
    """Intermediate training states of a round (not an asset output: DVC and Dagster never see it)."""
    return root / DATA / round_prefix(round_number) / "train_state"


# Which compute stage writes each output (rl_assets.stages), and in what order a run writes them.
OUTSIDE_ROUNDS = {"r00/checkpoint": "sft", "evaluation": "evaluation", "reward_model": "reward_model", "promoted_model": "promote"}
ROUND_OUTPUTS = {"rollouts": "rollouts", "rewards": "rewards", "checkpoint": "train"}  # in flow order within a round


def stage_of(key: str) -> tuple[str, int | None]:
    """(stage, round) that writes output `key`.

    >>> stage_of("r03/checkpoint"), stage_of("r00/checkpoint"), stage_of("evaluation")
    (('train', 3), ('sft', None), ('evaluation', None))
    """
    if key in OUTSIDE_ROUNDS:
        return OUTSIDE_ROUNDS[key], None
    found = re.fullmatch(r"r(\d{2})/(rollouts|rewards|checkpoint)", key)
    if not found or found.group(1) == "00":
        raise ValueError(f"no compute stage writes {key!r}; outputs: {sorted(OUTSIDE_ROUNDS)} and rNN/{{{','.join(ROUND_OUTPUTS)}}}")
    return ROUND_OUTPUTS[found.group(2)], int(found.group(1))


def flow_order(keys: list[str]) -> list[str]:
    """`keys` in the order the flow writes them: r00, then each round's rollouts, rewards, checkpoint, then the rest.

    >>> flow_order(["r02/rollouts", "evaluation", "r01/checkpoint", "r01/rewards"])
    ['r01/rewards', 'r01/checkpoint', 'r02/rollouts', 'evaluation']
    """
    def position(key: str) -> tuple:
        stage, n = stage_of(key)
        if n is None:
            return ({"sft": 0, "reward_model": 0}.get(stage, 10**6), 0, list(OUTSIDE_ROUNDS).index(key))
        return (n, 1 + list(ROUND_OUTPUTS.values()).index(stage), 0)

    return sorted(dict.fromkeys(keys), key=position)
