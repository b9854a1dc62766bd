#!/usr/bin/env bash
# GPU check: a ~200M-parameter Llama built locally from a config (no download) through one RL round
# (SFT warm start of a few steps, rollouts, rewards, GRPO training in bf16), in a temp copy of the
# project; prints rollout and training tokens/s and the model-FLOPs utilisation (MFU). Under 8 minutes.
#
#   bash bench/gpu_check.sh                          # DEVICE=cuda SHAPE=medium (hidden 1024, 12 layers: ~201M)
#   DEVICE=cpu SHAPE=small bash bench/gpu_check.sh   # CPU dry run of this script (a ~0.3M model, seconds)
#   SHAPE=gsm8k bash bench/gpu_check.sh              # the GSM8K example's shape: Qwen2.5-0.5B's architecture (151,936-token
#                                                    # vocabulary, GQA) from a config, chat prompts, 256-token completions
#
# Settings (environment): DEVICE cuda|cpu, SHAPE small|medium|"hidden,layers,heads,intermediate",
# PEAK_TFLOPS (dense bf16 peak of the device; otherwise looked up from nvidia-smi's GPU name),
# ENGINE transformers|auto|vllm (rollout sampler; auto picks vLLM when installed), DECODE eager|compiled (rollouts.decode and
# evaluation.decode: the transformers sampler's step as written, or compiled with CUDA graphs; compiling is inside the timing), LIMIT_S (470),
# PYTHON (default .venv/bin/python, else a python3 that already has torch/transformers/trl), KEEP=1
# keeps the work folder, LOG_DIR=dir gets each step's log (on a lent machine: LOG_DIR=$OUT), PROFILE=1 runs the sft and
# train steps under cProfile and puts their 40 costliest calls (cumulative) in LOG_DIR/NAME.prof.txt. MFU = 6 * n_params * training tokens/s / peak, tokens counted as the
# non-padding prompt+completion tokens the training forward/backward passes process; rollouts are
# given 4 * n_params FLOPs per prompt+completion token (sampling, then the log-prob pass).
set -euo pipefail

LIMIT_S=${LIMIT_S:-470}
if [ -z "${GPU_CHECK_INNER:-}" ]; then  # a hard stop for the whole script; each step also gets what is left
  GPU_CHECK_INNER=1 exec timeout --kill-after=10 "$((LIMIT_S + 15))" bash "$0" "$@"
fi
DEADLINE=$((SECONDS + LIMIT_S))
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-medium}
ENGINE=${ENGINE:-transformers}
DECODE=${DECODE:-eager}

case "$SHAPE" in
  gsm8k)  HIDDEN=896;  LAYERS=24; HEADS=14; INTER=4864 ;;  # Qwen2.5-0.5B-Instruct's shape; DEVICE=cpu shrinks it below
  small)  HIDDEN=128;  LAYERS=2;  HEADS=4;  INTER=256 ;;
  medium) HIDDEN=1024; LAYERS=12; HEADS=16; INTER=4096 ;;
  *,*,*,*) IFS=, read -r HIDDEN LAYERS HEADS INTER <<<"$SHAPE" ;;
  *) echo "SHAPE must be small, medium or hidden,layers,heads,intermediate" >&2; exit 2 ;;
esac
if [ "$SHAPE" = gsm8k ]; then   # examples/gsm8k's round shape: B=64 x G=8, up to 256 new tokens, micro-batches of 16
  B=64; G=8; NEW=256; GEN_BATCH=512; MINIBATCH=128; SFT_STEPS=1; SFT_BATCH=1; MIXED=${MIXED:-bf16}
  [ "$DEVICE" = cuda ] || { HIDDEN=64; LAYERS=2; HEADS=4; INTER=128; B=4; G=2; NEW=32; GEN_BATCH=8; MINIBATCH=8; MIXED=no; }
elif [ "$DEVICE" = cuda ]; then   # the round: B=512 prompts x G=8, up to 128 new tokens, 2 epochs of 256-completion minibatches
  B=512; G=8; NEW=128; GEN_BATCH=1024; MINIBATCH=256; SFT_STEPS=${SFT_STEPS:-20}; SFT_BATCH=64; MIXED=${MIXED:-bf16}
