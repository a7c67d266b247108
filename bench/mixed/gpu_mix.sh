#!/usr/bin/env bash
# On the GPU machine: mixed-corpus points (bench/mixed/run_mix.py) of one or more models in one
# call. Each point is timed unprofiled (as is, with the cause's remedy, with the compute remedy)
# and, unless NO_DIAGNOSE=1, diagnosed by `navdoctor diagnose` (both traced passes and the timing
# pass); the captures are trimmed (bench/trim_capture.py) and packed into archives under $OUT,
# ready for bench/mixed/add_points.py.
#   source .gpu/prelude.sh && SPECS="fcn50:0.3,0.4 lraspp:0.4" KINDS=data LIMIT=550 TAG=a \
#       bash bench/mixed/gpu_mix.sh
# SPECS: model:shares ... (mix.py's --model names); KINDS: run_mix.py's --kinds (default data);
# LIMIT: seconds the call may take (default 550); REPEAT: interleaved timings per variant
# (default 1); COMPILE=1: also the torch.compile variant; NO_DIAGNOSE=1: timings only; TAG names
# the files under $OUT. The amounts come from the calibrations in SEED (default
# bench/results/mixed-calibrations.jsonl: ResNet-50's of the H200, the other models' of an H100;
# mixed-calibrations-h200.jsonl holds the H200's LR-ASPP), so that a share means the same amount
# as in the corpus. Lines already in $OUT/mix_$TAG.jsonl are skipped: running it again resumes.
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mix /tmp/mixruns
source bench/device_plotly_stub.sh
TAG=${TAG:-a}
LIMIT=${LIMIT:-550}
res=$OUT/mix_$TAG.jsonl
[ -f "$res" ] || cp "${SEED:-bench/results/mixed-calibrations.jsonl}" "$res"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for spec in $SPECS; do m=${spec%%:*}; s=${spec#*:}
  python3 bench/mixed/run_mix.py "$res" /tmp/mix --kinds "${KINDS:-data}" --shares "$s" \
      --budget $((LIMIT - SECONDS - 40)) --model "$m" --repeat "${REPEAT:-1}" \
      ${COMPILE:+--compile} ${NO_DIAGNOSE:+--no-diagnose}
  echo "$m done ${SECONDS}s"
done
if [ -z "${NO_DIAGNOSE:-}" ]; then     # a timings-only call has no capture to pack
  for d in /tmp/mix/runs_*; do ln -sfn "$d" "/tmp/mixruns/${d##*/runs_}"; done
  python3 bench/trim_capture.py /tmp/mixruns /tmp/mixcap_$TAG --max-mb 15 && cp /tmp/mixcap_$TAG-*.tar "$OUT/"
fi
ls -la "$OUT"; echo "all done ${SECONDS}s"
