#!/usr/bin/env bash
# One GPU call of issue #17 evidence (2026-12-05): the rule library's new classes of data on a
# real GPU. For each workload (unified-memory faults, memory growth, torch.profiler's op
# anti-patterns) and its fixed twin: unprofiled timings (interleaved), then `navdoctor
# diagnose` (both passes); the run directories are trimmed into fixtures and packed for the
# trip back. VERIFY_OPT=1: then `navdoctor verify` of the optimizer remedies on ops_patterns.
#   source .gpu/prelude.sh && bash bench/gpu_session_c.sh
# Env: EV_WORKLOADS (default all three), EV_REPEATS (timing rounds, default 2), EV_STEPS (20),
# VERIFY_OPT, VERIFY_REPEATS (3), VERIFY_ARGS (extra workload arguments), TAG.
set -u
export PYTHONUNBUFFERED=1
source bench/device_plotly_stub.sh   # plotly.js, or a stub: diagnose's report.html is then chartless
TAG=${TAG:-c}
WL=${EV_WORKLOADS:-memory_um_faults,memory_growth,ops_patterns}
mkdir -p "$OUT" /tmp/ev/runs
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/ev_$TAG.txt"
if [ "${EV_REPEATS:-2}" -gt 0 ]; then
  for rep in $(seq "${EV_REPEATS:-2}"); do
    for w in ${WL//,/ }; do
      for f in "" --fixed; do
        timeout 120 python3 bench/workloads/$w.py --steps 30 $f 2>&1 | tail -n 2 >> "$OUT/ev_$TAG.txt"
      done
    done
  done
  echo "timings done ${SECONDS}s" | tee -a "$OUT/ev_$TAG.txt"
fi
if [ "${EV_DIAGNOSE:-1}" = 1 ]; then
  for w in ${WL//,/ }; do
    for f in "" --fixed; do
      id=$w${f:+_fixed}
      timeout 240 python3 -m navdoctor.cli diagnose -q --out /tmp/ev/runs/$id bench/workloads/$w.py \
          --steps "${EV_STEPS:-20}" $f > "/tmp/ev/$id.txt" 2>&1
      echo "== $id rc=$? ${SECONDS}s" >> "$OUT/ev_$TAG.txt"
      tail -n 40 "/tmp/ev/$id.txt" >> "$OUT/ev_$TAG.txt"
    done
  done
  python3 bench/trim_capture.py /tmp/ev/runs /tmp/evcap_$TAG --max-mb 15 && cp /tmp/evcap_$TAG-*.tar "$OUT/"
  echo "diagnose done ${SECONDS}s" | tee -a "$OUT/ev_$TAG.txt"
fi
if [ -n "${VERIFY_OPT:-}" ]; then
  timeout 400 python3 -m navdoctor.cli verify --out /tmp/ev/verify --repeats "${VERIFY_REPEATS:-3}" --warmup 3 --steps 12 \
      --remedy zero_grad_set_to_none,foreach_optimizer,zero_grad_set_to_none+foreach_optimizer \
      --json "$OUT/verify_opt_$TAG.json" bench/workloads/ops_patterns.py --steps 40 ${VERIFY_ARGS:-} \
      > "$OUT/verify_opt_$TAG.txt" 2>&1
  echo "verify done rc=$? ${SECONDS}s" | tee -a "$OUT/ev_$TAG.txt"
fi
ls -la "$OUT"
echo "all done ${SECONDS}s"
