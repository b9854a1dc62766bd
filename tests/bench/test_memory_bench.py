"""bench/memory.py runs end to end at a tiny shape: both sides of both cases report a positive peak and a ratio.

No assertion on the ratio itself: it is a benchmark, not a test.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import PYTHON, REPO

pytestmark = pytest.mark.e2e  # runs a benchmark or a pipeline end to end: not in `make test-fast`

TINY = ["--vocab", "4096", "--hidden", "16", "--intermediate", "32", "--sequences", "4", "--group-size", "2",
        "--prompt-tokens", "8", "--completion-tokens", "16"]


def test_memory_bench_reports_both_peaks_and_a_ratio(tmp_path):
    out = tmp_path / "memory.json"
    done = subprocess.run([PYTHON, str(REPO / "bench" / "memory.py"), *TINY, "--json", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    assert "target: rl-assets <= 1.0x TRL" in done.stdout
    for case in ("logprobs", "train"):
        row = re.search(rf"^{case}\s+(\d+)\s+(\d+)\s+(\d+\.\d+)x", done.stdout, re.MULTILINE)
        assert row, f"no table row for {case}:\n{done.stdout}"
        assert int(row[1]) > 0 and int(row[2]) > 0
    summary = json.loads(out.read_text())
    assert summary["shape"]["sequences"] == 4 and summary["shape"]["vocab"] == 4096
    for case in ("logprobs", "train"):
        numbers = summary["cases"][case]
        assert numbers["rl_assets"]["peak_mib"] > 0 and numbers["trl"]["peak_mib"] > 0
        assert numbers["ratio_rl_assets_over_trl"] > 0


def test_memory_bench_takes_a_real_models_folder_as_a_vision_language_model_with_gradient_checkpointing(tmp_path):
    """The other side of each option from the test above, in one run: a real model's folder (not a random Qwen2), in a
    LLaVA with images (not text only), with gradient checkpointing."""
    from real_models import save_real_model

    model = save_real_model(tmp_path / "model", "llama", hidden_size=32, generation_defaults={})
    out = tmp_path / "memory.json"
    vision = ["--vision", "--image-size", "16", "--vision-hidden", "16", "--vision-layers", "1"]
    done = subprocess.run([PYTHON, str(REPO / "bench" / "memory.py"), "--model", str(model), "--gradient-checkpointing", *vision,
                           *TINY[TINY.index("--sequences"):], "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    assert "in a LLaVA with a SigLIP tower (1 layers, width 16): one 16px image per sequence, 4 image tokens before the prompt" in done.stdout
    summary = json.loads(out.read_text())
    assert summary["shape"]["model"] == str(model) and summary["shape"]["gradient_checkpointing"] is True
    assert summary["shape"]["vocab"] == json.loads((model / "config.json").read_text())["vocab_size"]  # read from the folder
    assert summary["shape"]["vision"] is True and summary["shape"]["image_size"] == 16
    for case in ("logprobs", "train"):
        assert summary["cases"][case]["rl_assets"]["peak_mib"] > 0 and summary["cases"][case]["trl"]["peak_mib"] > 0
