"""Compute outputs as a Dagster Pipes child process (what the compute assets launch).

    python -m pipelines.launch.pipes_child KEY [KEY ...] [--params params.yaml] [--set k=v]
    python -m torch.distributed.run --standalone --nproc_per_node=N -m pipelines.launch.pipes_child r01/checkpoint

Writes the outputs in flow order in this one process, the models kept loaded (rl_assets.run.resident).
Rank 0 (across machines joined by c10d, the lowest rank of the launcher Dagster started, which the rendezvous may
number otherwise: rl_assets.run.process.reporting_rank) opens the Pipes session and reports each output the moment
it is written, as rank 0 wrote it: its metadata,
its content hash as the data version, and its guards' verdicts as asset checks. A blocking guard
that fails ends the child before the next output. Other ranks only compute. Imports
dagster_pipes (no Dagster), so the child stays light.

A step that raises says whether a retry could help. The child prints the traceback, then one line
`error: <ExceptionType>: <message>` on stderr, writes that line and its verdict to
`$RL_ASSETS_ERROR_DIR/rank<R>.json` (a launcher such as torchrun exits 1 whatever its workers did), and
exits with DETERMINISTIC_EXIT (the same inputs would fail again: bad params, data or state, a shape
error, a reward that raises, any bug) or TRANSIENT_EXIT (out of device memory, a collective or network
that timed out or lost a peer). A process killed by a signal (the OOM killer, a preemption) writes
nothing. `pipelines.launch.failures.step_failure` turns the verdict into Dagster's retry decision.

A child whose launcher dies by SIGKILL (the step process, torchrun's agent), which could not stop it, exits within a
second (rl_assets.run.process.exit_with_launcher).

With RL_ASSETS_REPORTED set (a Slurm job, which Slurm may requeue and start again), rank 0 appends each output it
reported to that file, and a child that finds the file continues after the outputs it lists.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import re
import sys
import traceback
from pathlib import Path

ERROR_DIR_ENV = "RL_ASSETS_ERROR_DIR"
PIPES_CONTEXT_ENV = "DAGSTER_PIPES_CONTEXT"  # set by Dagster in the environment of the process it launched
REPORTED_ENV = "RL_ASSETS_REPORTED"  # a journal of the outputs reported, for a job that may restart (pipelines.launch.slurm_job)
DETERMINISTIC_EXIT = 65  # sysexits EX_DATAERR: retrying cannot help
TRANSIENT_EXIT = 75  # sysexits EX_TEMPFAIL: a retry may succeed
GUARD_DESCRIPTION = "rl_assets/description"  # a guard's verdict text (report_asset_check takes no description)
WRITING, WRITING_PATH = "while writing ", "output path: "  # rl_assets.run.resident's notes on an error: the output it was writing, its path

# RuntimeErrors raised by torch.distributed backends and CUDA when a peer, the network or the device fails.
TRANSIENT_MESSAGE = re.compile(r"NCCL|\bgloo\b|timed out|timeout|connection (closed|reset|refused) by peer|"
                               r"out of memory|ECC error", re.IGNORECASE)


def _transient_types() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [MemoryError, ConnectionError, TimeoutError]
    torch = sys.modules.get("torch")  # only when the step imported it: no torch error without torch
    if torch is not None:
        kinds += [getattr(torch, "OutOfMemoryError", None), getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None),
                  getattr(getattr(torch, "distributed", None), "DistError", None)]  # DistBackendError, DistNetworkError, DistStoreError
    return tuple(kind for kind in kinds if isinstance(kind, type))


def _deterministic_types() -> tuple[type[BaseException], ...]:
    """Errors that name bad inputs even when their message mentions a timeout or memory."""
    kinds: list[type[BaseException]] = [ValueError, KeyError, IndexError, TypeError, AttributeError, ImportError, AssertionError,
                                        FileNotFoundError, NotImplementedError]
    for module, name in (("rl_assets.core.config", "ParamsError"), ("rl_assets.train.train_state", "TrainStateMismatch")):
        kind = getattr(sys.modules.get(module), name, None)
        if isinstance(kind, type):
            kinds.append(kind)
    return tuple(kinds)


def classify(error: BaseException) -> str:
    """'transient' when a retry may succeed (device or host memory, a distributed backend, the network), else 'deterministic'.

    An exception is deterministic unless it, or an exception it was raised from, is a known transient kind:
    an error raised by the step's own code means the same inputs fail the same way again.
    """
    if isinstance(error, _deterministic_types()):
        return "deterministic"
    transient, seen = _transient_types(), set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, transient) or (type(error) is RuntimeError and TRANSIENT_MESSAGE.search(str(error))):
            return "transient"
        error = error.__cause__ or error.__context__
    return "deterministic"


def error_line(error: BaseException) -> str:
    """`Type: message` on one line (whitespace collapsed, at most 1000 characters)."""
    message = " ".join(str(error).split())
    line = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return line if len(line) <= 1000 else line[:997] + "..."


# What torch's and safetensors' writers say when a write fails half-way (a full disk among the likely causes).
SHORT_WRITE = re.compile(r"No space left on device|unexpected pos \d+ vs \d+|failed writing file|Disk quota exceeded", re.IGNORECASE)


def resource_fault(error: BaseException, output: str | None, path: Path | None = None) -> str | None:
    """Plain words for a fault of the machine rather than of the step's inputs: a full disk, no host memory.

    >>> resource_fault(MemoryError(), "r01/checkpoint")
    'out of memory (host RAM) while writing r01/checkpoint'
    """
    import errno
    import shutil

    where = output or "its outputs"
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or SHORT_WRITE.search(str(error)):
            written = path or Path("data")
            while not written.exists() and written != written.parent:
                written = written.parent
            free = shutil.disk_usage(written).free
            amount = f"{free / 1e6:.1f} MB" if free >= 1e6 else f"{free / 1e3:.0f} kB"
            return (f"no space left on device while writing {path or 'data/'}: {amount} free on "
                    f"its filesystem; free some space, then `rl-assets run` continues from this output")
        if isinstance(error, MemoryError):
            return f"out of memory (host RAM) while writing {where}"
        error = error.__cause__ or error.__context__
    return None


def report_failure(error: BaseException) -> int:
    """Print the traceback and the one-line error, leave the verdict for the parent; returns the exit code.

    A fault of the machine (a full disk, no memory) is said in plain words, whatever exception the library raised for it.
    """
    notes = getattr(error, "__notes__", [])
    output = next((note.removeprefix(WRITING) for note in notes if note.startswith(WRITING)), None)
    path = next((Path(note.removeprefix(WRITING_PATH)) for note in notes if note.startswith(WRITING_PATH)), None)
    kind, line = classify(error), resource_fault(error, output, path) or error_line(error)
    traceback.print_exception(error)
    print(f"error: {line}", file=sys.stderr, flush=True)
    if directory := os.environ.get(ERROR_DIR_ENV):
        rank = int(os.environ.get("RANK", "0"))
        record = Path(directory) / f"rank{rank}.json"
        try:
            partial = record.with_suffix(".partial")
            partial.write_text(json.dumps({"kind": kind, "error": line, "type": type(error).__name__, "rank": rank, "output": output}))
            partial.rename(record)
        except OSError as problem:  # the exit code still carries the verdict
            print(f"warning: could not write {record}: {problem}", file=sys.stderr)
    return DETERMINISTIC_EXIT if kind == "deterministic" else TRANSIENT_EXIT


def data_version(output: Path) -> str:
    """A checkpoint's id (the hash of its weights, computed when it was saved), else the output's content hash."""
    from rl_assets.core.checkpoints import LINEAGE_FILE, checkpoint_id
    from rl_assets.core.storage import content_hash

    return checkpoint_id(output) if (output / LINEAGE_FILE).is_file() else content_hash(output)


def run(argv: list[str] | None = None) -> int:
    from rl_assets.run.process import exit_with_launcher

    launched = PIPES_CONTEXT_ENV in os.environ
    exit_with_launcher(launched=launched)  # first: a launcher killed from here on is noticed
    from rl_assets.run import step

    args, params = step.parse_args(argv, prog="python -m pipelines.launch.pipes_child")
    journal = Path(os.environ[REPORTED_ENV]) if os.environ.get(REPORTED_ENV) and args.stage is None else None
    if journal is not None and journal.is_file():  # a requeued Slurm job: its first attempt reported these
        reported = set(journal.read_text().split())
        outputs = [key for key in args.outputs if key not in reported]
        print(f"a restarted job: {len(args.outputs) - len(outputs)} of its outputs were reported by an earlier attempt; "
              f"continuing from {outputs[0] if outputs else 'nothing left'}", file=sys.stderr, flush=True)
        args.outputs = outputs
        if not outputs:
            return 0
    return step.run(args, params, functools.partial(to_dagster, journal=journal), launched=launched)


@contextlib.contextmanager
def to_dagster(params, journal: Path | None = None):
    """The reporter of a Dagster step: each output as a materialization of the experiment's own asset, with its content hash as
    the data version and its guards' verdicts as asset checks; with a `journal`, each reported key appended to it."""
    from dagster_pipes import open_dagster_pipes

    from rl_assets.core.paths import asset_key_path

    with open_dagster_pipes() as pipes:  # an exception is also reported through Pipes (the run's event log)
        def report(output) -> None:
            key = "/".join(asset_key_path(output.key, params.experiment))  # the experiment's own asset (paths.asset_key_path)
            pipes.report_asset_materialization(asset_key=key, metadata=output.metadata, data_version=data_version(output.path))
            for guard in output.guards:
                pipes.report_asset_check(check_name=guard.name, passed=guard.passed, severity="ERROR" if guard.blocking else "WARN",
                                         metadata={**guard.metadata, GUARD_DESCRIPTION: guard.description}, asset_key=key)
            if journal is not None:
                with journal.open("a") as lines:
                    lines.write(output.key + "\n")

        yield report


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except Exception as error:  # not KeyboardInterrupt/SystemExit: a cancelled run stays cancelled
        return report_failure(error)


def leave(code: int) -> None:
    """End the process with `code` without the interpreter's teardown, once everything it wrote is closed and reported.

    A child holding torch, transformers and TRL spends long in Python's shutdown (freeing modules and tensors
    one by one), and its step, then the run, waits for that exit. What shutdown does that matters still happens,
    in its order: `sys.exit` lets thread pools stop, waits for non-daemon threads and runs the atexit handlers
    (weakref finalizers included: trackers, vLLM); `_end_after_exit_handlers`, registered when this module is
    imported and so run last, flushes stdout and stderr, shuts logging down and ends the process before the
    modules are freed. The outputs are already renamed into place and Pipes closed, so nothing is left half-written.
    """
    global _leaving_with
    _leaving_with = code
    sys.exit(code)


_leaving_with: int | None = None


def _end_after_exit_handlers() -> None:
    if _leaving_with is None:  # the module was only imported (a test, the code location): Python ends as it would
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it anyway
            pass
    logging.shutdown()
    os._exit(_leaving_with)


atexit.register(_end_after_exit_handlers)  # first registered, last run: after every handler the child's own imports add


if __name__ == "__main__":
    leave(main())
