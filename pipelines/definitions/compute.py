"""The compute multi-assets: r00/checkpoint, every round's rollouts, rewards and checkpoint, the evaluation and the promotion.

Every output is an asset of its own (its materialization, data version, code version, metadata and
guards), and the op that writes them can be subset: a run asks for the outputs it needs (all of
them, `r04/*`, or `r03/rewards` alone to rescore), and one child process writes them in flow order
with the models kept loaded (rl_assets.run.resident), reporting each the moment it is done, so the UI
fills in round by round. The op carries the GPU tags and the `gpu` pool, and launches through
torchrun or the k8s executor like any compute step (one child per output when the step uses
several processes).

With `rollouts.staleness` k >= 1, round N samples from checkpoint N-1-k, so its sampling need not wait for round
N-1's training. Where the overlap can pay (`overlapped`), the outputs are written by one op per round and lane
(`lanes`): a sampling op (rollouts and rewards, the `sampler` pool) and a training op (checkpoint and PPO's critic,
the `gpu` pool), so the executor runs round N-1's training beside round N+k-1's sampling, one op of each lane at a
time. On a machine with two or more GPUs each lane's child sees its own (`lane_gpus`): training the first half,
sampling the rest. One subsettable op per lane would not do: Dagster splits such an op where the graph leaves and re-enters it,
and consecutive checkpoints would stay in one invocation, which the next sampling op then waits for whole.
"""

import os
from pathlib import Path
from typing import Iterator, NamedTuple

from dagster import (AssetCheckResult, AssetExecutionContext, AssetsDefinition, AssetSpec, DagsterEventType, DataVersion, MaterializeResult,
                     PipesSubprocessClient, multi_asset)

from pipelines.definitions.specs import compute_specs
from pipelines.launch.checks import guard_specs
from pipelines.launch.params import ParamsResource, asset_key
from pipelines.launch.resources import TRAINING_RETRY, compute_tags
from pipelines.launch.steps import run_compute
from rl_assets.core.config import Params
from rl_assets.core.graph import unroll
from rl_assets.core.paths import flow_order, output_key, round_prefix

COMPUTE_OP = "compute"  # the one compute op without staleness; every lane op's name starts with it too (pipelines.launch.steps)
SAMPLING_STAGES = {"rollouts", "rewards"}


def compute_assets(params: Params) -> list[AssetsDefinition]:
    """Every output that needs a model: one op that can be subset, or with `rollouts.staleness` one op per round and lane."""
    specs = compute_specs(params)
    if not overlapped(params):
        return [compute_op(COMPUTE_OP, specs, params)]
    return [compute_op(lane.name, lane.specs, params, pool=lane.pool, threads=lane.threads, gpus=lane.gpus, priority=lane.priority)
            for lane in lanes(params, specs)]


def overlapped(params: Params) -> bool:
    """Whether a round's training runs beside a later round's sampling: staleness k >= 1 and `compute.overlap` (auto: the steps
    have a GPU, named or on this machine, or a cluster gives each its own resources)."""
    compute = params.compute
    if params.rollouts.staleness == 0 or compute.overlap is False:
        return False
    if compute.overlap is True:
        return True
    gpu_here = compute.device == "auto" and bool(visible_gpus())  # what `auto` resolves to
    return compute.device == "cuda" or compute.executor in ("k8s", "slurm") or gpu_here


class Lane(NamedTuple):
    """One op of an overlapped run and what its child gets of the machine."""

    name: str
    specs: list[AssetSpec]
    pool: str  # `sampler` or `gpu`: the executor runs one op of each pool at a time
    threads: int | None  # CPU threads of its child; None: torch's default, every core
    gpus: str | None  # CUDA_VISIBLE_DEVICES of its child; None: what the step itself sees
    priority: int  # the executor's order among ready ops: earlier rounds first


