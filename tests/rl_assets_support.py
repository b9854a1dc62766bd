"""Plain helpers shared by the rl_assets tests (a uniquely named module: `import conftest` is ambiguous
once another test folder has a conftest.py too)."""

from __future__ import annotations

import functools
from pathlib import Path

import pyarrow as pa

from rl_assets.core.config import ModelParams, TinyModelParams
from rl_assets.data.prompts import prompt_id
from rl_assets.core.schemas import PROMPTS, ROLLOUTS

REPO = Path(__file__).resolve().parents[1]

# The smallest Llama the embedded config allows, so generate and a training step take well under a second.
TINY = ModelParams(tiny=TinyModelParams(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32))


def new_tiny_model(seed: int = 0):
    """A fresh randomly-initialised tiny policy in eval mode (tests that train need their own copy)."""
    from rl_assets.core.policy import build_tiny_model  # transformers: imported only by tests that need it
    from rl_assets.core.tokenizer import build_tiny_tokenizer

    model = build_tiny_model(TINY, build_tiny_tokenizer(), seed)
    model.eval()
    return model


def prompts_table(problems: list[tuple[str, str]], splits: list[str] | None = None) -> pa.Table:
    """A PROMPTS table for (problem, answer) pairs; every row is in the 'rl' split unless `splits` says otherwise."""
    splits = splits or ["rl"] * len(problems)
    rows = [
        {"prompt_id": prompt_id(p, a), "prompt": p, "problem": p, "answer": a, "split": s, "n_tokens": len(p) + 1,
         "source": "test", "source_hash": "0" * 32, "source_row": i, "extra": "{}"}
        for i, ((p, a), s) in enumerate(zip(problems, splits))
    ]
    return pa.Table.from_pylist(rows, schema=PROMPTS)


def rollouts_table(rows: list[dict]) -> pa.Table:
    """A ROLLOUTS table from partial rows; the columns a test does not care about get fixed values."""
    defaults = {"round": 1, "prompt": "1+1=", "answer": "2", "extra": "{}", "completion": "2", "prompt_ids": [1, 5, 67, 5, 71],
                "completion_ids": [6, 2], "logprobs": [-1.0, -1.0], "truncated": False, "policy_id": "policy",
                "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4, "seed": 0, "prompts_hash": "prompts"}
    return pa.Table.from_pylist([{**defaults, **row} for row in rows], schema=ROLLOUTS)


@functools.lru_cache(maxsize=None)
def shared_tiny_model():
    """One read-only tiny policy for the whole run; tests that train build their own with `new_tiny_model`."""
    return new_tiny_model(seed=0)
