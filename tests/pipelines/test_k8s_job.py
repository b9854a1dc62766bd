"""The Kubernetes example of a round on several machines, and every manifest the project ships, against Kubernetes' own
schemas (kubernetes-validate's strict JSON schemas: a misspelt or misplaced field fails, as `kubectl apply` would)."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO
from pipelines.launch.steps import compute_command
from rl_assets.core.run_params import ComputeParams
from pipelines.launch.k8s_job import job_name, manifests_text, rendezvous_endpoint, training_job_manifests

kubernetes_validate = pytest.importorskip("kubernetes_validate")
KUBERNETES = "1.30"  # the oldest release still supported by its cloud providers as of this writing; the manifests use nothing newer

EXAMPLES = sorted((REPO / "examples" / "k8s").glob("*.yaml"))


def validate(resource: dict) -> None:
    kubernetes_validate.validate(resource, KUBERNETES, strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_shipped_manifest_is_valid_kubernetes(path):
    resources = [r for r in yaml.safe_load_all(path.read_text()) if r]
    assert resources
    for resource in resources:
        validate(resource)


def test_the_strict_schema_catches_a_misplaced_field():
    service, job = training_job_manifests()
    job["spec"]["template"]["spec"]["containers"][0]["cmd"] = ["python"]  # not a container field
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)


def test_the_committed_example_is_the_generated_one():
    assert (REPO / "examples/k8s/train-round.yaml").read_text() == manifests_text()


@pytest.mark.parametrize("nodes", [2, 4])
def test_the_job_holds_the_other_machines_and_hosts_the_rendezvous_dagster_s_step_joins(nodes):
    service, job = training_job_manifests(round_number=3, nodes=nodes, nproc=8)
    for resource in (service, job):
        validate(resource)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == nodes - 1  # Dagster's pod is one
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"] == job_name(3)
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    endpoint = rendezvous_endpoint(3)
    assert endpoint.startswith(f"{job_name(3)}-0.{job_name(3)}:")  # pod 0's stable name through the headless Service
    command = pod["containers"][0]["command"]
    # the same rendezvous as the one Dagster's compute step launches with those params (pipelines.launch.steps.compute_command)
    dagster = compute_command(["r03/checkpoint"], "params.json", ComputeParams(nproc=8, nnodes=nodes, rdzv_endpoint=endpoint))
    for option in ("--nnodes", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id"):
        assert command[command.index(option) + 1] == dagster[dagster.index(option) + 1], option
    assert command[command.index("--nproc_per_node") + 1] == "8" and "--nproc_per_node=8" in dagster
    assert command[command.index("-m", command.index("--max-restarts")) + 1:][:4] == ["rl_assets.run.step", "train", "--round", "3"]
