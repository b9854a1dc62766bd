"""Fail once, and say why: errors that would recur are not retried, and a failed run ends with its cause.

- Unit: which exceptions a compute child calls deterministic or transient, and how `run_child` maps what
  a Pipes child did (its error record, its exit code, a signal) onto Dagster's retry decision, with
  tiny `python -c` children in a one-asset job whose RetryPolicy would retry anything it is allowed to.
- End to end (marked e2e): a micro run whose SFT step cannot build the model fails once, exits 1 and
  ends with the asset, the error's own message and the run id; a reward that raises does the same.
"""

import json
import os
import re
import sys

import pytest
import torch
from dagster import (AssetExecutionContext, AssetKey, DagsterEventType, DagsterInstance, Failure, PipesSubprocessClient, RetryPolicy,
                     asset, materialize)

from pipelines.cli import failure_report
from pipelines.launch.pipes_child import DETERMINISTIC_EXIT, TRANSIENT_EXIT, classify, error_line
from pipelines.launch.failures import ComputeStepCrashed, step_failure
from pipelines.launch.steps import run_child
from rl_assets.core.config import ParamsError
from rl_assets.train.train_state import TrainStateMismatch
from conftest import REPO, python


# --- classification --------------------------------------------------------------------------------

def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except BaseException as outer:
        return outer


@pytest.mark.parametrize("error", [
    ValueError("The hidden size (32) is not a multiple of the number of attention heads (5)."),
    KeyError("answer"), TypeError("unsupported operand"), FileNotFoundError("data/r00/checkpoint/lineage.json"),
    ParamsError("params.yaml: train.learning_rate: must be > 0"),
    TrainStateMismatch("saved state was made with learning_rate 0.01, this run uses 0.005"),
    TrainStateMismatch("timed out? no: a mismatch is deterministic whatever its message"),
    RuntimeError("shape '[16, 12, 5, 6]' is invalid for input of size 9216"),
    AssertionError(), Exception("a reward function raised"),
])
def test_errors_that_would_recur_are_deterministic(error):
    assert classify(error) == "deterministic"


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    torch.cuda.OutOfMemoryError("CUDA out of memory"),
    torch.distributed.DistBackendError("NCCL communicator was aborted"),
    torch.distributed.DistStoreError("Timed out after 901 seconds waiting for clients"),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"),
    RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
    MemoryError(), ConnectionResetError("Connection reset by peer"), TimeoutError("read timed out"),
    _raised_from(Exception("the trainer stopped"), torch.OutOfMemoryError("CUDA out of memory")),
])
def test_transient_failures_are_transient(error):
    assert classify(error) == "transient"


def test_error_line_is_one_line_with_the_type():
    error = ValueError("Class validation error for validator 'validate_architecture':\n    ValueError: heads (5).")
    assert error_line(error) == "ValueError: Class validation error for validator 'validate_architecture': ValueError: heads (5)."
    assert error_line(KeyError()) == "KeyError"


def test_step_failure_maps_records_and_exit_codes():
    record = {"kind": "deterministic", "error": "ValueError: bad shape", "rank": 0}
    deterministic = [step_failure("sft", 1, [record]),  # torchrun exits 1 whatever its workers did
                     step_failure("sft", DETERMINISTIC_EXIT, []), step_failure("sft", 2, [])]
    assert all(isinstance(e, Failure) and e.allow_retries is False for e in deterministic)
    assert deterministic[0].description == "ValueError: bad shape"
    # one rank's deterministic error wins over another rank's lost peer
    mixed = step_failure("train", 1, [{"kind": "transient", "error": "RuntimeError: Connection closed by peer", "rank": 0},
                                      {**record, "rank": 1}])
    assert isinstance(mixed, Failure) and mixed.description == "ValueError: bad shape (rank 1)"
    for code, words in ((-9, "SIGKILL"), (137, "SIGKILL"), (-15, "SIGTERM"), (143, "SIGTERM"), (1, "code 1"), (None, "failed")):
        crashed = step_failure("train", code, [])
        assert isinstance(crashed, ComputeStepCrashed) and words in str(crashed), (code, crashed)
    transient = step_failure("train", TRANSIENT_EXIT, [{"kind": "transient", "error": "OutOfMemoryError: CUDA out of memory", "rank": 0}])
    assert isinstance(transient, ComputeStepCrashed) and "CUDA out of memory" in str(transient)


