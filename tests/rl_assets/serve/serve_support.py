"""A project with real (tiny) loadable checkpoints, and a uvicorn server on a free loopback port for it."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from ops_support import make_fake_project
from rl_assets.core.checkpoints import read_lineage, save_checkpoint
from rl_assets.core.config import ModelParams, TinyModelParams
from rl_assets.core.params_file import load_params
from rl_assets.eval.promotion import run_promotion

TINY = ModelParams(tiny=TinyModelParams(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32))


def make_served_project(root: Path) -> Path:
    """The fake two-round project (ops_support) whose r01 is a real tiny model, promoted."""
    from rl_assets.core.policy import build_tiny_model
    from rl_assets.core.tokenizer import build_tiny_tokenizer

    make_fake_project(root, sampled={0: 0.3, 1: 0.5, 2: 0.4})
    tokenizer = build_tiny_tokenizer()
    path = root / "data/r01/checkpoint"
    card = {k: v for k, v in read_lineage(path).items() if k not in ("checkpoint_id", "code_version")}
    save_checkpoint(build_tiny_model(TINY, tokenizer, seed=1), tokenizer, path, card)
    from ops_support import write_evaluation

    write_evaluation(root, {0: 0.3, 1: 0.5, 2: 0.4})
    run_promotion(load_params(root / "params.yaml"), None, root, "cpu")
    return root


def status_command(status: dict) -> list[str]:
    """A stand-in for `python -m pipelines status` that prints `status` (as a failed run would, with exit 1)."""
    return [sys.executable, "-c", f"import sys; print({json.dumps(json.dumps(status))}); sys.exit(0)"]


@contextlib.contextmanager
def running_server(app, timeout: float = 60.0, **config):
    """Serve `app` with uvicorn on a free port of 127.0.0.1 in a thread; yields the base URL. `config`: more uvicorn.Config."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, timeout=60, **kwargs)
