#!/usr/bin/env bash
# Builds megac and runs the main job on the embedded default model
# (synthetic weights, no downloads, no ../shared needed).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
./build/compiler/megac run --prompt "Hello" -n 48 --temp 0 "$@"
