#!/usr/bin/env bash
# The GPU layer on a real GPU, in one command (see bench/gpu.py for what each part measures).
#
#   scripts/gpu-check.sh [OUT]      OUT: where gpu.jsonl, the tests' log and the summary go
#                                   (default $OUT, else .argus/gpu-check)
#
# Installs the wheels `make gpu-wheels` put in .gpu-wheels/ (fastavro, backports.zstd,
# cupti-python for the CUDA major of the machine's torch) into a private folder, puts this
# checkout on the path, then runs within a hard budget of 8 minutes in all: bench/gpu.py (a
# JSON line per part: cupti, events, nvml, overhead, straggler) and the tests marked `gpu`.
# Without a CUDA device it runs what needs none and says in one line where it stopped.
# ARGUS_GPU_BUDGET_S (480) bounds the whole run; ARGUS_GPU_PARTS=cupti,events,... picks parts.
# Uses the machine's python3 (its torch); nothing is fetched.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.argus/gpu-check}}"
mkdir -p "$out"
budget="${ARGUS_GPU_BUDGET_S:-480}"
start=$SECONDS
py="${PYTHON:-python3}"
site="${TMPDIR:-/tmp}/argus-gpu-site"
left() { echo $((budget - (SECONDS - start))); }

if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
  if "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu-wheels/*.whl; then
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  else  # e.g. the wheels are for Python 3.12 and this is another Python: its own packages may do
    echo "gpu-check: the carried wheels did not install here; going on with $py's own packages"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$py" -c "import argus, fastavro" 2>/dev/null \
  || { echo "gpu-check: argus or fastavro cannot be imported (run make gpu-wheels first)"; exit 2; }
"$py" - <<'PY' | tee "$out/versions.txt"
import importlib.metadata as m, platform
for name in ("torch", "cupti-python", "nvidia-ml-py", "nvidia-cuda-cupti", "fastavro"):
    try:
        print(f"{name}={m.version(name)}", end=" ")
    except m.PackageNotFoundError:
        print(f"{name}=absent", end=" ")
print(f"python={platform.python_version()}")
PY

status=0
timeout --kill-after=10 "$(( $(left) - 100 ))" "$py" bench/gpu.py --out "$out" ${ARGUS_GPU_PARTS:+--parts "$ARGUS_GPU_PARTS"} 2>&1 | tee "$out/bench.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
if "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  if (( $(left) > 30 )); then
    timeout --kill-after=10 "$(( $(left) - 5 ))" "$py" -m pytest -q -m gpu tests/gpu -p no:cacheprovider --noconftest \
      -o addopts="--import-mode=importlib" 2>&1 | tee "$out/tests.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  else
    echo "gpu-check: no time left for the gpu tests" | tee "$out/tests.log"
    status=1
  fi
fi
echo "gpu-check: done in $((SECONDS - start)) s (exit $status)"
exit $status
