"""How well a step uses its device: the busy share while it runs, and a training loop's model FLOPs utilisation (MFU).

    busy_share   on a GPU, NVML's utilisation (the share of each sample period in which a kernel ran), averaged over
                 samples taken through the step; on a CPU, the process's CPU time over wall time x torch's threads
    mfu          a training loop's model FLOP/s over the device's dense bf16 peak (`peak_flops`): 2N per token
                 forward, 2N backward to the activations, 2N_trainable to the weights (PaLM's count, without the
                 attention term and without the recomputation of gradient checkpointing)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' data sheets, matched in order against the
# device name: the longer names first ("H100 PCIe" before "H100", "L40S" before "L40" before "L4").
DENSE_BF16_TFLOPS = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
    ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("MI300X", 1307.0),
)


def peak_flops(device: str, configured_tflops: float | None = None) -> float | None:
    """The device's dense bf16 peak in FLOP/s: `configured_tflops` (compute.peak_tflops) when given, else the GPU's from
    DENSE_BF16_TFLOPS by its name; None where neither says (a CPU, an unlisted GPU): no MFU is reported then.

    >>> peak_flops("cpu"), peak_flops("cpu", 2.5)
    (None, 2500000000000.0)
    """
    if configured_tflops:
        return configured_tflops * 1e12
    if not device.startswith("cuda"):
        return None
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    return next((tflops * 1e12 for key, tflops in DENSE_BF16_TFLOPS if key in name), None)


def training_flops_per_token(model) -> float:
    """Model FLOPs of one token through a training step: 2 x the matmul weights (forward) + 2 x them (the backward to the
    activations) + 2 x the trainable ones (the backward to the weights). An input embedding is a lookup, not a matmul,
    so it counts only where it is tied to the output head (which is one).

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    >>> training_flops_per_token(net)  # 40 matmul weights, all trainable
    240.0
    >>> _ = net[1].requires_grad_(False); training_flops_per_token(net)
    160.0
    """
    import torch

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = {id(output.weight)} if output is not None else set()
    weights = [p for p in model.parameters() if id(p) not in embeddings or id(p) in tied]
    matmul = sum(p.numel() for p in weights)
    trainable = sum(p.numel() for p in weights if p.requires_grad)
    return 4.0 * matmul + 2.0 * trainable


def training_utilisation(model, tokens_per_second: float, world: int, device: str, configured_tflops: float | None) -> dict:
    """`model_tflops_per_second` per process of a training loop that saw `tokens_per_second` (all processes' tokens, prompt
    and completion) and, where the device's peak is known, `mfu`.

    >>> import torch
    >>> training_utilisation(torch.nn.Linear(1000, 1000, bias=False), 5e5, 1, "cpu", 6.0)
    {'model_tflops_per_second': 3.0, 'mfu': 0.5}
    """
    achieved = training_flops_per_token(model) * tokens_per_second / world
    result = {"model_tflops_per_second": round(achieved / 1e12, 6)}
    peak = peak_flops(device, configured_tflops)
    if peak:
        result["mfu"] = round(achieved / peak, 6)
    return result


def nvidia_smi() -> list[dict]:
    """Per GPU: used and total memory in bytes and the utilisation share, from nvidia-smi (no CUDA needed in this process)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total,utilization.gpu", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in done.stdout.strip().splitlines():
        index, used, total, utilization = (part.strip() for part in line.split(","))
        gpus.append({"gpu": index, "used": float(used) * 2**20, "total": float(total) * 2**20,
                     "utilization": float(utilization) / 100 if utilization.replace(".", "").isdigit() else None})
    return gpus


def gpu_utilisation(device: str) -> float | None:
    """The GPU's utilisation share now (torch's NVML reading, else nvidia-smi's), None when neither answers."""
    import torch

    index = torch.device(device).index or 0
    try:
        return torch.cuda.utilization(index) / 100
    except Exception:  # no pynvml (nvidia-ml-py) in this environment, or NVML refused: ask the driver's tool
        return next((gpu["utilization"] for gpu in nvidia_smi() if gpu["gpu"] == str(index)), None)


class BusyShare:
    """The device's busy share over a `with` block (see the module's docstring); `result()` gives {busy_share, busy_device}.

    On a GPU a daemon thread reads `read()` (default: `gpu_utilisation`) every `interval` seconds; a block shorter than
    one interval is read once at its end. Readings that fail (None) are left out, and with none there is no busy_share.

    >>> with BusyShare("cpu") as busy:
    ...     _ = sum(i * i for i in range(200_000))
    >>> busy.result()["busy_device"], 0 <= busy.result()["busy_share"] <= 1
    ('cpu', True)
    """

    def __init__(self, device: str, interval: float = 1.0, read=None):
        self.device, self.interval = device, interval
        self.gpu = device.startswith("cuda")
        self.read = read or (lambda: gpu_utilisation(device))
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="busy-share", daemon=True)

    def _take(self) -> None:
        value = self.read()
        if value is not None:
            self.samples.append(float(value))

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def __enter__(self) -> "BusyShare":
        import torch

        self._threads = torch.get_num_threads()
        self._wall, self._cpu = time.perf_counter(), _process_cpu_seconds()
        if self.gpu:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._wall, self._cpu = time.perf_counter() - self._wall, _process_cpu_seconds() - self._cpu
        if self.gpu:
            self._stop.set()
            self._thread.join()
            if not self.samples:
                self._take()

    def result(self) -> dict:
        if self.gpu:
            return {"busy_share": round(sum(self.samples) / len(self.samples), 4), "busy_device": self.device} if self.samples else {}
        share = self._cpu / (self._wall * self._threads) if self._wall > 0 else 0.0
        return {"busy_share": round(min(share, 1.0), 4), "busy_device": "cpu"}


def _process_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system
