"""How an asset body finishes: launch a compute step through Pipes, or report an in-process output.

Both paths end the same way: the output's content hash (a checkpoint's id) becomes the Dagster data
version, the stage is recorded in `dvc.lock` so `dvc status` agrees with what Dagster just
materialized, and the asset's guards run in the same step (pipelines/checks.py). Asset bodies
`yield from` them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator

from dagster import (AssetCheckResult, AssetExecutionContext, AssetKey, ConfigurableResource, DagsterError, DagsterExecutionInterruptedError,
                     DataVersion, Failure, MaterializeResult, PipesMessageReader, PipesSubprocessClient, PipesTempFileMessageReader,
                     PreviewWarning, open_pipes_session)
from dagster_pipes import PipesDefaultMessageWriter

from pipelines.checks import check_result, guarded
from pipelines.dvc import MISSING, JournalFollower, dotted, record_in_dvc, record_journal
from pipelines.pipes_child import DETERMINISTIC_EXIT, ERROR_DIR_ENV
from pipelines.warm_child import CHILD_ENV, PIPES_CHILD, take
from rl_assets.core.config import ComputeParams, Params, load_params
from rl_assets.core.paths import asset_key_path, dvc_stage_name, output_key, stage_of
from rl_assets.core.stage_table import STAGE_TABLE
from rl_assets.core.storage import content_hash

# Dagster's own Pipes session reads this preview property on every compute step; the warning is not about our code.
warnings.filterwarnings("ignore", message=r"Function `PipesMessageReader\.expected_writer_count` is currently in preview", category=PreviewWarning)



class ParamsResource(ConfigurableResource):
    """Which params file (and `--set` overrides) the run uses; editable in the launchpad."""

    path: str = "params.yaml"
    overrides: list[str] = []

    def load(self) -> Params:
        return load_params(self.path, self.overrides)


def project_params() -> ParamsResource:
    """The project's params as this process was asked for them: $RL_ASSETS_PARAMS and the `--set` overrides in $RL_ASSETS_SET.

    Read when called, never at import: `rl-assets run --set k=v` sets the variable, then builds the code location.
    """
    return ParamsResource(path=os.environ.get("RL_ASSETS_PARAMS", "params.yaml"),
                          overrides=[item for item in os.environ.get("RL_ASSETS_SET", "").split(";") if item])


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
    except DagsterError:  # an asset body invoked directly (tests): there is no run to tag (DagsterInvalidPropertyError)
        return
    tags = run_tags(params)
    if any(current.get(k) != v for k, v in tags.items()):
        context.instance.add_run_tags(context.run_id, tags)


def asset_key(key: str) -> AssetKey:
    """The Dagster asset key of output `key` (e.g. 'r01/rollouts') in the project params' experiment
    (paths.asset_key_path: experiments other than the default live under experiments/<name>/; paths.output_key is the way back)."""
    return AssetKey(asset_key_path(key, load_project_params().experiment))


def load_project_params() -> Params:
    """The params that shape the graph (how many rounds), read when the code location loads.

    Every asset factory asks; the file is parsed once per content, overrides and environment.
    """
    resource = project_params()
    path = Path(resource.path)
    text = path.read_bytes() if path.is_file() else b""
    return _parsed_params(resource.path, tuple(resource.overrides), text, frozenset(os.environ.items()), str(Path.cwd()))


def written_keys(keys: list[str]) -> list[str]:
    """The params keys a DVC stage can list: every section, and a dotted key (`rollouts.tools`) only where the params file has it.

    DVC refuses to run a stage whose params key is missing from params.yaml; the default it would have is in the code version.
    The file is read as the run reads it (`--set` overrides included), so an override names its key too.
    """
    resource = project_params()
    path = Path(resource.path)
    raw = _written_params(resource.path, tuple(resource.overrides), path.read_bytes() if path.is_file() else b"", frozenset(os.environ.items()))
    return [key for key in keys if "." not in key or dotted(raw, key) is not MISSING]


@functools.lru_cache(maxsize=8)
def _written_params(path: str, overrides: tuple[str, ...], text: bytes, environment: frozenset) -> dict:
    """The params file as written, as a run reads it (${VAR} and overrides applied), parsed once per content."""
    from rl_assets.core.config import read_params_file, resolved_raw

    return resolved_raw(read_params_file(path), path, overrides) if text else {}


@functools.lru_cache(maxsize=8)
def _parsed_params(path: str, overrides: tuple[str, ...], text: bytes, environment: frozenset, cwd: str) -> Params:
    return load_params(path, list(overrides))


def compute_command(keys: list[str], params: ParamsResource, compute: ComputeParams) -> list[str]:
    """The child command that writes `keys`: `python -m pipelines.pipes_child KEY …`, or the same under a launcher.

    torchrun when a training output uses several processes (with c10d rendezvous across `nnodes` machines), or
    `accelerate launch` with the user's config file (DeepSpeed, FSDP, …) when `compute.accelerate_config` is set.
    """
    args = [*PIPES_CHILD, *keys, "--params", params.path]
    for override in params.overrides:
        args += ["--set", override]
    if not any(STAGE_TABLE[stage_of(key)[0]].distributed for key in keys):  # SFT and training scale across processes
        return [sys.executable, *args]
    if compute.accelerate_config:
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", compute.accelerate_config,
                "--num_processes", str(compute.nproc * compute.nnodes), "--num_machines", str(compute.nnodes), *args]
    if compute.nnodes > 1:
        rendezvous = ["--nnodes", str(compute.nnodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", compute.rdzv_endpoint,
                      "--rdzv_id", f"rl-assets-{dvc_stage_name(keys[-1])}"]
        return [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc_per_node={compute.nproc}", *args]
    if compute.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={compute.nproc}", *args]
    return [sys.executable, *args]


def resident(compute: ComputeParams) -> bool:
    """One child for all of a step's outputs: asked for (compute.resident) and possible (one process: see rl_assets.run.loaded)."""
    return compute.resident and compute.nproc * compute.nnodes == 1 and not compute.accelerate_config


