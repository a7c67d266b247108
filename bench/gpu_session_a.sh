#!/usr/bin/env bash
# One GPU call of issue #14/#20/#13 evidence (2026-12-04): the bundled workload diagnosed
# (both passes), the A/A capture pairs compared on the device, then the mixed corpus begun.
#   source .gpu/prelude.sh && bash bench/gpu_session_a.sh  (writes under $OUT)
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/aa" "$OUT/mix" /tmp/nav /tmp/aa /tmp/mix
SECONDS=0
[ -n "${SKIP_NAV:-}" ] || timeout 120 python3 -m navdoctor.cli diagnose --out /tmp/nav -q --json "$OUT/nav_report.json" > /tmp/nav.log 2>&1
echo "nav rc=$? ${SECONDS}s"
[ -n "${SKIP_NAV:-}" ] || tar -C /tmp/nav --exclude='*.nsys-rep' --exclude='*.duckdb' --exclude='*.qdstrm' -czf "$OUT/nav_run.tgz" . /tmp/nav.log 2>/dev/null
python3 bench/compare/aa_capture.py /tmp/aa --pairs 4 --budget "${AA_BUDGET:-300}" ${AA_ARGS:-}
echo "aa captures done ${SECONDS}s"
ls -d /tmp/aa/*_*a | while read a; do b="${a%a}b"; [ -f "$b/kineto.json.gz" ] && echo "$a $b"; done \
  | xargs -P 4 -L 1 sh -c 'python3 -m navdoctor.cli compare "$0" "$1" -q --json "$0.compare.json" > "$0.compare.txt" 2>&1; echo "$(basename $0) rc=$?"'
cp /tmp/aa/aa.jsonl "$OUT/aa/" 2>/dev/null
tar -C /tmp/aa -czf "$OUT/aa_compare.tgz" $(cd /tmp/aa && ls *.compare.json *.compare.txt aa.jsonl 2>/dev/null)
echo "aa compare done ${SECONDS}s"
[ -n "${MIX_RESUME:-}" ] && cp "$MIX_RESUME" "$OUT/mix/results.jsonl"
[ -n "${SKIP_MIX:-}" ] || python3 bench/mixed/run_mix.py "$OUT/mix/results.jsonl" /tmp/mix --budget "${MIX_BUDGET:-120}"
[ -n "${SKIP_MIX:-}" ] || tar -C /tmp/mix -czf "$OUT/mix_files.tgz" $(cd /tmp/mix && ls *.json *.json.gz *.sqlite.gz 2>/dev/null)
echo "all done ${SECONDS}s"
