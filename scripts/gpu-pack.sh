#!/usr/bin/env bash
# gpu-pack.sh - prepares gpu-pack/ for a GPU machine that has the CUDA
# toolkit and a driver but none of megac's other build dependencies (no
# LLVM, libyaml or Criterion there, and nothing can be installed): builds
# megac without the CPU backend (-DMEGAC_CPU_BACKEND=OFF) and test_cuda
# here, the cuBLAS baseline tools/gpubench for sm_80/sm_90/sm_120, and
# copies beside them the shared libraries they need that are not glibc's,
# the C++ runtime's or the CUDA toolkit's (the GPU machine has its own),
# plus the ../shared files the CUDA tests read. scripts/gpu-check.sh uses
# gpu-pack/ when it is there and runs; it builds from source otherwise.
#
#   scripts/gpu-pack.sh            # here; then send gpu-pack/ along (about 14 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
pack=$root/gpu-pack
build=$root/build-gpu
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cudalib=$(dirname "$(dirname "$nvcc")")/lib64

echo "gpu-pack: building megac (no CPU backend) and test_cuda in $build" >&2
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMEGAC_CPU_BACKEND=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target megac test_cuda >/dev/null

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib" "$pack/shared/models" "$pack/shared/golden" "$pack/shared/hf-configs"
cp "$build/compiler/megac" "$build/tests/test_cuda" "$pack/bin/"

echo "gpu-pack: building tools/gpubench (cuBLAS baseline)" >&2
"$nvcc" -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_120,code=sm_120 tools/gpubench/gpubench.cu -L"$cudalib" -lcublas \
    -o "$pack/bin/gpubench"

# Dependencies that the GPU machine may lack: everything ldd resolves
# outside glibc, the C++ runtime and the CUDA toolkit.
ldd "$pack/bin/megac" "$pack/bin/test_cuda" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s)\.so|/ld-linux|/cuda|libnvrtc|libcublas' |
    while read -r lib; do cp -L "$lib" "$pack/lib/"; done

shared=$root/../shared
for f in models/stories260K.bin models/tok512.bin golden/stories260K_once_upon_a_time_n200.txt; do
    if [ -f "$shared/$f" ]; then cp "$shared/$f" "$pack/shared/$f"; fi
done
cp "$shared"/hf-configs/*.json "$pack/shared/hf-configs/" 2>/dev/null || true
git rev-parse HEAD >"$pack/commit" 2>/dev/null || true
echo "gpu-pack: $(du -sh "$pack" | cut -f1) in $pack ($(ls "$pack/lib" | wc -l) libraries)" >&2
