"""The Kubernetes example of serving and the step pods' liveness probe, without a cluster (like tests/pipelines/test_k8s.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import yaml

from conftest import REPO, python
from rl_assets.serve.deployment import manifests_text, serve_manifests
from rl_assets.run.heartbeat import Heartbeat

import kubernetes  # noqa: E402  (through dagster-k8s, a dev dependency)


def as_model(document: dict, kind: str):
    """The kubernetes client's model of a manifest; a key it does not know is dropped, so the round trip shows typos."""
    client = kubernetes.client.ApiClient()

    class Response:
        data = json.dumps(document)

    model = client.deserialize(Response(), kind)
    assert client.sanitize_for_serialization(model) == document, f"{kind} has keys the API does not know"
    return model


def test_the_committed_example_is_the_generated_one():
    assert (REPO / "examples/k8s/serve.yaml").read_text() == manifests_text(), "run: python -m rl_assets.serve.deployment > examples/k8s/serve.yaml"


def test_the_deployment_is_probed_on_health_and_scraped_by_prometheus():
    deployment, service = (as_model(d, kind) for d, kind in zip(yaml.safe_load_all(manifests_text()), ("V1Deployment", "V1Service")))
    pod = deployment.spec.template
    assert pod.metadata.annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}
    [container] = pod.spec.containers
    assert container.readiness_probe.http_get.path == "/health" and container.liveness_probe.http_get.path == "/health/live"
    assert container.readiness_probe.http_get.port == container.liveness_probe.http_get.port == container.ports[0].name == "http"
    assert container.command[:4] == ["rl-assets", "serve", "--host", "0.0.0.0"] and container.ports[0].container_port == 8000
    assert pod.spec.security_context.run_as_non_root and pod.spec.security_context.run_as_user == 1000
    assert service.spec.selector == deployment.spec.selector.match_labels == pod.metadata.labels
    assert service.spec.ports[0].target_port == "http"
    gpu = serve_manifests(gpus=1)[0]["spec"]["template"]["spec"]["containers"][0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1" and gpu["command"][-2:] == ["--device", "cuda"]


POD = """
import json
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config
import pipelines.definitions.code_location as d

node = next(n for n in d.defs().resolve_job_def("rl_pipeline").graph.node_defs if n.name == "compute")
tags = {k: v if isinstance(v, str) else json.dumps(v) for k, v in node.tags.items()}
config = DagsterK8sJobConfig(job_image="registry.example/rl-assets:1", dagster_home="/opt/dagster/home", instance_config_map="dagster-instance")
job = construct_dagster_k8s_job(config, ["dagster", "api", "execute_step"], "job-train", user_defined_k8s_config=get_user_defined_k8s_config(tags))
probe = job.spec.template.spec.containers[0].liveness_probe
print(json.dumps(None if probe is None else {"command": probe._exec.command, "period": probe.period_seconds}))
"""


def test_k8s_step_pods_get_a_heartbeat_liveness_probe():
    done = python(["-c", POD], REPO, timeout=180, RL_ASSETS_SET="compute.executor=k8s")
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe == {"command": ["python", "-m", "rl_assets.run.heartbeat", "--this-host"], "period": 60}


def test_the_probe_command_fails_only_on_a_stale_step_of_this_host(tmp_path):
    check = lambda *extra: subprocess.run([sys.executable, "-m", "rl_assets.run.heartbeat", "--this-host", *extra, str(tmp_path)],  # noqa: E731
                                          capture_output=True, text=True, timeout=60)
    assert check().returncode == 0 and json.loads(check().stdout) == []
    with Heartbeat(tmp_path, "train", 1, interval=3600) as beat:
        assert check("--timeout", "60").returncode == 0
        beat.record["progress"] -= 120
        beat.path.write_text(json.dumps(beat.record))
        stale = check("--timeout", "60")
        assert stale.returncode == 1 and json.loads(stale.stdout)[0]["host"] == socket.gethostname()
