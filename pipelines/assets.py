"""The stages outside the rounds, in flow order: raw_data -> prompts (in their own steps), r00/checkpoint and evaluation
(specs of the compute multi-asset, pipelines/compute.py).

Each body loads its inputs, calls one rl_assets function, and reports metadata. The `rl_assets/*`
metadata tell `dvc-sync` which params sections, code and raw inputs each stage depends on. Every
definition comes from a factory given the params (pipelines.definitions builds them when Dagster
loads the code location): nothing here reads params at import.
"""

from collections import Counter
from pathlib import Path
from typing import Iterator

from dagster import AssetExecutionContext, AssetsDefinition, AssetSpec, Backoff, MaterializeResult, MetadataValue, RetryPolicy, asset

from pipelines.checks import guard_specs
from pipelines.params import ParamsResource, asset_key, written_keys
from pipelines.steps import materialized
from rl_assets.core.config import Params
from rl_assets.core.run_params import ComputeParams
from rl_assets.core.paths import DATA, IMAGES, checkpoint_key, data_dir, output_path


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


def stage_tracking(stage: str, params: Params, inputs: list[str] | None = None, outputs: list[str] | None = None) -> dict:
    """The `metadata` and `code_version` of a stage's asset: what dvc-sync writes and what the UI compares.

    The metadata name the params keys and code files of the stage (rl_assets.core.stage_table: the declared
    project code and the user's own modules, e.g. reward modules) and its raw inputs: the stage's DVC deps.
    The code version hashes that code's content and the params' effective values, so the UI shows the asset
    stale exactly when `dvc status` shows its stage changed. `outputs`: what it writes besides its table or
    folder (raw_data's images), DVC outs too.
    """
    from rl_assets.core.stage_table import stage_code, stage_params, stage_version

    code = [path for path in stage_code(stage, params) if not Path(path).is_absolute()]  # DVC deps live in the project
    metadata = {"rl_assets/params": written_keys(stage_params(stage, params)), "rl_assets/code": code}
    if inputs:
        metadata["rl_assets/inputs"] = inputs
    if outputs:
        metadata["rl_assets/outputs"] = outputs
    return {"metadata": metadata, "code_version": stage_version(stage, params)}


def raw_inputs(params: Params) -> list[str]:
    """Every file or folder the sources read (data files, dataset folders, generator modules): DVC deps."""
    from rl_assets.data.raw_data import source_inputs

    return source_inputs(params.raw_data)


def has_images(params: Params) -> bool:
    """Whether a raw_data source maps an image column: then raw_data writes <data>/images too."""
    return any(source.columns.image for source in params.raw_data.sources)


def data_assets(params: Params) -> list[AssetsDefinition]:
    """raw_data and prompts, each written in its own step by the Dagster process (no model, no compute child)."""

    @asset(
        key=asset_key("raw_data"),  # experiments/<name>/raw_data for any experiment but the default
        group_name="data",
        kinds={"parquet"},
        description="Every configured source (JSONL/CSV/Parquet/datasets files, seeded generators) merged into one table with source and hash per row.",
        **stage_tracking("raw_data", params, raw_inputs(params), [(DATA / IMAGES).as_posix()] if has_images(params) else None),
        check_specs=guard_specs(asset_key("raw_data")),
    )
    def raw_data(context: AssetExecutionContext, params: ParamsResource) -> Iterator[MaterializeResult]:
        from rl_assets.core.schemas import RAW_DATA, write_table
        from rl_assets.data.raw_data import load_raw_data

        p = params.load()
        data = data_dir(p.experiment)
        table, dropped = load_raw_data(p.raw_data, p.seed, images_dir=data / IMAGES)  # raises before anything is written
        path = write_table(table, output_path("raw_data", data), RAW_DATA, "raw_data")
        counts = Counter(table["source"].to_pylist())
        sample = "\n".join(f"- `{message}`" for message in dropped[:10]) or "none"
        images = len({identifier for ids in table["image_ids"].to_pylist() for identifier in ids})
        yield from materialized(context, params, path, {"rows": table.num_rows, "rows_per_source": dict(counts), "images": images,
                                                        "dropped_bad_rows": len(dropped),
                                                        "dropped_bad_rows_sample": MetadataValue.md(sample)})

    @asset(
        key=asset_key("prompts"),
        deps=[raw_data],
        group_name="data",
        kinds={"parquet"},
        description="Deduplicated prompts with a stable hash-based sft/rl/eval split and a token-length filter.",
        **stage_tracking("prompts", params),
        check_specs=guard_specs(asset_key("prompts")),
    )
    def prompts(context: AssetExecutionContext, params: ParamsResource) -> Iterator[MaterializeResult]:
        from rl_assets.core.schemas import PROMPTS, read_table, write_table
        from rl_assets.core.tokenizer import load_tokenizer
        from rl_assets.core.vision import tokens_per_image
        from rl_assets.data.prompts import build_prompts

        p = params.load()
        data = data_dir(p.experiment)
        table, dropped = build_prompts(read_table(output_path("raw_data", data), "raw_data"), p.prompts, load_tokenizer(p.model),
                                       image_tokens=tokens_per_image(p.model), images_dir=data / IMAGES)
        path = write_table(table, output_path("prompts", data), PROMPTS, "prompts")
        splits = Counter(table["split"].to_pylist())
        yield from materialized(context, params, path, {"rows": table.num_rows, **{f"split_{s}": splits[s] for s in ("sft", "rl", "eval")},
                                                        "dropped_duplicates": dropped["duplicates"], "dropped_too_long": dropped["too_long"],
                                                        "dropped_conflicting_answers": dropped["conflicting"]})

    return [raw_data, prompts]


def base_checkpoint_spec(params: Params) -> AssetSpec:
    """r00/checkpoint; it starts from the promoted model when promotion.warm_start says so: then DVC tracks that model too."""
    promotion = params.promotion
    inputs = [f"{promotion.directory}/promoted"] if promotion.warm_start == "promoted" else None
    return AssetSpec(asset_key(checkpoint_key(0)), deps=[asset_key("prompts")], group_name="r00", kinds={"pytorch"},
                     description="The base policy (embedded tiny model or any HF causal LM), warm-started with TRL's SFTTrainer.",
                     **stage_tracking("sft", params, inputs))


def evaluation_spec(params: Params) -> AssetSpec:
    """Every checkpoint r00..rR on the held-out prompts; depends on all of them."""
    return AssetSpec(asset_key("evaluation"), deps=[asset_key(checkpoint_key(n)) for n in range(params.rounds + 1)] + [asset_key("prompts")],
                     group_name="evaluation", kinds={"parquet"},
                     description="Greedy and sampled accuracy of every checkpoint on held-out prompts, with a per-round plot.",
                     **stage_tracking("evaluation", params))
