"""The rl-assets code location: the asset graph in flow order (each asset with its guards), the job, its triggers, executor and resources.

Built when Dagster loads it (`defs`, a `@dagster.definitions` function), not at import: the params are read
then, once, and passed to every factory. Loads without importing torch, transformers or trl (each UI
reload and schedule tick loads it).
"""

import logging

from dagster import (AssetSelection, Definitions, PipesSubprocessClient, colored_console_logger, define_asset_job, definitions, logger,
                     multiprocess_executor)

from pipelines.definitions.assets import data_assets
from pipelines.definitions.compute import compute_assets
from pipelines.launch.params import load_project_params, project_params
from pipelines.definitions.reward_model import reward_model_asset
from pipelines.definitions.schedules import raw_data_sensor, retrain_schedule
from rl_assets.core.config import Params

# Runs that write the project's data queue behind each other (dagster.yaml limits this tag to one at a time).
rl_pipeline = define_asset_job("rl_pipeline", selection=AssetSelection.all(), tags={"rl_assets/writes": "data"},
                               description="raw data to evaluated checkpoints, every round, then promotion.")


_built: tuple = (None, None)  # (params, their Definitions): the last build in this process


@definitions
def defs() -> Definitions:
    """The project's code location for its params ($RL_ASSETS_PARAMS, $RL_ASSETS_SET: `pipelines.launch.params.project_params`).

    Built again only when those params change: `load_project_params` gives the same object while the file, the
    overrides and the environment are the same (the CLI asks several times in a run).
    """
    global _built
    params = load_project_params()
    if _built[0] is not params:
        _built = (params, build_definitions(params))
    return _built[1]


def build_definitions(params: Params) -> Definitions:
    assets = [*data_assets(params), *compute_assets(params)]  # every model step: one resident op, or one per round and lane (compute.py)
    if (reward_model := reward_model_asset(params)) is not None:  # only when params configure one
        assets.append(reward_model)
    if params.owners:  # who to ask about an asset, shown on every asset in the UI
        assets = [a.map_asset_specs(lambda spec: spec.replace_attributes(owners=params.owners)) for a in assets]
    return Definitions(
        assets=assets,
        jobs=[rl_pipeline],
        schedules=[retrain_schedule(params)],
        sensors=[raw_data_sensor(params)],
        executor=executor(params),
        resources={"pipes": PipesSubprocessClient(), "params": project_params()},
        loggers={"brief_console": brief_console},
    )


def executor(params):
    """Local processes, or one Kubernetes pod per step whose GPU requests come from the op tags (extra `[k8s]`)."""
    if params.compute.executor == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    # Each step is a process; a forkserver that has already imported the code location starts them without
    # importing it again in each.
    return multiprocess_executor.configured({"start_method": {"forkserver": {"preload_modules": STEP_PRELOAD}}})


STEP_PRELOAD = ["pipelines.definitions.code_location"]


def start_step_server(params) -> None:
    """Start the forkserver that the multiprocess executor forks steps from, now, so that it imports the code location
    while Dagster creates the run, not after. The executor finds it running and uses it (a running forkserver
    keeps the modules it was started with; the code location imports the executor's own)."""
    if params.compute.executor == "k8s":
        return
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(STEP_PRELOAD)
    forkserver.ensure_running()


def without_stack_trace(record: logging.LogRecord) -> bool:
    """Cut Dagster's "Stack Trace:" from a console line. It shows where the orchestration code raised the step's Failure,
    once for the step and again for the run, after the child's own traceback, the one that says what broke."""
    message = record.getMessage()
    if "\nStack Trace:" in message:
        record.msg, record.args = message.split("\nStack Trace:", 1)[0].rstrip() + "\n(its stack trace: make ui, the run's logs)", ()
    return True


@logger(colored_console_logger.config_schema, description="Dagster's console logger without the stack traces of failures "
        "(the event log and the UI keep them); what `rl-assets run` prints")
def brief_console(init_context):
    console = colored_console_logger.logger_fn(init_context)
    console.addFilter(without_stack_trace)
    return console