else                            # the dry run: same steps, a few seconds of work
  B=16; G=4; NEW=16; GEN_BATCH=64; MINIBATCH=32; SFT_STEPS=${SFT_STEPS:-3}; SFT_BATCH=16; MIXED=${MIXED:-no}
fi

# Python: the project's .venv, else a python3 that has the libraries, else create .venv on top of the system packages.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python
elif python3 -c "import torch, transformers, trl, accelerate, datasets, pyarrow, pydantic, yaml" 2>/dev/null; then PY=$(command -v python3)
else
  echo "no .venv and no python3 with the libraries: creating .venv (system packages visible, so a preinstalled CUDA torch is kept)"
  python3 -m venv --system-site-packages "$REPO/.venv"
  "$REPO/.venv/bin/pip" install --quiet -e "$REPO" || { rm -rf "$REPO/.venv"; echo "pip install failed (offline?): set PYTHON" >&2; exit 1; }
  PY=$REPO/.venv/bin/python
fi
"$PY" -c "
import torch, transformers, trl
assert '$DEVICE' != 'cuda' or torch.cuda.is_available(), f'DEVICE=cuda but torch {torch.__version__} in $PY sees no GPU (a CPU build?); set PYTHON to a CUDA one'
print(f'python $PY: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}')"

PEAK=${PEAK_TFLOPS:-}
GPU_NAME=cpu
if [ "$DEVICE" = cuda ]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  if [ -z "$PEAK" ]; then  # the dense bf16 peak the pipeline's own MFU uses (rl_assets/run/hardware.py)
    PEAK=$(cd "$REPO" && "$PY" -c "from rl_assets.run.hardware import peak_flops; p = peak_flops('cuda'); print(p / 1e12 if p else '')")
    [ -n "$PEAK" ] || echo "unknown GPU '$GPU_NAME': set PEAK_TFLOPS for an MFU figure" >&2
  fi
fi

WORK=$(mktemp -d /tmp/rl-assets-gpu-check-XXXXXX)
[ -n "${KEEP:-}" ] && echo "work folder: $WORK" || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/data"
cp -r "$REPO/rl_assets" "$WORK/"
cp -r "$REPO/data/raw" "$WORK/data/"
mkdir -p "$WORK/tests" && cp "$REPO/tests/real_models.py" "$WORK/tests/"  # the BPE tokenizer builder; trains on $WORK/data/raw
cd "$WORK"
export PYTHONPATH=$WORK:$WORK/tests${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

if [ "$SHAPE" = gsm8k ]; then
"$PY" - "$HIDDEN" "$LAYERS" "$HEADS" "$INTER" <<'PY'
import sys
import torch
from transformers import AutoModelForCausalLM, Qwen2Config
from real_models import build_bpe_tokenizer, end_token_ids
hidden, layers, heads, inter = map(int, sys.argv[1:])
tokenizer = build_bpe_tokenizer("qwen2")  # byte-level BPE with Qwen2.5's special tokens and chat template, trained locally
config = Qwen2Config(vocab_size=151936, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                     intermediate_size=inter, tie_word_embeddings=True, max_position_embeddings=2048,
                     eos_token_id=end_token_ids(tokenizer, "qwen2"), pad_token_id=tokenizer.pad_token_id)
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config).save_pretrained("base")
tokenizer.save_pretrained("base")
PY
ACCUM=$((MINIBATCH / 16 > 0 ? MINIBATCH / 16 : 1))
cat > params.yaml <<EOF
seed: 0
rounds: 1
compute: {nproc: 1, device: "$DEVICE", gpus_per_step: 0, peak_tflops: ${PEAK:-null}}
model: {name_or_path: base}
raw_data:
  sources:
    - {kind: generator, path: data/raw/math_problems.json, count: 2000}
prompts:
  eval_fraction: 0.1
  sft_fraction: 0.0
  max_prompt_tokens: 512
  template: "{prompt}\nLet's think step by step and output the final answer after \"####\"."
  chat_template: true
