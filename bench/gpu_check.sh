#!/usr/bin/env bash
# The GPU check: one prepared script for a machine with a CUDA GPU and no internet, whose image
# already has torch (CUDA), transformers, peft and accelerate. It
#   1. installs rlvr with --no-deps over the image's packages (falls back to PYTHONPATH=src),
#      and any wheels carried in $WHEELS (e.g. trl, datasets) the same way;
#   2. checks CPU-vs-CUDA log-prob agreement on a tiny Qwen2 (fp32);
#   3. builds a random Qwen2-0.5B-shaped model and a local BPE tokenizer, runs GRPO steps on
#      CUDA in bf16, full fine-tuning and LoRA, printing s/step, tokens/s and peak GPU memory;
#   4. runs the same full fine-tuning through the FSDP2 learner at world size 1
#      (trainer.learners=fsdp: NCCL on CUDA, gloo on a CPU), in bf16, then with fp32 shards,
#      bf16 compute, fp32 reduce and (CUDA) the shards offloaded to CPU memory;
#   5. runs TRL's GRPOTrainer on the same work when trl (and datasets) import;
#   6. trains a small Idefics3 vision-language model (built in code) with LoRA in bf16 on the
#      count_shapes task, printing the sampler-vs-trainer log-prob gap, then exports and reloads it.
# Each part has its own time limit so the whole fits in 11 minutes (PARTS runs fewer); output is JSON lines.
#
#   bash bench/gpu_check.sh                      # on the GPU machine
#   bash bench/gpu_check.sh --device cpu --tiny  # dry run of the same code paths on a CPU
#   PARTS="agree fsdp" bash bench/gpu_check.sh    # only these parts (agree full lora fsdp trl vlm)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-$ROOT/wheels}"
ARGS=("$@")
DEVICE=cuda
for ((i = 0; i < ${#ARGS[@]}; i++)); do
  [[ "${ARGS[i]}" == "--device" ]] && DEVICE="${ARGS[i + 1]:-cuda}"
done
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
START=$SECONDS
say() { echo "== [$((SECONDS - START))s] $*"; }

say "install (no dependencies: the image's torch/transformers/peft are used as they are)"
if [[ "${NO_INSTALL:-0}" != 1 ]]; then
  if ! "$PY" -m pip install --no-deps --no-build-isolation --no-index -q -e "$ROOT" >"$WORK/pip.log" 2>&1; then
    echo "pip install failed (see $WORK/pip.log); using PYTHONPATH=$ROOT/src"
  fi
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install --no-deps --no-index -q "$WHEELS"/*.whl || echo "carried wheels did not install"
  fi
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'EOF'
import importlib, json
versions = {}
for name in ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "rlvr"):
    try:
        versions[name] = getattr(importlib.import_module(name), "__version__", "?")
    except ImportError:
        versions[name] = None
import torch
versions["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
print(json.dumps({"check": "versions", **versions}))
EOF
[[ "$DEVICE" == cuda* ]] && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader || true

part() {  # part LIMIT_S NAME ARGS...: one measurement in its own process, killed past its limit
  local limit=$1 name=$2
  shift 2
  [[ " ${PARTS:-agree full lora fsdp trl vlm} " == *" $name "* ]] || return 0
  say "$name (limit ${limit}s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$PY" "$ROOT/bench/gpu_check.py" --work "$WORK" "$@" "${ARGS[@]}"
  local rc=$?
  [[ $rc == 0 ]] || echo "{\"check\": \"$name\", \"failed\": true, \"exit_code\": $rc}"
}

part 60 agree --only agree
part 200 full --only full     # includes building the 0.5B model (reused by the parts after it)
part 120 lora --only lora
part 150 fsdp --only fsdp
part 90 trl --only trl
part 120 vlm --only vlm
say "done in $((SECONDS - START))s"
rm -rf "$WORK"
