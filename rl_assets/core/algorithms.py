"""The training algorithms, each with what the rest of the flow needs to know about it: one registry, read everywhere.

A round's graph, its training function, its advantages and its checks ask the registry (`algorithm(name)`)
what an algorithm does, instead of comparing names: adding one is a row here and its functions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    trainer: str  # what trains the policy on a round's table: policy_gradient (ours), dpo or rft (TRL's trainers)
    advantages: str | None  # policy_gradient's estimator: group (GRPO), rloo, reinforce_pp, or gae (from the value model)
    group: str | None  # how it compares a prompt's completions with each other (then it needs 2 or more); None: it does not
    value_model: bool = False  # trains rNN/critic beside the policy, whose estimates give the advantages


ALGORITHMS = {
    "grpo": Algorithm("policy_gradient", "group", "every advantage is a reward minus its group's mean"),
    "rloo": Algorithm("policy_gradient", "rloo", "the baseline is the other samples' mean"),
    "reinforce_pp": Algorithm("policy_gradient", "reinforce_pp", "the group mean is subtracted before whitening"),
    "ppo": Algorithm("policy_gradient", "gae", None, value_model=True),
    "dpo": Algorithm("dpo", None, "pairs are a prompt's best and worst completions"),
    "rft": Algorithm("rft", None, None),
}


def algorithm(name: str) -> Algorithm:
    """The registry's entry for `name`.

    >>> algorithm("ppo").value_model, algorithm("grpo").advantages, algorithm("rft").trainer
    (True, 'group', 'rft')
    """
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; one of {sorted(ALGORITHMS)}") from None
