"""Resident rounds: one process writes a run's outputs in flow order, with the models kept loaded from one to the next.

Round after round the policy, its optimizer moments and the KL reference stay in memory
(`rl_assets.run.loaded`), and on a GPU one vLLM engine is reused, its weights updated in place
(`rl_assets.rollout.vllm_sampling.VllmEngine`). Each output is still a step of its own as far as anyone can tell:
it is written atomically, reported the moment it is done, and its guards run on it before the next
output starts, so a blocking guard that fails stops the run there and nothing after it is written.
Writing the same outputs one process each gives the same bits (every stage seeds itself, and only
what equals a fresh load is kept): tested on checkpoint ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rl_assets.core.config import Params
from rl_assets.run.loaded import Loaded
from rl_assets.eval.output_guards import GuardFailed, GuardResult, evaluate_guards, stop_if_blocked
from rl_assets.core.paths import data_dir, flow_order, output_path, stage_of
from rl_assets.run.stages import run_stage

WRITING = "while writing "
WRITING_PATH = "output path: "


@dataclass
class Output:
    key: str
    metadata: dict
    path: Path
    guards: list[GuardResult] = field(default_factory=list)


def write_outputs(keys: list[str], params: Params, root: Path = Path("."), loaded: Loaded | None = None,
                  guard: bool = True) -> Iterator[Output]:
    """Write each output of `keys` in flow order in this process, yielding it with its guards' verdicts as soon as it is done.

    A blocking guard that fails raises `GuardFailed` after its output is yielded (reported), before the next one starts.
    Under torchrun only rank 0 evaluates guards; the other ranks' outputs carry none.
    """
    import torch.distributed as dist

    loaded = loaded or Loaded()
    for key in flow_order(keys):
        stage, round_number = stage_of(key)
        before = sum(loaded.loads.values())
        try:
            metadata, path = run_stage(stage, params, round_number, root, loaded)
        except Exception as error:
            error.add_note(f"{WRITING}{key}")  # which output failed, for the error report (pipes_child.report_failure)
            error.add_note(f"{WRITING_PATH}{output_path(key, data_dir(params.experiment, root))}")
            raise
        if stage in ("rollouts", "train", "critic"):  # 0 once the run is under way: what residency saves, on the output itself
            metadata = {**metadata, "models_loaded_from_disk": sum(loaded.loads.values()) - before}
        results = evaluate_guards(key, params) if guard and (not dist.is_initialized() or dist.get_rank() == 0) else []
        yield Output(key, metadata, path, results)
        try:
            stop_if_blocked(key, results)
        except GuardFailed as error:
            error.add_note(f"{WRITING}{key}")
            raise
