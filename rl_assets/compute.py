"""Compute steps that load a model, runnable on their own or as a Dagster Pipes child process.

    python -m rl_assets.compute {sft,rollouts,train,evaluation} [--round N] [--params params.yaml] [--set k=v]
    torchrun --nproc_per_node=2 -m rl_assets.compute train --round 1

Each step reads its inputs from data/, writes its output atomically, and returns the metadata a
user looks at. Dagster launches the same steps through `pipelines.pipes_child`, where rank 0
reports that metadata and the output's content hash as the materialization.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed as dist

from rl_assets.checkpoints import checkpoint_id, read_lineage, save_checkpoint
from rl_assets.config import Params, load_params
from rl_assets.precision import compute_autocast, resolve_mixed_precision, weights_dtype
from rl_assets.paths import EVALUATION_METRICS, EVALUATION_PLOT, checkpoint_key, output_path, round_prefix, train_state_dir
from rl_assets.schemas import EVALUATION, ROLLOUTS, read_table, table_lineage, write_table
from rl_assets.stage_code import stage_lineage
from rl_assets.storage import file_hash


def _markdown_table(header: list[str], rows: list[list]) -> str:
    escape = lambda v: str(v).replace("|", "\\|").replace("\n", "\\n")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(escape(v) for v in row) + " |" for row in rows])


def run_sft(params: Params, root: Path, device: str) -> dict:
    """r00/checkpoint: build or load the base model, warm-start it with SFT when enabled, save it."""
    from rl_assets.models import load_base_model, load_policy
    from rl_assets.promotion import warm_start_path
    from rl_assets.sft import warm_start

    prompts_path = output_path("prompts", root)
    prompts = read_table(prompts_path, "prompts")
    promoted = warm_start_path(params.promotion, root)
    if promoted is not None:  # the promoted model already went through SFT and RL: continue from it as is
        model, tokenizer = load_policy(promoted)
        metrics, parent, trained_on, algorithm = {}, checkpoint_id(promoted), {}, "promoted"
    else:
        model, tokenizer = load_base_model(params.model, params.seed)
        metrics = warm_start(model, tokenizer, prompts, params.sft, params.seed, use_cpu=device == "cpu") if params.sft.enabled else {}
        parent, trained_on = params.model.name_or_path, {"prompts": file_hash(prompts_path)} if params.sft.enabled else {}
        algorithm = "sft" if params.sft.enabled else "none"
    lineage = {"round": 0, "parent": parent, "trained_on": trained_on, "algorithm": algorithm,
               "params_hash": params.section_hash("seed", "model", "sft"), **stage_lineage("sft", params, ["seed", "model", "sft"]),
               "metrics": metrics, "num_parameters": sum(p.numel() for p in model.parameters())}
    path = output_path(checkpoint_key(0), root)
    if dist.is_initialized() and dist.get_rank() != 0:
        return {}
    save_checkpoint(model, tokenizer, path, lineage)
    return {"parameters": lineage["num_parameters"], **{k: v for k, v in metrics.items() if v is not None}}


def _with_heldout(metadata: dict, checkpoint: Path, params: Params, root: Path, device: str) -> tuple[dict, Path]:
    """Evaluate a new checkpoint now, so its held-out accuracy is on its own materialization (the evaluation asset reuses it).

    Called here, not by run_sft/run_train: the checkpoint does not depend on the evaluation code or the rewards
    (stage_code follows those functions), so editing a reward module does not make the checkpoints stale.
    """
    from rl_assets.evaluation import evaluated, heldout_metadata

    if dist.is_initialized() and dist.get_rank() != 0:
        return metadata, checkpoint
    try:
        rows, _ = evaluated(checkpoint, params, root, device, _precision(params, device))
    except Exception as error:  # e.g. a reward that raises: its own asset fails with it; the checkpoint is fine
        print(f"warning: held-out evaluation of {checkpoint} failed: {type(error).__name__}: {error}", file=sys.stderr)
        return {**metadata, "heldout_error": f"{type(error).__name__}: {error}"[:500]}, checkpoint
    return {**metadata, **heldout_metadata(rows)}, checkpoint


def run_rollouts(params: Params, round_number: int, root: Path, device: str) -> dict:
    """rNN/rollouts: G samples for each of B train prompts from the previous round's checkpoint."""
    from rl_assets.models import load_policy
    from rl_assets.rollouts import sample_rollouts

    policy_path = output_path(checkpoint_key(round_number - 1), root)
    prompts_path = output_path("prompts", root)
    mode = _precision(params, device)
    model, tokenizer = load_policy(policy_path, device, dtype=weights_dtype(mode))
    started = time.perf_counter()
    table = sample_rollouts(model, tokenizer, read_table(prompts_path, "prompts"), params.rollouts, round_number=round_number,
                            seed=params.seed, policy_id=checkpoint_id(policy_path), prompts_hash=file_hash(prompts_path),
                            model_path=str(policy_path), autocast=compute_autocast(mode, device))
    elapsed = time.perf_counter() - started
    write_table(table, output_path(f"{round_prefix(round_number)}/rollouts", root), ROLLOUTS, "rollouts",
                lineage=stage_lineage("rollouts", params, ["seed", "rollouts"]))
    lengths = [len(ids) for ids in table["completion_ids"].to_pylist()]
    samples = [[p, c, a] for p, c, a in zip(table["prompt"].to_pylist()[:8], table["completion"].to_pylist()[:8], table["answer"].to_pylist()[:8])]
    return {"rows": table.num_rows, "prompts": table.num_rows // params.rollouts.samples_per_prompt,
            "mean_completion_tokens": sum(lengths) / len(lengths), "truncated_share": sum(table["truncated"].to_pylist()) / table.num_rows,
            "completion_tokens_per_second": sum(lengths) / elapsed if elapsed else 0.0,  # sampling plus the log-prob pass
            "samples": {"type": "md", "raw_value": _markdown_table(["prompt", "completion", "answer"], samples)}}


