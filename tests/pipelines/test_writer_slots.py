"""A run that ended (failed, canceled) while still holding a pool slot no longer blocks the next run (issue 25, problem 2)."""

from __future__ import annotations

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from pipelines.records.writer import exclusive_writer


def test_the_next_writer_frees_the_slots_of_runs_that_ended(tmp_path):
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots("gpu", 1)
        ended = instance.add_run(DagsterRun(job_name="rl_pipeline", run_id="ended-run", status=DagsterRunStatus.FAILURE))
        live = instance.add_run(DagsterRun(job_name="rl_pipeline", run_id="live-run", status=DagsterRunStatus.STARTED,
                                           tags={"rl_assets/writes": "none"}))
        assert storage.claim_concurrency_slot("gpu", ended.run_id, "compute").is_claimed
        assert not storage.claim_concurrency_slot("gpu", live.run_id, "compute").is_claimed  # waits behind the ended run
        said = []
        with exclusive_writer(instance, "run", log=said.append):
            pass
        assert said == ["run ended-run (FAILURE) still held a slot of the gpu pool: freed it"]
        info = storage.get_concurrency_info("gpu")
        assert {slot.run_id for slot in info.claimed_slots} <= {"live-run"}  # the live run's pending step may take it now
        assert "ended-run" not in {step.run_id for step in info.pending_steps}
