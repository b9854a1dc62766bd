"""`GET /metrics` of `rl-assets serve`: Prometheus metrics read from what the pipeline recorded, at scrape time.

    rl_assets_train_<metric>{round}          every numeric metric of each checkpoint card (reward_mean, kl, loss, entropy, tokens_per_second, ...)
    rl_assets_eval_accuracy{round,mode}      held-out accuracy from the evaluation table (greedy, sampled)
    rl_assets_step_duration_seconds{stage,round}   the last finished run of each compute step (.rl_assets/steps.jsonl)
    rl_assets_step_busy_share{stage,round,device}, rl_assets_step_peak_memory_bytes{stage,round,memory}   the same runs'
                                             device busy share and peak memory (rss, cuda); see rl_assets.run.hardware
    rl_assets_step_heartbeat_age_seconds{stage,round,pid}, rl_assets_step_progress_age_seconds{...}   running steps
    rl_assets_run_status{status}             1 for the latest Dagster run's status; rl_assets_healthy 1 or 0
    rl_assets_promoted_info{checkpoint_id,source}, rl_assets_promoted_sampled_accuracy
    rl_assets_gpu_memory_used_bytes{gpu}, rl_assets_gpu_memory_total_bytes{gpu}, rl_assets_gpu_utilization_ratio{gpu}   (nvidia-smi)
    rl_assets_requests_total{endpoint,code}, rl_assets_request_duration_seconds{endpoint}, rl_assets_batch_size,
    rl_assets_completion_tokens_total, rl_assets_generation_tokens_per_second   (this server's predict endpoints)
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from rl_assets.serve.health import assess
from rl_assets.run.hardware import nvidia_smi
from rl_assets.run.heartbeat import running_steps, step_durations

RUN_STATES = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "SUCCESS", "FAILURE", "CANCELING", "CANCELED")


def metric_name(text: str) -> str:
    """A Prometheus-safe name part.

    >>> metric_name("reward/mean-2")
    'reward_mean_2'
    """
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


class ProjectCollector:
    """Gauges from the project's files and the status cache, computed at each scrape."""

    def __init__(self, root: Path, data: Path, status, heartbeat_timeout: float):
        self.root, self.data, self.status, self.heartbeat_timeout = root, data, status, heartbeat_timeout

    def collect(self):
        from rl_assets.eval.curves import round_rows

        families: dict[str, GaugeMetricFamily] = {}

        def gauge(name: str, help_text: str, labels: list[str]) -> GaugeMetricFamily:
            return families.setdefault(name, GaugeMetricFamily(name, help_text, labels=labels))

        for row in round_rows(self.data):
            for key, value in row.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or key == "step":
                    continue
                group, name = key.split("/", 1)
                if group == "train":
                    gauge(f"rl_assets_train_{metric_name(name)}", f"{name} of the round's checkpoint (its lineage card)", ["round"]).add_metric([str(row["step"])], value)
                elif name.endswith("_accuracy"):
                    gauge("rl_assets_eval_accuracy", "held-out accuracy of the round's checkpoint", ["round", "mode"]).add_metric(
                        [str(row["step"]), name.removesuffix("_accuracy")], value)
        for (stage, round_number), step in step_durations(self.root).items():
            gauge("rl_assets_step_duration_seconds", "wall time of the last finished run of a compute step", ["stage", "round", "ok"]).add_metric(
                [stage, "" if round_number is None else str(round_number), str(step["ok"]).lower()], step["seconds"])
            labels = [stage, "" if round_number is None else str(round_number)]
            if "busy_share" in step:
                gauge("rl_assets_step_busy_share", "share of the last finished run of a compute step in which its device computed "
                      "(GPU: NVML utilisation; CPU: CPU time over wall time x threads)", ["stage", "round", "device"]).add_metric(
                    [*labels, step["busy_device"]], step["busy_share"])
            for memory in ("peak_rss_gb", "peak_cuda_gb"):
                if memory in step:
                    gauge("rl_assets_step_peak_memory_bytes", "peak memory of the last finished run of a compute step's process",
                          ["stage", "round", "memory"]).add_metric([*labels, memory.split("_")[1]], step[memory] * 1e9)
        for step in running_steps(self.root, self.heartbeat_timeout):
            labels = [step["stage"], "" if step["round"] is None else str(step["round"]), str(step["pid"])]
            gauge("rl_assets_step_heartbeat_age_seconds", "seconds since a running step's last heartbeat", ["stage", "round", "pid"]).add_metric(labels, step["heartbeat_age_s"])
            gauge("rl_assets_step_progress_age_seconds", "seconds since a running step's main thread last moved", ["stage", "round", "pid"]).add_metric(labels, step["progress_age_s"])
        status = self.status.latest(wait=False)
        if status is not None:
            run = (status.get("latest_run") or {}).get("status")
            family = gauge("rl_assets_run_status", "1 for the status of the latest rl_pipeline run", ["status"])
            for state in RUN_STATES:
                family.add_metric([state], float(run == state))
            promoted = status.get("promoted_model")
            if promoted:
                gauge("rl_assets_promoted_info", "the promoted model", ["checkpoint_id", "source"]).add_metric(
                    [promoted["checkpoint_id"], str(promoted.get("source"))], 1)
                gauge("rl_assets_promoted_sampled_accuracy", "held-out sampled accuracy of the promoted model", []).add_metric([], promoted["sampled_accuracy"])
        healthy, _ = assess(status, running_steps(self.root, self.heartbeat_timeout))
        gauge("rl_assets_healthy", "1 when /health answers 200", []).add_metric([], float(healthy))
        for gpu in nvidia_smi():
            gauge("rl_assets_gpu_memory_used_bytes", "GPU memory in use (all processes)", ["gpu"]).add_metric([gpu["gpu"]], gpu["used"])
            gauge("rl_assets_gpu_memory_total_bytes", "GPU memory", ["gpu"]).add_metric([gpu["gpu"]], gpu["total"])
            if gpu["utilization"] is not None:
                gauge("rl_assets_gpu_utilization_ratio", "GPU utilization", ["gpu"]).add_metric([gpu["gpu"]], gpu["utilization"])
        yield from families.values()


class ServerMetrics:
    """The predict endpoints' own counters and histograms, with the project gauges, in one registry per app."""

    def __init__(self, collector: ProjectCollector):
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        self.requests = Counter("rl_assets_requests", "predict requests answered", ["endpoint", "code"], registry=self.registry)
        self.latency = Histogram("rl_assets_request_duration_seconds", "predict request latency", ["endpoint"], registry=self.registry,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.batch = Histogram("rl_assets_batch_size", "completions generated together", registry=self.registry,
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.tokens = Counter("rl_assets_completion_tokens", "completion tokens generated", registry=self.registry)
        self.speed = Gauge("rl_assets_generation_tokens_per_second", "completion tokens per second of the last batch", registry=self.registry)

    def on_batch(self, completions: int, tokens: int, seconds: float) -> None:
        self.batch.observe(completions)
        self.tokens.inc(tokens)
        self.speed.set(tokens / seconds if seconds else 0.0)