def _precision(params: Params, device: str) -> str:
    """The one precision mode of every policy forward pass: the trainer's (see precision.py)."""
    return resolve_mixed_precision(params.train.mixed_precision, device)


def run_train(params: Params, round_number: int, root: Path, device: str) -> dict:
    """rNN/checkpoint: the configured algorithm on the round's stored rollouts and rewards, starting from rNN-1."""
    from rl_assets.models import load_policy, load_trainable_policy
    from rl_assets.train_state import fingerprint, load_carried_optimizer, save_carried_optimizer

    prefix = round_prefix(round_number)
    parent = output_path(checkpoint_key(round_number - 1), root)
    rollouts_path, rewards_path = output_path(f"{prefix}/rollouts", root), output_path(f"{prefix}/rewards", root)
    rollouts, rewards = read_table(rollouts_path, "rollouts"), read_table(rewards_path, "rewards")
    trained_on = {"rollouts": file_hash(rollouts_path), "rewards": file_hash(rewards_path)}
    world = dist.get_world_size() if dist.is_initialized() else 1
    train = params.train
    model, tokenizer = load_trainable_policy(parent, train.lora, output_path(checkpoint_key(0), root), device,
                                             dtype=weights_dtype(_precision(params, device)))
    seed = params.seed * 1000 + round_number
    ref_model = optimizer_state = None
    if train.algorithm in ("dpo", "rft"):
        from rl_assets.preference import train_dpo, train_rft

        run = train_dpo if train.algorithm == "dpo" else train_rft
        model, metrics = run(model, tokenizer, rollouts, rewards, train, seed=seed, use_cpu=not device.startswith("cuda"))
        history = metrics.pop("history")
    else:
        from rl_assets.train import table_group_size, train_on_rollouts

        ref_model = load_policy(output_path(checkpoint_key(0), root), device)[0] if train.beta > 0 else None
        state = fingerprint(train.model_dump(mode="json"), inputs=trained_on, parent=checkpoint_id(parent), world_size=world, seed=seed)
        carried = load_carried_optimizer(checkpoint_id(parent), root, device) if train.carry_optimizer_state else None
        model, metrics, history, optimizer_state = train_on_rollouts(
            model, rollouts, rewards, train, group_size=table_group_size(rollouts, params.rollouts.samples_per_prompt),
            temperature=params.rollouts.temperature,
            pad_id=tokenizer.pad_token_id, seed=seed, max_new_tokens=params.rollouts.max_new_tokens, device=device, ref_model=ref_model,
            state_dir=train_state_dir(round_number, root), fingerprint=state,
            optimizer_state=carried)
    if dist.is_initialized() and dist.get_rank() != 0:
        return {}
    from rl_assets.train import reference_kl

    reference = ref_model if ref_model is not None else load_policy(output_path(checkpoint_key(0), root), device)[0]
    metrics["kl"] = reference_kl(model.to(device), reference, rollouts, pad_id=tokenizer.pad_token_id, temperature=params.rollouts.temperature)
    lineage = {"round": round_number, "parent": checkpoint_id(parent), "parent_path": str(parent.relative_to(root)),
               "trained_on": trained_on, "algorithm": train.algorithm, "train": train.model_dump(mode="json"),
               "params_hash": params.section_hash("seed", "train"), "world_size": world, "metrics": metrics, "history": history,
               **stage_lineage("train", params, ["seed", "train"])}
    for table_path in (rollouts_path, rewards_path):  # the code that sampled and scored what this round trained on
        lineage["code"].update(table_lineage(table_path).get("code", {}))
    saved_id = save_checkpoint(model, tokenizer, output_path(checkpoint_key(round_number), root), lineage, lora=train.lora)
    if optimizer_state is not None and train.carry_optimizer_state:
        save_carried_optimizer(optimizer_state, saved_id, round_number, root)
    shutil.rmtree(train_state_dir(round_number, root), ignore_errors=True)  # the round is done; its resume points are not needed
    return metrics