sft: {enabled: false}
rollouts: {prompts_per_round: $B, samples_per_prompt: $G, temperature: 1.0, top_p: 1.0, max_new_tokens: $NEW, batch_size: $GEN_BATCH, logprob_batch_size: 16, engine: "$ENGINE", decode: "$DECODE"}
rewards:
  functions:
    - {name: math_answer, weight: 1.0}
    - {name: format_regex, weight: 0.1, options: {pattern: '.*####\s*-?[\d,]*\.?\d+'}}
train: {algorithm: grpo, learning_rate: 1.0e-6, epochs: 1, minibatch_size: $MINIBATCH, gradient_accumulation_steps: $ACCUM, gradient_checkpointing: false, beta: 0.0, mixed_precision: "$MIXED"}
evaluation: {max_prompts: 32, samples_per_prompt: 2, temperature: 1.0, max_new_tokens: $NEW, correctness: math_answer, decode: "$DECODE"}
EOF
else
cat > params.yaml <<EOF
seed: 0
rounds: 1
compute: {nproc: 1, device: "$DEVICE", gpus_per_step: 0, peak_tflops: ${PEAK:-null}}
model:
  name_or_path: tiny
  tiny: {hidden_size: $HIDDEN, num_layers: $LAYERS, num_heads: $HEADS, intermediate_size: $INTER}
raw_data:
  sources:
    - {kind: generator, path: data/raw/math_problems.json, count: 6000}
prompts: {eval_fraction: 0.1, sft_fraction: 0.5, max_prompt_tokens: 24, template: "{prompt}"}
sft: {enabled: true, learning_rate: 1.0e-4, max_steps: $SFT_STEPS, batch_size: $SFT_BATCH}
rollouts: {prompts_per_round: $B, samples_per_prompt: $G, temperature: 1.0, top_p: 1.0, max_new_tokens: $NEW, batch_size: $GEN_BATCH, engine: "$ENGINE", decode: "$DECODE"}
rewards:
  functions:
    - {name: arithmetic_answer, weight: 1.0}
train: {algorithm: grpo, learning_rate: 1.0e-5, epochs: 2, minibatch_size: $MINIBATCH, epsilon: 0.2, beta: 0.0, max_grad_norm: 1.0, mixed_precision: "$MIXED"}
evaluation: {max_prompts: 64, samples_per_prompt: 4, temperature: 1.0, max_new_tokens: 8, decode: "$DECODE"}
EOF
fi

step() {  # step NAME COMMAND...: runs with the time that is left, log in $WORK/NAME.log
  local name=$1 left=$((DEADLINE - SECONDS)) started=$SECONDS
  shift
  if [ "$left" -le 5 ]; then echo "out of time before $name (LIMIT_S=$LIMIT_S)" >&2; exit 124; fi
  local ok=1
  timeout "$left" "$@" >"$WORK/$name.log" 2>&1 || ok=0
  if [ -n "${LOG_DIR:-}" ]; then
    mkdir -p "$LOG_DIR" && cp "$WORK/$name.log" "$LOG_DIR/$name.log"
    [ -f "$WORK/$name.prof" ] && "$PY" -c "import pstats, sys; pstats.Stats(sys.argv[1], stream=sys.stdout).sort_stats('cumulative').print_stats(40)" \
      "$WORK/$name.prof" >"$LOG_DIR/$name.prof.txt" 2>&1
  fi
  if [ "$ok" = 0 ]; then
    echo "step $name failed or ran out of time (limit ${left}s); last lines:" >&2
    tail -25 "$WORK/$name.log" >&2
    exit 1
  fi
  echo "$name: $((SECONDS - started)) s"
  echo "$name $((SECONDS - started))" >>"$WORK/step_seconds.txt"
}
profiled() {  # profiled NAME: python's arguments for module rl_assets.run.step, under cProfile when PROFILE=1
  if [ -n "${PROFILE:-}" ]; then echo -m cProfile -o "$WORK/$1.prof" -m rl_assets.run.step; else echo -m rl_assets.run.step; fi
}

