"""Rewards of episodes (rollouts with tools or an environment): what the environment reported, and how the tools were used."""

from __future__ import annotations


def environment_reward(completions: list[str], environment_rewards: list[dict] | None = None, *, part: str, **kwargs) -> list[float | None]:
    """The environment's reward part `part`, summed over the episode's turns; None for a rollout without it (a single completion).

    >>> environment_reward(["42", "50"], environment_rewards=[{"solved": 1.0, "turns": 3.0}, {}], part="solved")
    [1.0, None]
    """
    parts = environment_rewards or [{}] * len(completions)
    return [float(p[part]) if part in p else None for p in parts]


def tool_success(completions: list[str], tool_calls: list[list[dict]] | None = None, **kwargs) -> list[float | None]:
    """Share of the episode's tool calls that ran without an error; None for an episode without calls.

    >>> tool_success(["a", "b", "c"], tool_calls=[[{"error": None}, {"error": "unknown tool"}], [], None])
    [0.5, None, None]
    """
    calls = tool_calls or [None] * len(completions)
    return [sum(c.get("error") is None for c in made) / len(made) if made else None for made in calls]