def _accuracy_plot(report: list[dict], reward_means: dict[int, float], path: Path) -> str:
    """Accuracy per checkpoint (greedy, sampled) and mean rollout reward per round; returns base64 PNG."""
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


def run_evaluation(params: Params, root: Path, device: str) -> dict:
    """evaluation: every checkpoint r00..rR on the held-out prompts, greedy and sampled."""
    from rl_assets.evaluation import evaluated
    from rl_assets.tracking import write_round_plots

    report, examples, reused = [], [], 0
    for round_number in range(params.rounds + 1):
        path = output_path(checkpoint_key(round_number), root)
        rows, was_done = evaluated(path, params, root, device, _precision(params, device))  # usually done by the step that made it
        reused += was_done
        for row in rows:
            examples += [[checkpoint_key(round_number), row["mode"], *e] for e in row.pop("examples")[:3]]
            report.append({"checkpoint": checkpoint_key(round_number), "checkpoint_id": checkpoint_id(path), **row})
    table = pa.Table.from_pylist(report, schema=EVALUATION)
    write_table(table, output_path("evaluation", root), EVALUATION, "evaluation",
                lineage=stage_lineage("evaluation", params, ["seed", "rounds", "evaluation", "rewards"]))
    summary = {f"{r['checkpoint'].split('/')[0]}_{r['mode']}_{metric}": round(r[metric], 4)
               for r in report for metric in ("accuracy", "reward_mean", "pass_at_k")}
    (root / EVALUATION_METRICS).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    write_round_plots(root)
    reward_means = {}
    for round_number in range(1, params.rounds + 1):
        card = read_lineage(output_path(checkpoint_key(round_number), root))
        reward_means[round_number] = card["metrics"]["reward_mean"]
    plot = _accuracy_plot(report, reward_means, root / EVALUATION_PLOT)
    accuracy_rows = [[r["checkpoint"], r["mode"], f"{r['accuracy']:.3f}", f"{r['pass_at_k']:.3f}", f"{r['reward_mean']:.3f}",
                      r["n_prompts"] * r["n_samples"]] for r in report]
    return {
        **summary, "checkpoints_evaluated_before": reused,
        "accuracy": {"type": "md", "raw_value": _markdown_table(["checkpoint", "mode", f"accuracy ({report[0]['correctness']})", "pass@k", "mean reward", "completions"], accuracy_rows)},
        "plot": {"type": "md", "raw_value": f"![accuracy and reward per round](data:image/png;base64,{plot})"},
        "examples": {"type": "md", "raw_value": _markdown_table(["checkpoint", "mode", "prompt", "completion", "answer"], examples)},
    }


