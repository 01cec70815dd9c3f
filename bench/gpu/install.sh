# Sourced (bash) by bench/gpu/run_all.sh and recipes/smollm2/device_call.sh: the one way a GPU call installs what it
# carries. Installs the wheels WHEELS/*.whl (default .whl/, made by bench/gpu/carry.sh) with PYTHON (default python3)
# into SITE (default /tmp/trims-site) with --no-index --no-deps --target (the device has no network), once per machine
# and wheel list (a stamp); then puts SITE, when installed (by this call or an earlier one on the same machine), and
# the checkout ROOT first on PYTHONPATH. Returns 1 when the install fails.
wheels=${WHEELS:-.whl}
site=${SITE:-/tmp/trims-site}
if compgen -G "$wheels/*.whl" > /dev/null; then
  stamp=$(ls "$wheels"/*.whl | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$site/.installed" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$site"
    "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$wheels"/*.whl || { echo "error: installing $wheels/ into $site failed"; return 1; }
    echo "$stamp" > "$site/.installed"
  fi
fi
if [ -f "$site/.installed" ]; then
  export PYTHONPATH=$site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
