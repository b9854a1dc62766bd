"""raw_data -> prompts: the stages that need no model, each in its own step in the Dagster process.

Each body loads its inputs, calls one rl_assets function, and reports metadata. The `rl_assets/*`
metadata tell `dvc-sync` which params sections, code and raw inputs each stage depends on. Every
definition comes from a factory given the params (pipelines.definitions.code_location builds them when Dagster
loads the code location): nothing here reads params at import.
"""

from collections import Counter
from typing import Iterator

from dagster import AssetExecutionContext, AssetsDefinition, MaterializeResult, MetadataValue, asset

from pipelines.launch.checks import guard_specs
from pipelines.definitions.tracking import stage_tracking
from pipelines.launch.params import ParamsResource, asset_key
from pipelines.launch.steps import materialized
from rl_assets.core.config import Params
from rl_assets.core.graph import unroll
from rl_assets.core.paths import DATA, IMAGES, data_dir, output_path


def raw_inputs(params: Params) -> list[str]:
    """Every file or folder the sources read (data files, dataset folders, generator modules): DVC deps."""
    from rl_assets.data.raw_data import source_inputs

    return source_inputs(params.raw_data)


def has_images(params: Params) -> bool:
    """Whether a raw_data source maps an image column: then raw_data writes <data>/images too."""
    return any(source.columns.image for source in params.raw_data.sources)


def data_assets(params: Params) -> list[AssetsDefinition]:
    """raw_data and prompts, each written in its own step by the Dagster process (no model, no compute child)."""
    inputs = {output.key: output.inputs for output in unroll(params)}

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
        deps=[asset_key(key) for key in inputs["prompts"]],
        group_name="data",
        kinds={"parquet"},
        description="Deduplicated prompts with a stable hash-based sft/rl/eval split and a token-length filter.",
        **stage_tracking("prompts", params),
        check_specs=guard_specs(asset_key("prompts")),
    )
    def prompts(context: AssetExecutionContext, params: ParamsResource) -> Iterator[MaterializeResult]:
        from rl_assets.core.schemas import PROMPTS, read_table, write_table
        from rl_assets.core.tokenizer import load_tokenizer, tokens_per_image
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
