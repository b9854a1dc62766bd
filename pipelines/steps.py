"""How an asset body finishes: launch a compute step through Pipes, or report an in-process output.

Both paths end the same way: the output's content hash (a checkpoint's id) becomes the Dagster data
version, the stage is recorded in `dvc.lock` so `dvc status` agrees with what Dagster just
materialized, and the asset's guards run in the same step (pipelines/checks.py). Asset bodies
`yield from` them.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from dagster import AssetExecutionContext, ConfigurableResource, DataVersion, Failure, MaterializeResult, PipesSubprocessClient
from dagster._core.errors import DagsterInvalidPropertyError, DagsterPipesExecutionError  # the second: what PipesSubprocessClient raises for a non-zero exit; not exported

from pipelines.checks import guarded
from pipelines.dvc import record_in_dvc
from pipelines.pipes_child import DETERMINISTIC_EXIT, ERROR_DIR_ENV
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


def run_tags(params: ParamsResource) -> dict[str, str]:
    """What a run records about its params: experiment, params file, overrides and the hash of the effective params."""
    loaded = params.load()
    tags = {"rl_assets/experiment": loaded.experiment, "rl_assets/params_file": params.path,
            "rl_assets/params_hash": loaded.section_hash(*Params.model_fields)}
    if params.overrides:
        tags["rl_assets/overrides"] = ";".join(params.overrides)
    return tags


def tag_run(context: AssetExecutionContext, params: ParamsResource) -> None:
    """Put `run_tags` on the running run, however it was launched (CLI, UI launchpad, schedule, sensor)."""
    try:
        current = context.run.tags
    except DagsterInvalidPropertyError:  # an asset body invoked directly (tests): there is no run to tag
        return
    tags = run_tags(params)
    if any(current.get(k) != v for k, v in tags.items()):
        context.instance.add_run_tags(context.run_id, tags)


def load_project_params() -> Params:
    """The params that shape the graph (how many rounds), read when the code location loads.

    Every asset factory asks; the file is parsed once per content, overrides and environment.
    """
    resource = ParamsResource()
    path = Path(resource.path)
    text = path.read_bytes() if path.is_file() else b""
    return _parsed_params(resource.path, tuple(resource.overrides), text, frozenset(os.environ.items()), str(Path.cwd()))


@functools.lru_cache(maxsize=8)
def _parsed_params(path: str, overrides: tuple[str, ...], text: bytes, environment: frozenset, cwd: str) -> Params:
    return load_params(path, list(overrides))


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
                round_number: int | None = None) -> Iterator[MaterializeResult]:
    """Run one compute step in a child process (rank 0 reports metadata and the data version), then the asset's guards."""
    tag_run(context, params)
    loaded = params.load()
    command = compute_command(stage, params, loaded.compute, round_number)
    result = run_child(context, pipes, command, stage).get_materialize_result()
    _log_done(context, result.metadata or {})
    key = context.asset_key.to_user_string()
    record_in_dvc(context, key, params.path, params.overrides)
    yield from guarded(key, loaded, result)


def run_child(context: AssetExecutionContext, pipes: PipesSubprocessClient, command: list[str], stage: str):
    """Launch a Pipes child; a failed child raises what `step_failure` makes of its exit code and error records.

    A child that failed with an error that would recur raises `Failure(allow_retries=False)` with the child's
    own error line: the step fails once, whatever its retry policy. A dead or killed child, or a transient
    error in it, raises `ComputeStepCrashed`, which the step's retry policy (if any) retries.
    """
    context.log.info("launching: %s", " ".join(command))
    errors = Path(tempfile.mkdtemp(prefix="rl-assets-errors-"))
    env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", ERROR_DIR_ENV: str(errors)}
    try:
        return pipes.run(context=context, command=command, env=env)
    except DagsterPipesExecutionError as error:
        raise step_failure(stage, _returncode(error), _error_records(errors)) from None  # the child's error, not Pipes' exit-code wrapper
    finally:
        shutil.rmtree(errors, ignore_errors=True)


class ComputeStepCrashed(Exception):
    """A compute step's process died, was killed, or hit a transient error: a retry may succeed."""


def step_failure(stage: str, returncode: int | None, records: list[dict]) -> Exception:
    """The exception a failed compute step raises: `Failure(allow_retries=False)` when a retry cannot help."""
    deterministic = [r for r in records if r.get("kind") == "deterministic"]
    metadata = {"stage": stage, "exit_code": returncode if returncode is not None else "unknown"}
    if deterministic:
        first = min(deterministic, key=lambda r: r.get("rank", 0))
        where = f" (rank {first['rank']})" if first.get("rank") else ""
        return Failure(description=f"{first['error']}{where}", metadata={**metadata, "retried": False}, allow_retries=False)
    if returncode in (DETERMINISTIC_EXIT, 2):  # 2: argparse rejected the command line
        return Failure(description=f"the {stage} step failed with an error that would recur (exit code {returncode}); its log has the traceback",
                       metadata={**metadata, "retried": False}, allow_retries=False)
    if records:
        return ComputeStepCrashed(f"{records[0]['error']} (a transient error in the {stage} step)")
    return ComputeStepCrashed(f"the {stage} step's process {_exit_reason(returncode)}")


def _exit_reason(returncode: int | None) -> str:
    number = -returncode if returncode is not None and returncode < 0 else returncode - 128 if returncode and returncode > 128 else None
    try:
        name = signal.Signals(number).name if number else None
    except ValueError:
        name = None
    if name == "SIGKILL":
        return f"was killed by SIGKILL (exit {returncode}): out of memory (the kernel's OOM killer) or the node was reclaimed"
    if name == "SIGTERM":
        return f"was terminated by SIGTERM (exit {returncode}): preempted or stopped"
    if name:
        return f"was killed by {name} (exit {returncode})"
    if returncode is None:
        return "failed"
    return f"exited with code {returncode} without reporting an error (a crash outside Python, or a launcher's worker died)"


def _returncode(error: DagsterPipesExecutionError) -> int | None:
    found = re.search(r"failed with code (-?\d+)", str(error))
    return int(found.group(1)) if found else None


def _error_records(directory: Path) -> list[dict]:
    """What each rank of the child reported about its exception (pipes_child.report_failure)."""
    records = []
    for path in sorted(directory.glob("rank*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def _log_done(context: AssetExecutionContext, metadata: dict) -> None:
    numbers = {k: getattr(v, "value", v) for k, v in metadata.items()}
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items() if isinstance(v, (int, float)))
    context.log.info(f"materialized {context.asset_key.to_user_string()}: {shown}")


def materialized(context: AssetExecutionContext, params: ParamsResource, path, metadata: dict) -> Iterator[MaterializeResult]:
    """Report an output written in this process, with its content hash as the data version, then the asset's guards."""
    tag_run(context, params)
    _log_done(context, metadata)
    key = context.asset_key.to_user_string()
    record_in_dvc(context, key, params.path, params.overrides)
    yield from guarded(key, params.load(), MaterializeResult(metadata={"path": str(path), **metadata}, data_version=DataVersion(content_hash(path))))
