"""Where each asset lives: <data>/<asset key>, a `.parquet` file for tables, a folder for models (checkpoints, reward_model).

`<data>` is the experiment's data folder (`data_dir`): data/ for the default experiment (the project's params.yaml,
the one DVC tracks), data/experiments/<experiment>/ for any other, so one experiment's run never overwrites another's.
The asset key, the data path and the DVC stage name are the same words (`r01/rollouts`,
`data/r01/rollouts.parquet`, stage `r01-rollouts`), so one name finds a stage everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

from rl_assets.core.stage_table import STAGE_TABLE

DATA = Path("data")


def round_prefix(round_number: int) -> str:
    return f"r{round_number:02d}"


def checkpoint_key(round_number: int) -> str:
    return f"{round_prefix(round_number)}/checkpoint"


def data_dir(experiment: str, root: Path = Path(".")) -> Path:
    """The folder that holds an experiment's outputs and run state.

    >>> data_dir("default"), data_dir("examples-gsm8k-params", Path("/p"))
    (PosixPath('data'), PosixPath('/p/data/experiments/examples-gsm8k-params'))
    """
    return root / DATA if experiment == "default" else root / DATA / "experiments" / experiment


def data_dir_of(checkpoint: Path) -> Path | None:
    """The data folder a round's checkpoint lies in, None for any other folder (e.g. a promoted model).

    >>> data_dir_of(Path("data/experiments/x/r02/checkpoint")), data_dir_of(Path("models/promoted"))
    (PosixPath('data/experiments/x'), None)
    """
    return checkpoint.parent.parent if re.fullmatch(r"r\d\d", checkpoint.parent.name) else None


IMAGES = "images"  # <data>/images/<sha256>.<ext>: the prompts' images, raw_data's second output when a source has an image column


def output_path(key: str, data: Path) -> Path:
    """The file or folder an asset key writes in the data folder `data` (`data_dir`).

    >>> output_path("r01/rollouts", DATA), output_path("r01/checkpoint", Path("data/experiments/x")), output_path("r02/critic", DATA)
    (PosixPath('data/r01/rollouts.parquet'), PosixPath('data/experiments/x/r01/checkpoint'), PosixPath('data/r02/critic'))
    """
    return data / key if STAGE_TABLE[writer_of(key)[0]].kind == "model" else data / f"{key}.parquet"


WRITERS = {key: name for name, stage in STAGE_TABLE.items() for key in stage.outputs}  # output key (rNN/... in rounds) -> stage


def writer_of(key: str) -> tuple[str, int | None]:
    """(stage, round) that writes output `key`, round None outside the rounds 1..R.

    >>> writer_of("r00/checkpoint"), writer_of("r03/checkpoint"), writer_of("prompts")
    (('sft', None), ('train', 3), ('prompts', None))
    """
    if key in WRITERS:
        return WRITERS[key], None
    found = re.fullmatch(r"r(\d\d)/(\w+)", key)
    if found and found.group(1) != "00" and (stage := WRITERS.get(f"rNN/{found.group(2)}")):
        return stage, int(found.group(1))
    raise ValueError(f"no stage writes {key!r}; outputs: {sorted(WRITERS)}")


def asset_key_path(key: str, experiment: str) -> list[str]:
    """The Dagster asset key (as its path) of output `key` in `experiment`: the output key for the default experiment,
    under experiments/<experiment>/ for others, so each experiment has its own materializations, staleness and checks.

    >>> asset_key_path("r01/rollouts", "default"), asset_key_path("r01/rollouts", "x")
    (['r01', 'rollouts'], ['experiments', 'x', 'r01', 'rollouts'])
    """
    return [*([] if experiment == "default" else ["experiments", experiment]), *key.split("/")]


def output_key(asset_key_path: list[str] | tuple[str, ...]) -> str:
    """The output key of a Dagster asset key path, whatever its experiment.

    >>> output_key(["experiments", "x", "r01", "rollouts"]), output_key(["evaluation"])
    ('r01/rollouts', 'evaluation')
    """
    parts = list(asset_key_path)
    return "/".join(parts[2:] if parts[:1] == ["experiments"] and len(parts) > 2 else parts)


def dvc_stage_name(key: str) -> str:
    """DVC stage names may not contain '/', so 'r01/rollouts' becomes 'r01-rollouts'."""
    return key.replace("/", "-")


# Inside the data folder: the evaluation's metrics and plot (DVC metrics and plots for the default experiment).
EVALUATION_METRICS = "evaluation.json"
EVALUATION_PLOT = "evaluation.png"


def train_state_dir(round_number: int, data: Path, stage: str = "train") -> Path:
    """Intermediate training states of a round's `stage` (train, critic; not an asset output: DVC and Dagster never see it)."""
    return data / round_prefix(round_number) / ("train_state" if stage == "train" else f"{stage}_state")


# Each round's output names and the stage writing each (rl_assets.core.stage_table), in the table's flow order.
ROUND_OUTPUTS = {key.removeprefix("rNN/"): name for name, stage in STAGE_TABLE.items() for key in stage.outputs if key.startswith("rNN/")}


def stage_of(key: str) -> tuple[str, int | None]:
    """(stage, round) that writes output `key`.

    >>> stage_of("r03/checkpoint"), stage_of("r00/checkpoint"), stage_of("evaluation")
    (('train', 3), ('sft', None), ('evaluation', None))
    """
    try:
        stage, round_number = writer_of(key)
    except ValueError:
        stage = None
    if stage is None or not STAGE_TABLE[stage].compute:
        outside = sorted(k for k, name in WRITERS.items() if STAGE_TABLE[name].compute and not k.startswith("rNN/"))
        raise ValueError(f"no compute stage writes {key!r}; outputs: {outside} and rNN/{{{','.join(ROUND_OUTPUTS)}}}")
    return stage, round_number


def flow_order(keys: list[str]) -> list[str]:
    """`keys` in the order the flow writes them: round by round, each round in the stage table's order; the stages the table
    lists before the rounds' first before round 1, those after them last (rl_assets.core.graph.unroll's order).

    >>> flow_order(["r02/rollouts", "evaluation", "r01/checkpoint", "r01/rewards"])
    ['r01/rewards', 'r01/checkpoint', 'r02/rollouts', 'evaluation']
    """
    stages = list(STAGE_TABLE)
    first_round_stage = min(stages.index(stage) for stage in ROUND_OUTPUTS.values())

    def position(key: str) -> tuple:
        stage, n = stage_of(key)
        place = stages.index(stage)
        return (n if n is not None else 0 if place < first_round_stage else float("inf"), place)

    return sorted(dict.fromkeys(keys), key=position)
