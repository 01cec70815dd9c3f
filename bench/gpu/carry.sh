#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what a GPU call carries: bench/gpu/carried_packages.txt as Python 3.12 x86-64
# wheels, DeepSpeed built into a wheel by PYTHON (a Python 3.12 with the device's torch: the pre-flight's venv).
# Does nothing when .whl/ was made from the same list.
#
#   bash bench/gpu/carry.sh PYTHON        # needs the package registry (PyPI)
set -euo pipefail
python=${1:?usage: bash bench/gpu/carry.sh PYTHON (a Python 3.12 with torch, e.g. the pre-flight venv)}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/.whl/" "$exclude" 2>/dev/null || echo "/.whl/" >> "$exclude"
stamp=$(sha256sum bench/gpu/carried_packages.txt | cut -d' ' -f1)
if [ "$(cat .whl/.made-from 2>/dev/null)" = "$stamp" ]; then
  echo ".whl/ is up to date ($(du -sh .whl | cut -f1))"
  exit 0
fi
rm -rf .whl && mkdir -p .whl
mapfile -t wanted < <(grep -vE '^\s*(#|$)' bench/gpu/carried_packages.txt)
for spec in "${wanted[@]}"; do
  if [ "${spec%%==*}" = deepspeed ]; then
    DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$spec"
  else
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$spec"
  fi
done 2>&1 | grep -vE "Location|WARNING" || true
[ "$(ls -1 .whl/*.whl | wc -l)" -eq "${#wanted[@]}" ] || { echo "error: .whl/ holds $(ls -1 .whl/*.whl | wc -l) wheels, ${#wanted[@]} wanted" >&2; exit 1; }
echo "$stamp" > .whl/.made-from
echo ".whl/: ${#wanted[@]} wheels, $(du -sh .whl | cut -f1)"
