#!/usr/bin/env bash
# GPU check: a ~200M-parameter Llama built locally from a config (no download) through one RL round
# (SFT warm start of a few steps, rollouts, rewards, GRPO training in bf16), in a temp copy of the
# project; prints rollout and training tokens/s and the model-FLOPs utilisation (MFU). Under 8 minutes.
#
#   bash bench/gpu_check.sh                          # DEVICE=cuda SHAPE=medium (hidden 1024, 12 layers: ~201M)
#   DEVICE=cpu SHAPE=small bash bench/gpu_check.sh   # CPU dry run of this script (a ~0.3M model, seconds)
#
# Settings (environment): DEVICE cuda|cpu, SHAPE small|medium|"hidden,layers,heads,intermediate",
# PEAK_TFLOPS (dense bf16 peak of the device; otherwise looked up from nvidia-smi's GPU name),
# ENGINE transformers|auto|vllm (rollout sampler; auto picks vLLM when installed), LIMIT_S (470),
# PYTHON (default .venv/bin/python, else a python3 that already has torch/transformers/trl), KEEP=1
# keeps the work folder. MFU = 6 * n_params * training tokens/s / peak, tokens counted as the
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

case "$SHAPE" in
  small)  HIDDEN=128;  LAYERS=2;  HEADS=4;  INTER=256 ;;
  medium) HIDDEN=1024; LAYERS=12; HEADS=16; INTER=4096 ;;
  *,*,*,*) IFS=, read -r HIDDEN LAYERS HEADS INTER <<<"$SHAPE" ;;
  *) echo "SHAPE must be small, medium or hidden,layers,heads,intermediate" >&2; exit 2 ;;
esac
if [ "$DEVICE" = cuda ]; then   # the round: B=512 prompts x G=8, up to 128 new tokens, 2 epochs of 256-completion minibatches
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
  if [ -z "$PEAK" ]; then  # dense (no sparsity) bf16 tensor-core peaks from the vendor's data sheets, TFLOP/s
    case "$GPU_NAME" in
      *H200*) PEAK=989 ;;
      *H100*PCIe*) PEAK=756 ;;
      *H100*NVL*) PEAK=835 ;;
      *H100*) PEAK=989 ;;
      *A100*) PEAK=312 ;;
      *L40S*) PEAK=362 ;;
      *L4*) PEAK=121 ;;
      *) echo "unknown GPU '$GPU_NAME': set PEAK_TFLOPS for an MFU figure" >&2 ;;
    esac
  fi
fi

WORK=$(mktemp -d /tmp/rl-assets-gpu-check-XXXXXX)
[ -n "${KEEP:-}" ] && echo "work folder: $WORK" || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/data"
cp -r "$REPO/rl_assets" "$WORK/"
cp -r "$REPO/data/raw" "$WORK/data/"
cd "$WORK"
export PYTHONPATH=$WORK TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

cat > params.yaml <<EOF
seed: 0
rounds: 1
compute: {nproc: 1, device: "$DEVICE", gpus_per_step: 0}
model:
  name_or_path: tiny
  tiny: {hidden_size: $HIDDEN, num_layers: $LAYERS, num_heads: $HEADS, intermediate_size: $INTER}
raw_data:
  sources:
    - {kind: generator, path: data/raw/math_problems.json, count: 6000}
prompts: {eval_fraction: 0.1, sft_fraction: 0.5, max_prompt_tokens: 24, template: "{prompt}"}
sft: {enabled: true, learning_rate: 1.0e-4, max_steps: $SFT_STEPS, batch_size: $SFT_BATCH}
rollouts: {prompts_per_round: $B, samples_per_prompt: $G, temperature: 1.0, top_p: 1.0, max_new_tokens: $NEW, batch_size: $GEN_BATCH, engine: "$ENGINE"}
rewards:
  functions:
    - {name: arithmetic_answer, weight: 1.0}
train: {algorithm: grpo, learning_rate: 1.0e-5, epochs: 2, minibatch_size: $MINIBATCH, epsilon: 0.2, beta: 0.0, max_grad_norm: 1.0, mixed_precision: "$MIXED"}
evaluation: {max_prompts: 64, samples_per_prompt: 4, temperature: 1.0, max_new_tokens: 8}
EOF

step() {  # step NAME COMMAND...: runs with the time that is left, log in $WORK/NAME.log
  local name=$1 left=$((DEADLINE - SECONDS)) started=$SECONDS
  shift
  if [ "$left" -le 5 ]; then echo "out of time before $name (LIMIT_S=$LIMIT_S)" >&2; exit 124; fi
  if ! timeout "$left" "$@" >"$WORK/$name.log" 2>&1; then
    echo "step $name failed or ran out of time (limit ${left}s); last lines:" >&2
    tail -25 "$WORK/$name.log" >&2
    exit 1
  fi
  echo "$name: $((SECONDS - started)) s"
}

