#!/usr/bin/env bash
# The CPU pre-flight of a GPU window: runs the window's own command (run_all.sh) at tiny scale in an environment
# that mirrors the GPU machine, so a call never fails there on something this machine could have caught.
#
#   bash bench/gpu/preflight.sh [OUT [RUN_ALL_FLAGS...]]   # default OUT: /tmp/trims-preflight; flags such as
#                                                           # --student llada2 --parts decode,train go to run_all.sh
#
# 1. A Python 3.12 virtual environment (PYTHON312, default: the first python3.12 found) holding the device's own
#    packages at its versions (bench/gpu/device_packages.txt: torch 2.11, whose CUDA build runs on a CPU,
#    transformers 5.17, ...), kept in PREFLIGHT_VENV (default ~/.cache/trims-preflight-py312) and remade when
#    that list changes.
# 2. What a call carries, made here: .whl/ (bench/gpu/carry.sh) and .carry/shared/fixtures, a copy of the tests'
#    fixtures (only the checkout travels to the device; both folders are git-ignored, never committed).
# 3. run_all.sh at --scale tiny with that Python, the wheels installed into a fresh folder exactly as on the device
#    (--no-index --no-deps --target, first on PYTHONPATH). Exit code: run_all.sh's.
#
# The device call is then:  bash bench/gpu/run_all.sh $OUT --shared .carry/shared    (carry [".whl", ".carry"])
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-/tmp/trims-preflight}
shift $(( $# > 0 ? 1 : 0 ))
source bench/gpu/venv.sh
bash bench/gpu/carry.sh "$venv/bin/python"
exclude="$(git rev-parse --git-path info/exclude)"
grep -qxF "/.carry/" "$exclude" 2>/dev/null || echo "/.carry/" >> "$exclude"
shared=${SHARED_DIR:-$root/../shared}
rm -rf .carry/shared && mkdir -p .carry/shared && cp -r "$shared/fixtures" .carry/shared/
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs/results' || echo '+uncommitted')" > .carry/commit
echo "carried: .whl $(du -sh .whl | cut -f1), .carry $(du -sh .carry | cut -f1), tracked tree $(git ls-files -z | du -ch --files0-from=- | tail -1 | cut -f1)"
rm -rf "$out"
# No deadline to speak of: on a CPU shared with other jobs the tiny parts take minutes, and the point is that none fails.
PYTHON=$venv/bin/python SITE=$(mktemp -d)/site PYTHONNOUSERSITE=1 bash bench/gpu/run_all.sh "$out" --scale tiny --shared .carry/shared \
  --deadline 3600 "$@"
