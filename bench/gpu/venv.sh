# Sourced (bash, from the checkout's root) by bench/gpu/preflight.sh and recipes/smollm2/preflight.sh: sets $venv to
# the Python 3.12 virtual environment that mirrors the GPU machine (PREFLIGHT_VENV, default
# ~/.cache/trims-preflight-py312: bench/gpu/device_packages.txt at the device's versions), made with PYTHON312 (default:
# the first python3.12 that runs) only when that list changed since it was made. Exits 2 when no Python 3.12 is found.
venv=${PREFLIGHT_VENV:-$HOME/.cache/trims-preflight-py312}
python312=${PYTHON312:-}
if [ -z "$python312" ]; then  # the first python3.12 that runs (a pyenv shim may not)
  for candidate in $(command -v python3.12) "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    "$candidate" -c "" 2>/dev/null && { python312=$candidate; break; }
  done
fi
stamp=$(sha256sum bench/gpu/device_packages.txt | cut -d' ' -f1)
if [ "$(cat "$venv/.made-from" 2>/dev/null)" != "$stamp" ]; then
  [ -n "$python312" ] && "$python312" -c "import sys; assert sys.version_info[:2] == (3, 12)" \
    || { echo "error: no Python 3.12 found (set PYTHON312)" >&2; exit 2; }
  rm -rf "$venv"
  "$python312" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r bench/gpu/device_packages.txt 2>&1 | grep -vE "Location|WARNING" || true
  "$venv/bin/python" -c "import torch, transformers; print('venv:', torch.__version__, transformers.__version__)"
  echo "$stamp" > "$venv/.made-from"
fi
