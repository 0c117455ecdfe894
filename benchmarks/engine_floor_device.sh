#!/usr/bin/env bash
# One device call for issue 17 (the engine alone against the workload floor), most important
# numbers first, each part bounded so a cut still leaves the ones before it:
#   1. benchmarks/decode_tiles.py: the decode-attention tile sweep and its pick (env lines);
#   2. the engine alone, both profiles, lof then FCFS, with the pick in the engine's
#      environment (the seventh session's call also passed --long-mixed: measured, dropped);
#   3. the GPU tests of the decode kernel and the piecewise graphs, in what time is left.
# Run from the repository root: OUT=dir BUDGET=seconds bash benchmarks/engine_floor_device.sh
# PARTS="engine tests" leaves the sweep out (the engine then runs the kernels' own defaults).
set -u
OUT=${OUT:-.}
BUDGET=${BUDGET:-290}
PARTS=${PARTS:-sweep engine tests}
start=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - start))); }

engine='{}'
if [[ " $PARTS " == *" sweep "* ]]; then
    echo "== decode tile sweep ($(left) s left)"
    timeout 80 python3 benchmarks/decode_tiles.py --budget-s "${SWEEP_S:-40}" --out "$OUT"
fi
if [ -f "$OUT/decode_tile.env" ]; then
    engine=$(python3 -c '
import json, sys
env = dict(line.strip().split("=", 1) for line in open(sys.argv[1]) if "=" in line)
print(json.dumps({"_bench": {"env": env}}))' "$OUT/decode_tile.env")
fi
if [[ " $PARTS " == *" engine "* ]]; then
    echo "== engine alone, variant d=$engine ($(left) s left)"
    timeout $(($(left) - ${TESTS_S:-30})) python3 benchmarks/native_gpu_http_vs_engine.py \
        --skip-engine --skip-http --skip-variant-mixed --policies lof fcfs \
        --engine-variant "d=$engine" --out "$OUT"
fi
if [[ " $PARTS " == *" tests "* ]]; then
    echo "== GPU tests ($(left) s left)"
    timeout $(($(left) - 3)) python3 -m pytest -q -m gpu -x -p no:cacheprovider \
        tests/engines/native/test_kernels.py tests/engines/native/test_piecewise.py \
        -k "decode or bfloat16-llama3 or with_and_without_piecewise"
fi
echo "== done ($(left) s left)"
