#!/usr/bin/env bash
# The whole GPU check (bench/gpu.py) on one CUDA GPU, stopped after 10 minutes.
#
#   bash bench/gpu_check.sh                 # everything
#   bash bench/gpu_check.sh --no-compile    # without the torch.compile peer
#   bash bench/gpu_check.sh --only w4       # W4 alone: host work overlapped, on against off
#
# It needs a Python with CUDA torch, transformers and triton (PYTHON, else .venv/bin/python,
# else python3) and the repository importable; it downloads nothing (the model is built with
# random weights). Exit status: bench/gpu.py's, or 124 when the time limit cut it short.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" - <<'PY'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "triton", "safetensors", "tokenizers")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing packages: {', '.join(missing)} (pip install -e '.[local,dev]')")
import torch
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
PY
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout "${GPU_CHECK_TIMEOUT:-600}" "$PYTHON" bench/gpu.py "$@"
