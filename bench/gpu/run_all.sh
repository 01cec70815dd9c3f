#!/usr/bin/env bash
# One GPU window, from one command: install what the call carries, record the machine, then run the parts most
# important first, each under its own time budget (bench/gpu/budgets.py: FLOP and byte counts on an H100), inside a
# hard deadline for the whole; a part that would cross the deadline is skipped with a line. Everything is written
# into OUT as it happens, so a call killed at its limit keeps what was done.
#
#   bash bench/gpu/run_all.sh OUT [--scale real|tiny] [--deadline SECONDS] [--parts tests,decode,train,recipe,score,zero2]
#                                 [--profile | --profile-worst FILE] [--shared DIR] [--student llada|dream|llada_moe|llada2]
#                                 [--decode-batches 1[,N...]]
#
# --decode-batches narrows the decode part to those batches (default 1,16): `1` alone is the batch-1 rows, where the
# forward's bound is judged, in about half the decode part's budget.
#
#   OUT/log.txt          everything printed, part by part
#   OUT/env.json         GPU, driver, CUDA, Python and library versions, commit, date
#   OUT/parts.jsonl      the budgets' arithmetic, then one line per part: ran / failed / timed out / skipped, seconds
#   OUT/real_size.jsonl  bench/real_size.py's measurement lines (train, recipe, decode, score, zero2)
#   OUT/train_profile.txt the train part's profiled step, summarised (bench/train_profile.py)
#   OUT/tests.xml        JUnit report of tests/test_cuda_correctness.py (at real scale only the CUDA variants)
#   OUT/profile.txt      with --profile: torch.profiler tables of the parts run (their timings are not benchmarks);
#                        --profile-worst FILE profiles only the part that missed its goal by most in FILE (a
#                        real_size.jsonl of an earlier run: bench/gpu/worst_part.py), and does nothing if none did
#
# PYTHON (default python3) runs everything; the carried wheels WHEELS/*.whl (default .whl/, made by
# bench/gpu/carry.sh) are installed into SITE (default /tmp/trims-site) by bench/gpu/install.sh and put first on
# PYTHONPATH, as the device has no network. --shared names
# the folder holding fixtures/ (default: ../shared beside the repository; TRIMS_SHARED for the tests). Exit 0 when
# every part asked for ran and passed, 1 otherwise, 2 on a usage error.
set -uo pipefail
usage() { sed -n '7,9p' "$0" | sed 's/^#  */usage: /' >&2; exit 2; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
out=$1; shift
scale=real deadline=480 parts=tests,decode,train,recipe,score,zero2 profile=0 student=llada
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=$root/../shared
while [ $# -gt 0 ]; do
  case $1 in --scale|--deadline|--parts|--profile-worst|--shared|--student|--decode-batches)
    [ $# -ge 2 ] || { echo "error: $1 needs a value" >&2; exit 2; } ;;
  esac
  case $1 in
    --scale) scale=${2:-}; shift 2 ;;
    --deadline) deadline=${2:-}; shift 2 ;;
    --parts) parts=${2:-}; shift 2 ;;
    --profile) profile=1; shift ;;
    --profile-worst) profile=1; worst_from=${2:-}; shift 2 ;;
    --shared) shared=${2:-}; shift 2 ;;
    --student) student=${2:-}; shift 2 ;;
    --decode-batches) decode_batches=${2:-}; shift 2 ;;
    *) echo "error: unknown argument $1" >&2; usage ;;
  esac