echo "device $DEVICE ($GPU_NAME), shape hidden=$HIDDEN layers=$LAYERS heads=$HEADS intermediate=$INTER, round B=$B x G=$G, new tokens <= $NEW, decode $DECODE, train $MIXED"
step data "$PY" -c "
from rl_assets.core.params_file import load_params
from rl_assets.core.tokenizer import load_tokenizer
from rl_assets.core.paths import DATA, output_path
from rl_assets.data.prompts import build_prompts
from rl_assets.data.raw_data import load_raw_data
from rl_assets.core.schemas import PROMPTS, RAW_DATA, write_table
params = load_params('params.yaml')
raw, _ = load_raw_data(params.raw_data, params.seed)
write_table(raw, output_path('raw_data', DATA), RAW_DATA, 'raw_data')
prompts, _ = build_prompts(raw, params.prompts, load_tokenizer(params.model))
write_table(prompts, output_path('prompts', DATA), PROMPTS, 'prompts')"
step sft "$PY" $(profiled sft) sft
step rollouts "$PY" -c "
import json, time, torch
from pathlib import Path
from rl_assets.core.checkpoints import checkpoint_id
from rl_assets.core.params_file import load_params
from rl_assets.core.policy import load_policy, pick_device
from rl_assets.core.paths import DATA, checkpoint_key, output_path
from rl_assets.core.precision import compute_autocast, resolve_mixed_precision, weights_dtype
from rl_assets.rollout.generation import generate
from rl_assets.rollout.sampling import sample_rollouts
from rl_assets.core.schemas import ROLLOUTS, read_table, write_table
from rl_assets.core.storage import file_hash
params = load_params('params.yaml')
device = pick_device(params.compute.device)
policy, prompts_path = output_path(checkpoint_key(0), DATA), output_path('prompts', DATA)
mode = resolve_mixed_precision(params.train.mixed_precision, device)  # the trainer's precision, as the rollouts step uses it
model, tokenizer = load_policy(policy, device, dtype=weights_dtype(mode))
prompts = read_table(prompts_path, 'prompts')
sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
generate(model, tokenizer, ['1+1='] * 8, 2, greedy=False, max_new_tokens=4)  # warm-up: CUDA context and kernels are not the round's cost
sync()
started = time.perf_counter()
table = sample_rollouts(model, tokenizer, prompts, params.rollouts, round_number=1, seed=params.seed, policy_id=checkpoint_id(policy),
                        prompts_hash=file_hash(prompts_path), progress=False, model_path=str(policy), autocast=compute_autocast(mode, device))
sync()
seconds = time.perf_counter() - started
write_table(table, output_path('r01/rollouts', DATA), ROLLOUTS, 'rollouts')
completion = sum(map(len, table['completion_ids'].to_pylist()))
prompt = sum(map(len, table['prompt_ids'].to_pylist()))
Path('rollouts_timing.json').write_text(json.dumps({'seconds': seconds, 'rows': table.num_rows, 'completion_tokens': completion, 'prompt_tokens': prompt,
                  'dtype': str(next(model.parameters()).dtype) + ('' if mode == 'no' else ' + ' + mode + ' autocast'), 'truncated_share': sum(table['truncated'].to_pylist()) / table.num_rows}))"
step rewards "$PY" -c "
from rl_assets.core.params_file import load_params
from rl_assets.core.paths import DATA, output_path
from rl_assets.rewards import score_rollouts
from rl_assets.core.schemas import read_table, reward_function_names, rewards_schema, write_table
from rl_assets.core.storage import file_hash
params = load_params('params.yaml')
source = output_path('r01/rollouts', DATA)
rewards = score_rollouts(read_table(source, 'rollouts'), params.rewards, file_hash(source))
write_table(rewards, output_path('r01/rewards', DATA), rewards_schema(reward_function_names(rewards)), 'rewards')"
step train "$PY" $(profiled train) train --round 1
cp "$REPO/bench/gpu_plain_loop.py" .
step plain "$PY" gpu_plain_loop.py plain.json   # the same rollouts through a plain forward/backward/step loop

