"""How an asset body finishes: launch a compute step through Pipes, or report an in-process output.

Both paths end the same way: the output's content hash (a checkpoint's id) becomes the Dagster data
version, the stage is recorded in `dvc.lock` so `dvc status` agrees with what Dagster just
materialized, and the asset's guards run in the same step (pipelines/launch/checks.py). Asset bodies
`yield from` them. The params (pipelines.launch.params), the message reader (pipelines.launch.pipes_reader) and
the failure classification (pipelines.launch.failures) are modules of their own.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from dagster import (AssetCheckResult, AssetExecutionContext, DagsterError, DagsterExecutionInterruptedError, DataVersion, MaterializeResult,
                     PipesSubprocessClient, open_pipes_session)

from pipelines.launch.checks import check_result, guarded
from pipelines.storage import remote
from pipelines.records.dvc import JournalFollower, record_in_dvc, record_journal
from pipelines.launch.failures import ComputeStepCrashed, error_records, step_failure
from pipelines.launch.params import ParamsResource, asset_key, tag_run
from pipelines.launch.pipes_child import ERROR_DIR_ENV
from pipelines.launch.pipes_reader import message_reader
from pipelines.launch.warm_child import CHILD_ENV, PIPES_CHILD, take
from rl_assets.core.config import Params
from rl_assets.core.run_params import ComputeParams
from rl_assets.core.paths import dvc_stage_name, output_key, stage_of
from rl_assets.core.stage_table import STAGE_TABLE
from rl_assets.core.storage import content_hash


def compute_command(keys: list[str], resolved_params: str, compute: ComputeParams, threads: int | None = None) -> list[str]:
    """The child command that writes `keys`: `python -m pipelines.launch.pipes_child KEY … --resolved-params FILE`, or the same under a launcher.

    torchrun when a training output uses several processes (with c10d rendezvous across `nnodes` machines), or
    `accelerate launch` with the user's config file (DeepSpeed, FSDP, …) when `compute.accelerate_config` is set.
    `resolved_params` is the step's params as it resolved them (`resolved_params_file`): the child does not resolve them again.
    `threads`: the child's CPU threads (a step that runs beside another: pipelines.definitions.compute.lanes).
    """
    args = [*PIPES_CHILD, *keys, "--resolved-params", resolved_params, *(["--threads", str(threads)] if threads else [])]
    if not any(STAGE_TABLE[stage_of(key)[0]].distributed for key in keys):  # SFT and training scale across processes
        return [sys.executable, *args]
    if compute.accelerate_config:
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", compute.accelerate_config,
                "--num_processes", str(compute.nproc * compute.nnodes), "--num_machines", str(compute.nnodes), *args]
    if compute.nnodes > 1:  # under Slurm without an endpoint, the job's script names its first node (pipelines.launch.slurm_job)
        rendezvous = ["--nnodes", str(compute.nnodes), "--rdzv_backend", "c10d", *(["--rdzv_endpoint", compute.rdzv_endpoint] if
                      compute.rdzv_endpoint else []), "--rdzv_id", f"rl-assets-{dvc_stage_name(keys[-1])}"]
        return [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc_per_node={compute.nproc}", *args]
    if compute.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={compute.nproc}", *args]
    return [sys.executable, *args]


def slurm_command(command: list[str], keys: list[str], compute: ComputeParams, folder: Path) -> list[str]:
    """`command` as a Slurm job (pipelines.launch.slurm_job): the step's nodes and GPUs, and compute.slurm's options."""
    slurm = compute.slurm
    options = {"--partition": slurm.partition, "--time": slurm.time_limit, "--cpus-per-task": slurm.cpus_per_task or "", "--mem": slurm.mem,
               "--gpus-per-node": compute.gpus_per_step or ""}
    return [sys.executable, "-m", "pipelines.launch.slurm_job", "--folder", str(folder), "--job-name",
            f"rl-assets {keys[0]}" + (f"..{keys[-1]}" if len(keys) > 1 else ""), "--nodes", str(compute.nnodes), "--poll", str(slurm.poll_seconds),
            "--heartbeat", str(slurm.heartbeat_seconds),
            *(f"{option}={value}" for option, value in options.items() if value), *([] if slurm.requeue else ["--no-requeue"]),
            *(f"--sbatch-arg={arg}" for arg in slurm.sbatch_args), "--", *command]


def scratch_dir(compute: ComputeParams) -> Path | None:
    """Where a step's temporary files go (its resolved params, Pipes messages, error records): the system's temporary folder,
    or under Slurm a folder of the project (compute.slurm.shared_dir), which the job's nodes see as this machine does."""
    if compute.executor != "slurm":
        return None
    folder = Path(compute.slurm.shared_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def resolved_params_file(params: Params, scratch: Path | None = None) -> Path:
    """`params` as one JSON file of every field (in a private temporary folder, under `scratch` if given): what the compute
    child validates, as resolved here once (file, ${VAR}, --set). The child runs on this machine (a k8s step's pod runs its
    child inside it) or on a Slurm node that shares `scratch`."""
    path = Path(tempfile.mkdtemp(prefix="rl-assets-params-", dir=scratch)) / "params.json"
    path.write_text(params.model_dump_json())
    return path


def resident(compute: ComputeParams) -> bool:
    """One child for all of a step's outputs: asked for (compute.resident) and possible (one process: see rl_assets.run.loaded)."""
    return compute.resident and compute.nproc * compute.nnodes == 1 and not compute.accelerate_config


def run_compute(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource,
                keys: list[str], threads: int | None = None, gpus: str | None = None) -> Iterator[MaterializeResult | AssetCheckResult]:
    """Write `keys` in child processes, yielding each materialization and its guards' results the moment the child reports them.

    One resident child writes them all (`resident`), else one child per output, each under its own launcher; `threads` and
    `gpus` (CUDA_VISIBLE_DEVICES) limit what the child uses of the machine (pipelines.definitions.compute.Lane). DVC's
    Python commits each output's stage as it is reported, at nice 19, and dvc.lock is written once at the end (a
    `dvc commit` per output beside the training child slowed it: pipelines/records/dvc.py). A child stopped by a failed blocking guard, or by an error that
    would recur, fails the step without retries; a crash or a transient error fails it for the retry policy.
    """
    tag_run(context, params)
    loaded = params.load()
    context.log.info(f"params: {params.path}" + "".join(f" --set {override}" for override in params.overrides) +
                     (f" (resolved once: {params.spec})" if params.spec else ""))
    batches = [keys] if resident(loaded.compute) else [[key] for key in keys]
    pushing = remote.pushes_during_run(loaded)  # each output (or round) to the remote as it is recorded (pipelines/storage/remote.py)
    follower = JournalFollower(pushes=pushing)  # commits each output's DVC stage while the child goes on (pipelines/records/dvc.py)
    watcher = remote.SnapshotWatcher(loaded, follower) if pushing else None
    scratch = scratch_dir(loaded.compute)
    resolved = resolved_params_file(loaded, scratch)
    try:
        for number, batch in enumerate(batches, 1):
            command = compute_command(batch, str(resolved), loaded.compute, threads)
            if loaded.compute.executor == "slurm":
                command = slurm_command(command, batch, loaded.compute, Path(tempfile.mkdtemp(prefix="job-", dir=scratch)))
            for result in run_child(context, pipes, command, batch, last=number == len(batches), scratch=scratch,
                                    env={"CUDA_VISIBLE_DEVICES": gpus} if gpus else None):
                if isinstance(result, AssetCheckResult):
                    yield check_result(result)
                    continue
                key = output_key(result.asset_key.path)
                _log_done(context, key, result.metadata or {})
                if stage := record_in_dvc(context, key, params.path, params.overrides, later=True, experiment=loaded.experiment, spec=params.spec):
                    follower.send(stage)
                yield result
                if pushing and stage and (loaded.storage.push == "output" or key.endswith("checkpoint")):
                    remote.push(context.instance, loaded, wait=False, follower=follower)  # by the follower, at nice 19
    finally:  # also when the child failed: what it wrote before is recorded
        if watcher is not None:
            watcher.stop()
        shutil.rmtree(resolved.parent, ignore_errors=True)
        started = time.perf_counter()
        if recorded := record_journal(context.log, follower):
            context.log.info(f"dvc.lock: recorded {len(recorded)} stages in one commit ({time.perf_counter() - started:.1f} s)")


def run_child(context: AssetExecutionContext, pipes: PipesSubprocessClient, command: list[str], keys: list[str],
              last: bool = False, scratch: Path | None = None, env: dict[str, str] | None = None) -> Iterator:
    """Launch a Pipes child that writes `keys`; yield what it reports while it runs; a failed child then raises `step_failure`'s exception.

    With `last` (no child after this one), a step process of the multiprocess executor then gives the CPU to the child
    (`yield_cpu_to_children`); a step run in the caller's process (`materialize`, the in-process executor) does not.

    A child that failed with an error that would recur (a blocking guard included) raises `Failure(allow_retries=False)`
    with the child's own error line: the step fails once, whatever its retry policy. A dead or killed child, or a
    transient error in it, raises `ComputeStepCrashed`, which the step's retry policy (if any) retries.
    An output or check reported twice (a Slurm job requeued between an output's report and its journal line) is passed on once.
    `scratch`: the folder of the step's temporary files (`scratch_dir`); `env`: variables of this child beyond the step's.
    """
    context.log.info("launching: %s", " ".join([*(f"{name}={value}" for name, value in (env or {}).items()), *command]))
    errors = Path(tempfile.mkdtemp(prefix="rl-assets-errors-", dir=scratch))
    env = {**pipes.env, **CHILD_ENV, **(env or {}), ERROR_DIR_ENV: str(errors)}
    seen, written = 0, set()
    try:
        with open_pipes_session(context=context, context_injector=pipes.context_injector, message_reader=message_reader(pipes, scratch)) as session:
            env = {**os.environ, **env, **session.get_bootstrap_env_vars()}
            asked = time.perf_counter()
            process, why_not = take(command, pipes.cwd, env)  # the child the CLI started ahead (pipelines/launch/warm_child.py)
            if process is None:
                context.log.debug(f"a fresh child: {why_not}")
                process = subprocess.Popen(command, cwd=pipes.cwd, env=env)
            else:
                context.log.debug(f"a fork of the warm child (pid {process.pid}) runs it (the step waited {time.perf_counter() - asked:.1f} s for it)")
            if last and multiprocessing.parent_process() is not None:  # a step process of its own, not a caller's (in-process run, notebook)
                yield_cpu_to_children()
            try:
                while process.poll() is None:
                    reported = session.get_reported_results()
                    yield from _once(reported[seen:], written)
                    seen = len(reported)
                    time.sleep(0.2)  # not process.wait(timeout): it polls from 0.5 ms up, ~50 wakeups a second beside the child
            except (DagsterExecutionInterruptedError, GeneratorExit):  # the run was terminated: stop the child too, as Dagster's client does
                process.send_signal(signal.SIGINT)
                process.wait(timeout=pipes.termination_timeout_seconds)
                raise
        yield from _once(session.get_reported_results()[seen:], written)  # what arrived as the child ended (the reader is drained on exit)
        if process.returncode != 0:
            not_written = [key for key in keys if asset_key(key) not in written]
            failed_at = not_written[0] if not_written else keys[-1]
            failure = step_failure(failed_at, process.returncode, error_records(errors), not_written)
            if isinstance(failure, ComputeStepCrashed):  # said now: the retry policy's delay would otherwise pass without a word
                context.log.warning(f"{failure}; {len(keys) - len(not_written)} of its {len(keys)} outputs were written before it; a retry "
                                    f"(the step's retry policy, while attempts are left) continues from {failed_at}")
            raise failure
    finally:
        shutil.rmtree(errors, ignore_errors=True)


def _once(results: list, written: set) -> Iterator:
    """`results` not passed on before: `written` holds the asset keys (materializations) and (key, check) pairs yielded so far."""
    for result in results:
        name = (result.asset_key, result.check_name) if isinstance(result, AssetCheckResult) else getattr(result, "asset_key", None)
        if name in written:
            continue
        written.add(name)
        yield result


def yield_cpu_to_children(niceness: int = 19) -> None:
    """Lower this process's CPU priority (every thread of it: Linux sets it per thread) below the children it has launched.

    While the compute child trains, this step process relays its reports into Dagster's event log, SQLite
    writes that cost CPU per event. At the child's priority it takes a core from torch's threads, which then wait for
    each other at every barrier. At nice 19 the relay runs when the child
    leaves a core idle. A process cannot raise its priority back, and children inherit it: call
    it after the last launch. Threads started later inherit it from the thread that starts them.
    """
    tasks = Path("/proc/self/task")
    for thread in [int(name) for name in os.listdir(tasks)] if tasks.is_dir() else [0]:
        with contextlib.suppress(OSError):  # a thread that has just ended
            if os.getpriority(os.PRIO_PROCESS, thread) < niceness:
                os.setpriority(os.PRIO_PROCESS, thread, niceness)


def compute_step_follows(context: AssetExecutionContext) -> bool:
    """Whether this run also runs a compute step (every compute op's name starts with `compute`: pipelines.definitions.compute),
    which records the stages waiting in the DVC journal at its end.

    Then raw_data and prompts wait there too, and one commit records them with the compute step's outputs (rather than a commit of
    their own each). A run stopped before the compute step leaves them in the journal: the CLI
    records it when its run ends, the next run when it starts.
    """
    try:
        steps = context.run.step_keys_to_execute
    except DagsterError:  # an asset body called directly: no run, nothing follows (DagsterInvalidPropertyError)
        return False
    return steps is None or any(step.startswith("compute") for step in steps)


def _log_done(context: AssetExecutionContext, key: str, metadata: dict) -> None:
    numbers = {k: getattr(v, "value", v) for k, v in metadata.items()}
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items() if isinstance(v, (int, float)))
    context.log.info(f"materialized {key}: {shown}")


def materialized(context: AssetExecutionContext, params: ParamsResource, path, metadata: dict) -> Iterator[MaterializeResult]:
    """Report an output written in this process, with its content hash as the data version, then the asset's guards."""
    tag_run(context, params)
    key = output_key(context.asset_key.path)
    _log_done(context, key, metadata)
    loaded = params.load()
    record_in_dvc(context, key, params.path, params.overrides, later=compute_step_follows(context), experiment=loaded.experiment,
                  spec=params.spec)
    yield from guarded(key, loaded, MaterializeResult(metadata={"path": str(path), **metadata}, data_version=DataVersion(content_hash(path))))
