"""The stage graph of one run: every output its params make, with the stage that writes it, its round, its inputs and its kind.

The stage table (stage_table.py) says what each stage is; `unroll` says which outputs one `params` has and
what each reads: rounds 1..R, PPO's value model, the reward model, the evaluation and the promotion. Dagster's
asset specs, dvc.yaml, the order a run writes its outputs in and what a push records all read it, so a
dependency is written down here once.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_assets.core.algorithms import algorithm
from rl_assets.core.paths import checkpoint_key, round_prefix
from rl_assets.core.stage_table import STAGE_TABLE


@dataclass(frozen=True)
class Node:
    """A node of the graph: one output, its asset key, DVC stage and file or folder under the data folder."""

    key: str  # e.g. r01/rollouts
    stage: str  # the stage table's name for what writes it
    round: int | None  # 1..R for round outputs, 0 for r00/checkpoint, None outside the rounds
    inputs: tuple[str, ...]  # the output keys it reads, in the order a reader would name them

    @property
    def kind(self) -> str:
        """"table" (a Parquet file) or "model" (a save_pretrained folder)."""
        return STAGE_TABLE[self.stage].kind


def uses_reward_model(params) -> bool:
    """Whether a reward function scores with the trained reward model (every round's rewards then read it)."""
    return params.reward_model is not None and any(f.name == "reward_model" for f in params.rewards.functions)


def critic_parent(params, round_number: int) -> str:
    """The output key of the value model round `round_number` starts from: the previous round's critic, or in round 1 r00's body
    (a zero value head) or the reward model (train.ppo.critic_init).

    >>> from types import SimpleNamespace
    >>> p = SimpleNamespace(train=SimpleNamespace(ppo=SimpleNamespace(critic_init="reward_model")))
    >>> critic_parent(p, 1), critic_parent(p, 3)
    ('reward_model', 'r02/critic')
    """
    if round_number > 1:
        return f"{round_prefix(round_number - 1)}/critic"
    return "reward_model" if params.train.ppo.critic_init == "reward_model" else checkpoint_key(0)


def sampling_checkpoint(params, n: int) -> str:
    """The checkpoint round `n` samples its rollouts from: n-1, or n-1-k with `rollouts.staleness` k (never before r00).

    >>> from types import SimpleNamespace
    >>> p = SimpleNamespace(rollouts=SimpleNamespace(staleness=1))
    >>> sampling_checkpoint(p, 1), sampling_checkpoint(p, 2), sampling_checkpoint(p, 5)
    ('r00/checkpoint', 'r00/checkpoint', 'r03/checkpoint')
    """
    return checkpoint_key(max(0, n - 1 - params.rollouts.staleness))


def round_outputs(params, n: int) -> list[Node]:
    """Round `n`'s outputs in the order a run writes them: rollouts, rewards, checkpoint, and PPO's critic last (the policy's
    advantages read the parent's value estimates before this round's critic is trained in place)."""
    prefix, previous = round_prefix(n), checkpoint_key(n - 1)
    rollouts, rewards, checkpoint = (f"{prefix}/{name}" for name in ("rollouts", "rewards", "checkpoint"))
    reference = (checkpoint_key(0),) if params.train.beta > 0 and n > 1 else ()  # r00 is the KL reference
    value_model = algorithm(params.train.algorithm).value_model
    parent_critic = (critic_parent(params, n),) if value_model else ()
    outputs = [
        Node(rollouts, "rollouts", n, (sampling_checkpoint(params, n), "prompts")),
        Node(rewards, "rewards", n, (rollouts, *(("reward_model",) if uses_reward_model(params) else ()))),
        Node(checkpoint, "train", n, (rewards, rollouts, previous, *reference, *(c for c in parent_critic if c != previous))),
    ]
    if value_model:
        outputs.append(Node(f"{prefix}/critic", "critic", n, (rewards, rollouts, *parent_critic, *reference)))
    return outputs


def unroll(params) -> list[Node]:
    """Every output of a run with `params`, each after everything it reads.

    >>> from rl_assets.core.params_file import load_params
    >>> [(o.key, o.inputs) for o in unroll(load_params("params.yaml", ["rounds=1", "train.beta=0.0"]))]  # doctest: +NORMALIZE_WHITESPACE
    [('raw_data', ()), ('prompts', ('raw_data',)), ('r00/checkpoint', ('prompts',)),
     ('r01/rollouts', ('r00/checkpoint', 'prompts')), ('r01/rewards', ('r01/rollouts',)),
     ('r01/checkpoint', ('r01/rewards', 'r01/rollouts', 'r00/checkpoint')),
     ('evaluation', ('r00/checkpoint', 'r01/checkpoint', 'prompts')), ('promoted_model', ('evaluation',))]
    """
    outputs = [Node("raw_data", "raw_data", None, ()), Node("prompts", "prompts", None, ("raw_data",)),
               Node(checkpoint_key(0), "sft", 0, ("prompts",))]
    if params.reward_model is not None:  # trained from its own preference file
        outputs.append(Node("reward_model", "reward_model", None, ()))
    for n in range(1, params.rounds + 1):
        outputs += round_outputs(params, n)
    outputs.append(Node("evaluation", "evaluation", None, (*(checkpoint_key(n) for n in range(params.rounds + 1)), "prompts")))
    outputs.append(Node("promoted_model", "promote", None, ("evaluation",)))
    return outputs
