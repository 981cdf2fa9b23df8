#!/usr/bin/env bash
# Every check that needs an accelerator, in one call of a lent GPU machine, logs and results under OUT:
#
#   bash launch/bench/device_check.sh OUT            # on the GPU machine (wheels it lacks in .whl/, see below)
#   SMALL=1 bash launch/bench/device_check.sh OUT    # the same commands at toy size on a CPU: try the script first
#
# 1. versions and devices;
# 2. OPD at real model size: a random pair at Qwen3-1.7B -> Qwen3-0.6B shapes (real vocabulary, depth, width,
#    heads; opd_jax/bench/scale_pair.py build_shaped_pair) trained with configs/real/qwen3_1p7b_to_0p6b.py at a
#    shortened batch / response length, once with bf16 rollouts and once with fp8 weights + fp8 KV: step time,
#    tokens/s, k3 between sampler and learner, and memory/device_peak_gib -- the measured side of
#    `launch/plan_memory.py` for the same config (run on any machine; the command is printed);
# 3. the time-to-quality benchmark on pair1 (sync bf16 vs async fp8).
# Each step has its own time limit and log; a failed step does not stop the next. The last lines are a summary.
# OUT gets summary.txt, steps.log, opd_{bf16,fp8}_metrics.jsonl and time_to_quality.json.
# The GPU image has jax / flax / optax / orbax / transformers; the packages it lacks travel as py3.12 wheels in
# .whl/ (docs/benchmarks.md, "On a GPU", says which and how).
set -u
OUT=${1:-${OUT:-/tmp/device_check}}
mkdir -p "$OUT"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && [ -z "${SMALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$REPO
fi
PY=${PY:-python3}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

LOGS=/tmp/device_check_logs  # one log per step, joined into OUT/steps.log at the end (8 files at most come back)
rm -rf "$LOGS"; mkdir -p "$LOGS"

step() {  # step NAME SECONDS CMD...: runs CMD with a limit, its output in LOGS/NAME.log, one summary line
  local name=$1 limit=$2 start rc
  shift 2
  echo "=== $name (limit ${limit}s)"
  start=$(date +%s)
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$SUMMARY"
  grep -v "it/s" "$LOGS/$name.log" | tail -n 4  # progress bars are one long line each
  return $rc
}

step env 120 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null;
  $PY -c 'import jax, flax, optax, orbax.checkpoint, aqt, grain, ml_collections, transformers, opd_jax
print(\"jax\", jax.__version__, \"flax\", flax.__version__, \"optax\", optax.__version__, \"transformers\",
      transformers.__version__, jax.devices())'"

PAIR=/tmp/device_check_pair
if [ -n "${SMALL:-}" ]; then  # toy size on CPU: XLA:CPU computes no bf16 x bf16 -> f32 dots (issue 39)
  BUILD="from opd_jax.bench.scale_pair import build_scale_pair as b; b('$PAIR', vocab_size=4096)"
  SHAPE="--config.train.steps=2 --config.train.batch_size=4 --config.train.micro_batch_size=2
         --config.rollout.max_new_tokens=16 --config.train.log_every=1 --config.train.eval_size=4
         --config.train.eval_batch_size=4 --config.student_compute_dtype=float32
         --config.teacher_compute_dtype=float32"
  TTQ="--target=0.05 --eval_every=2"
else
  BUILD="from opd_jax.bench.scale_pair import build_shaped_pair as b; b('$PAIR', 'qwen3-1.7b', 'qwen3-0.6b')"
  # 6 steps of 32 responses x 256 tokens (random weights never stop early): rows 1-3 include compilation,
  # rows 4-6 are the steady state.
  SHAPE="--config.train.steps=6 --config.train.batch_size=32 --config.train.micro_batch_size=8
         --config.rollout.max_new_tokens=256 --config.train.log_every=3 --config.train.eval_size=32
         --config.train.eval_batch_size=32"
  TTQ="--target=0.75 --eval_every=20"
fi
step build_pair 300 $PY -c "$BUILD"

CONFIG="configs/real/qwen3_1p7b_to_0p6b.py:teacher=$PAIR/teacher,student=$PAIR/student,train_file=$PAIR/train.jsonl,heldout_file=$PAIR/heldout.jsonl"
COMMON="--config.data.max_prompt_tokens=64 --config.train.eval_every=1000 --config.train.checkpoint_every=1000
        --config.train.export_dtype= --config.train.progress_bar=False --config.train.malloc_huge_pages=False"
echo "planner, same runs: python launch/plan_memory.py --config=$CONFIG --devices=1 $(echo $SHAPE $COMMON) [--config.rollout.weights=fp8 --config.rollout.kv_cache=fp8]" >> "$SUMMARY"
for arm in bf16:"--config.rollout.weights=bf16 --config.rollout.kv_cache=bf16" \
           fp8:"--config.rollout.weights=fp8 --config.rollout.kv_cache=fp8"; do
  name=${arm%%:*}
  rm -rf "/tmp/device_check_runs/$name"
  # shellcheck disable=SC2086  # the override lists are meant to split into flags
  step "opd_$name" 200 $PY launch/train.py --config="$CONFIG" --workdir="/tmp/device_check_runs/$name" \
    $SHAPE $COMMON ${arm#*:}
  cp "/tmp/device_check_runs/$name/metrics.jsonl" "$OUT/opd_${name}_metrics.jsonl" 2>/dev/null
  $PY - "$OUT/opd_${name}_metrics.jsonl" "$name" >> "$SUMMARY" 2>&1 <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
  if "perf/step_s" in r:
    print(f"  {sys.argv[2]} step {r['step']}: {r['perf/step_s']:.2f} s/step, {r['perf/tokens_per_s']:.0f} tok/s, "
          f"k3 {r.get('mismatch/k3', float('nan')):.3g}, response {r['response_tokens']:.0f} tokens, "
          f"device peak {r.get('memory/device_peak_gib', float('nan')):.2f} GiB")
EOF
done

rm -rf /tmp/device_check_ttq
step time_to_quality 180 $PY launch/bench/time_to_quality.py --config=configs/pair1.py $TTQ \
  --workdir=/tmp/device_check_ttq
cp /tmp/device_check_ttq/time_to_quality.json "$OUT/" 2>/dev/null
grep -v "it/s" "$LOGS/time_to_quality.log" | tail -n 4 >> "$SUMMARY"
for f in "$LOGS"/*.log; do echo "=== $f"; cat "$f"; done > "$OUT/steps.log"
echo "=== summary"
cat "$SUMMARY"
