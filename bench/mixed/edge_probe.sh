#!/usr/bin/env bash
# One GPU call: `navdoctor verify --classify --remedy num_workers` (4 timed runs per arm) of the
# mixed corpus's DeepLabV3 MobileNetV3 data mix (batch 32) at each amount of AMTS, near where
# its loader hides behind the GPU in some processes and not in others (docs/accuracy.md,
# "Thirteenth session"): does the baseline's class come out a close call from its runs' waits?
#   source .gpu/prelude.sh && AMTS="4.3 4.71" LIMIT=540 bash bench/mixed/edge_probe.sh
set -u
export PYTHONUNBUFFERED=1
source bench/device_plotly_stub.sh
for amt in ${AMTS}; do
  python3 -m navdoctor verify --classify --repeats 4 --warmup 4 --steps 12 --remedy num_workers --priming-runs 0 \
    --json $OUT/verify_dlv3_$amt.json -q bench/mixed/mix.py --model deeplabv3mnv3 --batch 32 \
    --kind data --amount $amt --fix none --steps 40 > $OUT/verify_dlv3_$amt.txt 2>&1
  echo "amount $amt rc $? ${SECONDS}s"; tail -12 $OUT/verify_dlv3_$amt.txt
  [ $SECONDS -gt $((LIMIT - 120)) ] && break
done
