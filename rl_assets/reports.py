"""What a step shows in the UI beside its numbers: markdown tables and the accuracy plot."""

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


def accuracy_plot(report: list[dict], reward_means: dict[int, float], path: Path) -> str:
    """Accuracy per checkpoint (greedy, sampled) and mean rollout reward per round, saved at `path`; returns base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5), dpi=100)
    for mode, style in (("greedy", "o-"), ("sampled", "s-")):
        points = [(int(r["checkpoint"][1:3]), r["accuracy"]) for r in report if r["mode"] == mode]
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
