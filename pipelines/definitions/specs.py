"""The asset specs of the compute multi-asset, one per output of the stage graph (rl_assets.core.graph.unroll): r00/checkpoint,
every round's rollouts, rewards, checkpoint (and PPO's critic), the evaluation and the promotion.

Dependencies, kinds and order come from the graph; what is added here is what the UI shows (groups, descriptions)
and what DVC tracks (`stage_tracking`). The compute multi-asset (pipelines/definitions/compute.py) writes them.
"""

from dagster import AssetSpec

from pipelines.definitions.tracking import stage_tracking
from pipelines.launch.params import asset_key
from rl_assets.core.config import Params
from rl_assets.core.graph import Node, critic_parent, unroll
from rl_assets.core.paths import checkpoint_key, round_prefix
from rl_assets.core.stage_table import STAGE_TABLE

KINDS = {"table": {"parquet"}, "model": {"pytorch"}}


def group_name(output: Node) -> str:
    """The UI's group of a compute output: r00..rNN, evaluation, promotion."""
    if output.round is not None:
        return round_prefix(output.round)
    return "promotion" if output.stage == "promote" else output.stage


def description(output: Node, params: Params) -> str:
    n = output.round
    if output.stage == "sft":
        return "The base policy (embedded tiny model or any HF causal LM), warm-started with TRL's SFTTrainer."
    if output.stage == "rollouts":
        return f"Round {n}: G completions per training prompt sampled from {checkpoint_key(n - 1)}, with per-token log-probs."
    if output.stage == "rewards":
        # The code version hashes the `rewards` section and the reward code (the user's modules included): after
        # editing either, the UI shows this asset as changed and the rollouts as up to date (as `dvc status` does).
        return f"Round {n}: every rollout scored by the configured reward functions (rescored without resampling)."
    if output.stage == "train":
        return f"Round {n}: {checkpoint_key(n - 1)} updated by {params.train.algorithm} on this round's stored rollouts and rewards."
    if output.stage == "critic":
        parent, ppo = critic_parent(params, n), params.train.ppo
        start = {"reward_model": "the reward model", checkpoint_key(0): "r00 with a zero value head"}.get(parent, parent)
        return f"Round {n}: PPO's value model, {start} fitted to this round's returns (GAE, gamma {ppo.gamma}, lambda {ppo.lam})."
    if output.stage == "evaluation":
        return "Greedy and sampled accuracy of every checkpoint on held-out prompts, with a per-round plot."
    if output.stage == "promote":
        # Not a DVC stage: what it writes (models/promoted, versions, history.jsonl) depends on the models promoted
        # before, so it is a decision with a history, not a reproducible output.
        return ("The best evaluated checkpoint whose guards pass, copied to models/promoted/ with a model card, only when it "
                "beats the current promoted model on the same evaluation; models/history.jsonl keeps every promotion and rollback.")
    raise ValueError(f"no description for stage {output.stage!r}")


def raw_inputs(output: Node, params: Params) -> list[str] | None:
    """Files outside the graph that an output reads (DVC deps): r00 starts from the promoted model when promotion.warm_start says so."""
    if output.stage == "sft" and params.promotion.warm_start == "promoted":
        return [f"{params.promotion.directory}/promoted"]
    return None


def compute_specs(params: Params) -> list[AssetSpec]:
    """Every output the compute multi-asset writes (each stage of the table that runs in a compute step, but the reward model,
    which has a step of its own), in flow order."""
    outputs = [o for o in unroll(params) if STAGE_TABLE[o.stage].compute and o.stage != "reward_model"]
    return [AssetSpec(asset_key(o.key), deps=[asset_key(key) for key in o.inputs], group_name=group_name(o), kinds=KINDS[o.kind],
                      description=description(o, params),
                      **({} if o.stage == "promote" else stage_tracking(o.stage, params, raw_inputs(o, params))))
            for o in outputs]
