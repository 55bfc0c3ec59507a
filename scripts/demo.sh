#!/usr/bin/env bash
# Builds megac and runs the main job on the embedded default model
# (synthetic weights, no downloads, no ../shared needed); then, when
# ../shared is there, the same on a real trained model (stories260K).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
./build/compiler/megac run --prompt "Hello" -n 48 --temp 0 "$@"
echo "(the embedded default model has synthetic weights: its text is noise)" >&2
if [ -f ../shared/models/stories260K.bin ] && [ -f ../shared/models/tok512.bin ]; then
    echo "== stories260K, a real trained model from ../shared:" >&2
    ./build/compiler/megac run models/stories260k.yaml --prompt "Once upon a time" -n 120 --temp 0
fi
