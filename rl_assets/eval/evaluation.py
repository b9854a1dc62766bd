"""evaluation: how well a checkpoint does the task on the held-out prompts, greedy and sampled.

Completions are scored with the configured reward functions, the same ones the rounds train on.
Accuracy is the share of completions that the correctness function (`evaluation.correctness`,
default the first reward function) scores 1; the mean total reward and pass@k (k = the samples per
prompt: the share of prompts with at least one correct completion) are reported beside it, and
promotion ranks on the sampled accuracy. Every checkpoint sees the same prompts with the same seed,
so a gain is reported with its paired standard error (`rl_assets.eval.stats.paired_difference`).

Each checkpoint is evaluated once per evaluation: the result is kept under
data/evaluations/<checkpoint id>-<evaluation key>.json, its scored completions beside it (.parquet, so that
`rl-assets rescore` can score them with another reward without sampling), written by the step that made the
checkpoint (so its held-out accuracy is on its own materialization, round by round), and the
`evaluation` asset assembles those results, evaluating only what is not there yet.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rl_assets.core.config import EvaluationParams, RewardsParams, RolloutsParams
from rl_assets.rewards import score_rollouts
from rl_assets.rollout.generation import generate


def eval_prompts(prompts: pa.Table, params: EvaluationParams) -> pa.Table:
    held_out = prompts.filter(pa.compute.equal(prompts["split"], "eval"))
    if held_out.num_rows == 0:
        raise ValueError("prompts table has no eval split rows; raise prompts.eval_fraction or add data")
    return held_out.slice(0, params.max_prompts)


def correctness_function(params: EvaluationParams, rewards: RewardsParams) -> str:
    """The score column (without `score_`) whose 1.0 means correct; a ValueError naming the key when there is none.

    The preflight checks this once the reward functions load; a run from the UI or a schedule meets it here.
    """
    if why := params.correctness_problem(rewards):
        raise ValueError(why)
    return params.correctness or rewards.functions[0].score_name


def score_completions(held_out: pa.Table, completions, samples: int, rewards: RewardsParams) -> pa.Table:
    """The evaluation completions (or episodes) of `held_out` with their scores: the rollouts' columns that rewards read, then
    the rewards table's `reward` and `score_<name>` columns, scored like rollouts (same functions, options and reward inputs)."""
    repeat = lambda column: [v for v in held_out[column].to_pylist() for _ in range(samples)]  # noqa: E731
    n = len(completions.texts)
    columns = {"round": [0] * n, "prompt_id": repeat("prompt_id"), "sample_idx": [i % samples for i in range(n)],
               "policy_id": [""] * n, "prompt": repeat("prompt"), "answer": repeat("answer"), "extra": repeat("extra"),
               "completion": completions.texts, "completion_ids": completions.completion_ids, "truncated": completions.truncated}
    if "image_ids" in held_out.column_names:  # the prompts' images: the rewards see them as in training
        columns["image_ids"] = [ids or [] for ids in repeat("image_ids")]
    if hasattr(completions, "num_turns"):  # episodes: what the environment reported goes to the rewards too
        columns.update(num_turns=completions.num_turns, environment_rewards=completions.environment_rewards, tool_calls=completions.tool_calls,
                       turns=completions.turns)
    return with_scores(pa.table(columns), rewards)


def with_scores(completions: pa.Table, rewards: RewardsParams) -> pa.Table:
    """`completions` without any earlier scores, then `reward` and one `score_<name>` column per function of `rewards`."""
    unscored = completions.drop_columns([c for c in completions.column_names if c == "reward" or c.startswith("score_")])
    scored = score_rollouts(unscored, rewards, rollouts_hash="evaluation")
    for name in ["reward", *[c for c in scored.column_names if c.startswith("score_")]]:
        unscored = unscored.append_column(scored.schema.field(name), scored[name])
    return unscored


def pass_at_k(correct: list[bool], samples: int) -> float:
    """Share of prompts (consecutive groups of `samples`) with at least one correct completion.

    >>> pass_at_k([False, True, False, False], 2)
    0.5
    """
    groups = [correct[i : i + samples] for i in range(0, len(correct), samples)]
    return sum(any(g) for g in groups) / len(groups)


