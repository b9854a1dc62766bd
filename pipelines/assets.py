"""The stages outside the rounds, in flow order: raw_data -> prompts -> r00/checkpoint, and evaluation.

Each body loads its inputs, calls one rl_assets function (or launches one compute step), and
reports metadata. The `rl_assets/*` metadata tell `dvc-sync` which params sections, code and raw
inputs each stage depends on.
"""


from collections import Counter

from dagster import AssetExecutionContext, AssetKey, Backoff, MaterializeResult, MetadataValue, PipesSubprocessClient, RetryPolicy, asset

from pipelines.steps import ParamsResource, load_project_params, materialized, run_compute
from rl_assets.paths import checkpoint_key, output_path

def compute_tags() -> dict:
    """Op tags of a compute step: its GPU need, which dagster-k8s turns into an nvidia.com/gpu request."""
    gpus = load_project_params().compute.gpus_per_step
    tags = {"rl_assets/compute": "true", "rl_assets/gpus": str(gpus)}
    if gpus:
        limits = {"nvidia.com/gpu": str(gpus)}
        tags["dagster-k8s/config"] = {"container_config": {"resources": {"requests": limits, "limits": limits}}}
    return tags


COMPUTE_TAGS = compute_tags()
# A training step killed by a preemption or an OOM is retried; it resumes from its last saved state. Only such
# transient failures reach the policy: run_compute raises Failure(allow_retries=False) for an error that would recur.
TRAINING_RETRY = RetryPolicy(max_retries=2, delay=30, backoff=Backoff.EXPONENTIAL)


def base_checkpoint_dvc_meta() -> dict:
    """r00 starts from the promoted model when promotion.warm_start says so: then DVC tracks that choice and the model."""
    promotion = load_project_params().promotion
    if promotion.warm_start == "promoted":
        return dvc_meta(["seed", "model", "sft", "promotion.warm_start"], ["rl_assets/models.py", "rl_assets/sft.py"], [f"{promotion.directory}/promoted"])
    return dvc_meta(["seed", "model", "sft"], ["rl_assets/models.py", "rl_assets/sft.py"])


def dvc_meta(params: list[str], code: list[str], inputs: list[str] | None = None) -> dict:
    meta = {"rl_assets/params": params, "rl_assets/code": code}
    if inputs:
        meta["rl_assets/inputs"] = inputs
    return meta


def raw_inputs() -> list[str]:
    """Every file or folder the sources read (data files, dataset folders, generator modules): DVC deps."""
    from rl_assets.raw_data import source_inputs

    return source_inputs(load_project_params().raw_data)


@asset(
    group_name="data",
    kinds={"parquet"},
    description="Every configured source (JSONL/CSV/Parquet/datasets files, seeded generators) merged into one table with source and hash per row.",
    metadata=dvc_meta(["seed", "raw_data"], ["rl_assets/raw_data.py", "rl_assets/raw_files.py", "rl_assets/raw_generators.py"], raw_inputs()),
)
def raw_data(context: AssetExecutionContext, params: ParamsResource) -> MaterializeResult:
    from rl_assets.raw_data import load_raw_data
    from rl_assets.schemas import RAW_DATA, write_table

    p = params.load()
    table, dropped = load_raw_data(p.raw_data, p.seed)  # raises before anything is written
    path = write_table(table, output_path("raw_data"), RAW_DATA, "raw_data")
    counts = Counter(table["source"].to_pylist())
    sample = "\n".join(f"- `{message}`" for message in dropped[:10]) or "none"
    return materialized(context, path, {"rows": table.num_rows, "rows_per_source": dict(counts), "dropped_bad_rows": len(dropped),
                                        "dropped_bad_rows_sample": MetadataValue.md(sample)})


@asset(
    deps=[raw_data],
    group_name="data",
    kinds={"parquet"},
    description="Deduplicated prompts with a stable hash-based sft/rl/eval split and a token-length filter.",
    metadata=dvc_meta(["prompts", "model.name_or_path"], ["rl_assets/prompts.py"]),
)
def prompts(context: AssetExecutionContext, params: ParamsResource) -> MaterializeResult:
    from rl_assets.models import load_tokenizer
    from rl_assets.prompts import build_prompts
    from rl_assets.schemas import PROMPTS, read_table, write_table

    p = params.load()
    table, dropped = build_prompts(read_table(output_path("raw_data"), "raw_data"), p.prompts, load_tokenizer(p.model))
    path = write_table(table, output_path("prompts"), PROMPTS, "prompts")
    splits = Counter(table["split"].to_pylist())
    return materialized(context, path, {"rows": table.num_rows, **{f"split_{s}": splits[s] for s in ("sft", "rl", "eval")},
                                        "dropped_duplicates": dropped["duplicates"], "dropped_too_long": dropped["too_long"]})


@asset(
    key=AssetKey(["r00", "checkpoint"]),
    deps=[prompts],
    group_name="r00",
    kinds={"pytorch"},
    pool="gpu",
    op_tags=COMPUTE_TAGS,
    retry_policy=TRAINING_RETRY,
    description="The base policy (embedded tiny model or any HF causal LM), warm-started with TRL's SFTTrainer.",
    metadata=base_checkpoint_dvc_meta(),
)
def base_checkpoint(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> MaterializeResult:
    return run_compute(context, pipes, params, "sft")


def evaluation_asset(rounds: int):
    """Every checkpoint r00..rR on the held-out prompts; depends on all of them."""

    @asset(
        name="evaluation",
        deps=[AssetKey(checkpoint_key(n).split("/")) for n in range(rounds + 1)] + [prompts],
        group_name="evaluation",
        kinds={"parquet"},
        pool="gpu",
        op_tags=COMPUTE_TAGS,
        description="Greedy and sampled accuracy of every checkpoint on held-out prompts, with a per-round plot.",
        metadata=dvc_meta(["seed", "rounds", "evaluation"], ["rl_assets/evaluation.py"]),
    )
    def evaluation(context: AssetExecutionContext, pipes: PipesSubprocessClient, params: ParamsResource) -> MaterializeResult:
        return run_compute(context, pipes, params, "evaluation")

    return evaluation
