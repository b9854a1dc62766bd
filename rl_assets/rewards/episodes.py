"""Rewards of episodes (rollouts with tools or an environment): what the environment reported, and how the tools were used."""

from __future__ import annotations


def environment_reward(completions: list[str], environment_rewards: list[dict] | None = None, *, part: str, **kwargs) -> list[float | None]:
    """The environment's reward part `part`, summed over the episode's turns; None for a rollout without it (a single completion).

    >>> environment_reward(["42", "50"], environment_rewards=[{"solved": 1.0, "turns": 3.0}, {}], part="solved")
    [1.0, None]
    """
    parts = environment_rewards or [{}] * len(completions)
    return [float(p[part]) if part in p else None for p in parts]


def final_answer(completions: list[str], answer: list[str | None], turns: list[list[dict] | None] | None = None,
                 **kwargs) -> list[float | None]:
    """1.0 when the last number of the policy's last turn equals the reference: what it answered, not what a tool said before.

    A single completion (no turns) is its own last turn; `math_answer` reads both numbers.

    >>> episode = [{"role": "assistant", "text": "<call calculator>6*7</call>"}, {"role": "environment", "text": "<result>42</result>"},
    ...            {"role": "assistant", "text": "42"}]
    >>> final_answer(["<call calculator>6*7</call><result>42</result>42", "x<result>42</result>", "42"], answer=["42"] * 3,
    ...              turns=[episode, episode[:2] + [{"role": "assistant", "text": ""}], None])
    [1.0, 0.0, 1.0]
    """
    from rl_assets.rewards.math_answers import math_answer

    last = [next((t["text"] for t in reversed(episode) if t["role"] == "assistant"), completion) if episode else completion
            for completion, episode in zip(completions, turns or [None] * len(completions))]
    return math_answer(last, answer)


def tool_success(completions: list[str], tool_calls: list[list[dict]] | None = None, **kwargs) -> list[float | None]:
    """Share of the episode's tool calls that ran without an error; None for an episode without calls.

    >>> tool_success(["a", "b", "c"], tool_calls=[[{"error": None}, {"error": "unknown tool"}], [], None])
    [0.5, None, None]
    """
    calls = tool_calls or [None] * len(completions)
    return [sum(c.get("error") is None for c in made) / len(made) if made else None for made in calls]