def held_out_completions(model, tokenizer, held_out: pa.Table, params: EvaluationParams, seed: int, rewards: RewardsParams,
                         autocast=None, rollouts: RolloutsParams | None = None, images_dir=None, processor=None) -> dict[str, pa.Table]:
    """The checkpoint's scored completions of the held-out prompts, greedy (when `params.greedy`) and sampled: {mode: table}.

    A vision-language policy (its `processor` given) sees each prompt's images, read from `images_dir`.
    With tools or an environment (`rollouts.episodes`) each completion is an episode in that environment, with the
    rollouts' turn and token limits.
    """
    prompts = held_out["prompt"].to_pylist()
    tables = {}
    modes = ([("greedy", 1)] if params.greedy else []) + [("sampled", params.samples_per_prompt)]
    images = None
    if processor is not None and "image_ids" in held_out.column_names:
        from rl_assets.data.images import open_images

        images = open_images([ids or [] for ids in held_out["image_ids"].to_pylist()], images_dir)
    for mode, samples in modes:
        if rollouts is not None and rollouts.episodes is not None:
            out = _episodes(model, tokenizer, held_out, samples, rollouts, greedy=mode == "greedy", temperature=params.temperature,
                            max_new_tokens=params.max_new_tokens, seed=seed, autocast=autocast, images=images, processor=processor)
        else:
            out = generate(model, tokenizer, prompts, samples, greedy=mode == "greedy", temperature=params.temperature,
                           max_new_tokens=params.max_new_tokens, batch_size=params.batch_size, seed=seed, autocast=autocast,
                           images=images, processor=processor, compiled=params.decode == "compiled")
        tables[mode] = score_completions(held_out, out, samples, rewards)
    return tables


def evaluation_rows(completions: dict[str, pa.Table], params: EvaluationParams, seed: int, correctness: str) -> list[dict]:
    """One row per mode: accuracy (the share of completions `score_<correctness>` scores 1), mean total reward, pass@k,
    each prompt's correct completions, and the rest of what the evaluation table records. A pure function of the scored
    completions, so rescoring them (rl_assets.eval.rescoring) gives the rows another reward would have given."""
    rows = []
    for mode, scored in completions.items():
        samples = 1 if mode == "greedy" else params.samples_per_prompt
        correct = [score == 1.0 for score in scored[f"score_{correctness}"].to_pylist()]
        texts, prompts, answers = (scored[c].to_pylist() for c in ("completion", "prompt", "answer"))
        tool_calls = scored["tool_calls"].to_pylist() if "tool_calls" in scored.column_names else None
        rows.append({
            "mode": mode,
            "accuracy": sum(correct) / len(correct),
            "reward_mean": sum(scored["reward"].to_pylist()) / scored.num_rows,
            "pass_at_k": pass_at_k(correct, samples),
            "correct_per_prompt": [sum(correct[i : i + samples]) for i in range(0, len(correct), samples)],
            "correctness": correctness,
            "n_prompts": len(correct) // samples,
            "n_samples": samples,
            "mean_completion_tokens": sum(map(len, scored["completion_ids"].to_pylist())) / scored.num_rows,
            "temperature": 0.0 if mode == "greedy" else params.temperature,
            "seed": seed,
            "tool_call_rate": sum(bool(calls) for calls in tool_calls) / len(tool_calls) if tool_calls is not None else None,
            "examples": list(zip(prompts[: 5 * samples : samples], texts[: 5 * samples : samples], answers[: 5 * samples : samples])),
        })
    return rows


def evaluate_checkpoint(model, tokenizer, held_out: pa.Table, params: EvaluationParams, seed: int, rewards: RewardsParams,
                        autocast=None, rollouts: RolloutsParams | None = None, images_dir=None, processor=None) -> list[dict]:
    """Two rows, greedy and sampled: accuracy, mean total reward and pass@k of the checkpoint's completions
    (`held_out_completions`, then `evaluation_rows`); with tools, the share of episodes that called one too."""
    correctness = correctness_function(params, rewards)  # before sampling: a misnamed function stops at once
    completions = held_out_completions(model, tokenizer, held_out, params, seed, rewards, autocast, rollouts, images_dir, processor)
    return evaluation_rows(completions, params, seed, correctness)


def _episodes(model, tokenizer, held_out: pa.Table, samples: int, rollouts: RolloutsParams, **sampling):
    from rl_assets.rollout.environments import load_environment
    from rl_assets.rollout.episodes import sample_episodes
    from rl_assets.rollout.generation import eos_token_ids

    name, options = rollouts.episodes
    return sample_episodes(model, tokenizer, held_out.to_pylist(), samples, load_environment(name, options), name, top_p=1.0,
                           max_turns=rollouts.max_turns, max_tokens=rollouts.max_episode_tokens, batch_size=rollouts.batch_size,
                           eos_ids=eos_token_ids(model, tokenizer), **sampling)


