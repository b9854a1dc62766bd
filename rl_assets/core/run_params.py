"""Params sections of where and how a run executes: compute (processes, devices, Slurm), storage, tracking, the
retraining schedule and promotion. The stages' own sections are in config.py, which gathers both into `Params`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_assets.core.sections import Section


class SlurmParams(Section):
    partition: str = Field("", description="Partition of the compute step's job (sbatch --partition); empty: the cluster's default.")
    time_limit: str = Field("", description="The job's time limit in Slurm's format (sbatch --time, e.g. 04:00:00); empty: the partition's.")
    cpus_per_task: int = Field(0, ge=0, description="CPUs per task (sbatch --cpus-per-task); 0: not asked for.")
    mem: str = Field("", description="Memory per node (sbatch --mem, e.g. 64G); empty: not asked for.")
    requeue: bool = Field(True, description="Let Slurm requeue the job (preemption, a failed node): the requeued job continues after "
                                            "the outputs the first attempt reported.")
    sbatch_args: list[str] = Field(default_factory=list, description="More sbatch options, as given on its command line "
                                                                      "(e.g. [--account=ml, --qos=high]).")
    shared_dir: str = Field(".rl_assets/slurm", description="Where a step's job script, its log, its Pipes messages and its resolved "
                                                            "params are written: a folder of the project, which every node must "
                                                            "see at the same path (as it sees data/).")
    poll_seconds: float = Field(0.5, gt=0, description="How often the step asks Slurm for its job's state (scontrol show job).")
    heartbeat_seconds: float = Field(10.0, gt=0, description="How often the step tells its job it still runs (a file in shared_dir): "
                                                             "a job whose step process was killed cancels itself after a few missed beats "
                                                             "(pipelines/launch/slurm_job.py's MISSED_BEATS).")


class ComputeParams(Section):
    nproc: int = Field(1, ge=1, le=1024, description="Processes per compute step; torchrun is used when > 1.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where compute steps run; auto picks cuda when present.")
    gpus_per_step: int = Field(0, ge=0, description="GPUs a compute step asks the executor for (op tags and k8s requests).")
    nnodes: int = Field(1, ge=1, description="Machines per training step; > 1 uses torchrun's c10d rendezvous at rdzv_endpoint.")
    rdzv_endpoint: str = Field("", description="host:port of the rendezvous for multi-node training (e.g. a k8s headless service).")
    accelerate_config: str = Field("", description="An Accelerate config file (DeepSpeed, FSDP, ...): steps then launch with `accelerate launch`.")
    sharding: Literal["none", "fsdp"] = Field("none", description="fsdp: the training step shards the policy's weights, gradients and "
                                              "AdamW moments over its processes with torch's FSDP2 (each decoder layer, then the rest; "
                                              "CPU and GPU); none: each process holds all of them (DDP). Needs several processes.")
    gpu_memory_fraction: float = Field(1.0, gt=0, le=1, description="Cap on the share of each GPU's memory a step may allocate.")
    executor: Literal["multiprocess", "k8s", "slurm"] = Field("multiprocess", description="Where steps run: local processes, one pod per "
                                                                "step (dagster-k8s), or each compute step as a Slurm job (sbatch).")
    slurm: SlurmParams = Field(default_factory=SlurmParams, description="The compute steps' Slurm jobs, with executor: slurm.")
    resident: bool = Field(True, description="One child process writes all the round outputs a run asks for, models kept loaded; false: one "
                                             "process per output (always so when nproc, nnodes or accelerate_config ask for several processes).")
    overlap: bool | Literal["auto"] = Field("auto", description="With rollouts.staleness >= 1, run a round's training beside a later "
                                            "round's sampling (one op per round and lane). auto: where steps get devices of their own or a "
                                            "GPU (device cuda, a GPU on this machine, or the k8s or slurm executor); not on a CPU alone, "
                                            "where the two lanes slow each other more than they gain (docs/training.md).")
    peak_tflops: float | None = Field(None, gt=0, description="The device's dense bf16 peak in TFLOP/s, for training's MFU; absent: known "
                                       "GPUs' by name (H100, H200, A100, L4, ...), none on a CPU (set it to your CPU's to see one).")
    return_freed_memory: bool = Field(False, description="Give each freed tensor of 128 KiB or more back to the system at once (glibc's "
                                      "mmap threshold, fixed): a lower peak memory for slower steps (measured in docs/benchmarks.md).")

    @model_validator(mode="after")
    def _check_nodes(self):
        if self.nnodes > 1 and not self.rdzv_endpoint and self.executor != "slurm":  # under Slurm: the job's first node
            raise ValueError("nnodes > 1 needs rdzv_endpoint (host:port every node can reach)")
        if self.sharding == "fsdp" and self.nproc * self.nnodes == 1:
            raise ValueError("sharding fsdp needs several processes to shard over (nproc or nnodes > 1)")
        if self.sharding == "fsdp" and self.accelerate_config:
            raise ValueError("sharding fsdp and an accelerate_config both say how to distribute training: keep one")
        return self


class ScheduleParams(Section):
    cron: str = Field("0 3 * * 1", min_length=1, description="When the retraining schedule launches rl_pipeline (cron, UTC).")
    enabled: bool = Field(False, description="Start the schedule switched on; otherwise switch it on in the UI.")
    watch_raw_data: bool = Field(False, description="Start the sensor that retrains when the raw data files change switched on.")


class PromotionParams(Section):
    warm_start: Literal["base", "promoted"] = Field("base", description="r00 is the base model (+ SFT), or the promoted model when there is one.")
    min_improvement: float = Field(0.0, ge=0, description="Sampled accuracy a candidate must gain over the promoted model to replace it.")
    directory: str = Field("models", min_length=1, description="Where promoted/ (the current model), versions/ and history.jsonl live. "
                                                             "Absent: models/ for the default experiment, models/experiments/<experiment>/ for others.")


class StorageParams(Section):
    remote: str = Field("", description="Where every output, run state and promoted model is pushed: an S3 or GCS URL (s3://bucket/path) or "
                                        "a directory. Set as DVC remote `storage` in .dvc/config.local. Empty: DVC's default remote when "
                                        "the project has one (`dvc remote add -d`), else nothing is pushed.")
    endpoint_url: str = Field("", description="An S3-compatible server's URL (MinIO, Ceph, a local S3); empty: AWS's, or $AWS_ENDPOINT_URL.")
    push: Literal["output", "round", "run", "manual"] = Field(
        "output", description="When a run pushes, in the background of the next step: after each output, after each round's checkpoint, "
                              "or at the run's end only; output and round also push training states saved mid-round (train.save_steps) as "
                              "they are saved, and every mode but manual pushes at the run's end. manual: `rl-assets push` only.")
    keep_rounds: int = Field(0, ge=0, description="After each run, retire the round checkpoints other than the last N, the promoted ones "
                                                  "and the best by held-out accuracy (`rl-assets retire --keep N`); 0 keeps every one.")
    retire_from_remote: bool = Field(False, description="Retiring also deletes a checkpoint's files from the remote (its card stays).")


class TrackingParams(Section):
    backends: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["tensorboard"], description="Experiment trackers each pipeline run logs to: per-round metrics (round as "
                                                             "the step), the params and the lineage ids (rl_assets/eval/trackers.py).")
    mlflow_tracking_uri: str = Field("", description="MLflow tracking URI; empty: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db (a local store).")
    mlflow_experiment: str = Field("", description="MLflow experiment name; empty: rl-assets/<experiment>.")
    wandb_project: str = Field("rl-assets", min_length=1, description="Weights & Biases project.")
    wandb_mode: Literal["", "online", "offline"] = Field("", description="W&B mode; empty: $WANDB_MODE, else online.")
