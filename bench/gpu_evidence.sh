#!/usr/bin/env bash
# On the GPU machine: everything the accuracy (docs/accuracy.md), verify (docs/verify.md) and
# performance (docs/performance.md, `nsys analyze` reference) documents quote, in one go.
#
#   source .gpu/prelude.sh && bash bench/gpu_evidence.sh RESULTS_DIR [PHASE ...]
#
# PHASE: corpus (corpus entries through `navdoctor diagnose`, both passes, with the confusion
# matrix; each run's traces trimmed into RESULTS_DIR/fixtures-N.tar; CORPUS_ONLY=id,id to run
# a subset; verdicts appended to RESULTS_DIR/verdicts.jsonl, or to CORPUS_RESULTS, and then
# those already in that file are reused; CORPUS_BUDGET=SECONDS starts no entry after that, so a
# corpus longer than one call is this phase repeated with the same CORPUS_RESULTS; TRIM=0
# makes no fixtures), verify-io, verify-compute, verify-launch, verify-no-effect (the remedy
# measurements of docs/verify.md; `verify` runs all four), timing (unprofiled before/after step
# times of the remedy pairs, interleaved; TIMING_ONLY=id,id and TIMING_REPEATS=N), nsys-analyze
# (`nsys analyze` and navdoctor on a generated 1 M-kernel export).
# Default: verify, corpus, timing, nsys-analyze. Each phase appends to PHASE.log in RESULTS_DIR
# (and to stdout) and "== PHASE done" at its end; a phase's failure does not stop the next.
# RUNS_DIR: where the corpus's run directories go (default RESULTS_DIR/corpus-runs; put them
# outside $OUT on the GPU machine, which brings back only 8 files).
#
# Everything takes well over the 10 minutes one call may run, and a detached job does not
# outlive its machine: run phases in the foreground, about 9 minutes per call, and copy
# RESULTS_DIR/*.log, *.json and fixtures-*.tar to $OUT at the end of each call. Measured on
# an H200, without priming runs: verify 8 min 45 s for all four; corpus ~40 s per entry;
# timing 330 s for the first three pairs at 3 repeats (5-10 s of start-up per run). With
# priming runs: verify-launch over 250 s (12 runs, then 3 profiled passes); cuda_graphs alone
# without --classify 66 s; timing ~60 s per small pair; the whole corpus (22 entries) 868 s of
# corpus phases over 3 calls, 20-100 s per entry (the realtime entries with CUDA graphs
# 65-97 s: they compile first); the realtime timing pair at 3 repeats 103 s. With
# RESULTS_DIR=$OUT, RUNS_DIR=/tmp/..., CORPUS_RESULTS and CORPUS_BUDGET a killed call still
# leaves its verdicts and logs in $OUT.
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
        runs=${RUNS_DIR:-$results/corpus-runs}
        $py bench/run_corpus.py --runs-dir "$runs" ${CORPUS_ONLY:+--only "$CORPUS_ONLY"} \
          --results "${CORPUS_RESULTS:-$results/verdicts.jsonl}" ${CORPUS_RESULTS:+--resume} \
          ${CORPUS_BUDGET:+--budget "$CORPUS_BUDGET"}
        # Trimmed in a scratch folder; only the archives go to RESULTS_DIR (the GPU machine
        # brings back 8 files). TRIM=0: no fixtures.
        if [ "${TRIM:-1}" = 1 ] && [ -d "$runs" ]; then
          scratch=$(mktemp -d) && $py bench/trim_capture.py "$runs" "$scratch/fixtures" &&
            cp "$scratch"/fixtures-*.tar "$results/"
        fi
        ;;
      verify|verify-io|verify-compute|verify-launch|verify-no-effect)
        # The I/O workload: the loader remedies. The compute workload: bf16 autocast. The launch
        # workload: CUDA graphs (torch.compile reduce-overhead), and compile alone beside it. A
        # remedy that applies but cannot help: cudnn.benchmark on a GEMM-only model (it tunes
        # convolutions only).
        case $phase in verify|verify-io)
          verify io --classify --repeats 3 --warmup 3 --steps 12 --remedy num_workers,num_workers+pin_memory \
            bench/workloads/io_jpeg_decode.py --steps 40 ;; esac
        case $phase in verify|verify-compute)
          verify compute --classify --repeats 3 --warmup 3 --steps 12 --remedy amp_bf16 \
            bench/workloads/compute_convnet.py --steps 40 ;; esac
        case $phase in verify|verify-launch)
          verify launch --classify --repeats 3 --warmup 5 --steps 20 --remedy cuda_graphs,compile \
            bench/workloads/launch_batch1_small.py --steps 200 ;; esac
        case $phase in verify|verify-no-effect)
          verify no-effect --repeats 3 --warmup 3 --steps 12 --remedy cudnn_benchmark \
            bench/workloads/compute_matmul.py --steps 40 ;; esac
        ;;
      timing)
        $py bench/run_corpus.py --no-diagnose --timing-repeats "${TIMING_REPEATS:-3}" \
          ${TIMING_ONLY:+--only "$TIMING_ONLY"}
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
  } 2>&1 | tee -a "$results/$phase.log"
done