def run_compute(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource,
                keys: list[str]) -> Iterator[MaterializeResult | AssetCheckResult]:
    """Write `keys` in child processes, yielding each materialization and its guards' results the moment the child reports them.

    One resident child writes them all (`resident`), else one child per output, each under its own launcher. DVC's
    Python commits each output's stage as it is reported, at nice 19, and dvc.lock is written once at the end (a
    `dvc commit` per output beside the training child slowed it: pipelines/dvc.py). A child stopped by a failed blocking guard, or by an error that
    would recur, fails the step without retries; a crash or a transient error fails it for the retry policy.
    """
    tag_run(context, params)
    loaded = params.load()
    batches = [keys] if resident(loaded.compute) else [[key] for key in keys]
    follower = JournalFollower()  # commits each output's DVC stage while the child goes on (pipelines/dvc.py)
    try:
        for number, batch in enumerate(batches, 1):
            command = compute_command(batch, params, loaded.compute)
            for result in run_child(context, pipes, command, batch, last=number == len(batches)):
                if isinstance(result, AssetCheckResult):
                    yield check_result(result)
                    continue
                key = output_key(result.asset_key.path)
                _log_done(context, key, result.metadata or {})
                if stage := record_in_dvc(context, key, params.path, params.overrides, later=True, experiment=loaded.experiment):
                    follower.send(stage)
                yield result
    finally:  # also when the child failed: what it wrote before is recorded
        started = time.perf_counter()
        if recorded := record_journal(context.log, follower):
            context.log.info(f"dvc.lock: recorded {len(recorded)} stages in one commit ({time.perf_counter() - started:.1f} s)")


