#!/usr/bin/env bash
# One device call of the SmolLM2 study (recipes/smollm2/README.md, GPU runbook), kept here so that it is tested:
#
#   bash recipes/smollm2/device_call.sh OUTDIR STUDY [replicate.py flags...]
#
# Installs the carried wheels (./.whl, once per machine), runs replicate.py --output STUDY --results-dir OUTDIR with
# the flags, and writes its log to OUTDIR/log as it goes (a call killed at its time limit keeps what it printed),
# the units' records to OUTDIR/units.txt and the per-problem records to OUTDIR. Exits with replicate.py's code
# (0 done, 2 bad input, 3 out of budget: call again), so the caller sees it; the last line says it.
set -o pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash recipes/smollm2/device_call.sh OUTDIR STUDY [replicate.py flags...]" >&2
  exit 2
fi
out=$1
study=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
if [ -d .whl ] && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.installed || { echo "exit 1 (install)"; exit 1; }
fi
if [ -f /tmp/site/.installed ]; then
  export PYTHONPATH=/tmp/site:$(cd "$here/../.." && pwd)
fi
"${PYTHON:-python3}" "$here/replicate.py" --output "$study" --results-dir "$out" "$@" 2>&1 | tee -a "$out/log"
rc=${PIPESTATUS[0]}
tail -n +1 "$study"/*/unit.json "$study"/variants/*/unit.json > "$out/units.txt" 2>/dev/null
cp "$study/report/records.jsonl.gz" "$out/" 2>/dev/null
echo "exit $rc"
exit "$rc"
