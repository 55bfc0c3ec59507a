#!/usr/bin/env bash
# Installs what megac needs on Debian (idempotent). The CUDA toolkit is
# expected in /usr/local/cuda (NVRTC and headers; no GPU needed).
set -euo pipefail
need=()
for p in cmake make gcc clang-14 llvm-14-dev libyaml-dev libcriterion-dev pkg-config python3; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -f /usr/local/cuda/include/nvrtc.h ]; then
  echo "deps: warning: no CUDA toolkit in /usr/local/cuda; CUDA codegen will not build" >&2
fi
