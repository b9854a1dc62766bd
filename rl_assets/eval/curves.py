"""Curves of a run: training curves per optimizer step and every round's metrics side by side, as plots and TensorBoard files.

    rl-assets track --backend tensorboard     write data/tensorboard/ from the lineage cards and the evaluation

Everything comes from what the pipeline already recorded: each checkpoint card's per-step `history`
becomes data/tensorboard/rNN (curves per optimizer step), and every card's metrics plus the
evaluation table become data/tensorboard/rounds (reward, accuracy, KL, loss, entropy by round).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.paths import DATA, checkpoint_key, output_path

# Inside an experiment's data folder (paths.data_dir):
TENSORBOARD = "tensorboard"
ROUND_PLOTS = "evaluation_rounds"  # the same by-round curves for `dvc plots show`
# Panels of the by-round figure: both accuracies; of the other groups, the first metric the cards have.
PANELS = {"reward": ["train/reward_mean"], "held-out accuracy": ["eval/sampled_accuracy", "eval/greedy_accuracy"],
          "KL to reference": ["train/kl", "train/kl_ref"], "loss": ["train/loss"], "entropy": ["train/entropy"]}


def write_scalars(logdir: str | Path, rows: list[dict], prefix: str = "") -> int:
    """One scalar per numeric value of each row, at step `row["step"]` (else its index); returns how many."""
    from torch.utils.tensorboard import SummaryWriter

    written = 0
    with SummaryWriter(str(logdir)) as writer:
        for index, row in enumerate(rows):
            step = int(row.get("step", index))
            for name, value in row.items():
                if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(f"{prefix}{name}", value, step)
                    written += 1
    return written


def round_rows(data: Path) -> list[dict]:
    """Per round of the data folder `data`: the checkpoint's training metrics (train/...) and its held-out accuracy (eval/...)."""
    rows: dict[int, dict] = {}
    for card in sorted(data.glob("r*/checkpoint/lineage.json")):
        lineage = read_lineage(card.parent)
        rows[lineage["round"]] = {"step": lineage["round"], **{f"train/{k}": v for k, v in (lineage.get("metrics") or {}).items()}}
    evaluation = output_path("evaluation", data)
    if evaluation.is_file():
        from rl_assets.core.schemas import read_table

        for row in read_table(evaluation, "evaluation").to_pylist():
            round_number = int(row["checkpoint"][1:3])
            if row["checkpoint"] == checkpoint_key(round_number) and round_number in rows:
                rows[round_number][f"eval/{row['mode']}_accuracy"] = row["accuracy"]
    return [rows[n] for n in sorted(rows)]


def write_round_plots(data: Path = DATA) -> Path:
    """DATA/evaluation_rounds/<metric>.csv, columns `round,value`: one `dvc plots show` plot per metric of PANELS."""
    from rl_assets.core.storage import atomic_path

    rows = round_rows(data)
    names = [name for names in PANELS.values() for name in names if any(name in row for row in rows)]
    with atomic_path(data / ROUND_PLOTS, is_dir=True) as tmp:
        for name in names:
            points = [f"{row['step']},{row[name]}" for row in rows if isinstance(row.get(name), (int, float))]
            (tmp / f"{name.replace('/', '_')}.csv").write_text("\n".join(["round,value", *points]) + "\n")
    return data / ROUND_PLOTS


def export_tensorboard(data: Path = DATA) -> Path:
    """Rewrite DATA/tensorboard from scratch (a rerun must not append duplicate points)."""
    logdir = data / TENSORBOARD
    shutil.rmtree(logdir, ignore_errors=True)
    for card in sorted(data.glob("r*/checkpoint/lineage.json")):
        history = read_lineage(card.parent).get("history") or []
        if history:
            write_scalars(logdir / card.parent.parent.name, history, prefix="train/")
    write_scalars(logdir / "rounds", round_rows(data))
    return logdir


def rounds_figure(rows: list[dict], path: Path) -> Path:
    """One small panel per metric over rounds (PNG), for the UI's metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(PANELS), figsize=(3 * len(PANELS), 2.6), dpi=90)
    for axis, (title, names) in zip(axes, PANELS.items()):
        for name in names:
            points = [(row["step"], row[name]) for row in rows if isinstance(row.get(name), (int, float))]
            if points:
                axis.plot(*zip(*points), "o-", label=name.split("/")[1])
                if title != "held-out accuracy":
                    break
        if axis.lines:
            axis.legend(fontsize=7)
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("round", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path

