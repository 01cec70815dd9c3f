#!/usr/bin/env bash
# The device calls of one GPU window of the SmolLM2 study (recipes/smollm2/README.md, GPU runbook), kept here so that
# they are tested and pre-flown (recipes/smollm2/preflight.sh). The GGUF travels cut into parts, one a call, as many as
# the pre-flight needed (.gguf-a, .gguf-b, ...: no call may carry more than 64 MiB with the tree); the last part's
# folder holds the whole file's sha256. Run from the checkout's root on the device, back to back on one machine:
#
#   bash recipes/smollm2/device_call.sh 1 OUT                          # carry [".whl-smollm2", ".gguf-a"]
#   bash recipes/smollm2/device_call.sh N OUT [replicate.py flags...]  # carry [".gguf-<N-th letter>"], after call N-1
#
# Call 1 installs the carried wheels (bench/gpu/install.sh, into SITE); every call keeps its part in GGUF_DIR (default
# /tmp/gguf). The last call (its part holds sha256) joins the parts, checks the sha256, and runs replicate.py --output
# STUDY (default /tmp/study) --results-dir OUT --gguf GGUF_DIR/... with a --budget-minutes that has every unit end
# DEADLINE_S (default 510) seconds after the call started (the report and the copies follow, so the call ends inside
# ~9 minutes); replicate.py's flags go with it alone. Its log goes to OUT/log as it goes (a call killed at its limit
# keeps it), the units' records to OUT/units.txt, the per-problem records to OUT. Exit codes, also on the last line:
# 0 done (the report names a tail dropped for time; or a part kept), 1 install or GGUF check failed, 2 usage, or an
# earlier call's part is gone (the machine went back between the calls: start again at call 1), 3 the main
# comparison is unfinished (replicate.py).
set -o pipefail
usage() { sed -n '7,8p' "$0" | sed 's/^#  */usage: /' >&2; echo "exit 2"; exit 2; }
letters=(a b c d e f g h)
[ $# -ge 2 ] && [[ "$1" =~ ^[1-8]$ ]] || usage
call=$1 out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
gguf_dir=${GGUF_DIR:-/tmp/gguf}
gguf=$gguf_dir/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export WHEELS=${WHEELS:-.whl-smollm2}  # recipes/smollm2/preflight.sh makes it: bench/gpu's wheels less DeepSpeed's
letter=${letters[call - 1]}
part=.gguf-$letter
[ -f "$part/part" ] || { echo "error: $part/part is not here (call $call carries $part)"; echo "exit 2"; exit 2; }
for earlier in "${letters[@]:0:call - 1}"; do
  [ -f "$gguf_dir/$earlier" ] || { echo "error: $gguf_dir/$earlier is gone (the machine went back after an earlier call): start again at call 1"; echo "exit 2"; exit 2; }
done
if [ ! -f "$part/sha256" ] && [ $# -gt 0 ]; then
  echo "error: call $call carries a middle part ($part has no sha256): replicate.py's flags ($*) go with the last call"
  echo "exit 2"; exit 2
fi
if [ "$call" = 1 ]; then
  ROOT=$root source "$root/bench/gpu/install.sh" || { echo "exit 1"; exit 1; }
fi
mkdir -p "$gguf_dir" && cp "$part/part" "$gguf_dir/$letter" || { echo "exit 1"; exit 1; }
if [ ! -f "$part/sha256" ]; then
  echo "call $call done in ${SECONDS}s: GGUF part $letter kept$([ "$call" = 1 ] && echo ", wheels installed"); make call $((call + 1)) now"
  echo "exit 0"
  exit 0
fi
(cd "$gguf_dir" && cat "${letters[@]:0:call}") > "$gguf" && echo "$(cat "$part/sha256")  $gguf" | sha256sum -c --quiet \
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
