"""How an asset body finishes: launch a compute step through Pipes, or report an in-process output.

Both paths end the same way: the output's content hash becomes the Dagster data version, and the
stage is recorded in `dvc.lock` so `dvc status` agrees with what Dagster just materialized.
"""

from __future__ import annotations

import os
import sys

from dagster import AssetExecutionContext, ConfigurableResource, DataVersion, MaterializeResult, PipesSubprocessClient

from pipelines.dvc import record_in_dvc
from rl_assets.config import ComputeParams, Params, load_params
from rl_assets.storage import content_hash

# SFT (HF Trainer) and GRPO training scale across processes; sampling and evaluation run in one.
DISTRIBUTED_STAGES = {"sft", "train"}


def _env_overrides() -> list[str]:
    return [item for item in os.environ.get("RL_ASSETS_SET", "").split(";") if item]


class ParamsResource(ConfigurableResource):
    """Which params file (and `--set` overrides) the run uses; editable in the launchpad."""

    path: str = os.environ.get("RL_ASSETS_PARAMS", "params.yaml")
    overrides: list[str] = _env_overrides()

    def load(self) -> Params:
        return load_params(self.path, self.overrides)


def load_project_params() -> Params:
    """The params that shape the graph (how many rounds), read when the code location loads."""
    return ParamsResource().load()


def compute_command(stage: str, params: ParamsResource, compute: ComputeParams, round_number: int | None = None) -> list[str]:
    """The child command of a compute step: `python -m pipelines.pipes_child …`, or the same under a launcher.

    torchrun when the step uses several processes (with c10d rendezvous across `nnodes` machines), or
    `accelerate launch` with the user's config file (DeepSpeed, FSDP, …) when `compute.accelerate_config` is set.
    """
    args = ["-m", "pipelines.pipes_child", stage, "--params", params.path]
    if round_number is not None:
        args += ["--round", str(round_number)]
    for override in params.overrides:
        args += ["--set", override]
    if stage not in DISTRIBUTED_STAGES:
        return [sys.executable, *args]
    if compute.accelerate_config:
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", compute.accelerate_config,
                "--num_processes", str(compute.nproc * compute.nnodes), "--num_machines", str(compute.nnodes), *args]
    if compute.nnodes > 1:
        rendezvous = ["--nnodes", str(compute.nnodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", compute.rdzv_endpoint,
                      "--rdzv_id", f"rl-assets-{stage}-{round_number or 0}"]
        return [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc_per_node={compute.nproc}", *args]
    if compute.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={compute.nproc}", *args]
    return [sys.executable, *args]


def run_compute(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource, stage: str,
                round_number: int | None = None) -> MaterializeResult:
    """Run one compute step in a child process; rank 0 reports metadata and the data version."""
    command = compute_command(stage, params, params.load().compute, round_number)
    context.log.info("launching: %s", " ".join(command))
    env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = pipes.run(context=context, command=command, env=env).get_materialize_result()
    _log_done(context, result.metadata or {})
    record_in_dvc(context, context.asset_key.to_user_string())
    return result


def _log_done(context: AssetExecutionContext, metadata: dict) -> None:
    numbers = {k: getattr(v, "value", v) for k, v in metadata.items()}
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items() if isinstance(v, (int, float)))
    context.log.info(f"materialized {context.asset_key.to_user_string()}: {shown}")


def materialized(context: AssetExecutionContext, path, metadata: dict) -> MaterializeResult:
    """Report an output written in this process, with its content hash as the data version."""
    _log_done(context, metadata)
    record_in_dvc(context, context.asset_key.to_user_string())
    return MaterializeResult(metadata={"path": str(path), **metadata}, data_version=DataVersion(content_hash(path)))
