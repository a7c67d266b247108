#!/usr/bin/env bash
# On the GPU machine: everything the accuracy (docs/accuracy.md), verify (docs/verify.md) and
# performance (docs/performance.md, `nsys analyze` reference) documents quote, in one go.
#
#   source .gpu/prelude.sh && bash bench/gpu_evidence.sh RESULTS_DIR [PHASE ...]
#
# PHASE: corpus (every corpus entry through `navdoctor diagnose`, both passes, with the
# confusion matrix; each run's traces trimmed into RESULTS_DIR/fixtures-N.tar), verify (the
# remedy measurements), timing (unprofiled before/after step times of every remedy pair,
# interleaved), nsys-analyze (`nsys analyze` and navdoctor on a generated 1 M-kernel export).
# Default: verify, corpus, timing, nsys-analyze (most wanted first, should time run out). Each
# phase writes PHASE.log in RESULTS_DIR and "== PHASE done" at its end; a phase's failure does
# not stop the next one. Runs long (about 30 min on an H200): start it detached and read the
# logs as they grow.
set -u
results=$(realpath -m "$1"); shift
mkdir -p "$results"
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(verify corpus timing nsys-analyze)
export PYTHONUNBUFFERED=1
py=python3
measured() {  # measured CMD... : wall time and peak RSS of CMD and its children, on stderr
  $py -c 'import resource, subprocess, sys, time
t = time.time(); rc = subprocess.call(sys.argv[1:])
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
print(f"measured: rc={rc} wall={time.time() - t:.1f}s peak_rss={rss:.2f}GB: {sys.argv[1:]}", file=sys.stderr)' "$@"
}
verify() {  # verify NAME ARGS... : one `navdoctor verify`, its JSON and table kept
  local name=$1; shift
  echo "== verify $name: $*"
  $py -m navdoctor.cli verify --out "$results/verify-runs" --json "$results/verify-$name.json" "$@" \
    2>&1 | tee "$results/verify-$name.txt"
}

for phase in "${phases[@]}"; do
  SECONDS=0
  {
    echo "== $phase: $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
    case $phase in
      corpus)
        $py bench/run_corpus.py --runs-dir "$results/corpus-runs"
        $py bench/trim_capture.py "$results/corpus-runs" "$results/fixtures"
        ;;
      verify)
        # The I/O workload: the loader remedies. The compute workload: bf16 autocast. The launch
        # workload: CUDA graphs (torch.compile reduce-overhead). A remedy that applies but
        # cannot help: cudnn.benchmark on a GEMM-only model (it tunes convolutions only).
        verify io --classify --repeats 3 --warmup 3 --steps 12 --remedy num_workers,num_workers+pin_memory \
          bench/workloads/io_jpeg_decode.py --steps 40
        verify compute --classify --repeats 3 --warmup 3 --steps 12 --remedy amp_bf16 \
          bench/workloads/compute_convnet.py --steps 40
        verify launch --classify --repeats 3 --warmup 5 --steps 20 --remedy cuda_graphs,compile \
          bench/workloads/launch_batch1_small.py --steps 200
        verify no-effect --repeats 3 --warmup 3 --steps 12 --remedy cudnn_benchmark \
          bench/workloads/compute_matmul.py --steps 40
        ;;
      timing)
        $py bench/run_corpus.py --no-diagnose --timing-repeats "${TIMING_REPEATS:-3}" \
          --only "${TIMING_ONLY:-io-jpeg-decode,io-jpeg-decode-fixed,io-slow-storage,io-slow-storage-fixed,compute-convnet,compute-convnet-fixed,compute-matmul,compute-matmul-fixed,memory-pageable-copy,memory-pageable-copy-fixed,memory-item-sync,memory-item-sync-fixed,launch-batch1-small,launch-batch1-small-fixed,launch-python-loop,launch-python-loop-fixed,navigation-batched,navigation-batched-tuned,navigation-realtime,navigation-realtime-tuned}"
        ;;
      nsys-analyze)
        # `nsys analyze` on the benchmark's 1 M-kernel export, as a reference for issue #7.
        $py bench/perf/make_traces.py --out /tmp/navdoctor-perf --kineto-mb --nsys-mrows 1 &&
        for f in /tmp/navdoctor-perf/nsys_1m_kernels.sqlite; do
          ls -la "$f"
          measured nsys analyze "$f" > "$results/nsys-analyze-1m.txt"
          measured $py -m navdoctor.cli analyze "$f" -q --json "$results/navdoctor-1m.json"
        done
        ;;
      *) echo "unknown phase $phase" ;;
    esac
    echo "== $phase done in ${SECONDS}s"
  } > "$results/$phase.log" 2>&1
done
