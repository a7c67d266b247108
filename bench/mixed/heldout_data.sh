#!/usr/bin/env bash
# One GPU call of mixed-corpus points (bench/mixed/run_mix.py), several models in turn, each
# diagnosed with its timing pass (the step and the DataLoader wait without a tracer); the
# captures trimmed and packed into one archive under $OUT (a call brings back few files).
#   source .gpu/prelude.sh && SPECS="fcn50:0.3,0.4 lraspp:0.4" LIMIT=550 TAG=a KINDS=data \
#       bash bench/mixed/heldout_data.sh
# SPECS: model:shares ...; LIMIT: seconds the call may take; KINDS: run_mix.py's --kinds (data).
# The amounts come from the calibrations in bench/results/mix-calibrations-seed.jsonl (the same
# amounts as the corpus's earlier calls: ResNet-50's of 2026-12-04, the others' of their first
# H100 call); SEED names another calibrations file (the H200's: mix-calibrations-seed-h200.jsonl).
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mix /tmp/mixruns
source bench/device_plotly_stub.sh
res=$OUT/mix_lw_$TAG.jsonl
cp "${SEED:-bench/results/mix-calibrations-seed.jsonl}" "$res"
for spec in $SPECS; do m=${spec%%:*}; s=${spec#*:}
  python3 bench/mixed/run_mix.py "$res" /tmp/mix --kinds "${KINDS:-data}" --shares "$s" \
      --budget $((LIMIT - SECONDS - 40)) --model "$m"
  echo "$m done ${SECONDS}s"
done
for d in /tmp/mix/runs_*; do ln -sfn "$d" "/tmp/mixruns/${d##*/runs_}"; done
python3 bench/trim_capture.py /tmp/mixruns /tmp/mixcap_$TAG --max-mb 15 && cp /tmp/mixcap_$TAG-*.tar "$OUT/"
ls -la "$OUT"; echo "all done ${SECONDS}s"