def run_child(context: AssetExecutionContext, pipes: PipesSubprocessClient, command: list[str], keys: list[str],
              last: bool = False) -> Iterator:
    """Launch a Pipes child that writes `keys`; yield what it reports while it runs; a failed child then raises `step_failure`'s exception.

    With `last` (no child after this one), a step process of the multiprocess executor then gives the CPU to the child
    (`yield_cpu_to_children`); a step run in the caller's process (`materialize`, the in-process executor) does not.

    A child that failed with an error that would recur (a blocking guard included) raises `Failure(allow_retries=False)`
    with the child's own error line: the step fails once, whatever its retry policy. A dead or killed child, or a
    transient error in it, raises `ComputeStepCrashed`, which the step's retry policy (if any) retries.
    """
    context.log.info("launching: %s", " ".join(command))
    errors = Path(tempfile.mkdtemp(prefix="rl-assets-errors-"))
    env = {**pipes.env, **CHILD_ENV, ERROR_DIR_ENV: str(errors)}
    seen, written = 0, set()
    try:
        with open_pipes_session(context=context, context_injector=pipes.context_injector, message_reader=_message_reader(pipes)) as session:
            env = {**os.environ, **env, **session.get_bootstrap_env_vars()}
            asked = time.perf_counter()
            process, why_not = take(command, pipes.cwd, env)  # the child the CLI started ahead (pipelines/warm_child.py)
            if process is None:
                context.log.debug(f"a fresh child: {why_not}")
                process = subprocess.Popen(command, cwd=pipes.cwd, env=env)
            else:
                context.log.debug(f"the warm child (pid {process.pid}) runs it (the step waited {time.perf_counter() - asked:.1f} s for it)")
            if last and multiprocessing.parent_process() is not None:  # a step process of its own, not a caller's (in-process run, notebook)
                yield_cpu_to_children()
            try:
                while process.poll() is None:
                    reported = session.get_reported_results()
                    for result in reported[seen:]:
                        written.add(getattr(result, "asset_key", None))
                        yield result
                    seen = len(reported)
                    time.sleep(0.2)  # not process.wait(timeout): it polls from 0.5 ms up, ~50 wakeups a second beside the child
            except (DagsterExecutionInterruptedError, GeneratorExit):  # the run was terminated: stop the child too, as Dagster's client does
                process.send_signal(signal.SIGINT)
                process.wait(timeout=pipes.termination_timeout_seconds)
                raise
        for result in session.get_reported_results()[seen:]:  # what arrived as the child ended (the reader is drained on exit)
            written.add(getattr(result, "asset_key", None))
            yield result
        if process.returncode != 0:
            not_written = [key for key in keys if asset_key(key) not in written]
            failed_at = not_written[0] if not_written else keys[-1]
            failure = step_failure(failed_at, process.returncode, _error_records(errors), not_written)
            if isinstance(failure, ComputeStepCrashed):  # said now: the retry policy's delay would otherwise pass without a word
                context.log.warning(f"{failure}; {len(keys) - len(not_written)} of its {len(keys)} outputs were written before it; a retry "
                                    f"(the step's retry policy, while attempts are left) continues from {failed_at}")
            raise failure
    finally:
        shutil.rmtree(errors, ignore_errors=True)


def yield_cpu_to_children(niceness: int = 19) -> None:
    """Lower this process's CPU priority (every thread of it: Linux sets it per thread) below the children it has launched.

    While the compute child trains, this step process relays its reports into Dagster's event log: ~20 ms of CPU per
    event in SQLite writes, ~5 s over a run of the default params. At the child's priority it takes a core from
    torch's threads, which then wait for each other at every barrier (on 2 cores a training loop took 16.1 s alone, 59 s
    beside a busy process at its priority, 16.7 s beside it at nice 19). At nice 19 the relay runs when the child
    leaves a core idle. A process cannot raise its priority back, and children inherit it: call
    it after the last launch. Threads started later inherit it from the thread that starts them.
    """
    tasks = Path("/proc/self/task")
    for thread in [int(name) for name in os.listdir(tasks)] if tasks.is_dir() else [0]:
        with contextlib.suppress(OSError):  # a thread that has just ended
            if os.getpriority(os.PRIO_PROCESS, thread) < niceness:
                os.setpriority(os.PRIO_PROCESS, thread, niceness)


