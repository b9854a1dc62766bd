"""hardware.py: the busy share's sampling, the peak lookup and the training FLOPs count behind MFU."""

from __future__ import annotations

import time

import pytest
import torch

from rl_assets.run import hardware
from rl_assets.run.hardware import BusyShare, peak_flops, training_flops_per_token, training_utilisation


def test_a_gpu_busy_share_is_the_mean_of_the_readings_taken_through_the_block():
    readings = iter([0.9, None, 0.5, 0.7] + [0.7] * 100)  # a failed reading (None) is left out
    with BusyShare("cuda:0", interval=0.02, read=lambda: next(readings)) as busy:
        time.sleep(0.2)
    assert len(busy.samples) >= 3 and busy.samples[:3] == [0.9, 0.5, 0.7]
    assert busy.result() == {"busy_share": round(sum(busy.samples) / len(busy.samples), 4), "busy_device": "cuda:0"}


def test_a_block_shorter_than_an_interval_is_read_once_and_no_reading_gives_no_share():
    with BusyShare("cuda:1", interval=60, read=lambda: 0.25) as busy:
        pass
    assert busy.result() == {"busy_share": 0.25, "busy_device": "cuda:1"}
    with BusyShare("cuda:1", interval=60, read=lambda: None) as silent:
        pass
    assert silent.result() == {}


def test_a_cpu_busy_share_follows_the_threads_that_computed():
    threads = torch.get_num_threads()
    with BusyShare("cpu") as idle:
        time.sleep(0.3)
    with BusyShare("cpu") as working:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
    # one thread of `threads` spinning: at most its share, less only when other processes take the cores
    assert idle.result()["busy_share"] < 0.2 < working.result()["busy_share"] * threads <= 1.1


@pytest.mark.parametrize("name, tflops", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
                                          ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                          ("Tesla T4", None)])
def test_the_peak_is_the_gpus_by_name_longest_name_first_or_the_configured_one(monkeypatch, name, tflops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops("cuda:0") == (tflops * 1e12 if tflops else None)
    assert peak_flops("cuda:0", 100.0) == 100e12


def test_training_flops_count_tied_heads_once_and_lora_weights_as_frozen_matmuls():
    from rl_assets.core.policy import build_tiny_model
    from rl_assets.core.tokenizer import build_tiny_tokenizer
    from rl_assets_support import TINY

    model = build_tiny_model(TINY, build_tiny_tokenizer(), seed=0)
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    tied = model.get_output_embeddings().weight is embedding
    matmul = total if tied else total - embedding.numel()
    assert training_flops_per_token(model) == 6 * matmul
    for p in model.parameters():
        p.requires_grad_(False)
    assert training_flops_per_token(model) == 4 * matmul  # frozen: the backward still reaches the activations
    assert training_utilisation(model, 1000.0, 2, "cpu", None) == {"model_tflops_per_second": round(4 * matmul * 1000 / 2 / 1e12, 6)}


def test_gpu_utilisation_falls_back_to_nvidia_smi_when_nvml_is_missing(monkeypatch):
    def no_nvml(device=None):
        raise ModuleNotFoundError("pynvml")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    monkeypatch.setattr(hardware, "nvidia_smi", lambda: [{"gpu": "0", "utilization": 0.5}, {"gpu": "1", "utilization": 0.93}])
    assert hardware.gpu_utilisation("cuda:1") == 0.93 and hardware.gpu_utilisation("cuda") == 0.5


def test_the_kl_reference_stays_loaded_only_on_a_gpu_with_room_for_it(monkeypatch):
    """With train.beta 0 the reference serves one metric a round: kept on a GPU where it is a small share of the memory
    (a load each round costs seconds), dropped on a CPU (it would add to every later round's peak)."""
    from types import SimpleNamespace

    from rl_assets.core.policy import build_tiny_model
    from rl_assets.core.tokenizer import build_tiny_tokenizer
    from rl_assets.run.loaded import Loaded
    from rl_assets_support import TINY

    loaded = Loaded()
    assert not loaded.reference_fits("cuda:0")  # nothing held
    model = build_tiny_model(TINY, build_tiny_tokenizer(), seed=0)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    loaded._reference = ("id", "cuda:0", model)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=size * 100))
    assert loaded.reference_fits("cuda:0") and not loaded.reference_fits("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=size * 10))
    assert not loaded.reference_fits("cuda:0")
