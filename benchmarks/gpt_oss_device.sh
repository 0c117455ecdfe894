#!/usr/bin/env bash
# One device call for GPT-OSS (issue 16) on one H100: benchmarks/gpt_oss_gpu.py in parts,
# each in its own process under its own time limit, most important first: the 20B MoE
# layer sweep + engine (MXFP4, with a kernel profile), 20B through HTTP (c=256, 1,000
# ShareGPT-like requests), the GPU tests of the MoE and GEMV kernels, 120B (MXFP4) engine,
# 20B with bf16 experts. Outputs go to $OUT. Needs the o200k_harmony tokenizer.json at
# $TOKENIZER. All parts take ~12 minutes: more than one device call allows. PARTS="http_20b
# tests" (any of the names below) runs only those; BUDGET=<seconds> cuts each part's limit
# to what is left of it.
set -u
OUT=${OUT:-out}
PARTS=${PARTS:-all}
BUDGET=${BUDGET:-100000}
TOKENIZER=${TOKENIZER:-assets/o200k_harmony.tokenizer.json}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/device.txt"
run() {  # run LIMIT_S NAME CMD...: output appended to $LOG, status printed
  local limit=$1 name=$2
  shift 2
  if [ "$PARTS" != all ] && [[ " $PARTS " != *" $name "* ]]; then return 0; fi
  local left=$((BUDGET - SECONDS - 5))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 10 ]; then echo "== $name skipped (budget)" | tee -a "$LOG"; return 0; fi
  echo "== $name (limit ${limit}s, t=${SECONDS}s)" | tee -a "$LOG"
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name rc=$rc t=${SECONDS}s" | tee -a "$LOG"
}
B="python3 benchmarks/gpt_oss_gpu.py --out $OUT"
# The tokenizer is needed for HTTP only (the engine parts run without one).
if [ -f "$TOKENIZER" ]; then B="$B --tokenizer-json $TOKENIZER"; fi
# Session 5 (kernel warm-up, split up/down tiles): the warm-up's and attention kernels' GPU
# tests; the first and second serve of one server started on an empty Triton cache (as on a
# fresh machine); the MoE sweep (benchmarks/gpt_oss_sweep.py) with the engine part after it;
# the engine with kernel profiles of eager batch-1 and batch-256 decode steps.
run 130 tests_new python3 -m pytest -q -p no:cacheprovider -m gpu \
  -k "warm_up or decode or extend or triton_backend or float32_matches or chunks_prefix" \
  tests/engines/native/test_gpu_gpt_oss.py tests/engines/native/test_kernels.py
run 240 http_20b_first_second $B --model 20b --parts http --http-serves 2 --fresh-triton-cache
run 200 sweep_engine_20b $B --model 20b --parts sweep engine --batch-sizes 1 2 4 8 16 256
run 120 engine_20b_profile $B --model 20b --parts engine --profile --batch-sizes 1 256
run 170 engine_20b_mxfp4 $B --model 20b --parts moe engine --profile
run 240 http_20b $B --model 20b --parts http
run 150 tests python3 -m pytest -q -p no:cacheprovider -m gpu \
  -k "fused_moe or grouped_gemms or alignment or router_kernel or expanded or float32_matches or half2 or gemv or expert_major or warm_up" \
  tests/engines/native/test_gpu_gpt_oss.py tests/engines/native/test_kernels.py
run 110 engine_120b_mxfp4 $B --model 120b --parts engine --batch-sizes 1 16 64 \
  --max-model-len 4096 --gpu-memory-utilization 0.95
run 70 engine_20b_mxfp4_packed $B --model 20b --parts engine --batch-sizes 1 256 --expand-min-pairs 0
run 70 engine_20b_bf16 $B --model 20b --moe-weights bf16 --parts engine --batch-sizes 1 64
grep -E "^== |passed|failed" "$LOG"
