"""The code location: what importing it costs, the shape of the asset graph, pools, and dvc.yaml sync."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from dagster import AssetKey

from conftest import REPO, import_pipelines, python
from rl_assets.core.params_file import load_params

REPO_ROUNDS = load_params(REPO / "params.yaml").rounds


def key(text: str) -> AssetKey:
    return AssetKey(text.split("/"))


@pytest.fixture(scope="module")
def graph():
    return import_pipelines("pipelines.definitions.code_location").defs().resolve_asset_graph()


def test_importing_definitions_reads_no_params_and_building_them_reads_them_once():
    """Importing the modules reads neither the environment nor params.yaml; Dagster builds the code location when it loads it."""
    code = "import pipelines.definitions.code_location as d, pipelines.launch.steps, pipelines.cli; print('imported'); d.defs()"
    done = python(["-c", code], REPO, timeout=120, check=False, RL_ASSETS_PARAMS="no-such-params.yaml")
    assert done.stdout.strip() == "imported" and "no-such-params.yaml: file not found" in done.stderr


def test_importing_definitions_does_not_import_torch_transformers_or_trl():
    code = ("import json, sys; import pipelines.definitions.code_location as d; assert d.defs().resolve_asset_graph(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'trl'})))")
    done = python(["-c", code], REPO, timeout=120)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_no_private_dagster_api_is_imported_or_named():
    """Public APIs only: an upgrade of Dagster must not break a run. Fails on `dagster._core...`, `dagster_pipes._x` and the like."""
    import re

    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for folder in ("rl_assets", "pipelines", "bench")
             for path in sorted((REPO / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bdagster(_[a-z0-9]+)?\._", line)]
    assert found == []


def test_graph_unrolls_every_round_of_params_yaml(graph):
    rounds = [f"r{n:02d}" for n in range(1, REPO_ROUNDS + 1)]
    expected = {"raw_data", "prompts", "r00/checkpoint", "evaluation", "promoted_model"} | {f"{r}/{s}" for r in rounds for s in ("rollouts", "rewards", "checkpoint")}
    assert REPO_ROUNDS >= 2, "the repo's params.yaml should have several rounds for this test to mean something"
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == expected

    parents = lambda k: {p.to_user_string() for p in graph.get(key(k)).parent_keys}  # noqa: E731
    assert parents("raw_data") == set()
    assert parents("prompts") == {"raw_data"}
    assert parents("r00/checkpoint") == {"prompts"}
    for n in range(1, REPO_ROUNDS + 1):
        r, previous = f"r{n:02d}", f"r{n - 1:02d}/checkpoint"
        assert parents(f"{r}/rollouts") == {previous, "prompts"}
        assert parents(f"{r}/rewards") == {f"{r}/rollouts"}
        assert parents(f"{r}/checkpoint") == {f"{r}/rewards", f"{r}/rollouts", previous}
    assert parents("evaluation") == {"prompts"} | {f"r{n:02d}/checkpoint" for n in range(REPO_ROUNDS + 1)}
    assert parents("promoted_model") == {"evaluation"}

    # flow order: every round after the one before it
    order = [k.to_user_string() for k in graph.toposorted_asset_keys]
    assert order.index("r00/checkpoint") < order.index("r01/rollouts")
    assert all(order.index(f"r{n - 1:02d}/checkpoint") < order.index(f"r{n:02d}/rollouts") for n in range(1, REPO_ROUNDS + 1))
    assert order[-2:] == ["evaluation", "promoted_model"]


def test_compute_assets_are_in_the_gpu_pool_and_table_assets_are_not(graph):
    # the rewards too: the resident op that writes every model step holds the slot for all of them
    compute = {"r00/checkpoint", "evaluation"} | {f"r{n:02d}/{s}" for n in range(1, REPO_ROUNDS + 1) for s in ("rollouts", "rewards", "checkpoint")}
    in_process = {"raw_data", "prompts"}
    for k in compute:
        assert graph.get(key(k)).pools == {"gpu"}, k
    for k in in_process:
        assert "gpu" not in graph.get(key(k)).pools, k


def test_compute_ops_declare_their_gpu_need_in_tags():
    code = ("import json; from pipelines.definitions.code_location import defs; d = defs(); g = d.resolve_asset_graph(); "
            "print(json.dumps({k.to_user_string(): d.resolve_assets_def(k).op.tags for k in g.get_all_asset_keys() if g.get(k).pools}))")
    done = python(["-c", code], REPO, timeout=120, RL_ASSETS_SET="compute.gpus_per_step=2")
    tags = json.loads(done.stdout.strip().splitlines()[-1])
    assert tags, "no compute ops found"
    for asset, op_tags in tags.items():
        gpu_tags = {k: v for k, v in op_tags.items() if "gpu" in (k + str(v)).lower()}
        assert any("2" in str(v) for v in gpu_tags.values()), f"{asset}: tags {op_tags} do not declare 2 GPUs"


def test_committed_dvc_yaml_is_the_generated_one():
    done = python(["-m", "pipelines", "dvc-sync", "--check"], REPO, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_dvc_yaml_has_one_stage_per_asset_materializing_it(graph):
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    reproducible = [k for k in graph.toposorted_asset_keys if k != key("promoted_model")]  # a decision with history, not a DVC output
    assert list(stages) == [k.to_user_string().replace("/", "-") for k in reproducible]
    for k in reproducible:
        stage = stages[k.to_user_string().replace("/", "-")]
        assert stage["cmd"] == f".venv/bin/python -m pipelines materialize {k.to_user_string()}"
        for parent in graph.get(k).parent_keys:  # every upstream output is a dep, so DVC sees the same edges
            out = stages[parent.to_user_string().replace("/", "-")]["outs"][0]
            assert out in stage["deps"], (k, parent)
    assert stages["r01-rewards"]["params"] == ["rewards"]


def test_dvc_sync_check_detects_a_stale_or_edited_dvc_yaml(micro_copy):
    check = ["-m", "pipelines", "dvc-sync", "--check"]
    assert python(check, micro_copy, timeout=120, check=False).returncode == 0

    dvc_yaml = micro_copy / "dvc.yaml"
    generated = dvc_yaml.read_text()
    dvc_yaml.write_text(generated.replace("- rewards\n", "- rewards\n    - train\n", 1))
    edited = python(check, micro_copy, timeout=120, check=False)
    assert edited.returncode == 1
    assert "dvc-sync" in edited.stderr
    assert dvc_yaml.read_text() != generated, "--check must not rewrite dvc.yaml"

    # a graph change (one more round) makes the committed file stale; dvc-sync brings it back in line
    dvc_yaml.write_text(generated)
    params = micro_copy / "params.yaml"
    params.write_text(params.read_text().replace("rounds: 1", "rounds: 2"))
    assert python(check, micro_copy, timeout=120, check=False).returncode == 1
    python(["-m", "pipelines", "dvc-sync"], micro_copy, timeout=120)
    assert "r02-checkpoint" in yaml.safe_load(dvc_yaml.read_text())["stages"]
    assert python(check, micro_copy, timeout=120, check=False).returncode == 0


def test_run_with_a_misspelled_override_stops_before_any_run(micro_copy):
    """`rl-assets run --set` validates params first: a typo exits 2 naming the key, and no run starts."""
    done = python(["-m", "pipelines", "run", "--set", "train.lerning_rate=1e-4"], micro_copy, timeout=120, check=False)
    assert done.returncode == 2
    assert "--set train.lerning_rate=1e-4: train.lerning_rate: unknown key; did you mean train.learning_rate?" in done.stderr
    assert "dagster run" not in done.stderr and not (micro_copy / "data" / "raw_data.parquet").exists()


def test_every_asset_shows_the_owners_of_params_yaml(graph):
    owners = load_params(REPO / "params.yaml").owners
    assert owners, "the repo's params.yaml names owners, so this test means something"
    for key in graph.get_all_asset_keys():
        assert list(graph.get(key).owners) == owners, key.to_user_string()


def test_every_asset_reads_what_the_stage_graph_says(graph):
    """Dagster's dependencies are the graph's (rl_assets.core.graph.unroll), for every output and no other asset."""
    from rl_assets.core.graph import unroll

    outputs = unroll(load_params(REPO / "params.yaml"))
    assert {o.key for o in outputs} == {k.to_user_string() for k in graph.get_all_asset_keys()}
    for output in outputs:
        assert {p.to_user_string() for p in graph.get(key(output.key)).parent_keys} == set(output.inputs), output.key


def test_with_staleness_each_rounds_training_can_run_beside_a_later_rounds_sampling(monkeypatch):
    """k=1 with overlap: one op per round and lane; train_rNN and sample_r(N+1) have no path between them (the executor runs them at
    once), and each lane keeps one op at a time through its pool. k=0, or no overlap (auto on a CPU alone), keeps the one resident op."""
    from pipelines.definitions.compute import compute_assets

    ops = {a.op.name: a for a in compute_assets(load_params(REPO / "params.yaml", ["rounds=3", "rollouts.staleness=1", "compute.overlap=true"]))}
    keys = {name: {k.to_user_string() for k in a.keys} for name, a in ops.items()}
    assert keys == {"compute_r00": {"r00/checkpoint"}, "compute_evaluation": {"evaluation", "promoted_model"},
                    **{f"compute_sample_r0{n}": {f"r0{n}/rollouts", f"r0{n}/rewards"} for n in (1, 2, 3)},
                    **{f"compute_train_r0{n}": {f"r0{n}/checkpoint"} for n in (1, 2, 3)}}
    op_of = {k: name for name, ks in keys.items() for k in ks}
    upstream = {name: {op_of[d.to_user_string()] for deps in a.asset_deps.values() for d in deps if d.to_user_string() in op_of} - {name}
                for name, a in ops.items()}

    def before(op):  # every op that must finish before `op` starts
        seen, todo = set(), list(upstream[op])
        while todo:
            if (o := todo.pop()) not in seen:
                seen.add(o)
                todo += upstream[o]
        return seen

    assert "compute_train_r01" not in before("compute_sample_r02") and "compute_sample_r02" not in before("compute_train_r01")
    assert "compute_train_r02" not in before("compute_sample_r03") and "compute_sample_r03" not in before("compute_train_r02")
    assert "compute_train_r01" in before("compute_sample_r03")  # r03 samples from r01
    assert [ops[f"compute_sample_r0{n}"].op.pools for n in (1, 2, 3)] == [{"sampler"}] * 3
    assert [ops[f"compute_train_r0{n}"].op.pools for n in (1, 2, 3)] == [{"gpu"}] * 3
    assert [name for name in ops] == ["compute_r00", "compute_sample_r01", "compute_train_r01", "compute_sample_r02", "compute_train_r02",
                                      "compute_sample_r03", "compute_train_r03", "compute_evaluation"]
    for no_overlap in (["rounds=3"], ["rounds=3", "rollouts.staleness=1", "compute.overlap=false"],
                       ["rounds=3", "rollouts.staleness=1", "compute.device=cpu"]):  # auto: not on a CPU alone
        assert [a.op.name for a in compute_assets(load_params(REPO / "params.yaml", no_overlap))] == ["compute"], no_overlap
    from pipelines.definitions import compute
    from pipelines.definitions.compute import lanes
    from pipelines.definitions.specs import compute_specs

    for device, half in (("cpu", max(1, os.cpu_count() // 2)), ("cuda", None)):  # a lane op's child takes half the cores of a CPU
        params = load_params(REPO / "params.yaml", ["rounds=3", "rollouts.staleness=1", f"compute.device={device}"])
        threads = {lane.name: lane.threads for lane in lanes(params, compute_specs(params))}
        assert threads == {"compute_r00": None, "compute_evaluation": None,
                           **{f"compute_{lane}_r0{n}": half for lane in ("sample", "train") for n in (1, 2, 3)}}, device
    # two GPUs: each lane's child sees one (training the first); r00 and the evaluation every one; none split on a cluster
    for visible, executor, nproc, split in (("0,1", "multiprocess", 1, {"train": "0", "sample": "1"}), ("0", "multiprocess", 1, {}),
                                            ("0,1", "slurm", 1, {}), ("0,1", "multiprocess", 2, {}),
                                            ("2,3,5", "multiprocess", 2, {"train": "2,3", "sample": "5"})):
        monkeypatch.setattr(compute, "visible_gpus", lambda: visible.split(","))
        params = load_params(REPO / "params.yaml", ["rounds=2", "rollouts.staleness=1", "compute.device=cuda", f"compute.executor={executor}",
                                                    f"compute.nproc={nproc}"])
        gpus = {lane.name: lane.gpus for lane in lanes(params, compute_specs(params))}
        assert gpus == {"compute_r00": None, "compute_evaluation": None,
                        **{f"compute_{kind}_r0{n}": split.get(kind) for kind in ("sample", "train") for n in (1, 2)}}, (visible, executor, nproc)
    on_a_cluster = ["rounds=3", "rollouts.staleness=1", "compute.device=cpu", "compute.executor=slurm"]
    assert len(compute_assets(load_params(REPO / "params.yaml", on_a_cluster))) == 8


def test_the_gpus_a_lane_may_split_are_the_drivers_devices_or_those_cuda_visible_devices_names(tmp_path, monkeypatch):
    from pipelines.definitions.compute import visible_gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("nvidia0", "nvidia1", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert visible_gpus(tmp_path) == [], "no driver (nvidiactl), no GPU"
    (tmp_path / "nvidiactl").touch()
    assert visible_gpus(tmp_path) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert visible_gpus(tmp_path) == ["3", "5"]