done
case $scale in real|tiny) ;; *) echo "error: --scale must be real or tiny, got '$scale'" >&2; exit 2 ;; esac
case $student in llada|dream|llada_moe|llada2) ;; *) echo "error: --student must be llada, dream, llada_moe or llada2, got '$student'" >&2; exit 2 ;; esac
[[ $deadline =~ ^[0-9]+$ ]] || { echo "error: --deadline must be whole seconds, got '$deadline'" >&2; exit 2; }
budget_flags=()
if [ -n "${decode_batches+set}" ]; then  # real_size_parts.decode.parse_decode_batches's rule, checked before anything
  # is written (its Python needs the carried wheels); tests/test_gpu_window.py holds the two to the same answers
  [[ $decode_batches =~ ^[0-9]+(,[0-9]+)*$ ]] \
    || { echo "error: --decode-batches must be whole numbers, comma-separated (e.g. 1 or 1,16), got '$decode_batches'" >&2; exit 2; }
  rising=1 previous=0
  [ "$((10#${decode_batches%%,*}))" = 1 ] || rising=0
  for batch in ${decode_batches//,/ }; do
    [ "$((10#$batch))" -gt "$previous" ] || rising=0
    previous=$((10#$batch))
  done
  [ $rising = 1 ] \
    || { echo "error: --decode-batches must be rising batch sizes starting at 1 (e.g. 1 or 1,16), got '$decode_batches'" >&2; exit 2; }
  budget_flags=(--decode-batches "$decode_batches")
fi
[ -n "${parts//,/}" ] || { echo "error: --parts names no part (tests, train, recipe, decode, score, zero2)" >&2; exit 2; }
for part in ${parts//,/ }; do
  case $part in tests|train|recipe|decode|score|zero2) ;; *) echo "error: --parts: unknown part '$part' (tests, train, recipe, decode, score, zero2)" >&2; exit 2 ;; esac
done
[ -d "$shared/fixtures" ] || { echo "error: --shared: $shared/fixtures does not exist (the tests' fixtures)" >&2; exit 2; }
if [ -n "${worst_from:-}" ]; then
  [ -f "$worst_from" ] || { echo "error: --profile-worst: $worst_from does not exist" >&2; exit 2; }
  worst=$(cd "$root" && "${PYTHON:-python3}" bench/gpu/worst_part.py "$worst_from") || exit 2
  [ -n "$worst" ] || { echo "every judged goal in $worst_from was met: nothing to profile"; exit 0; }
  echo "profiling the part furthest from its goals in $worst_from: $worst (part, shortfall)"
  parts=${worst%% *}
fi
start=$SECONDS
python=${PYTHON:-python3}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
exec > >(tee -a "$out/log.txt") 2>&1
cd "$root"
# No network there: nothing may wait on the Hub.
export PYTHONUNBUFFERED=1 TRIMS_SHARED=$(cd "$shared" && pwd) TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1
# The commit: .carry/commit (written by preflight.sh when it made the carried folders) names what was sent to a
# device, whose copy of the checkout may hold a stale .git; else git's own.
commit=$(cat .carry/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "== run_all $(date -u +%FT%TZ): scale $scale, deadline ${deadline}s, parts $parts, commit $commit"

# 1. What the call carries: the wheels, installed once per machine (a stamp of the wheel list).
ROOT=$root source bench/gpu/install.sh || exit 1
echo "installed in $((SECONDS - start))s"

# 2. The machine: GPU, driver, CUDA, Python and library versions.
"$python" - "$out/env.json" "$commit" <<'PY' || { echo "error: the environment does not import (see above)"; exit 1; }
import json, platform, subprocess, sys, time
import torch
from trims_hf.reports import library_versions
gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                       "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines() \
    if torch.cuda.is_available() else []
record = {"commit": sys.argv[2], "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
          "platform": platform.platform(), "torch": torch.__version__, "cuda": torch.version.cuda,
          "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
          "gpus": gpus, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
          "versions": library_versions("accelerate", "deepspeed", "datasets", "pytest")}
open(sys.argv[1], "w").write(json.dumps(record) + "\n")
print(json.dumps(record))
PY

# 3. The parts, in order, each under its budget; skipped when the budget would cross the deadline.
budgets=$("$python" bench/gpu/budgets.py --scale "$scale" "${budget_flags[@]}" --explain-to "$out/parts.jsonl")
rc=$?
[ $rc = 0 ] || { echo "error: bench/gpu/budgets.py failed (exit $rc)"; exit $(( rc == 2 ? 2 : 1 )); }
profile_flags=()
[ "$profile" = 1 ] && profile_flags=(--profile "$out/profile.txt")
failed=0
while read -r part budget flags; do
  case ",$parts," in *",$part,"*) ;; *) continue ;; esac
  left=$((deadline - (SECONDS - start)))
  if [ "$budget" -gt "$left" ]; then
    echo "== $part: skipped (budget ${budget}s, ${left}s left before the deadline)"
    echo "{\"part\": \"$part\", \"status\": \"skipped\", \"budget_s\": $budget, \"left_s\": $left}" >> "$out/parts.jsonl"
    failed=1
    continue
  fi
  if [ "$part" = tests ]; then
    select=()
    [ "$scale" = real ] && select=(-k "not cpu")  # the CUDA variants (the CPU ones run in CI)
    command=("$python" -m pytest -q -rs -p no:cacheprovider tests/test_cuda_correctness.py "${select[@]}" --junitxml "$out/tests.xml")
  else
    # shellcheck disable=SC2206
    command=("$python" bench/real_size.py --scale "$scale" --part "$part" --student "$student" --output "$out/real_size.jsonl" $flags "${profile_flags[@]}")
    [ "$part" = train ] && command+=(--train-profile "$out/train_profile.txt")
  fi
  echo "== $part: budget ${budget}s, ${left}s left: ${command[*]}"
  began=$SECONDS
  timeout -k 15 -s INT "$budget" "${command[@]}"
  rc=$?
  took=$((SECONDS - began))
  case $rc in 0) status=ran ;; 124|137) status=timed_out ;; *) status=failed ;; esac
  [ "$rc" = 0 ] || failed=1
  echo "== $part: $status (exit $rc) in ${took}s"
  echo "{\"part\": \"$part\", \"status\": \"$status\", \"exit\": $rc, \"seconds\": $took, \"budget_s\": $budget}" >> "$out/parts.jsonl"
done <<< "$budgets"
echo "== run_all done in $((SECONDS - start))s: $([ $failed = 0 ] && echo "every part ran and passed" || echo "not every part ran and passed (parts.jsonl)")"
exit $failed