# --- run_child inside Dagster, with a retry policy that retries whatever it may ----------------------

CHILDREN = {
    # the real child's failure path: traceback, `error: ...` line, record, DETERMINISTIC_EXIT
    "raises_value_error": "from pipelines.launch.pipes_child import report_failure; import sys; "
                          "sys.exit(report_failure(ValueError('The hidden size (32) is not a multiple of 5')))",
    "exits_deterministic": f"import sys; sys.exit({DETERMINISTIC_EXIT})",
    "raises_cuda_oom": "import sys, torch; from pipelines.launch.pipes_child import report_failure; "
                       "sys.exit(report_failure(torch.OutOfMemoryError('CUDA out of memory')))",
    "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",  # the OOM killer
    "terminated": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",  # preempted
    "exits_1": "import sys; sys.exit(1)",
}


def _attempts(kind: str, tmp_path, command: list[str] | None = None) -> tuple[int, object]:
    @asset(name=kind, retry_policy=RetryPolicy(max_retries=1, delay=0))
    def step(context: AssetExecutionContext, pipes: PipesSubprocessClient):
        yield from run_child(context, pipes, command or [sys.executable, "-c", CHILDREN[kind]], [kind])

    with DagsterInstance.ephemeral(tempdir=str(tmp_path)) as instance:
        result = materialize([step], instance=instance, resources={"pipes": PipesSubprocessClient(cwd=str(REPO))},
                             raise_on_error=False)
        assert not result.success
        launches = [e for e in instance.all_logs(result.run_id) if e.user_message.startswith("launching:")]
        restarts = instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_RESTARTED)
        assert len(launches) == 1 + len(restarts)  # each attempt launches the child once
        failure = instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_FAILURE)[-1].dagster_event.event_specific_data
        return len(launches), failure


@pytest.mark.parametrize("kind", ["raises_value_error", "exits_deterministic"])
def test_a_deterministic_child_runs_once(kind, tmp_path):
    attempts, failure = _attempts(kind, tmp_path)
    assert attempts == 1
    assert failure.user_failure_data is not None
    if kind == "raises_value_error":  # the child's own line is the failure's description
        assert failure.user_failure_data.description == "ValueError: The hidden size (32) is not a multiple of 5"


TORCHRUN_CHILD = """
import os, sys, time
sys.path.insert(0, os.getcwd())  # the repo (the client's cwd)
from pipelines.launch.pipes_child import report_failure
if os.environ["RANK"] == "1":
    sys.exit(report_failure(ValueError("rank 1 cannot read its shard")))
time.sleep(60)  # rank 0 waits, as in a collective, until torchrun stops it
"""


def test_a_deterministic_error_in_any_rank_under_torchrun_runs_once(tmp_path):
    """torchrun exits 1 whatever its workers did: the verdict comes from the rank's error record."""
    script = tmp_path / "child.py"
    script.write_text(TORCHRUN_CHILD)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    attempts, failure = _attempts("torchrun", tmp_path / "instance", command)
    assert attempts == 1
    assert failure.user_failure_data.description == "ValueError: rank 1 cannot read its shard (rank 1)"


@pytest.mark.parametrize("kind", ["raises_cuda_oom", "killed", "terminated", "exits_1"])
def test_a_transient_or_dead_child_is_retried(kind, tmp_path):
    attempts, failure = _attempts(kind, tmp_path)
    assert attempts == 2
    if kind in ("killed", "terminated"):
        assert ("SIGKILL" if kind == "killed" else "SIGTERM") in failure.error.to_string()


# --- end to end: a micro run ---------------------------------------------------------------------------

def _run_failing(project, *overrides: str):
    args = ["-m", "pipelines", "run", *[a for o in overrides for a in ("--set", o)]]
    return python(args, project, timeout=300, check=False)


# A promoted model whose config has 5 heads on a hidden size of 32: params pass (the up-front shape check
# covers model.tiny, not a saved model), and r00's SFT step fails when it loads the model, every time.
BROKEN_PROMOTED = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_attention_heads": 5,
                   "num_key_value_heads": 5, "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 64}