class WholeLineMessageReader(PipesMessageReader):
    """Dagster's temporary-file message reader, except that a message is read only once its whole line is written.

    The child's Pipes writer appends each message as one JSON line through a buffered text file, so a message longer
    than the buffer (a rollouts table's samples, the evaluation's per-round numbers) reaches the file in pieces.
    Dagster's reader (`tail_file`) parses whatever `readline` returns; when it lands between two pieces, its thread
    dies on the JSONDecodeError and every later message of the step is lost: the outputs are on disk but never
    materialized (seen on this 2-core machine under load: `[pipes] framework exception occurred in
    PipesFileMessageReader reader thread`, then `did not yield or return expected outputs`).
    """

    def __init__(self, include_stdio_in_messages: bool = False):
        self.include_stdio_in_messages = include_stdio_in_messages

    @contextlib.contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        with tempfile.TemporaryDirectory(prefix="rl-assets-pipes-") as directory:
            path = os.path.join(directory, "messages")
            open(path, "w", encoding="utf-8").close()
            session_closed = threading.Event()
            thread = threading.Thread(target=self._read, args=(path, handler, session_closed), daemon=True)
            thread.start()
            try:
                yield {PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                       PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: self.include_stdio_in_messages}
            finally:
                session_closed.set()
                thread.join()

    @staticmethod
    def _read(path: str, handler, session_closed: threading.Event) -> None:
        try:
            for line in whole_lines(path, session_closed.is_set):
                handler.handle_message(json.loads(line))
        except Exception:
            handler.report_pipes_framework_exception("WholeLineMessageReader reader thread", sys.exc_info())
            raise

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file."


def whole_lines(path: str, should_stop) -> Iterator[str]:
    """The lines appended to `path`, each once its newline is there, until `should_stop()` and nothing more to read.

    `should_stop` is asked before each read, so what the writer wrote before it stopped is all read. A last piece
    without its newline is dropped: its writer died mid-message (its exit code says so).
    """
    pending = ""
    with open(path, encoding="utf-8") as stream:
        while True:
            stopping = should_stop()
            piece = stream.readline()
            if piece:
                pending += piece
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif stopping:
                return
            else:
                time.sleep(0.05)  # a wakeup beside the training child costs it time; 50 ms is still no wait anyone notices


def _message_reader(pipes: PipesSubprocessClient):
    """The pipes resource's reader, with Dagster's default one replaced by `WholeLineMessageReader` (its stdio option,
    which this project never sets, is not carried over: it is not public)."""
    reader = pipes.message_reader
    return WholeLineMessageReader() if type(reader) is PipesTempFileMessageReader else reader


class ComputeStepCrashed(Exception):
    """A compute step's process died, was killed, or hit a transient error: a retry may succeed."""


def step_failure(stage: str, returncode: int | None, records: list[dict], not_written: list[str] | None = None) -> Exception:
    """The exception a failed compute step raises: `Failure(allow_retries=False)` when a retry cannot help.

    `stage` names what failed (the output the child was writing); `not_written` the outputs the step did not write.
    """
    deterministic = [r for r in records if r.get("kind") == "deterministic"]
    stage = next((r["output"] for r in records if r.get("output")), stage)
    metadata = {"stage": stage, "output": stage, "exit_code": returncode if returncode is not None else "unknown",
                **({"not_written": not_written} if not_written else {})}
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


def _error_records(directory: Path) -> list[dict]:
    """What each rank of the child reported about its exception (pipes_child.report_failure)."""
    records = []
    for path in sorted(directory.glob("rank*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def compute_step_follows(context: AssetExecutionContext) -> bool:
    """Whether this run also runs the compute step, which records the stages waiting in the DVC journal at its end.

    Then raw_data and prompts wait there too, and one commit records them with the compute step's outputs (a commit of
    their own held the run ~0.3 s each). A run stopped before the compute step leaves them in the journal: the CLI
    records it when its run ends, the next run when it starts.
    """
    try:
        steps = context.run.step_keys_to_execute
    except DagsterError:  # an asset body called directly: no run, nothing follows (DagsterInvalidPropertyError)
        return False
    return steps is None or "compute" in steps


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
    record_in_dvc(context, key, params.path, params.overrides, later=compute_step_follows(context), experiment=loaded.experiment)
    yield from guarded(key, loaded, MaterializeResult(metadata={"path": str(path), **metadata}, data_version=DataVersion(content_hash(path))))
