"""bench/real_model.py runs end to end on a tiny random Llama folder with a chat template: every case, every precision.

No assertion on any ratio or speed: it is a benchmark, not a test. Only that each number it reports
is there, positive and finite.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from conftest import PYTHON, REPO
from real_models import save_real_model

pytestmark = pytest.mark.e2e  # runs a benchmark or a pipeline end to end: not in `make test-fast`

PRECISIONS = ("no", "bf16", "pure_bf16")
TINY = ["--prompts", "2", "--samples", "2", "--max-new-tokens", "4", "--batch-size", "4", "--train-rows", "4", "--completion-tokens", "4",
        "--accum", "2", "--logprob-batch-size", "4", "--repeats", "1", "--matmul-size", "64", "--threads", "1"]


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_real_model_bench_reports_every_case_and_precision(tmp_path):
    # A Llama-architecture folder with a byte-level BPE tokenizer and ChatML-like template; no odd generation defaults.
    model = save_real_model(tmp_path / "model", "llama", hidden_size=32, generation_defaults={})
    out = tmp_path / "real_model.json"
    done = subprocess.run([PYTHON, str(REPO / "bench" / "real_model.py"), "--model", str(model), *TINY, "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    assert "fastest plain" in done.stdout and "targets: rollouts >= 0.8x" in done.stdout
    summary = json.loads(out.read_text())

    assert positive(summary["matmul"]["fp32_gflops"]) and positive(summary["matmul"]["bf16_gflops"])
    assert positive(summary["parameters"]) and 0 < summary["flop_parameters"] <= summary["parameters"]
    assert summary["workers"]["pure_bf16"]["weights_dtype"] == "torch.bfloat16" and summary["workers"]["bf16"]["weights_dtype"] == "torch.float32"
    for case in ("sampling", "logprobs", "training"):
        numbers = summary[case]
        assert set(numbers["per_precision"]) == set(PRECISIONS), case
        assert numbers["fastest_plain"] in PRECISIONS and positive(numbers["ratio_fastest_rl_assets_vs_fastest_plain"])
        for precision, row in numbers["per_precision"].items():
            assert positive(row["ratio_same_precision"]) and positive(row["ratio_vs_fastest_plain"]), (case, precision)
            for side in ("rl_assets", "plain"):
                assert positive(row[side]["tokens_per_s"]) and positive(row[side]["tokens"]), (case, precision, side)
                if case != "sampling":
                    assert positive(row[side]["gflops"]), (case, precision, side)
                    assert any(k.startswith("share_of_") and positive(v) for k, v in row[side].items()), (case, precision, side)
    for row in summary["logprobs"]["per_precision"].values():
        assert math.isfinite(row["max_abs_diff"])
    for row in summary["training"]["per_precision"].values():
        assert row["finite_losses"] and row["steps_per_call"] == 1 and math.isfinite(row["first_call_kl_old"])
