#!/usr/bin/env bash
# One GPU call of issue #20/#14 evidence (2026-12-05): the mixed corpus (bench/mixed/run_mix.py)
# for the kinds and shares given, captures trimmed and packed so that they travel back and are
# analysed here with the current code; then A/A capture pairs (bench/compare/aa_capture.py).
#   source .gpu/prelude.sh && MIX_KINDS=data,host,launch bash bench/gpu_session_b.sh
# Env: MIX_KINDS, MIX_SHARES (0.1,0.35,0.6), MIX_BUDGET (s), MIX_NO_DIAGNOSE (1: timings only), MIX_MODEL
# (resnet50 | lraspp), MIX_COMPILE (1: also the torch.compile variant), MIX_REPEAT (interleaved timings per variant), MIX_SEED, AA_PAIRS (0 = none), AA_FIRST,
# AA_BUDGET (s), TAG (names the files under $OUT).
set -u
export PYTHONUNBUFFERED=1
source bench/device_plotly_stub.sh   # plotly.js, or a stub: diagnose's report.html is then chartless
TAG=${TAG:-b}
mkdir -p "$OUT" /tmp/mix /tmp/aa /tmp/mixruns
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
res="$OUT/mix_$TAG.jsonl"
# the calibration of 2026-12-04 (same kind, same mix.py): amounts stay comparable across calls;
# MIX_SEED: an earlier call's lines instead (its calibration, and the points it finished are skipped)
if [ -n "${MIX_SEED:-}" ]; then cp "$MIX_SEED" "$res"; else head -n 1 bench/results/mix-h200-2026-12-04.jsonl > "$res"; fi
if [ -n "${NAV_ABLATION:-}" ]; then
  # fixtures/gpu/nav_realtime_graphs' label, measured: each of the two remedies that the tuned
  # run applies together, alone, unprofiled (frames median as the workload reports it)
  G="--amp bf16 --channels-last --cuda-graphs --frames 60 --warmup 6"
  for v in "graphs:" "static_post:--static-postprocess" "gpu_pre:--gpu-preprocess --num-workers 2 --pin-memory" \
           "tuned:--static-postprocess --gpu-preprocess --num-workers 2 --pin-memory"; do
    name=${v%%:*}; extra=${v#*:}
    echo "== nav $name" >> "$OUT/nav_ablation_$TAG.txt"
    timeout 120 python3 navdoctor/workloads/navigation.py $G $extra >> "$OUT/nav_ablation_$TAG.txt" 2>&1
  done
  echo "nav ablation done ${SECONDS}s"
fi
if [ -n "${MIX_KINDS:-}" ]; then
  python3 bench/mixed/run_mix.py "$res" /tmp/mix --kinds "$MIX_KINDS" \
      --shares "${MIX_SHARES:-0.1,0.35,0.6}" --budget "${MIX_BUDGET:-500}" ${MIX_NO_DIAGNOSE:+--no-diagnose} \
      --model "${MIX_MODEL:-resnet50}" --repeat "${MIX_REPEAT:-1}" ${MIX_COMPILE:+--compile}
  echo "mix done ${SECONDS}s"
  if [ -z "${MIX_NO_DIAGNOSE:-}" ]; then     # a timings-only call has no capture to pack
    for d in /tmp/mix/runs_*; do ln -sfn "$d" "/tmp/mixruns/${d##*/runs_}"; done
    python3 bench/trim_capture.py /tmp/mixruns /tmp/mixcap_$TAG --max-mb 15 && cp /tmp/mixcap_$TAG-*.tar "$OUT/" 2>/dev/null
    echo "mix packed ${SECONDS}s"
  fi
fi
if [ "${AA_PAIRS:-0}" -gt 0 ]; then
  python3 bench/compare/aa_capture.py /tmp/aa --pairs "$AA_PAIRS" --first "${AA_FIRST:-0}" --budget "${AA_BUDGET:-300}"
  echo "aa captures done ${SECONDS}s"
  cp /tmp/aa/aa.jsonl "$OUT/aa_$TAG.jsonl"
  # one archive per configuration (each under the 16 MiB a file may have on its way back)
  for c in $(cd /tmp/aa && ls -d *_*[ab] | sed 's/_[0-9]*[ab]$//' | sort -u); do
    (cd /tmp/aa && tar -cf "$OUT/aa_${TAG}_$c.tar" $(ls -d ${c}_*[ab] | sed 's|$|/kineto.json.gz|'))
  done
fi
ls -la "$OUT"
echo "all done ${SECONDS}s"
