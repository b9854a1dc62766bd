"""Where each asset lives: data/<asset key>, a `.parquet` file for tables, a folder for models (checkpoints, reward_model).

The asset key, the data path and the DVC stage name are the same words (`r01/rollouts`,
`data/r01/rollouts.parquet`, stage `r01-rollouts`), so one name finds a stage everywhere.
"""

from __future__ import annotations

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
