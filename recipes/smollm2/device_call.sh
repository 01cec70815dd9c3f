#!/usr/bin/env bash
# The two device calls of one GPU window of the SmolLM2 study (recipes/smollm2/README.md, GPU runbook), kept here so
# that they are tested and pre-flown (recipes/smollm2/preflight.sh). Run from the checkout's root on the device:
#
#   bash recipes/smollm2/device_call.sh 1 OUT                          # carry [".whl-smollm2", ".gguf-a"]
#   bash recipes/smollm2/device_call.sh 2 OUT [replicate.py flags...]  # carry [".gguf-b"], right after call 1
#
# Call 1 installs the carried wheels (bench/gpu/install.sh, into SITE) and keeps the GGUF's first part in GGUF_DIR
# (default /tmp/gguf). Call 2, on the same warm machine, appends the second part, checks the whole file's sha256, and
# runs replicate.py --output STUDY (default /tmp/study) --results-dir OUT --gguf GGUF_DIR/... with a --budget-minutes
# that has every unit end DEADLINE_S (default 510) seconds after the call started (the report and the copies follow,
# so the call ends inside ~9 minutes). Its log goes to OUT/log as it goes (a call killed at its limit keeps it), the
# units' records to OUT/units.txt, the per-problem records to OUT. Exit codes, also on the last line: 0 done (the
# report names a tail dropped for time), 1 install or GGUF check failed, 2 usage, or call 1's files are gone (the
# machine went back between the calls: start again at call 1), 3 the main comparison is unfinished (replicate.py).
set -o pipefail
usage() { sed -n '5,6p' "$0" | sed 's/^#  */usage: /' >&2; echo "exit 2"; exit 2; }
[ $# -ge 2 ] && { [ "$1" = 1 ] || [ "$1" = 2 ]; } || usage
call=$1 out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
gguf_dir=${GGUF_DIR:-/tmp/gguf}
gguf=$gguf_dir/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export WHEELS=${WHEELS:-.whl-smollm2}  # recipes/smollm2/preflight.sh makes it: bench/gpu's wheels less DeepSpeed's
if [ "$call" = 1 ]; then
  [ -f .gguf-a/part ] || { echo "error: .gguf-a/part is not here (carry .gguf-a)"; echo "exit 2"; exit 2; }
  ROOT=$root source "$root/bench/gpu/install.sh" || { echo "exit 1"; exit 1; }
  mkdir -p "$gguf_dir" && cp .gguf-a/part "$gguf_dir/a" || { echo "exit 1"; exit 1; }
  echo "call 1 done in ${SECONDS}s: wheels installed, first GGUF part kept; make call 2 now"
  echo "exit 0"
  exit 0
fi
[ -f "$gguf_dir/a" ] || { echo "error: $gguf_dir/a is gone (the machine went back after call 1): start again at call 1"; echo "exit 2"; exit 2; }
[ -f .gguf-b/part ] && [ -f .gguf-b/sha256 ] || { echo "error: .gguf-b/ is not here (carry .gguf-b)"; echo "exit 2"; exit 2; }
cat "$gguf_dir/a" .gguf-b/part > "$gguf" && echo "$(cat .gguf-b/sha256)  $gguf" | sha256sum -c --quiet \
  || { echo "error: the joined GGUF is not the one carried (sha256)"; echo "exit 1"; exit 1; }
ROOT=$root source "$root/bench/gpu/install.sh" || { echo "exit 1"; exit 1; }
minutes=$(awk -v left=$(( ${DEADLINE_S:-510} - SECONDS )) 'BEGIN { printf "%.2f", (left > 1 ? left : 1) / 60 }')
study=${STUDY:-/tmp/study}
"${PYTHON:-python3}" "$here/replicate.py" --output "$study" --results-dir "$out" --gguf "$gguf" \
  --budget-minutes "$minutes" "$@" 2>&1 | tee -a "$out/log"
rc=${PIPESTATUS[0]}
tail -n +1 "$study"/*/unit.json "$study"/variants/*/unit.json > "$out/units.txt" 2>/dev/null
cp "$study/report/records.jsonl.gz" "$out/" 2>/dev/null
echo "exit $rc"
exit "$rc"
