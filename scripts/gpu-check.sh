#!/usr/bin/env bash
# gpu-check.sh - one command for a GPU machine (an H200 by default; about
# 5 minutes): builds megac, runs the CUDA tests on the device (the sm_XX
# bundles of stories260K and a synthetic model decoded next to the reference
# engine: logits within tolerance, identical greedy tokens, llama2.c's text),
# then benchmarks decode for the SmolLM2-135M and Llama-3.2-1B shapes
# (synthetic weights) against the baseline of tools/gpubench (cuBLAS bf16
# GEMVs and simple kernels for one decode step, captured in a CUDA graph).
#
# Writes into $OUT (or ./gpu-report/): gpu-check.json, gpu-check.md and the
# logs. Environment: HBM_GBPS (peak bandwidth, default 4800 for an H200),
# BENCH_TOKENS (decode steps per run, default 64), MODELS (default
# "smollm2-135m llama-3.2-1b").
#
# megac's kernels keep f32 weights for now (the lowering emits no bf16 or
# quantized weights yet), so they read twice the bytes of the bf16 baseline;
# the report gives each side's bytes and bandwidth next to the time ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-$root/gpu-report}
mkdir -p "$out"
hbm=${HBM_GBPS:-4800}
ntok=${BENCH_TOKENS:-64}
jobs=$(nproc)
build=$root/build-gpu
log() { printf '%s gpu-check: %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$out/gpu-check.log" >&2; }

: >"$out/gpu-check.log"
command -v nvidia-smi >/dev/null && nvidia-smi | tee "$out/nvidia-smi.txt" >/dev/null || true
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
case "$cc" in
    8*) target=sm_80 ;;
    9*) target=sm_90 ;;
    12*) target=sm_120 ;;
    *) log "no supported GPU found (compute capability '$cc'); assuming sm_90"; target=sm_90; cc=90 ;;
esac
log "target $target"

log "building megac"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >"$out/build.log" 2>&1
cmake --build "$build" -j"$jobs" >>"$out/build.log" 2>&1
megac=$build/compiler/megac

log "CUDA tests (test_cuda: NVRTC, host-cuda, and on the device)"
tests_ok=true
if ! (cd "$root" && timeout 300 "$build/tests/test_cuda" --jobs=4 --verbose >"$out/test_cuda.log" 2>&1); then
    tests_ok=false
    log "test_cuda FAILED (see test_cuda.log)"
fi
grep -E '^\[(PASS|FAIL|SKIP|----)\]' "$out/test_cuda.log" | tail -40 >&2 || true
gpu_tests=$(grep -cE '^\[PASS\] cuda_gpu::' "$out/test_cuda.log" || true)
gpu_skips=$(grep -cE '^\[SKIP\] cuda_gpu::' "$out/test_cuda.log" || true)

log "building the cuBLAS baseline"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cudalib=$(dirname "$(dirname "$nvcc")")/lib64
"$nvcc" -O3 -std=c++17 -arch="sm_$cc" tools/gpubench/gpubench.cu -L"$cudalib" -lcublas \
    -Xlinker -rpath -Xlinker "$cudalib" -o "$build/gpubench" >"$out/gpubench-build.log" 2>&1

# key VALUE from a models/*.yaml arch section (flat "  key: value" lines)
yaml_num() { sed -n "s/^  $2: *\([0-9]*\).*/\1/p" "$1" | head -1; }