"$PY" - rollouts_timing.json "${PEAK:-}" "$GPU_NAME" "$SHAPE" "$DECODE" <<'EOF'
import json, sys
from pathlib import Path

rollouts = json.loads(Path(sys.argv[1]).read_text())
plain = json.loads(Path("plain.json").read_text())
peak = float(sys.argv[2]) * 1e12 if sys.argv[2] else None
r00 = json.loads(Path("data/r00/checkpoint/lineage.json").read_text())
card = json.loads(Path("data/r01/checkpoint/lineage.json").read_text())
n = r00["num_parameters"]
tokens = rollouts["prompt_tokens"] + rollouts["completion_tokens"]
completion_tps = card["metrics"]["tokens_per_second"]  # completion tokens in the loss per second of the training loop
train_tps = completion_tps * tokens / rollouts["completion_tokens"]  # every row is used each epoch: prompt tokens ride along
rollout_tps = rollouts["completion_tokens"] / rollouts["seconds"]
mfu = lambda flops: round(flops / peak, 4) if peak else None  # noqa: E731
walls = {name: int(seconds) for name, seconds in (line.split() for line in Path("step_seconds.txt").read_text().splitlines())}
# The round (rollouts, rewards, train steps, each with its process start, loading, hashing, saving and the held-out
# evaluation of the new checkpoint) against its two model loops: sampling with the log-prob pass, and the training loop.
round_wall = walls["rollouts"] + walls["rewards"] + walls["train"]
in_loops = rollouts["seconds"] + card["metrics"].get("loop_seconds", 0.0)
summary = {
    "gpu": sys.argv[3], "shape": sys.argv[4], "decode": sys.argv[5], "parameters": n, "peak_tflops": peak and peak / 1e12,
    "rollouts": {"completions": rollouts["rows"], "mean_completion_tokens": round(rollouts["completion_tokens"] / rollouts["rows"], 1),
                 "truncated_share": round(rollouts["truncated_share"], 3), "dtype": rollouts["dtype"], "seconds": round(rollouts["seconds"], 2),
                 "completion_tokens_per_s": round(rollout_tps), "mfu_4n": mfu(4 * n * tokens / rollouts["seconds"])},
    "train": {"mixed_precision": card["metrics"].get("mixed_precision"), "steps": card["metrics"]["steps"],
              "completion_tokens_per_s": round(completion_tps), "tokens_per_s": round(train_tps),
              "mfu": mfu(6 * n * train_tps), "mfu_completion_tokens_only": mfu(6 * n * completion_tps),
              # what the pipeline itself reports in the checkpoint card (rl_assets/run/hardware.py)
              "card": {key: card["metrics"].get(key) for key in ("sequence_tokens_per_second", "model_tflops_per_second", "mfu", "loop_busy_share")}},
    "round": {"step_seconds": walls, "round_seconds": round_wall, "model_loop_seconds": round(in_loops, 1),
              "outside_loops_share": round(1 - in_loops / round_wall, 3) if round_wall else None},
    "plain_loop": {name: {**run, "mfu": mfu(6 * n * run["tokens_per_s"]), "trainer_vs_plain": round(train_tps / run["tokens_per_s"], 3)}
                   for name, run in plain.items()},
}
print(f"rollouts: {rollout_tps:,.0f} completion tokens/s ({summary['rollouts']['dtype']}); "
      f"training: {train_tps:,.0f} tokens/s ({completion_tps:,.0f} completion tokens/s, {summary['train']['mixed_precision']}); "
      f"MFU {summary['train']['mfu'] if peak else 'n/a (set PEAK_TFLOPS)'}; trainer / plain loop: "
      + ", ".join(f"{run['trainer_vs_plain']}x vs {name}" for name, run in summary["plain_loop"].items())
      + f"; outside the model loops: {summary['round']['outside_loops_share']} of the round's {round_wall} s")
print(json.dumps(summary, indent=2))
EOF