echo "device $DEVICE ($GPU_NAME), shape hidden=$HIDDEN layers=$LAYERS heads=$HEADS intermediate=$INTER, round B=$B x G=$G, new tokens <= $NEW, train $MIXED"
step data "$PY" -c "
from rl_assets.config import load_params
from rl_assets.models import load_tokenizer
from rl_assets.paths import output_path
from rl_assets.prompts import build_prompts
from rl_assets.raw_data import load_raw_data
from rl_assets.schemas import PROMPTS, RAW_DATA, write_table
params = load_params('params.yaml')
raw, _ = load_raw_data(params.raw_data, params.seed)
write_table(raw, output_path('raw_data'), RAW_DATA, 'raw_data')
prompts, _ = build_prompts(raw, params.prompts, load_tokenizer(params.model))
write_table(prompts, output_path('prompts'), PROMPTS, 'prompts')"
step sft "$PY" -m rl_assets.compute sft
step rollouts "$PY" -c "
import json, time, torch
from pathlib import Path
from rl_assets.checkpoints import checkpoint_id
from rl_assets.config import load_params
from rl_assets.models import load_policy, pick_device
from rl_assets.paths import checkpoint_key, output_path
from rl_assets.rollouts import generate, sample_rollouts
from rl_assets.schemas import ROLLOUTS, read_table, write_table
from rl_assets.storage import file_hash
params = load_params('params.yaml')
device = pick_device(params.compute.device)
policy, prompts_path = output_path(checkpoint_key(0)), output_path('prompts')
model, tokenizer = load_policy(policy, device)
prompts = read_table(prompts_path, 'prompts')
sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
generate(model, tokenizer, ['1+1='] * 8, 2, greedy=False, max_new_tokens=4)  # warm-up: CUDA context and kernels are not the round's cost
sync()
started = time.perf_counter()
table = sample_rollouts(model, tokenizer, prompts, params.rollouts, round_number=1, seed=params.seed, policy_id=checkpoint_id(policy),
                        prompts_hash=file_hash(prompts_path), progress=False, model_path=str(policy))
sync()
seconds = time.perf_counter() - started
write_table(table, output_path('r01/rollouts'), ROLLOUTS, 'rollouts')
completion = sum(map(len, table['completion_ids'].to_pylist()))
prompt = sum(map(len, table['prompt_ids'].to_pylist()))
Path('rollouts_timing.json').write_text(json.dumps({'seconds': seconds, 'rows': table.num_rows, 'completion_tokens': completion, 'prompt_tokens': prompt,
                  'dtype': str(next(model.parameters()).dtype), 'truncated_share': sum(table['truncated'].to_pylist()) / table.num_rows}))"
step rewards "$PY" -c "
from rl_assets.config import load_params
from rl_assets.paths import output_path
from rl_assets.rewards import score_rollouts
from rl_assets.schemas import read_table, reward_function_names, rewards_schema, write_table
from rl_assets.storage import file_hash
params = load_params('params.yaml')
source = output_path('r01/rollouts')
rewards = score_rollouts(read_table(source, 'rollouts'), params.rewards, file_hash(source))
write_table(rewards, output_path('r01/rewards'), rewards_schema(reward_function_names(rewards)), 'rewards')"
step train "$PY" -m rl_assets.compute train --round 1

"$PY" - rollouts_timing.json "${PEAK:-}" "$GPU_NAME" "$SHAPE" <<'EOF'
import json, sys
from pathlib import Path

rollouts = json.loads(Path(sys.argv[1]).read_text())
peak = float(sys.argv[2]) * 1e12 if sys.argv[2] else None
r00 = json.loads(Path("data/r00/checkpoint/lineage.json").read_text())
card = json.loads(Path("data/r01/checkpoint/lineage.json").read_text())
n = r00["num_parameters"]
tokens = rollouts["prompt_tokens"] + rollouts["completion_tokens"]
completion_tps = card["metrics"]["tokens_per_second"]  # completion tokens in the loss per second of the training loop
train_tps = completion_tps * tokens / rollouts["completion_tokens"]  # every row is used each epoch: prompt tokens ride along
rollout_tps = rollouts["completion_tokens"] / rollouts["seconds"]
mfu = lambda flops: round(flops / peak, 4) if peak else None  # noqa: E731
summary = {
    "gpu": sys.argv[3], "shape": sys.argv[4], "parameters": n, "peak_tflops": peak and peak / 1e12,
    "rollouts": {"completions": rollouts["rows"], "mean_completion_tokens": round(rollouts["completion_tokens"] / rollouts["rows"], 1),
                 "truncated_share": round(rollouts["truncated_share"], 3), "dtype": rollouts["dtype"], "seconds": round(rollouts["seconds"], 2),
                 "completion_tokens_per_s": round(rollout_tps), "mfu_4n": mfu(4 * n * tokens / rollouts["seconds"])},
    "train": {"mixed_precision": card["metrics"].get("mixed_precision"), "steps": card["metrics"]["steps"],
              "completion_tokens_per_s": round(completion_tps), "tokens_per_s": round(train_tps),
              "mfu": mfu(6 * n * train_tps), "mfu_completion_tokens_only": mfu(6 * n * completion_tps)},
}
print(f"rollouts: {rollout_tps:,.0f} completion tokens/s ({summary['rollouts']['dtype']}); "
      f"training: {train_tps:,.0f} tokens/s ({completion_tps:,.0f} completion tokens/s, {summary['train']['mixed_precision']}); "
      f"MFU {summary['train']['mfu'] if peak else 'n/a (set PEAK_TFLOPS)'}")
print(json.dumps(summary, indent=2))
EOF
