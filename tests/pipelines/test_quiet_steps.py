"""Quiet by default: a Dagster run of compute steps whose output is not a terminal prints no library
notices (Dagster's PreviewWarning from its own Pipes code, transformers' FutureWarnings) and no
progress bars (a carriage return per redraw: tqdm in our code, the trainers', Hugging Face's loading
and saving bars)."""

from __future__ import annotations

import re

import pytest

from conftest import python

pytestmark = pytest.mark.e2e


def test_compute_steps_print_no_notices_and_no_progress_bars_into_a_log(micro_copy):
    # SFT through TRL's trainer, saving r00; then sampling, which loads it (stdout and stderr are pipes here)
    done = python(["-m", "pipelines", "materialize", "raw_data", "prompts", "r00/checkpoint", "r01/rollouts"], micro_copy, timeout=600)
    output = done.stdout + done.stderr
    assert "materialized r00/checkpoint" in output and "materialized r01/rollouts" in output
    assert "PreviewWarning" not in output
    assert "FutureWarning" not in output
    assert "\r" not in output
    assert re.search(r"\d+(\.\d+)?(it| examples)/s", output) is None, "a progress bar"