def lanes(params: Params, specs: list[AssetSpec]) -> list[Lane]:
    """Each op of an overlapped run, in flow order.

    r00 and the evaluation with the promotion run alone (everything waits for r00; the evaluation for every checkpoint) with
    every thread and GPU; a round's ops may run beside the other lane's, so on a CPU each takes half of the cores, and on a
    machine with several GPUs each lane takes its share of them (`lane_gpus`). Earlier rounds go first when both of a lane's
    next ops are ready.
    """
    by_key = {spec.key: spec for spec in specs}
    groups: dict[str, Lane] = {}
    half = max(1, (os.cpu_count() or 2) // 2) if params.compute.device != "cuda" else None
    gpus = visible_gpus() if params.compute.device != "cpu" and params.compute.executor == "multiprocess" else []
    for node in unroll(params):
        spec = by_key.get(asset_key(node.key))
        if spec is None:  # raw_data, prompts, the reward model: steps of their own
            continue
        if not node.round:  # r00 (round 0), the evaluation and the promotion (no round): alone, every thread
            name = f"{COMPUTE_OP}_{round_prefix(0) if node.round == 0 else 'evaluation'}"
            lane = Lane(name, [], "gpu", None, None, 0)
        else:
            kind = "sample" if node.stage in SAMPLING_STAGES else "train"
            lane = Lane(f"{COMPUTE_OP}_{kind}_{round_prefix(node.round)}", [], "sampler" if kind == "sample" else "gpu", half,
                        lane_gpus(kind, gpus, params.compute.nproc), params.rounds - node.round)
        groups.setdefault(lane.name, lane).specs.append(spec)
    return list(groups.values())


def visible_gpus(dev: Path = Path("/dev")) -> list[str]:
    """The GPUs a child of this process may use, as CUDA numbers them: none without NVIDIA's driver, else
    CUDA_VISIBLE_DEVICES when set, else one per /dev/nvidiaN device node (without importing torch: the code location never does)."""
    if not (dev / "nvidiactl").exists():
        return []
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [device.strip() for device in visible.split(",") if device.strip()]
    return [str(n) for n in range(len(list(dev.glob("nvidia[0-9]*"))))]


def lane_gpus(lane: str, gpus: list[str], nproc: int = 1) -> str | None:
    """CUDA_VISIBLE_DEVICES of a lane's child: training gets the first half of `gpus` (the larger, when odd), sampling the
    rest. None, so that both share what the step sees, with fewer than two GPUs or when training's half is too small for
    its `nproc` processes.

    >>> lane_gpus("train", ["0", "1", "2"]), lane_gpus("sample", ["0", "1", "2"]), lane_gpus("sample", ["0"])
    ('0,1', '2', None)
    >>> lane_gpus("train", ["0", "1"], nproc=2), lane_gpus("sample", ["4", "5", "6", "7"], nproc=2)
    (None, '6,7')
    """
    first = (len(gpus) + 1) // 2
    if len(gpus) < 2 or nproc > first:
        return None
    return ",".join(gpus[:first] if lane == "train" else gpus[first:])


def compute_op(name: str, specs: list[AssetSpec], params: Params, pool: str = "gpu", threads: int | None = None,
               gpus: str | None = None, priority: int = 0) -> AssetsDefinition:
    """An op that writes `specs` (any subset of them) in one child; each output keeps its own guards as blocking or warning checks.
    `threads`, `gpus` and `priority`: as in `Lane`."""

    @multi_asset(
        name=name,
        specs=specs,
        check_specs=[check for spec in specs for check in guard_specs(spec.key)],
        can_subset=True,
        pool=pool,
        op_tags={**compute_tags(params.compute), **({"dagster/priority": str(priority)} if priority else {})},
        retry_policy=TRAINING_RETRY,
    )
    def compute(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> Iterator[MaterializeResult | AssetCheckResult]:
        wanted = flow_order([output_key(key.path) for key in context.selected_asset_keys])
        done = done_in_this_run(context, wanted)
        checks = {(c.asset_key, c.name) for c in context.selected_asset_check_keys}
        yield from reported_again(context, [key for key in wanted if key in done], checks)
        todo = [key for key in wanted if key not in done]
        if done:
            context.log.info(f"attempt {context.retry_number + 1}: {len(done)} outputs were written by an earlier attempt of this run "
                             f"(reported again); continuing from {todo[0] if todo else 'nothing left'}")
        for result in run_compute(context, pipes, params, todo, threads=threads, gpus=gpus) if todo else ():
            if not isinstance(result, AssetCheckResult) or (result.asset_key, result.check_name) in checks:
                yield result

    return compute


def done_in_this_run(context: AssetExecutionContext, keys: list[str]) -> set[str]:
    """Outputs an earlier attempt of this step already materialized in this run (a retry after a crash continues after them)."""
    if context.retry_number == 0:
        return set()
    done = set()
    for key in keys:
        event = context.instance.get_latest_materialization_event(asset_key(key))
        if event is not None and event.run_id == context.run_id:
            done.add(key)
    return done


def reported_again(context: AssetExecutionContext, keys: list[str], checks: set) -> Iterator[MaterializeResult | AssetCheckResult]:
    """The outputs an earlier attempt wrote, reported by this one with their data versions and their guards' verdicts (a step reports
    every output and check it was asked for)."""
    for key in keys:
        materialization = context.instance.get_latest_materialization_event(asset_key(key)).asset_materialization
        yield MaterializeResult(asset_key=materialization.asset_key, metadata={**materialization.metadata, "written_by_an_earlier_attempt": True},
                                data_version=DataVersion(materialization.tags["dagster/data_version"]))
    done = {asset_key(key) for key in keys}
    for event in context.instance.all_logs(context.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        verdict = event.dagster_event.event_specific_data
        if verdict.asset_key in done and (verdict.asset_key, verdict.check_name) in checks:
            yield AssetCheckResult(asset_key=verdict.asset_key, check_name=verdict.check_name, passed=verdict.passed, severity=verdict.severity,
                                   description=verdict.description, metadata=verdict.metadata)
