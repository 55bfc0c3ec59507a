#!/usr/bin/env bash
# The whole test suite: a -Werror build and its tests, then the same suite
# under AddressSanitizer + UBSan, then the ThreadSanitizer checks of
# tests/tsan (runtime and generated kernels instrumented; Criterion does not
# run under TSan, so that build has only those). Used by the README and by
# .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DMEGAC_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
# The configuration scripts/gpu-pack.sh builds for GPU machines: no LLVM.
cmake -S . -B build-nocpu -DMEGAC_WERROR=ON -DMEGAC_CPU_BACKEND=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-nocpu -j"$jobs" --target megac test_cuda
cmake -S . -B build-asan -DMEGAC_WERROR=ON -DMEGAC_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
# Sanitizer reports go to files: a leak is reported by a test's process as it
# exits, after Criterion has counted the test as passed, so ctest alone would
# let it through. Any report fails the suite (and is printed).
reports="$PWD/build-asan/sanitizer-reports"
rm -rf "$reports" && mkdir -p "$reports"
status=0
(cd build-asan && ASAN_OPTIONS="detect_leaks=1:log_path=$reports/asan" \
    UBSAN_OPTIONS="print_stacktrace=1:log_path=$reports/ubsan" MEGAC_SANITIZED=1 \
    ctest --output-on-failure -j"$jobs") || status=$?
if [ -n "$(ls -A "$reports")" ]; then
    for f in "$reports"/*; do
        echo "==== sanitizer report $f"
        cat "$f"
    done
    echo "test.sh: the sanitizers reported $(ls "$reports" | wc -l) time(s) (above)" >&2
    status=1
fi
[ "$status" -eq 0 ] || exit "$status"
cmake -S . -B build-tsan -DMEGAC_WERROR=ON -DMEGAC_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-tsan -j"$jobs" --target tsan_e2e
(cd build-tsan && ctest --output-on-failure -j"$jobs")