@pytest.mark.e2e
def test_a_model_shape_error_fails_the_run_once_and_says_why(micro_copy):
    """r00 warm-starts from a promoted model it cannot build: one attempt despite the retry policy, exit 1, the cause last."""
    promoted = micro_copy / "models" / "promoted"
    promoted.mkdir(parents=True)
    (promoted / "model_card.json").write_text("{}")
    (promoted / "config.json").write_text(json.dumps(BROKEN_PROMOTED))
    done = _run_failing(micro_copy, "promotion.warm_start=promoted")
    assert done.returncode == 1, done.stderr[-4000:]
    output = done.stdout + done.stderr
    assert output.count("launching:") == 1, output[-6000:]  # the SFT child ran once: no retry
    assert "STEP_UP_FOR_RETRY" not in output and "up for retry" not in output.lower()
    tail = "\n".join(done.stderr.strip().splitlines()[-8:])
    assert re.search(r"failed: r00/checkpoint: .*not a multiple of the number of attention heads \(5\)", tail), tail
    assert "not written: r01/rollouts, r01/rewards, r01/checkpoint, evaluation" in tail  # the rest of the compute step
    run_id = re.search(r"dagster run ([0-9a-f-]{36})", tail).group(1)
    with DagsterInstance.from_config(str(micro_copy / ".dagster")) as instance:
        assert not instance.all_logs(run_id, of_type=DagsterEventType.STEP_RESTARTED)
        assert len(instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)) == 1
    log = re.search(r"log of r00/checkpoint: (\S+)", tail).group(1)
    assert "not a multiple of the number of attention heads" in (micro_copy / log).read_text()  # the child's own output is kept


def test_the_report_of_a_failed_run_names_the_asset_its_error_and_what_was_skipped(tmp_path):
    """In-process assets have no retry policy: a reward that raises fails once; the report unwraps Dagster's wrapper."""
    @asset(key=["r01", "rewards"])
    def rewards():
        raise RuntimeError("reward 'my_rewards:score' failed: ValueError: cannot parse '7*'")

    @asset(key=["r01", "checkpoint"], deps=[rewards])
    def checkpoint():
        return None

    @asset(deps=[checkpoint])
    def evaluation():
        return None

    with DagsterInstance.ephemeral(tempdir=str(tmp_path)) as instance:
        result = materialize([rewards, checkpoint, evaluation], instance=instance, raise_on_error=False)
        names = {"r01__rewards": "r01/rewards", "r01__checkpoint": "r01/checkpoint", "evaluation": "evaluation"}
        report = failure_report(instance, result.run_id, names)
    assert report[0] == "failed: r01/rewards: RuntimeError: reward 'my_rewards:score' failed: ValueError: cannot parse '7*'"
    assert report[1] == "skipped: 2 assets after the failure (r01/checkpoint, evaluation)"
    assert report[-1].startswith(f"dagster run {result.run_id}: make ui")


def test_the_skipped_count_counts_check_steps_not_a_step_that_writes_several_assets(tmp_path):
    """One skipped step writing three assets is three assets and no check step (it read "-2 check steps"); a check of its
    own is one check step."""
    from dagster import AssetCheckResult, AssetSpec, asset_check, multi_asset

    @asset(key=["r01", "rewards"])
    def rewards():
        raise RuntimeError("reward 'my_rewards:score' failed")

    @multi_asset(specs=[AssetSpec(["r01", "checkpoint"], deps=[rewards]), AssetSpec("evaluation", deps=[["r01", "checkpoint"]]),
                        AssetSpec("promoted_model", deps=["evaluation"])], name="compute")
    def compute():
        return None

    @asset_check(asset=AssetKey(["r01", "checkpoint"]), name="lineage")
    def checkpoint_lineage():
        return AssetCheckResult(passed=True)

    with DagsterInstance.ephemeral(tempdir=str(tmp_path)) as instance:
        result = materialize([rewards, compute], instance=instance, raise_on_error=False)
        names = {"r01__rewards": "r01/rewards", "compute": "r01/checkpoint, evaluation, promoted_model"}
        report = failure_report(instance, result.run_id, names)
        assert report[1] == "skipped: 3 assets after the failure (r01/checkpoint, evaluation, promoted_model)"
        result = materialize([rewards, compute, checkpoint_lineage], instance=instance, raise_on_error=False)
        names["r01__checkpoint_lineage"] = "checks of r01/checkpoint"
        report = failure_report(instance, result.run_id, names)
    assert report[1] == "skipped: 3 assets after the failure (r01/checkpoint, evaluation, promoted_model) and 1 check step"


