#!/usr/bin/env bash
# Held-out scripts of three third-party frameworks (Lightning, timm, transformers) on the GPU,
# as a new user would run them: each case `navdoctor diagnose`d (both traced passes and the
# timing pass), then its remedies measured by `navdoctor verify`; the reports, verify's JSON,
# the logs and the trimmed captures packed into one archive under $OUT (a call brings back few
# files). Resumable across calls only by naming the cases left (CASES).
#   source .gpu/prelude.sh && CASES="lt_w0_jitter timm_tiny_480" LIMIT=560 \
#       bash bench/thirdparty/heldout_frameworks.sh
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/hf
source bench/device_plotly_stub.sh
T=bench/thirdparty
declare -A ARGS REM
# Lightning training (ResNet-50 / Wide ResNet-50-2), a 0-worker loader: JPEG decode + augment on the CPU
ARGS[lt_w0_jitter]="$T/lightning_train.py --workers 0 --steps 60 --crop 176 --size 256"
REM[lt_w0_jitter]="num_workers amp_bf16+channels_last"
ARGS[lt_w0_wide]="$T/lightning_train.py --workers 0 --steps 60 --model wide_resnet50_2 --crop 224 --size 232 --light"
REM[lt_w0_wide]="num_workers amp_bf16+channels_last"
# timm inference, a 0-worker loader with timm's eval transform
ARGS[timm_tiny_480]="$T/timm_infer.py --model convnext_tiny --workers 0 --batches 40 --size 480"
REM[timm_tiny_480]="num_workers amp_bf16+channels_last"
ARGS[timm_base_160]="$T/timm_infer.py --model convnext_base --workers 0 --batches 40 --size 160"
REM[timm_base_160]="num_workers amp_bf16+channels_last"
# transformers SegFormer per frame, the image processor on the CPU (--gpu-preprocess: its remedy as code)
ARGS[seg_b2_720]="$T/hf_segformer_frames.py --variant b2 --height 720 --frames 50"
REM[seg_b2_720]="amp_bf16"
ARGS[seg_b2_720_gpupre]="$T/hf_segformer_frames.py --variant b2 --height 720 --frames 50 --gpu-preprocess"
REM[seg_b2_720_gpupre]="amp_bf16"
ARGS[seg_b2_360]="$T/hf_segformer_frames.py --variant b2 --height 360 --frames 50"
REM[seg_b2_360]="amp_bf16"
ARGS[seg_b2_360_gpupre]="$T/hf_segformer_frames.py --variant b2 --height 360 --frames 50 --gpu-preprocess"
REM[seg_b2_360_gpupre]="amp_bf16"
LIMIT=${LIMIT:-560}
for c in $CASES; do
  left=$((LIMIT - SECONDS))
  if [ "$left" -lt 100 ]; then echo "skip $c: ${left}s left"; continue; fi
  d=/tmp/hf/$c; mkdir -p "$d"
  if [ "${NO_DIAGNOSE:-}" != 1 ] && [ "${c%_gpupre}" = "$c" ]; then
    timeout $((left - 60)) python3 -m navdoctor diagnose --out "$d/runs" --json "$d/report.json" \
        ${ARGS[$c]} > "$d/diagnose.log" 2>&1
    echo "$c diagnose rc $? ${SECONDS}s"
  fi
  rem=(); for r in ${REM[$c]}; do rem+=(--remedy "$r"); done
  left=$((LIMIT - SECONDS))
  timeout $((left - 20)) python3 -m navdoctor verify --out "$d/runs" --json "$d/verify.json" \
      --repeats 3 --priming-runs 0 --warmup 5 --steps 20 "${rem[@]}" ${ARGS[$c]} > "$d/verify.log" 2>&1
  echo "$c verify rc $? ${SECONDS}s"
done
# trimmed captures (diagnose's latest run per case) and everything else small
mkdir -p /tmp/hfruns
for d in /tmp/hf/*/; do c=$(basename "$d"); [ -d "$d/runs" ] && ln -sfn "$d/runs" "/tmp/hfruns/$c"; done
python3 bench/trim_capture.py /tmp/hfruns /tmp/hfcap_${TAG:-a} --max-mb 20 >/dev/null 2>&1 || echo "trim failed"
tar -C /tmp --exclude='*/runs/*' -cf "$OUT/hf_${TAG:-a}_logs.tar" hf
cp /tmp/hfcap_${TAG:-a}-*.tar "$OUT/" 2>/dev/null
ls -la "$OUT"; echo "all done ${SECONDS}s"