rows=()
for model in ${MODELS:-smollm2-135m llama-3.2-1b}; do
    yaml=models/$model.yaml
    bundle=$build/$model.$target.megac
    log "$model: megac compile --target $target"
    if ! timeout 240 "$megac" compile "$yaml" --target "$target" -o "$bundle" >"$out/$model.compile.log" 2>&1; then
        log "$model: compile FAILED (see $model.compile.log)"
        rows+=("{\"model\": \"$model\", \"error\": \"compile failed\"}")
        continue
    fi
    log "$model: megac bench ($ntok tokens x 3 runs)"
    if ! timeout 180 "$megac" bench "$bundle" -n "$ntok" --runs 3 --ceiling-mb 64 >"$out/$model.bench.log" 2>&1; then
        log "$model: bench FAILED (see $model.bench.log)"
        rows+=("{\"model\": \"$model\", \"error\": \"bench failed\"}")
        continue
    fi
    tok_s=$(sed -n 's/^tok_s=\([0-9.]*\).*/\1/p' "$out/$model.bench.log")
    wbytes=$(sed -n 's/^weights_read_bytes: *//p' "$bundle/manifest.yaml")
    workers=$(sed -n 's/^workers: *//p' "$bundle/manifest.yaml")
    dim=$(yaml_num "$yaml" dim); hidden=$(yaml_num "$yaml" hidden_dim); layers=$(yaml_num "$yaml" n_layers)
    heads=$(yaml_num "$yaml" n_heads); kvh=$(yaml_num "$yaml" n_kv_heads); hd=$(yaml_num "$yaml" head_dim)
    vocab=$(yaml_num "$yaml" vocab_size)
    [ -n "$hd" ] || hd=$((dim / heads))
    pos=$((ntok / 2))
    log "$model: baseline gpubench $dim $hidden $layers $heads $kvh $hd $vocab $pos"
    base=$(timeout 120 "$build/gpubench" "$dim" "$hidden" "$layers" "$heads" "$kvh" "$hd" "$vocab" "$pos" 300 \
        2>"$out/$model.gpubench.log" || echo '{}')
    base_us=$(echo "$base" | sed -n 's/.*"us_per_token": \([0-9.]*\).*/\1/p')
    base_bytes=$(echo "$base" | sed -n 's/.*"weight_bytes": \([0-9]*\).*/\1/p')
    rows+=("$(python3 - "$model" "$tok_s" "$wbytes" "$workers" "${base_us:-0}" "${base_bytes:-0}" "$hbm" <<'EOF'
import json, sys
model, tok_s, wbytes, workers, base_us, base_bytes, hbm = sys.argv[1:]
tok_s, wbytes, base_us, base_bytes, hbm = float(tok_s), int(wbytes), float(base_us), int(base_bytes), float(hbm)
us = 1e6 / tok_s if tok_s > 0 else 0.0
row = {"model": model, "workers": int(workers),
       "megac_us_per_token": round(us, 2), "megac_weight_bytes": wbytes,
       "megac_hbm_pct": round(100 * wbytes / (us * 1e3) / hbm, 1) if us else 0,
       "baseline_us_per_token": base_us, "baseline_weight_bytes": base_bytes,
       "baseline_hbm_pct": round(100 * base_bytes / (base_us * 1e3) / hbm, 1) if base_us else 0,
       "ratio_megac_over_baseline": round(us / base_us, 3) if base_us else None}
print(json.dumps(row))
EOF
)")
    log "$model: ${rows[-1]}"
done

python3 - "$out" "$target" "$tests_ok" "$gpu_tests" "$gpu_skips" "$hbm" "${rows[@]}" <<'EOF'
import json, sys
out, target, tests_ok, gpu_pass, gpu_skip, hbm = sys.argv[1:7]
rows = [json.loads(r) for r in sys.argv[7:]]
rep = {"target": target, "tests_passed": tests_ok == "true", "gpu_tests_passed": int(gpu_pass),
       "gpu_tests_skipped": int(gpu_skip), "hbm_gbps": float(hbm), "decode": rows}
json.dump(rep, open(f"{out}/gpu-check.json", "w"), indent=2)
md = [f"# megac gpu-check ({target})", "",
      f"CUDA tests: {'passed' if tests_ok == 'true' else 'FAILED'} "
      f"({gpu_pass} on the device, {gpu_skip} skipped); see test_cuda.log", "",
      "| model | megac us/token | HBM % | baseline (cuBLAS bf16) us/token | HBM % | megac / baseline |",
      "|---|---|---|---|---|---|"]
for r in rows:
    if "error" in r:
        md.append(f"| {r['model']} | {r['error']} | | | | |")
        continue
    md.append(f"| {r['model']} | {r['megac_us_per_token']} | {r['megac_hbm_pct']} | {r['baseline_us_per_token']} | "
              f"{r['baseline_hbm_pct']} | {r['ratio_megac_over_baseline']} |")
md += ["", f"HBM % = weight bytes read per token / time / {hbm} GB/s. megac reads f32 weights "
       "(twice the baseline's bf16 bytes); its time includes the per-step launch, memsets and logits copy."]
open(f"{out}/gpu-check.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
EOF
$tests_ok
