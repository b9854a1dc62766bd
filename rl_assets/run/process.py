"""Set-up of a compute process: quiet output, the torchrun process group, and an end with its launcher."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
import warnings

LAUNCHER_GONE_EXIT = 129  # 128 + SIGHUP: what a terminal's processes get when it hangs up


def exit_with_launcher(launched: bool = False, interval: float = 1.0) -> bool:
    """End this process within `interval` seconds of its launcher's death; returns whether it watches.

    A launcher killed by SIGKILL (a torchrun agent, a Dagster step process: by the OOM killer, a scheduler, a dead
    login node) cannot stop its children, and torchrun starts its workers in sessions of their own: they would
    compute on, their GPUs held, for nobody. A daemon thread checks the parent's pid: an orphan is given to init
    (or a subreaper), and then this process exits with LAUNCHER_GONE_EXIT after a line on stderr. Outputs are
    written to a temporary sibling and renamed, so the exit leaves nothing half-written where a reader looks.

    Only where the parent is the launcher: under torchrun (TORCHELASTIC_RUN_ID: its agent) or when `launched` (an
    orchestrator started this process). A step started by hand may outlive its shell (nohup) and is left alone.
    """
    if not launched and "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        with contextlib.suppress(OSError, ValueError):  # the launcher may have taken stderr's reader with it
            print(f"error: this process's launcher (pid {parent}) is gone: exiting", file=sys.stderr, flush=True)
        os._exit(LAUNCHER_GONE_EXIT)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
    return True


def release_freed_memory() -> None:
    """Hand the memory a step freed back to the system before the next step allocates its own.

    glibc keeps freed heap memory for reuse, and across threads and sizes it often is not reused: in a
    resident process the next step's peak then comes on top of the last one's leftovers. `malloc_trim` is
    glibc's documented call for it; elsewhere this does nothing.
    """
    import gc

    gc.collect()
    if (trim := _libc_function("malloc_trim")) is not None:
        trim(0)


M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
LARGE_BLOCK = 128 * 1024  # glibc's own default threshold, kept fixed


def free_large_blocks_at_once() -> None:
    """Serve every allocation of 128 KiB or more (a tensor's storage) from its own mapping, so freeing it returns it at once.

    glibc raises its mmap threshold to the size of each mapped block freed (up to 32 MiB): from then on tensors of
    that size come from the heap and, once freed, stay in the process, so the activations of one micro-batch are
    still held while the next allocates its own. Setting the threshold turns the adjustment off (mallopt's
    documented M_MMAP_THRESHOLD); each such allocation then costs a mapping and fresh pages, so it is an option
    (compute.return_freed_memory). On another C library this does nothing.
    """
    if (mallopt := _libc_function("mallopt")) is not None:
        mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)


def reset_peak_memory() -> None:
    """Start this process's peak-memory marks afresh: RSS (Linux's VmHWM, reset through /proc/self/clear_refs) and CUDA's.

    A resident process runs many steps: each step's peak is its own, counted from what was already resident.
    Where /proc cannot reset it the RSS mark runs from the process's start (`peak_memory` says which).
    """
    try:
        with open("/proc/self/clear_refs", "w") as marks:
            marks.write("5")  # 5: reset the peak RSS (proc(5))
    except OSError:
        pass
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict:
    """This process's peak memory since `reset_peak_memory`, in GB: {"peak_rss_gb", and "peak_cuda_gb" where CUDA was used}.

    >>> sorted(peak_memory())[0], peak_memory()["peak_rss_gb"] > 0
    ('peak_rss_gb', True)
    """
    try:
        with open("/proc/self/status") as status:
            peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource

        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux; since the process started
    result = {"peak_rss_gb": round(peak_kib * 1024 / 1e9, 3)}
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        result["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
    return result


@functools.cache
def _libc_function(name: str):
    """A glibc function by name, looked up once per process (None on another C library)."""
    import ctypes
    import ctypes.util

    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name, None) if library else None
    except OSError:
        return None


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


def start_distributed(params) -> int:
    """Join the torchrun process group when there is one (gloo on CPU, NCCL on GPUs); returns the rank."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        cuda = params.compute.device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo", **_attempt_store())
        label_log_lines(f"[rank {dist.get_rank()}] ")
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} (local rank {os.environ.get('LOCAL_RANK', 0)}, "
              f"{'nccl' if cuda else 'gloo'})", file=sys.stderr, flush=True)
    return dist.get_rank() if dist.is_initialized() else 0


def _attempt_store() -> dict:
    """Under torchrun after a restart: the group's store with keys of this attempt only.

    torchrun's agent keeps one store across restarts, and env:// puts every attempt's group under the same keys: a rank of
    the restarted group could read the address a killed rank had published and fail to connect ("Gloo connectFullMesh
    failed ... Connection refused", or wait on it). Each attempt gets a prefix of its own (TORCHELASTIC_RESTART_COUNT).
    """
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=default_pg_timeout)
    return {"store": dist.PrefixStore(f"rl-assets/attempt-{attempt}", store), "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}


def reporting_rank(launched: bool) -> int:
    """The lowest rank whose process says `launched` (its orchestrator started it: the one that can report), else 0.

    On one machine, or in a Slurm job (srun gives every node the step's environment), every rank says so: rank 0.
    Across machines joined by torchrun's c10d rendezvous only the launcher the orchestrator started does, and the
    rendezvous numbers machines in an order of its own. A collective: every rank calls it, in the same place.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return 0
    said = [False] * dist.get_world_size()
    dist.all_gather_object(said, launched)
    return next((rank for rank, launched_here in enumerate(said) if launched_here), 0)


def as_on_rank_0(items):
    """Each of `items` as rank 0 made it (an output's metadata, its guards' verdicts), on every rank: one broadcast each,
    so every rank must iterate as many (each writes the same outputs)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        yield from items
        return
    for item in items:
        box = [item if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        yield box[0]


class _Labelled:
    r"""A text stream that starts each line with `label` (what several ranks write into one log stays attributable).

    >>> import io
    >>> out = io.StringIO()
    >>> labelled = _Labelled(out, "[rank 1] ")
    >>> labelled.write("a\nb") + labelled.write("c\n"), out.getvalue()
    (5, '[rank 1] a\n[rank 1] bc\n')
    """

    def __init__(self, stream, label: str):
        self.stream, self.label, self.line_start = stream, label, True

    def write(self, text: str) -> int:
        pieces = []
        for piece in text.splitlines(keepends=True):
            pieces.append(self.label + piece if self.line_start else piece)
            self.line_start = piece.endswith(("\n", "\r"))  # a progress bar's redraw starts a line too
        self.stream.write("".join(pieces))
        return len(text)

    def __getattr__(self, name: str):  # flush, fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)


def label_log_lines(label: str) -> None:
    """Start every line this process writes to stderr (its log: warnings, progress, errors, tracebacks) with `label`,
    including the lines of logging handlers already set up on stderr. stdout, where rank 0 prints results, stays as it is."""
    import logging

    if isinstance(sys.stderr, _Labelled):
        return
    original = sys.stderr
    sys.stderr = _Labelled(original, label)
    for logger in [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values() if isinstance(item, logging.Logger))]:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is original:
                handler.setStream(sys.stderr)


def stop_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
