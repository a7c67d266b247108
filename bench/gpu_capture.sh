#!/usr/bin/env bash
# On the GPU machine: `navdoctor diagnose` (both passes) on the corpus workloads (as is and
# with --fixed), the rule library's workloads and the bundled workload, then pack each run's
# traces, report and logs into one archive (bench/trim_capture.py makes fixtures of them).
#   source .gpu/prelude.sh && bash bench/gpu_capture.sh ARCHIVE.tar.gz [NAME ...]
# NAME: a key of CMD below; without one, the eight baselines and the two bundled settings.
set -u
archive=$1; shift
runs=/tmp/navdoctor-capture
mkdir -p "$runs"
declare -A CMD=(
  [io_jpeg_decode]="bench/workloads/io_jpeg_decode.py --steps 12"
  [io_slow_storage]="bench/workloads/io_slow_storage.py --steps 12"
  [compute_convnet]="bench/workloads/compute_convnet.py --steps 12"
  [compute_matmul]="bench/workloads/compute_matmul.py --steps 12"
  [memory_pageable_copy]="bench/workloads/memory_pageable_copy.py --steps 12"
  [memory_item_sync]="bench/workloads/memory_item_sync.py --steps 12"
  [launch_batch1_small]="bench/workloads/launch_batch1_small.py --steps 12"
  [launch_python_loop]="bench/workloads/launch_python_loop.py --steps 12"
  [io_jpeg_decode_fixed]="bench/workloads/io_jpeg_decode.py --steps 12 --fixed"
  [io_slow_storage_fixed]="bench/workloads/io_slow_storage.py --steps 12 --fixed"
  [compute_convnet_fixed]="bench/workloads/compute_convnet.py --steps 12 --fixed"
  [compute_matmul_fixed]="bench/workloads/compute_matmul.py --steps 12 --fixed"
  [memory_pageable_copy_fixed]="bench/workloads/memory_pageable_copy.py --steps 12 --fixed"
  [memory_item_sync_fixed]="bench/workloads/memory_item_sync.py --steps 12 --fixed"
  [launch_batch1_small_fixed]="bench/workloads/launch_batch1_small.py --steps 12 --fixed"
  [launch_python_loop_fixed]="bench/workloads/launch_python_loop.py --steps 12 --fixed"
  [memory_um_faults]="bench/workloads/memory_um_faults.py --steps 20"
  [memory_um_faults_fixed]="bench/workloads/memory_um_faults.py --steps 20 --fixed"
  [memory_growth]="bench/workloads/memory_growth.py --steps 20"
  [memory_growth_fixed]="bench/workloads/memory_growth.py --steps 20 --fixed"
  [ops_patterns]="bench/workloads/ops_patterns.py --steps 20"
  [ops_patterns_fixed]="bench/workloads/ops_patterns.py --steps 20 --fixed"
  [nav_default]="navdoctor/workloads/navigation.py"
  [nav_tuned]="navdoctor/workloads/navigation.py --num-workers 4 --pin-memory --persistent-workers --amp bf16 --channels-last"
)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(launch_batch1_small io_jpeg_decode compute_convnet memory_pageable_copy nav_default memory_item_sync launch_python_loop io_slow_storage compute_matmul nav_tuned)
for n in "${names[@]}"; do
  SECONDS=0
  timeout ${PER_RUN_TIMEOUT:-240} python3 -m navdoctor.cli diagnose --out "$runs/$n" -q --json "$runs/$n.report.json" ${CMD[$n]} \
    > "$runs/$n.stdout" 2> "$runs/$n.stderr"
  rc=$?
  verdict=$(python3 -c "import json,sys;r=json.load(open('$runs/$n.report.json'));v=r['verdict'];print(v['bound'],v['confidence'],{k:round(x,2) for k,x in v['shares'].items()},[f['rule'] for f in r['findings']])" 2>/dev/null || tail -n 2 "$runs/$n.stderr")
  printf '%-22s rc=%s %4ss %s\n' "$n" "$rc" "$SECONDS" "$verdict"
  # Re-pack after every run, so a time limit still leaves the runs done so far.
  tar -C "$runs" --exclude='*.nsys-rep' --exclude='*.duckdb' --exclude='*.qdstrm' -czf "$archive.tmp" . 2>/dev/null && mv "$archive.tmp" "$archive"
done
ls -la "$archive"
