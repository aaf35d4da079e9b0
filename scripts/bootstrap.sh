#!/usr/bin/env bash
# Idempotent set-up of everything tinytrain needs on a fresh Debian machine:
# Debian toolchain packages (arm-none-eabi-gcc, newlib, qemu-system-arm), a virtual environment
# in .venv with the package and its test extras, and the offline PlatformIO parts.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

need_apt=()
command -v arm-none-eabi-gcc >/dev/null 2>&1 || need_apt+=(gcc-arm-none-eabi)
[ -d /usr/lib/arm-none-eabi/newlib ] || need_apt+=(libnewlib-arm-none-eabi)
command -v qemu-system-arm >/dev/null 2>&1 || need_apt+=(qemu-system-arm)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  echo "[bootstrap] installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.tinytrain-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[bootstrap] installing tinytrain with its test, device, flower, lab and interop extras into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  # the distribution was called "tinytrain" before it became tinytrain-mcu: drop an old editable
  # install, whose finder would still map tinytrain.codegen to the old top-level folder
  .venv/bin/pip uninstall -q -y tinytrain >/dev/null 2>&1 || true
  # interop: torch (CPU build, torch==2.13.0 as pinned), onnx, onnxruntime, tflite, ai-edge-litert;
  # the interop tests need it and fail without it
  .venv/bin/pip install -q -e ".[test,device,flower,lab,interop]"
  touch "$stamp"
fi
if [ -f tinytrain/device/toolchain.py ]; then
  .venv/bin/python -m tinytrain.device.toolchain setup --quiet
fi
