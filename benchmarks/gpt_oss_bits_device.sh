#!/usr/bin/env bash
# One device call for issue 16, sessions 6-7 (the bit-wise MXFP4 grouped GEMMs, mxfp4_bf16.py,
# and the kernels around them): each part in its own process under its own time limit,
# outputs in $OUT. PARTS picks parts:
#   sweep_engine  the grouped-GEMM sweep at 256 / 64 / 512 / 2,048 tokens (every config
#                 checked against the reference, with the weight-read floor), its winners
#                 installed for the engine decode step at batch 1 and 256
#   tests_bits    the GPU tests of the bit-wise grouped GEMMs, the expert sort, the router
#                 (its pair-order x) and the k-pair sum (~60 s)
#   engine        the engine decode step at batch 1 and 256 with the defaults
#   engine_old    the same with STATOR_MXFP4_GEMM=scaled (session 5's path at 256)
#   http          1,000 ShareGPT-like requests through HTTP, c=256 (needs $TOKENIZER)
set -u
OUT=${OUT:-out}
PARTS=${PARTS:-"tests_bits sweep_engine"}
BUDGET=${BUDGET:-100000}
TOKENIZER=${TOKENIZER:-../final/o200k_harmony.tokenizer.json}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/device.txt"
run() {  # run LIMIT_S NAME CMD...
  local limit=$1 name=$2
  shift 2
  if [[ " $PARTS " != *" $name "* ]]; then return 0; fi
  local left=$((BUDGET - SECONDS - 5))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 10 ]; then echo "== $name skipped (budget)" | tee -a "$LOG"; return 0; fi
  echo "== $name (limit ${limit}s, t=${SECONDS}s)" | tee -a "$LOG"
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
  echo "== $name rc=$? t=${SECONDS}s" | tee -a "$LOG"
}
B="python3 benchmarks/gpt_oss_gpu.py --out $OUT --model 20b"
run 60 tests_bits python3 -m pytest -q -p no:cacheprovider -m gpu \
  -k "bitwise or (grouped_gemms and bits) or alignment or router or pair_order" \
  tests/engines/native/test_gpu_gpt_oss.py
run 220 sweep_engine $B --parts gemm engine --profile --batch-sizes 1 256
run 120 engine $B --parts engine --batch-sizes 1 256
run 120 engine_old env STATOR_MXFP4_GEMM=scaled $B --parts engine --profile --batch-sizes 1 256
run 200 http $B --parts http --tokenizer-json "$TOKENIZER"
grep -E "^== |passed|failed" "$LOG"