def quiet_step() -> None:
    """A step's output is for people: no notices about libraries' own calls, progress bars only on a terminal.

    PEFT and TRL's DPOTrainer read `is_gradient_checkpointing`, which transformers 5.24 deprecates with a
    FutureWarning on every call (our own code uses the new names). Hugging Face's own progress bars (loading and saving
    weights, dataset maps) print a line per redraw into a log: off unless stderr is a terminal, or
    HF_HUB_DISABLE_PROGRESS_BARS=0 / HF_DATASETS_DISABLE_PROGRESS_BARS=0 ask for them. Our bars and the
    trainers' follow sys.stderr.isatty() too.
    """
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    if not sys.stderr.isatty():
        for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):  # read when those libraries load
            os.environ.setdefault(name, "1")
        if "transformers.utils.logging" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
            sys.modules["transformers.utils.logging"].disable_progress_bar()  # already loaded: too late for the variable


def run_stage(stage: str, params: Params, round_number: int | None, root: Path) -> tuple[dict, Path]:
    """Run one compute step in this process, with a heartbeat file while it runs; returns (metadata, output path)."""
    # Imported here, not at the top: stage_code follows compute.py's top-level imports into every stage's code,
    # and the heartbeat (read by /health and `rl-assets status`) shapes no output.
    from rl_assets.heartbeat import Heartbeat

    with Heartbeat(root, stage, round_number):
        return _run_stage(stage, params, round_number, root)


def _run_stage(stage: str, params: Params, round_number: int | None, root: Path) -> tuple[dict, Path]:
    quiet_step()
    device = _device(params)
    if stage == "sft":
        return _with_heldout(run_sft(params, root, device), output_path(checkpoint_key(0), root), params, root, device)
    if stage in ("rollouts", "train") and (round_number is None or not 1 <= round_number <= params.rounds):
        raise ValueError(f"{stage} needs --round between 1 and rounds={params.rounds}")
    if stage == "rollouts":
        return run_rollouts(params, round_number, root, device), output_path(f"{round_prefix(round_number)}/rollouts", root)
    if stage == "train":
        return _with_heldout(run_train(params, round_number, root, device), output_path(checkpoint_key(round_number), root), params, root, device)
    if stage == "evaluation":
        return run_evaluation(params, root, device), output_path("evaluation", root)
    if stage == "reward_model":
        from rl_assets.reward_model import train_reward_model

        if params.reward_model is None:
            raise ValueError("the reward_model stage needs a reward_model section in params")
        path = output_path("reward_model", root)
        return train_reward_model(params.reward_model, params.seed, path, use_cpu=not device.startswith("cuda")), path
    if stage == "promote":
        from rl_assets.promotion import run_promotion

        return run_promotion(params, root, device)
    raise ValueError(f"unknown stage {stage!r}")


def _device(params: Params) -> str:
    from rl_assets.models import pick_device

    device = pick_device(params.compute.device)
    if device == "cuda" and dist.is_initialized():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    if device.startswith("cuda") and params.compute.gpu_memory_fraction < 1:  # share a GPU without one step starving the rest
        torch.cuda.set_per_process_memory_fraction(params.compute.gpu_memory_fraction, torch.device(device))
    return device


def start_distributed(params: Params) -> int:
    """Join the torchrun process group when there is one (gloo on CPU, NCCL on GPUs); returns the rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        cuda = params.compute.device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank() if dist.is_initialized() else 0


def stop_distributed() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def parse_args(argv: list[str] | None = None, prog: str = "python -m rl_assets.compute") -> tuple[argparse.Namespace, Params]:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["sft", "rollouts", "train", "evaluation", "reward_model", "promote"])
    parser.add_argument("--round", type=int, default=None, help="round number N for rollouts and train")
    parser.add_argument("--params", default=os.environ.get("RL_ASSETS_PARAMS", "params.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)
    return args, load_params(args.params, args.overrides)


def main(argv: list[str] | None = None) -> int:
    """Run one step on its own (no orchestrator): rank 0 prints the output path and scalar metadata."""
    args, params = parse_args(argv)
    rank = start_distributed(params)
    metadata, output = run_stage(args.stage, params, args.round, Path("."))
    if rank == 0:
        plain = {k: v for k, v in metadata.items() if not isinstance(v, dict)}
        print(json.dumps({"output": str(output), **plain}, indent=2, default=str))
    stop_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