EVALUATIONS = "evaluations"  # inside the data folder: each checkpoint's evaluation rows, by evaluation key


def evaluation_key(params, data: Path, precision: str = "no") -> str:
    """Names one evaluation: held-out prompts file, evaluation and rewards params, seed, precision, and the code that
    samples and scores (the project's and the user's reward modules); equal keys compare fairly."""
    from rl_assets.core.paths import output_path
    from rl_assets.core.stage_table import code_hashes, stage_code
    from rl_assets.core.storage import file_hash

    episodes = params.rollouts.episodes  # an evaluation in an environment is another evaluation
    limits = [episodes, params.rollouts.max_turns, params.rollouts.max_episode_tokens] if episodes else []
    code = sorted(code_hashes(stage_code("evaluation", params)).values())  # an edited reward module scores otherwise
    blob = json.dumps([file_hash(output_path("prompts", data)), params.evaluation.model_dump(mode="json"),
                       params.rewards.model_dump(mode="json"), params.seed, code] + ([precision] if precision != "no" else []) + limits,
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def evaluated(checkpoint: Path, params, data: Path, device: str, precision: str = "no", load=None) -> tuple[list[dict], bool]:
    """The checkpoint's evaluation rows, from <data>/evaluations when this evaluation of it was done before; (rows, reused).

    `load() -> (model, tokenizer)` gives the checkpoint's model when it is already in memory (rl_assets.run.loaded).
    """
    from rl_assets.core.checkpoints import checkpoint_id
    from rl_assets.core.policy import load_policy
    from rl_assets.core.paths import output_path
    from rl_assets.core.precision import compute_autocast, weights_dtype
    from rl_assets.core.schemas import read_table
    from rl_assets.core.storage import atomic_path

    key = evaluation_key(params, data, precision)
    cached = data / EVALUATIONS / f"{checkpoint_id(checkpoint)}-{key}.json"
    if cached.is_file() and cached.with_suffix(".parquet").is_file():
        return json.loads(cached.read_text()), True
    held_out = eval_prompts(read_table(output_path("prompts", data), "prompts"), params.evaluation)
    from rl_assets.core.paths import IMAGES
    from rl_assets.core.vision import is_vision_model, load_processor

    correctness = correctness_function(params.evaluation, params.rewards)
    model, tokenizer = load() if load is not None else load_policy(checkpoint, device, dtype=weights_dtype(precision))
    processor = load_processor(checkpoint, tokenizer, model.config) if is_vision_model(model.config) else None
    completions = held_out_completions(model, tokenizer, held_out, params.evaluation, params.seed, params.rewards,
                                       autocast=compute_autocast(precision, device), rollouts=params.rollouts, images_dir=data / IMAGES,
                                       processor=processor)
    rows = evaluation_rows(completions, params.evaluation, params.seed, correctness)
    # the completions themselves, so that another reward can score them without sampling again (rl-assets rescore)
    with atomic_path(cached.with_suffix(".parquet")) as tmp:
        pq.write_table(completions_table(completions), tmp)
    text = json.dumps(rows, default=list)
    with atomic_path(cached) as tmp:
        tmp.write_text(text + "\n")
    return json.loads(text), False  # the same plain lists a later step reads back


def completions_table(completions: dict[str, pa.Table]) -> pa.Table:
    """The evaluation's completions of every mode in one table, with a `mode` column first (what `evaluated` stores)."""
    # each mode's columns were typed from its own values (a list of calls all without an error is list<struct<error: null>>)
    return pa.concat_tables([table.add_column(0, "mode", pa.array([mode] * table.num_rows, pa.string()))
                             for mode, table in completions.items()], promote_options="permissive")


def stored_completions(path: Path) -> dict[str, pa.Table]:
    """`completions_table`'s file back as {mode: table}, in the modes' order."""
    table = pq.read_table(path)
    modes = list(dict.fromkeys(table["mode"].to_pylist()))
    return {mode: table.filter(pa.compute.equal(table["mode"], mode)).drop_columns(["mode"]) for mode in modes}


def heldout_metadata(rows: list[dict]) -> dict:
    """What a checkpoint's own materialization shows about its evaluation."""
    return {f"heldout_{row['mode']}_{metric}": row[metric] for row in rows for metric in ("accuracy", "pass_at_k", "reward_mean")}
