"""A private single-node Slurm for tests: munged, slurmctld and slurmd from Debian's packages (`make test` installs them),
with their configuration, state, sockets and logs in one folder and their own ports, so nothing of the machine's is used.

Root only (slurmd starts jobs as their user); without the binaries or root the Slurm tests skip, naming why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel")
NODE = "rlnode"


def why_not() -> str | None:
    """Why a private Slurm cannot start here, or None."""
    missing = [name for name in DAEMONS if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]
    if missing:
        return f"{', '.join(missing)} not installed (`make test` installs slurm-wlm and munge as root with apt)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user: it must start as root"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _config(folder: Path, socket_path: Path) -> str:
    cpus = os.cpu_count() or 1
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024
    return "\n".join([
        "ClusterName=rltest", "SlurmctldHost=localhost", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge",
        # cred_expire (default 120 s) is also how long a requeued job waits before it may start again
        f"AuthInfo=socket={socket_path},cred_expire=20",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'slurmd.log'}",
        # what runs without cgroups or an accounting database (a container, a laptop)
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "ReturnToService=2",
        "KillWait=5",  # a cancelled job's processes get SIGKILL 5 s after SIGTERM (default 30)
        "JobRequeue=1",
        f"NodeName={NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        f"PartitionName=short Nodes={NODE} MaxTime=00:01:00 State=UP",
    ]) + "\n"


@contextlib.contextmanager
def local_slurm(folder: Path, timeout: float = 60.0):
    """Start munged, slurmctld and slurmd in `folder`; yield the environment a client needs (SLURM_CONF); stop them all."""
    if reason := why_not():
        pytest.skip(reason)
    for name in ("munge", "state", "spool"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / "munge").chmod(0o700)
    key, socket_path = folder / "munge" / "munge.key", folder / "munge" / "munge.socket"
    subprocess.run([_binary("mungekey"), "--create", "--keyfile", str(key)], check=True, capture_output=True)
    conf = folder / "slurm.conf"
    conf.write_text(_config(folder, socket_path))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = []
    try:
        subprocess.run([_binary("munged"), "--force", f"--socket={socket_path}", f"--key-file={key}", f"--log-file={folder / 'munged.log'}",
                        f"--pid-file={folder / 'munge' / 'munged.pid'}", f"--seed-file={folder / 'munge' / 'munged.seed'}"],
                       check=True, capture_output=True)
        started.append(folder / "munge" / "munged.pid")
        subprocess.run([_binary("slurmctld"), "-f", str(conf)], check=True, capture_output=True, env=env)
        started.append(folder / "slurmctld.pid")
        subprocess.run([_binary("slurmd"), "-f", str(conf), "-N", NODE], check=True, capture_output=True, env=env)
        started.append(folder / "slurmd.pid")
        deadline = time.monotonic() + timeout
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T", "-p", "debug"], capture_output=True, text=True, env=env).stdout:
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in folder.glob("*.log"))
                raise RuntimeError(f"the private Slurm did not come up in {timeout:.0f} s\n{logs}")
            time.sleep(0.2)
        yield {"SLURM_CONF": str(conf)}
    finally:
        subprocess.run(["scancel", "--full", "--partition=debug,short"], capture_output=True, env=env)
        for pid_file in reversed(started):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        time.sleep(0.5)


def job_state(job_id: str, env: dict) -> dict[str, str]:
    """`scontrol show job` of a job, as {field: value}."""
    import re

    done = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True, env={**os.environ, **env})
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout))
