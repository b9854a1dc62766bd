"""The Kubernetes deployment, without a cluster: the executor, the pod each compute step gets, and the launch commands."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, python
from pipelines.launch.steps import compute_command
from rl_assets.core.run_params import ComputeParams

pytest.importorskip("dagster_k8s", reason="dagster-k8s is the optional [k8s] extra")

# Loads the code location with k8s settings and builds, with dagster-k8s' own functions, the Job each step would get.
POD_SPECS = """
import json
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config
import pipelines.definitions.code_location as d
from kubernetes.client import ApiClient

out = {"executor": d.defs().executor.name}
for node in d.defs().resolve_job_def("rl_pipeline").graph.node_defs:
    tags = {k: v if isinstance(v, str) else json.dumps(v) for k, v in node.tags.items()}
    config = DagsterK8sJobConfig(job_image="registry.example/rl-assets:1", dagster_home="/opt/dagster/home", instance_config_map="dagster-instance")
    job = construct_dagster_k8s_job(config, ["dagster", "api", "execute_step"], "job-" + node.name.replace("_", "-")[:40],
                                    user_defined_k8s_config=get_user_defined_k8s_config(tags))
    container = job.spec.template.spec.containers[0]
    out[node.name] = {"limits": (container.resources.limits if container.resources else None) or {},
                      "requests": (container.resources.requests if container.resources else None) or {},
                      "image": container.image, "pool": node.pool,
                      "manifest": ApiClient().sanitize_for_serialization(job)}  # what the executor would send to the cluster
print(json.dumps(out))
"""


def pod_specs(**settings: str) -> dict:
    overrides = ";".join(f"{k}={v}" for k, v in settings.items())
    done = python(["-c", POD_SPECS], REPO, timeout=180, RL_ASSETS_SET=overrides)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_k8s_executor_gives_each_compute_step_its_gpus_and_nothing_to_the_rest():
    specs = pod_specs(**{"compute.executor": "k8s", "compute.gpus_per_step": "2"})
    assert specs["executor"] == "k8s"
    for op in ("compute",):  # the resident op that writes r00, every round, the evaluation and the promotion
        assert specs[op]["limits"] == {"nvidia.com/gpu": "2"} and specs[op]["requests"] == {"nvidia.com/gpu": "2"}, op
        assert specs[op]["image"] == "registry.example/rl-assets:1" and specs[op]["pool"] == "gpu"
    for op in ("raw_data", "prompts"):  # CPU-only stages request no GPU
        assert "nvidia.com/gpu" not in specs[op]["limits"], op


def test_every_step_job_the_k8s_executor_builds_is_valid_kubernetes():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    specs = pod_specs(**{"compute.executor": "k8s", "compute.gpus_per_step": "2"})
    for op in ("raw_data", "prompts", "compute"):
        kubernetes_validate.validate(specs[op]["manifest"], "1.30", strict=True)


def test_default_params_run_on_the_multiprocess_executor_without_gpu_requests():
    specs = pod_specs()
    assert specs["executor"] == "multiprocess"
    assert specs["compute"]["limits"] == {}


RESOURCE = "/tmp/rl-assets-params-x/params.json"  # the step's resolved params (pipelines.launch.steps.resolved_params_file)


def test_one_process_steps_run_plain_python():
    command = compute_command(["r03/rollouts", "r03/rewards"], RESOURCE, ComputeParams(nproc=4))
    assert command[1:] == ["-m", "pipelines.launch.pipes_child", "r03/rollouts", "r03/rewards", "--resolved-params", RESOURCE]


def test_several_processes_use_standalone_torchrun():
    command = compute_command(["r02/checkpoint"], RESOURCE, ComputeParams(nproc=4))
    assert command[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m"]


def test_several_nodes_use_torchrun_rendezvous():
    compute = ComputeParams(nproc=8, nnodes=4, rdzv_endpoint="rl-assets-train.default.svc:29400")
    command = " ".join(compute_command(["r02/checkpoint"], RESOURCE, compute))
    assert ("-m torch.distributed.run --nnodes 4 --rdzv_backend c10d --rdzv_endpoint rl-assets-train.default.svc:29400 "
            "--rdzv_id rl-assets-r02-checkpoint --nproc_per_node=8 -m pipelines.launch.pipes_child r02/checkpoint") in command


def test_an_accelerate_config_switches_the_launcher_to_accelerate_launch(tmp_path):
    compute = ComputeParams(nproc=8, nnodes=2, rdzv_endpoint="head:29500", accelerate_config="configs/zero3.yaml")
    command = compute_command(["r00/checkpoint"], RESOURCE, compute)
    assert command[1:10] == ["-m", "accelerate.commands.launch", "--config_file", "configs/zero3.yaml", "--num_processes", "16",
                             "--num_machines", "2", "-m"]
