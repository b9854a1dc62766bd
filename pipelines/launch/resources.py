"""What a compute step asks of the machine it runs on: its GPUs (op tags that dagster-k8s turns into requests), a liveness probe
on k8s, and its retry policy."""

from dagster import Backoff, RetryPolicy

from rl_assets.core.run_params import ComputeParams


def compute_tags(compute: ComputeParams) -> dict:
    """Op tags of a compute step: its GPU need, which dagster-k8s turns into an nvidia.com/gpu request."""
    gpus = compute.gpus_per_step
    tags, container = {"rl_assets/compute": "true", "rl_assets/gpus": str(gpus)}, {}
    if gpus:
        limits = {"nvidia.com/gpu": str(gpus)}
        container["resources"] = {"requests": limits, "limits": limits}
    if compute.executor == "k8s":  # the kubelet restarts a step whose heartbeat stops moving (rl_assets/run/heartbeat.py)
        container["liveness_probe"] = {"exec": {"command": ["python", "-m", "rl_assets.run.heartbeat", "--this-host"]},
                                       "period_seconds": 60, "failure_threshold": 3, "timeout_seconds": 30}
    if container:
        tags["dagster-k8s/config"] = {"container_config": container}
    return tags


# A training step killed by a preemption or an OOM is retried; it resumes from its last saved state. Only such
# transient failures reach the policy: run_compute raises Failure(allow_retries=False) for an error that would recur.
TRAINING_RETRY = RetryPolicy(max_retries=2, delay=30, backoff=Backoff.EXPONENTIAL)
