#!/usr/bin/env bash
# One device call for tensor parallelism on 2 GPUs (issue 8): the all-reduce alone
# (eager NCCL, NCCL in a graph, symmetric memory in a graph), the TP benchmark at TP=2
# (decode CUDA graphs), the TP GPU tests, then TP=1 eager for the eager-launch cost. Each
# part has its own time limit (`timeout -s USR1`: rank 0 prints its stacks, then is
# killed), so a hang costs only its part. Outputs go to $OUT (or ./out).
# Ran at 22:04 UTC 2026-11-21 with the graphs holding ProcessGroupNCCL collectives
# (benchmarks/native_gpu_notes.md); the code now captures symmetric-memory ones.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
run() {  # run LIMIT_S NAME CMD...: stdout+stderr to $OUT/NAME.txt, its status printed
  local limit=$1 name=$2
  shift 2
  echo "== $name (limit ${limit}s, t=${SECONDS}s)"
  timeout -s USR1 -k 10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name rc=$rc t=${SECONDS}s"
  return $rc
}
run 45 allreduce python3 benchmarks/native_gpu_allreduce.py --rows 1 32
grep -E "rows=|device" "$OUT/allreduce.txt"
run 90 tp_bench python3 benchmarks/native_gpu_tp.py --sizes 2 --json "$OUT/tp.json"
bench=$?
tail -5 "$OUT/tp_bench.txt"
if [ $bench -eq 0 ]; then
  run 150 tp_tests python3 -m pytest -q -x -m gpu tests/engines/native/test_tp.py
else
  run 60 tp_tests python3 -m pytest -q -m gpu -k eager tests/engines/native/test_tp.py
fi
tail -15 "$OUT/tp_tests.txt"
if [ $SECONDS -lt 125 ]; then
  run 40 tp1_eager python3 benchmarks/native_gpu_tp.py --sizes 1 --eager --batch-sizes 1
  tail -3 "$OUT/tp1_eager.txt"
fi