@pytest.mark.e2e
def test_a_reward_that_raises_fails_the_run_once_and_says_why(micro_copy):
    """The micro project's own reward module raises: r01/rewards fails once (an error that would recur), its message last."""
    module = micro_copy / "micro_rewards.py"
    module.write_text(module.read_text().replace("    return [", "    raise ValueError('digit_share: no digits to count')\n    return [", 1))
    done = _run_failing(micro_copy)
    assert done.returncode == 1, done.stderr[-4000:]
    tail = "\n".join(done.stderr.strip().splitlines()[-8:])
    assert re.search(r"failed: r01/rewards: .*digit_share: no digits to count", tail), tail
    assert "not written: r01/checkpoint, evaluation, promoted_model (same step, after the failure)" in tail, tail  # the rest of the compute step
    assert re.search(r"dagster run [0-9a-f-]{36}: make ui", tail.splitlines()[-1]), tail
    assert (done.stdout + done.stderr).count("Not executing") == 0  # one summary line instead of one line per skipped step


# --- the step process beside its child ----------------------------------------------------------------

YIELDING_STEP = """
import json, os, subprocess, sys, threading
from pipelines.launch.steps import yield_cpu_to_children
waiting = threading.Event()
threading.Thread(target=waiting.wait).start()  # a thread started before, like the Pipes reader
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
yield_cpu_to_children()
late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # launched after: inherits it
threads = [os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")]
print(json.dumps({"threads": threads, "child": os.getpriority(os.PRIO_PROCESS, child.pid), "late": os.getpriority(os.PRIO_PROCESS, late.pid)}))
child.kill(); late.kill(); waiting.set()
"""


def test_the_step_process_yields_the_cpu_to_the_child_it_launched(tmp_path):
    """Every thread of the step process drops to nice 19 after the launch (Linux: /proc/self/task); the child keeps the
    step's own priority."""
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the niceness the step process starts with (this test's)
    done = python(["-c", YIELDING_STEP], REPO, timeout=60)
    priorities = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(priorities["threads"]) >= 2 and set(priorities["threads"]) == {19}
    assert priorities["child"] == base
    assert priorities["late"] == 19  # why run_child lowers it only after the step's last launch


def test_a_step_run_in_the_callers_process_leaves_its_priority_alone(tmp_path):
    """`materialize` runs the step in this process: lowering it would slow whatever the caller does next."""
    @asset(name="last_child")
    def step(context: AssetExecutionContext, pipes: PipesSubprocessClient):
        yield from run_child(context, pipes, [sys.executable, "-c", "pass"], ["last_child"], last=True)

    before = os.getpriority(os.PRIO_PROCESS, 0)
    with DagsterInstance.ephemeral(tempdir=str(tmp_path)) as instance:
        materialize([step], instance=instance, resources={"pipes": PipesSubprocessClient(cwd=str(REPO))}, raise_on_error=False)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def test_a_child_sees_the_variables_its_step_gives_it(tmp_path):
    """A lane's GPUs reach its child as CUDA_VISIBLE_DEVICES (pipelines.definitions.compute.Lane), and the launch line says so."""
    seen = tmp_path / "seen"
    write = f"import os, pathlib; pathlib.Path({str(seen)!r}).write_text(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"

    @asset(name="lane_child")
    def step(context: AssetExecutionContext, pipes: PipesSubprocessClient):
        yield from run_child(context, pipes, [sys.executable, "-c", write], ["lane_child"], env={"CUDA_VISIBLE_DEVICES": "1"})

    with DagsterInstance.ephemeral(tempdir=str(tmp_path)) as instance:
        result = materialize([step], instance=instance, resources={"pipes": PipesSubprocessClient(cwd=str(REPO))}, raise_on_error=False)
        launches = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message.startswith("launching:")]
    assert seen.read_text() == "1"
    assert launches and launches[0].startswith("launching: CUDA_VISIBLE_DEVICES=1 ")
