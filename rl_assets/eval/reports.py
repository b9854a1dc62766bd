"""What a step shows in the UI beside its numbers (markdown tables, the accuracy plot), and the table a run ends with.

No torch here: the CLI prints `summary_text` after a run, and importing the model code for it would hold it up.
"""

from __future__ import annotations

import base64
from pathlib import Path


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A markdown table with `|` and newlines in cells escaped.

    >>> print(markdown_table(["a", "b"], [[1, "x|y"]]))
    | a | b |
    |---|---|
    | 1 | x\\|y |
    """
    escape = lambda v: str(v).replace("|", "\\|").replace("\n", "\\n")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(escape(v) for v in row) + " |" for row in rows])


def episodes_markdown(rows: list[dict], count: int = 3) -> str:
    """A few episodes turn by turn: who wrote each turn, what it says, and the tool calls made in it.

    >>> print(episodes_markdown([{"prompt": "2*3=", "answer": "6", "environment_rewards": '{"tool_calls": 1.0}',
    ...     "turns": [{"role": "assistant", "text": "<call calculator>2*3</call>"}, {"role": "environment", "text": "<result>6</result>"},
    ...               {"role": "assistant", "text": "6"}]}]))
    **2*3=** (answer 6; rewards {"tool_calls": 1.0})
    <BLANKLINE>
    | turn | role | text |
    |---|---|---|
    | 1 | assistant | <call calculator>2*3</call> |
    | 2 | environment | <result>6</result> |
    | 3 | assistant | 6 |
    """
    parts = []
    for row in rows[:count]:
        turns = [[i, t["role"], t["text"]] for i, t in enumerate(row["turns"] or [], 1)]
        parts.append(f"**{row['prompt']}** (answer {row['answer']}; rewards {row['environment_rewards']})\n\n"
                     + markdown_table(["turn", "role", "text"], turns))
    return "\n\n".join(parts)


def gain_text(row: dict) -> str:
    """An evaluation row's gain over r00 in points, with its paired standard error when known.

    >>> gain_text({"gain": 0.125, "gain_se": 0.031}), gain_text({"gain": 0.0, "gain_se": None}), gain_text({"gain": None})
    ('+12.5 ± 3.1p', '+0.0p', '')
    """
    if row.get("gain") is None:
        return ""
    return f"{row['gain'] * 100:+.1f}" + (f" ± {row['gain_se'] * 100:.1f}p" if row.get("gain_se") is not None else "p")


def accuracy_plot(report: list[dict], reward_means: dict[int, float], path: Path) -> str:
    """Accuracy per checkpoint (greedy, sampled) and mean rollout reward per round, saved at `path`; returns base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5), dpi=100)
    for mode, style in (("greedy", "o-"), ("sampled", "s-")):
        points = [(int(r["checkpoint"][1:3]), r["accuracy"]) for r in report if r["mode"] == mode]
        if points:  # greedy is optional (evaluation.greedy)
            axis.plot(*zip(*points), style, label=f"{mode} accuracy (held out)")
    if reward_means:
        axis.plot(list(reward_means), list(reward_means.values()), "^--", label="mean rollout reward")
    axis.set_xlabel("round (checkpoint rNN)")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return base64.b64encode(path.read_bytes()).decode()


def summary_text(data: Path = Path("data")) -> str:
    """The evaluation report of the data folder `data` (paths.data_dir) as a plain-text table: accuracy per checkpoint,
    greedy and sampled, with pass@k and mean reward."""
    from rl_assets.core.paths import output_path
    from rl_assets.core.schemas import read_table, table_lineage

    path = output_path("evaluation", data)
    rows = read_table(path, "evaluation").to_pylist()
    experiment = table_lineage(path).get("experiment")
    by_checkpoint: dict[str, dict] = {}
    for row in rows:
        by_checkpoint.setdefault(row["checkpoint"], {"id": row["checkpoint_id"]})[row["mode"]] = row
    first = next(iter(by_checkpoint.values()))
    k = first["sampled"]["n_samples"]
    lines = ["held-out accuracy by {} ({}sampled at T={:.1f}, {} samples/prompt, {} prompts; gain vs r00 ± paired SE){}".format(
        first["sampled"]["correctness"], "greedy; " if "greedy" in first else "", first["sampled"]["temperature"], k, first["sampled"]["n_prompts"],
        f"; experiment {experiment}" if experiment else ""),
        f"{'checkpoint':<16}{'id':<14}{'greedy':>8}{'sampled':>9}{'gain sampled':>16}{f'pass@{k}':>9}{'reward':>8}"]
    for name, entry in by_checkpoint.items():
        sampled = entry["sampled"]
        greedy = f"{entry['greedy']['accuracy']:>8.3f}" if "greedy" in entry else f"{'-':>8}"
        gain = gain_text(sampled) if sampled.get("gain") is not None else f"{(sampled['accuracy'] - first['sampled']['accuracy']) * 100:+.1f}p"
        lines.append(f"{name:<16}{entry['id'][:12]:<14}{greedy}{sampled['accuracy']:>9.3f}{gain:>16}"
                     f"{sampled['pass_at_k']:>9.3f}{sampled['reward_mean']:>8.3f}")
    return "\n".join(lines)
