"""Predict throughput of `rl-assets serve` under concurrent requests vs a plain loop of `generate` calls; /health latency.

    .venv/bin/python bench/serve_throughput.py [--requests 64] [--concurrency 16] [--max-tokens 16] [--health 100] [--small 20]

Both sides use one checkpoint (the embedded tiny model at its default shape, built in a temp project)
and the same prompts, greedy. Baseline: the model loaded once, then `rollouts.generate` called once per
prompt in a loop (what a naive server does). Server: uvicorn on a free loopback port, the prompts sent
as `/v1/completions` requests from `--concurrency` threads. Prints completions/s of each and the ratio
measured in this run. Then `/health` latency (p50, p95, max) while a training process runs in the
background (a forward/backward loop of the same model with a heartbeat, on the same CPUs), with the
run state read through the real `rl-assets status`. Last, fairness: the latency of `--small` one-prompt
requests sent one after another (p50, p95) alone, and again while one large request (64 prompts x n=16 x 64 tokens)
generates, with when the large one finished. Exit code 0 whatever the numbers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests/rl_assets/serve")]

TRAIN = """
import sys, torch
from pathlib import Path
from rl_assets.run.heartbeat import Heartbeat
from rl_assets.core.policy import load_policy
model, _ = load_policy(sys.argv[1])
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(4, 90, (32, 64))
with Heartbeat(Path(sys.argv[2]), "train", 1, interval=1.0):
    print("training", flush=True)
    while True:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def build_project(root: Path) -> Path:
    from ops_support import make_fake_project
    from rl_assets.core.checkpoints import read_lineage, save_checkpoint
    from rl_assets.core.config import ModelParams
    from rl_assets.core.policy import build_tiny_model
    from rl_assets.core.tokenizer import build_tiny_tokenizer

    make_fake_project(root)
    tokenizer, path = build_tiny_tokenizer(), root / "data/r01/checkpoint"
    card = {k: v for k, v in read_lineage(path).items() if k not in ("checkpoint_id", "code_version")}
    save_checkpoint(build_tiny_model(ModelParams(), tokenizer, seed=0), tokenizer, path, card)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--health", type=int, default=100, help="/health requests while training")
    parser.add_argument("--small", type=int, default=20, help="small requests timed alone and beside a large one")
    args = parser.parse_args()

    from rl_assets.core.params_file import load_params
    from rl_assets.core.policy import load_policy
    from rl_assets.rollout.generation import generate
    from rl_assets.serve.app import create_app
    from serve_support import running_server

    root = Path(tempfile.mkdtemp()) / "project"
    checkpoint = build_project(root)
    prompts = [f"{a}*{b}=" for a in range(8) for b in range(8)][: args.requests]
    prompts += prompts * (args.requests // len(prompts))
    prompts = prompts[: args.requests]

    model, tokenizer = load_policy(checkpoint)
    generate(model, tokenizer, prompts[:1], 1, greedy=True, max_new_tokens=args.max_tokens)  # warm-up
    started = time.perf_counter()
    for prompt in prompts:
        generate(model, tokenizer, [prompt], 1, greedy=True, max_new_tokens=args.max_tokens)
    loop_s = time.perf_counter() - started

    app = create_app(root, load_params(root / "params.yaml"), preload="r01", status_interval=5.0, max_request_tokens=65_536,
                     status_command=[sys.executable, "-m", "pipelines", "status"])  # what `rl-assets serve` hands over
    with running_server(app) as url, httpx.Client(timeout=120) as client:
        def ask(prompt: str) -> int:
            return client.post(f"{url}/v1/completions", json={"model": "r01", "prompt": prompt, "max_tokens": args.max_tokens}).status_code

        ask(prompts[0])  # warm-up (the model is loaded at start)
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            codes = list(pool.map(ask, prompts))
        server_s = time.perf_counter() - started
        assert codes == [200] * len(prompts), codes

        def small_latencies() -> list[float]:
            out = []
            for index in range(args.small):
                started = time.perf_counter()
                assert ask(prompts[index % len(prompts)]) == 200
                out.append(time.perf_counter() - started)
            return sorted(out)

        alone = small_latencies()
        large = {"model": "r01", "prompt": [f"{a}+{b}=" for a in range(8) for b in range(8)], "n": 16, "max_tokens": 64}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            started = time.perf_counter()
            big = pool.submit(client.post, f"{url}/v1/completions", json=large)
            time.sleep(0.2)  # admitted and generating
            beside = small_latencies()
            small_done = time.perf_counter() - started
            assert big.result().status_code == 200, big.result().text
            large_s = time.perf_counter() - started

        trainer = subprocess.Popen([sys.executable, "-c", TRAIN, str(checkpoint), str(root)], stdout=subprocess.PIPE, text=True)
        try:
            assert trainer.stdout.readline().strip() == "training"
            client.get(f"{url}/health")  # the first status read waits for `python -m pipelines status`
            latencies, bodies = [], []
            for _ in range(args.health):
                started = time.perf_counter()
                response = client.get(f"{url}/health")
                latencies.append(time.perf_counter() - started)
                bodies.append(response.json())
                time.sleep(0.05)
        finally:
            trainer.kill()
            trainer.wait()
    steps = sum(bool(body["running_steps"]) for body in bodies)
    print(f"{len(prompts)} prompts, {args.max_tokens} new tokens each, greedy, tiny model ({sum(p.numel() for p in model.parameters()):,} parameters)")
    print(f"  plain generate loop:            {len(prompts) / loop_s:8.1f} completions/s ({loop_s:.2f} s)")
    print(f"  serve, {args.concurrency:3d} concurrent requests: {len(prompts) / server_s:8.1f} completions/s ({server_s:.2f} s)")
    print(f"  ratio serve / loop:             {loop_s / server_s:8.2f}x")
    p95 = lambda xs: xs[max(int(0.95 * len(xs)) - 1, 0)]  # noqa: E731
    print(f"small requests ({args.small}, one prompt, {args.max_tokens} tokens): alone p50 {1000 * statistics.median(alone):.0f} ms, "
          f"p95 {1000 * p95(alone):.0f} ms; beside a 64 x 16 x 64-token request p50 {1000 * statistics.median(beside):.0f} ms, "
          f"p95 {1000 * p95(beside):.0f} ms (all {args.small} answered {small_done:.1f} s in; the large one took {large_s:.1f} s)")
    latencies.sort()
    print(f"/health while training ({len(latencies)} requests, {steps} saw the running step): "
          f"p50 {1000 * statistics.median(latencies):.1f} ms, p95 {1000 * latencies[int(0.95 * len(latencies)) - 1]:.1f} ms, "
          f"max {1000 * latencies[-1]:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
