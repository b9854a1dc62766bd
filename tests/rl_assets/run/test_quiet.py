"""Quiet by default: no deprecation notices from our own calls, progress bars only on a terminal.

The whole-step view (a Dagster run's output) is tests/pipelines/test_quiet_steps.py.
"""

from __future__ import annotations

import os
import sys
import warnings
from unittest import mock

import pytest

from rl_assets.core.config import RewardModelParams, SFTParams, TrainParams
from rl_assets.train.preference import dpo_config, rft_config
from rl_assets.train.reward_model import reward_config
from rl_assets.train.sft import sft_config

from rl_assets_support import new_tiny_model


@pytest.mark.parametrize("build,checkpointing", [
    (lambda out: sft_config(SFTParams(), out, seed=0, use_cpu=True), False),
    (lambda out: dpo_config(TrainParams(), out, seed=0, use_cpu=True), False),
    (lambda out: rft_config(TrainParams(gradient_checkpointing=True), out, seed=0, use_cpu=True), True),
    (lambda out: reward_config(RewardModelParams(preference_data="p.jsonl"), out, seed=0, use_cpu=True), True),
], ids=["sft", "dpo", "rft", "reward_model"])
def test_trainer_configs_use_the_current_names_and_bars_only_on_a_terminal(tmp_path, build, checkpointing):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # `gradient_checkpointing` is deprecated ... Use `activation_checkpointing`
        config = build(str(tmp_path))
    assert config.gradient_checkpointing is checkpointing  # the old name mirrors the new one, which TRL's trainers read
    assert config.disable_tqdm is (not sys.stderr.isatty())


def test_quiet_step_silences_libraries_reading_the_old_checkpointing_name_and_their_bars_off_a_terminal():
    from rl_assets.run.process import quiet_step
    from transformers.utils import logging

    model = new_tiny_model()
    bars_were_on = logging.is_progress_bar_enabled()
    with mock.patch.dict(os.environ), mock.patch.object(sys, "stderr", open(os.devnull, "w")) as not_a_terminal:
        for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
            os.environ.pop(name, None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_step()
            assert model.is_gradient_checkpointing is False  # what PEFT and TRL's DPOTrainer read
            warnings.warn("other notices still show", FutureWarning)
        assert [str(w.message) for w in seen] == ["other notices still show"]
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
        assert not logging.is_progress_bar_enabled()
        not_a_terminal.close()
    if bars_were_on:
        logging.enable_progress_bar()
