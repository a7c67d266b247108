#!/usr/bin/env bash
# GPU: the advice corpus (bench/advice/loops.py). For each kind: `navdoctor diagnose` of the
# loop as is (torch.profiler, Nsight Systems and the timing pass), then every variant timed
# without a tracer in one process, interleaved (loops.py --time-variants), and, for the seed
# script, a trace with the seed article's own profiler settings. Results are appended as they
# come to OUT/timings.jsonl, the captures trimmed into OUT/captures/<kind>/; a kind already in
# timings.jsonl is skipped, so running it again resumes.
#   source .gpu/prelude.sh && bash bench/advice/gpu_advice.sh OUT [KIND ...]
set -u
out=$1; shift
mkdir -p "$out/captures" "$out/runs"
source bench/device_plotly_stub.sh
declare -A VARIANTS=(
  [seed]="no_grad,cuda_graphs,amp_bf16,channels_last,bf16_cl"
  [frame_seg]="gpu_pre,gpu_post,gpu_pre_post"
  [street]="reduce_on_gpu"
  [train_loader]="workers4,workers8,amp_bf16"
  [small_batch1]="cuda_graphs,amp_bf16"
  [sync_metrics]="no_sync"
  [multi_cam]="pinned,amp_bf16"
  [regnet_train]="amp_bf16,channels_last,bf16_cl"
  [conf_map]="gpu_post"
)
kinds=("$@")
[ ${#kinds[@]} -eq 0 ] && kinds=(seed frame_seg street small_batch1 sync_metrics train_loader multi_cam regnet_train conf_map)
gpu=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
for k in "${kinds[@]}"; do
  grep -q "\"kind\": \"$k\"" "$out/timings.jsonl" 2>/dev/null && { echo "$k: done before"; continue; }
  SECONDS=0
  timeout 300 python3 -m navdoctor.cli diagnose --out "$out/runs/$k" -q --json "$out/runs/$k.report.json" \
      bench/advice/loops.py --kind "$k" --steps 30 > "$out/runs/$k.stdout" 2> "$out/runs/$k.stderr"
  echo "$k: diagnose rc=$? ${SECONDS}s $(python3 -c "import json;r=json.load(open('$out/runs/$k.report.json'));v=r['verdict'];print(v['bound'],v['confidence'],v.get('close_to'),[f['rule'] for f in r['findings']][:4])" 2>&1 | tail -n 1)"
  if [ "$k" = seed ]; then
    timeout 120 python3 bench/advice/loops.py --kind seed --seed-profile "$out/runs/seed_profile" > /dev/null 2>&1
    for f in "$out"/runs/seed_profile/*.json; do gzip -c "$f" > "$out/captures/seed_profile.json.gz"; done
  fi
  SECONDS=0
  timeout 240 python3 bench/advice/loops.py --kind "$k" --time-variants "${VARIANTS[$k]}" --rounds 3 --steps 30 \
      2> "$out/runs/$k.timing.stderr" | python3 -c "
import json, sys
for line in sys.stdin:
    if line.startswith('{'):
        d = json.loads(line); d['gpu'] = d.get('gpu') or '$gpu'; print(json.dumps(d), flush=True)
" >> "$out/timings.jsonl"
  echo "$k: timed ${SECONDS}s: $(grep "\"kind\": \"$k\"" "$out/timings.jsonl" | python3 -c "import json,sys;print({(d:=json.loads(l))['variant']:d['median_ms'] for l in sys.stdin})")"
  run=$(ls -d "$out/runs/$k"/*/ 2>/dev/null | tail -n 1)
  if [ -n "$run" ]; then
    mkdir -p "$out/captures/$k"
    cp "$run/kineto.json.gz" "$out/captures/$k/" 2>/dev/null
    cp "$run/report.json" "$out/captures/$k/" 2>/dev/null
    [ -f "$run/nsys.sqlite" ] && python3 -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
from trim_capture import trim_sqlite
trim_sqlite(Path('$run/nsys.sqlite'), Path('$out/captures/$k/nsys.sqlite.gz'))"
  fi
done
rm -rf "$out/runs"/*/*/trace.duckdb "$out/runs"/*/*/*.nsys-rep "$out/runs"/*/*/nsys.sqlite "$out/runs/seed_profile"
du -sh "$out/captures"/* 2>/dev/null
