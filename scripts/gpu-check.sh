#!/usr/bin/env bash
# gpu-check.sh - one command for a GPU machine (an H200 by default; 305 s
# there with gpu-pack/ on 2026-12-04 (the tests 67-204 s of it, NVRTC on that
# machine's CPUs; the long-context part 110 s), 445 s on the later run with
# the tests cut at 240 s and ncu 6 s): runs the CUDA tests on the device (stories260K and synthetic
# bundles, in f32, bf16, f16, w8a16 and w4a16, decoded next to the reference
# engine: logits within tolerance, identical greedy tokens, llama2.c's text;
# the watchdog), measures the device's read-bandwidth ceiling, then
# benchmarks decode for the SmolLM2-135M and Llama-3.2-1B shapes (synthetic
# weights) in bf16, w8a16 and w4a16 against the baseline of tools/gpubench
# (cuBLAS bf16 GEMVs and small kernels for one decode step, captured in a
# CUDA graph and replayed).
#
# megac and test_cuda come from gpu-pack/ when it is there and runs
# (scripts/gpu-pack.sh, made on a machine with the build dependencies);
# otherwise they are built here with cmake (LLVM optional).
#
# Writes into $OUT (or ./gpu-report/): gpu-check.json, gpu-check.md and the
# logs. Environment: HBM_GBPS (the vendor's peak, default 4800 for an H200),
# BENCH_TOKENS (decode steps per run, default 64), MODELS (default
# "smollm2-135m llama-3.2-1b"), FORMATS (default "bf16 w8a16 w4a16-g128"),
# TESTS (0 skips the tests), VARIANTS (kernel variants timed against the
# default kernel of one weight format, as "NAME:DEFINE=V[,DEFINE=V][@FORMAT]"
# words for MEGAC_CUDA_DEFINES (a DEFINE written set.KEY is a description
# knob instead: --set KEY=V), FORMAT bf16 unless given and one of
# FORMATS; default "wpipe:MK_WPIPE=4 wpipenp:MK_WPIPE=4,MK_WPIPE_PRIME=0
# wpipe32:MK_WPIPE=4,MK_ROW_LANES_MIN=32 wpipe32w8:MK_WPIPE=4,MK_ROW_LANES_MIN=32@w8a16 onerow:MK_NL_ONE_ROW=1
# oneroww8:MK_NL_ONE_ROW=1@w8a16 rows32w8:MK_ROW_LANES_MIN=32@w8a16
# rows32w4:MK_ROW_LANES_MIN=32@w4a16-g128 kvf32:set.compile.kv_dtype=f32" (the last: an f32 KV
# cache against the default f16 one), empty skips; the 2026-12-04 runs also timed set.attn_combine=in_o (or
# its opposite), MK_ROW_LANES_MIN=32 (bf16), MK_WAIT_SLEEP_MAX=0, MK_ISTAGE=0 (and @w8a16),
# MK_XREUSE=0, MK_WNOALLOC=0, MK_PRELOADS=0, MK_XSWIZZLE=0@w8a16,
# MK_WSTAGE_BYTES=131072 and MK_VLOADS=4 and 12: docs/performance.md),
# LONG_CONTEXT (default 2000, 0 skips the
# long-context benchmarks: SmolLM2 with an f16 cache (the default), and
# sink_window, streaming and TOVA on an f32 one, each against the dense f32
# cache in the same runs),
# LONG_TOKENS (timed there, default 32), PROFILE (default 1; 0 skips the
# cycle profile of each model's bf16 kernel built with MK_PROFILE=1), NCU
# (default 1; 0 skips Nsight Compute's counters for one decode step of the
# last model's bf16 kernel: DRAM throughput, warp stalls, occupancy, into
# ncu.txt; skipped where there is no ncu), TEST_TIMEOUT (seconds for each
# of the two test programs, default 400: the sparse test took 66-202 s on
# 2026-12-04 and over 240 s with the three GEMV copies of a later tree),
# DEADLINE (seconds from the start past which ncu's 150 s would run: then
# it is skipped; unset, no limit; set it a little under the device
# command's own timeout: the report is written before ncu and after it),
# TARGET (a dry run without a GPU:
# TARGET=host-cuda TESTS=0 MODELS=stories260k FORMATS=bf16 BENCH_TOKENS=4
# LONG_CONTEXT=8 LONG_TOKENS=2, about 3 minutes on 2 cores).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-$root/gpu-report}
mkdir -p "$out"
hbm=${HBM_GBPS:-4800}
ntok=${BENCH_TOKENS:-64}
models=${MODELS:-smollm2-135m llama-3.2-1b}
formats=${FORMATS:-bf16 w8a16 w4a16-g128}
work=${TMPDIR:-/tmp}/megac-gpu-check
mkdir -p "$work"
t0=$(date +%s)
log() { printf '%s +%4ss gpu-check: %s\n' "$(date -u +%H:%M:%S)" "$(($(date +%s) - t0))" "$*" | tee -a "$out/gpu-check.log" >&2; }
: >"$out/gpu-check.log"

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
case "$cc" in
    8*) target=sm_80 ;;
    9*) target=sm_90 ;;
    12*) target=sm_120 ;;
    *) log "no supported GPU found (compute capability '$cc'); assuming sm_90"; target=sm_90 ;;
esac
target=${TARGET:-$target}   # (TARGET=host-cuda: a dry run of the script's logic without a GPU)
log "target $target; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"

# ---- megac, test_cuda and gpubench ----
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cudalib=$(dirname "$(dirname "$nvcc")")/lib64
libpath=$cudalib
# NVRTC may live elsewhere (a pip wheel's lib folder).
if [ ! -e "$cudalib/libnvrtc.so.13" ] && [ ! -e "$cudalib/libnvrtc.so" ]; then
    nv=$(find / -xdev -name 'libnvrtc.so.1[0-9]*' -not -name '*builtins*' 2>/dev/null | head -1)
    [ -n "$nv" ] && libpath=$(dirname "$nv"):$libpath
fi
pack=$root/gpu-pack
prebuilt=false
if [ -x "$pack/bin/megac" ] && [ -x "$pack/bin/test_cuda" ]; then
    if LD_LIBRARY_PATH="$pack/lib:$libpath" "$pack/bin/megac" --help >/dev/null 2>"$out/prebuilt.err"; then
        prebuilt=true
        libpath=$pack/lib:$libpath
        megac=$pack/bin/megac
        test_cuda=$pack/bin/test_cuda
        gpubench=$pack/bin/gpubench
        log "using gpu-pack/ (built from $(cat "$pack/commit" 2>/dev/null || echo '?'))"
    else
        log "gpu-pack/bin/megac does not run here: $(head -c 300 "$out/prebuilt.err"); building"
    fi
fi
if ! $prebuilt; then
    build=$root/build-gpu
    cpu=ON
    command -v llvm-config-14 >/dev/null || command -v llvm-config >/dev/null || cpu=OFF
    log "building megac (CPU backend $cpu)"
    if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMEGAC_CPU_BACKEND=$cpu &&
           cmake --build "$build" -j"$(nproc)" --target megac test_cuda; } >"$out/build.log" 2>&1; then
        log "build FAILED (see build.log)"
        tail -20 "$out/build.log" >&2
        exit 1
    fi
    megac=$build/compiler/megac
    test_cuda=$build/tests/test_cuda
    gpubench=$build/gpubench
fi
if ! LD_LIBRARY_PATH=$libpath "$gpubench" --read-gbps 64 >/dev/null 2>&1; then
    log "building the cuBLAS baseline (tools/gpubench)"
    gpubench=$work/gpubench
    "$nvcc" -O3 -std=c++17 -arch="sm_${cc:-90}" tools/gpubench/gpubench.cu -L"$cudalib" -lcublas \
        -Xlinker -rpath -Xlinker "$cudalib" -o "$gpubench" >"$out/gpubench-build.log" 2>&1 ||
        log "gpubench build FAILED (see gpubench-build.log)"
fi
run() { LD_LIBRARY_PATH=$libpath "$@"; }
run "$megac" doctor >"$out/doctor.txt" 2>&1 || true

# The models and goldens the tests read live in ../shared; a machine that
# was sent only the checkout gets gpu-pack's copies there.
if [ ! -f "$root/../shared/models/stories260K.bin" ] && [ -f "$pack/shared/models/stories260K.bin" ]; then
    if [ ! -e "$root/../shared" ]; then
        ln -s "$pack/shared" "$root/../shared" && log "../shared -> gpu-pack/shared"
    else
        log "../shared exists but lacks stories260K.bin: the stories260K tests will skip"
    fi
fi

# ---- tests on the device ----
tests_ok=true
gpu_pass=0
gpu_skip=0
if [ "${TESTS:-1}" != 0 ]; then
    log "CUDA tests on the device (test_cuda: cuda_gpu, cuda_runtime)"
    for suite in cuda_gpu cuda_runtime; do
        if ! (MEGAC_TEST_SRC=$root MEGAC_TEST_BIN=$megac run timeout "${TEST_TIMEOUT:-400}" "$test_cuda" --filter "$suite/*" \
                  --jobs=8 --verbose) >"$out/test_$suite.log" 2>&1; then
            tests_ok=false
            log "$suite FAILED (see test_$suite.log)"
        fi
        grep -E '^\[(PASS|FAIL|SKIP|----)\]|Synthesis' "$out/test_$suite.log" | grep -v 'Test is disabled' >&2 || true
    done
    gpu_pass=$(grep -cE '^\[PASS\] cuda_gpu::' "$out/test_cuda_gpu.log" || true)
    gpu_skip=$(grep -cE '^\[SKIP\] cuda_gpu::' "$out/test_cuda_gpu.log" || true)
    log "tests: $gpu_pass cuda_gpu passed, $gpu_skip skipped, all ok: $tests_ok"
fi

# ---- a description run on the device as `megac run` compiles it (the
# GPU's cubin, a block per SM), against the reference engine's text ----
if [ -f "$root/../shared/models/stories260K.bin" ]; then
    (cd "$work" && run timeout 300 "$megac" run "$root/../shared/models/stories260K.bin" --engine cuda -n 128 --temp 0 \
        >"$out/run-cuda.txt" 2>"$out/run-cuda.log")
    run timeout 60 "$megac" run "$root/../shared/models/stories260K.bin" --engine reference -n 128 --temp 0 \
        >"$out/run-reference.txt" 2>/dev/null
    if [ -s "$out/run-cuda.txt" ] && cmp -s "$out/run-cuda.txt" "$out/run-reference.txt"; then
        log "megac run --engine cuda (stories260K.bin, compiled for the device): the reference's text"
    else
        tests_ok=false
        log "megac run --engine cuda FAILED or differs from the reference (see run-cuda.log, run-cuda.txt)"
    fi
fi

# ---- the device's read ceiling ----
ceil=$(run timeout 60 "$gpubench" --read-gbps 4096 2>>"$out/gpubench.log" || echo '{}')
read_gbps=$(echo "$ceil" | sed -n 's/.*"read_gbps": \([0-9.]*\).*/\1/p')
log "read ceiling: ${read_gbps:-?} GB/s (vendor peak $hbm GB/s)"

# ---- decode benchmarks ----
# key VALUE from a models/*.yaml arch section (flat "  key: value" lines)
yaml_num() { sed -n "s/^  $2: *\([0-9]*\).*/\1/p" "$1" | head -1; }

# Compiles run in parallel (they use the CPUs), benchmarks one at a time.
log "compiling $(echo $models | wc -w) models x $(echo $formats | wc -w) formats for $target"
for model in $models; do
    for fmt in $formats; do
        b=$work/$model.$fmt.$target.megac
        (run timeout 300 "$megac" compile "models/$model.yaml" --target "$target" --set "quant.default=$fmt" -o "$b" \
            >"$out/$model.$fmt.compile.log" 2>&1 || echo failed >"$b.failed") &
    done
done
# kernel variants (VARIANTS): a format's bundle with kernel_body.cuh knobs
# set; those of formats not benchmarked are left out
variants=
for v in ${VARIANTS-wpipe:MK_WPIPE=4 wpipenp:MK_WPIPE=4,MK_WPIPE_PRIME=0 wpipe32:MK_WPIPE=4,MK_ROW_LANES_MIN=32 \
    wpipe32w8:MK_WPIPE=4,MK_ROW_LANES_MIN=32@w8a16 onerow:MK_NL_ONE_ROW=1 oneroww8:MK_NL_ONE_ROW=1@w8a16 \
    rows32w8:MK_ROW_LANES_MIN=32@w8a16 rows32w4:MK_ROW_LANES_MIN=32@w4a16-g128 kvf32:set.compile.kv_dtype=f32}; do
    case $v in *@*) ;; *) v=$v@bf16 ;; esac
    case " $formats " in *" ${v##*@} "*) variants="$variants $v" ;; esac
done
# NAME:DEFINES@FORMAT -> vname, vdefs (space-separated), vfmt, and from
# vdefs vcuda (the MEGAC_CUDA_DEFINES) and vset (--set KEY=V arguments)
vsplit() {
    vname=${1%%:*}; vfmt=${1##*@}; vdefs=${1#*:}; vdefs=$(echo "${vdefs%@*}" | tr , ' ')
    vcuda=; vset=()
    for d in $vdefs; do
        case $d in set.*) vset+=(--set "${d#set.}") ;; *) vcuda="$vcuda $d" ;; esac
    done
    vcuda=${vcuda# }
}
for v in $variants; do
    vsplit "$v"
    for model in $models; do
        b=$work/$model.$vname.$target.megac
        (MEGAC_CUDA_DEFINES=$vcuda run timeout 300 "$megac" compile "models/$model.yaml" \
            --target "$target" --set "quant.default=$vfmt" "${vset[@]}" -o "$b" >"$out/$model.$vname.compile.log" 2>&1 ||
            echo failed >"$b.failed") &
    done
done
# cycle profiles (PROFILE=0 skips): each model's bf16 kernel with MK_PROFILE=1,
# whose SM cycles per step by op, signal and wait the runtime prints
if [ "${PROFILE:-1}" != 0 ]; then
    for model in $models; do
        (MEGAC_CUDA_DEFINES=MK_PROFILE=1 run timeout 300 "$megac" compile "models/$model.yaml" --target "$target" \
            --set quant.default=bf16 -o "$work/$model.profile.$target.megac" >"$out/$model.profile.compile.log" 2>&1 ||
            echo failed >"$work/$model.profile.$target.megac.failed") &
    done
fi
wait
log "compiled"

rows=()
for model in $models; do
    yaml=models/$model.yaml
    dim=$(yaml_num "$yaml" dim); hidden=$(yaml_num "$yaml" hidden_dim); layers=$(yaml_num "$yaml" n_layers)
    heads=$(yaml_num "$yaml" n_heads); kvh=$(yaml_num "$yaml" n_kv_heads); hd=$(yaml_num "$yaml" head_dim)
    vocab=$(yaml_num "$yaml" vocab_size)
    [ -n "$hd" ] || hd=$((dim / heads))
    pos=$((ntok / 2))
    base=$(run timeout 120 "$gpubench" "$dim" "$hidden" "$layers" "$heads" "$kvh" "$hd" "$vocab" "$pos" 300 \
        2>>"$out/gpubench.log" || echo '{}')
    base_us=$(echo "$base" | sed -n 's/.*"us_per_token": \([0-9.]*\).*/\1/p')
    base_bytes=$(echo "$base" | sed -n 's/.*"weight_bytes": \([0-9]*\).*/\1/p')
    log "$model: baseline (cuBLAS bf16, CUDA graph, pos $pos): ${base_us:-?} us/token"
    for fmt in $formats; do
        b=$work/$model.$fmt.$target.megac
        if [ -e "$b.failed" ]; then
            log "$model $fmt: compile FAILED (see $model.$fmt.compile.log)"
            rows+=("{\"model\": \"$model\", \"format\": \"$fmt\", \"error\": \"compile failed\"}")
            continue
        fi
        if ! run timeout 180 "$megac" bench "$b" -n "$ntok" --runs 5 --prefill --ceiling-mb 64 \
            >"$out/$model.$fmt.bench.log" 2>&1; then
            log "$model $fmt: bench FAILED (see $model.$fmt.bench.log)"
            tail -3 "$out/$model.$fmt.bench.log" >&2
            rows+=("{\"model\": \"$model\", \"format\": \"$fmt\", \"error\": \"bench failed\"}")
            continue
        fi
        tok_s=$(sed -n 's/^tok_s=\([0-9.]*\).*/\1/p' "$out/$model.$fmt.bench.log")
        pre_s=$(sed -n 's/^prefill_tok_s=\([0-9.]*\).*/\1/p' "$out/$model.$fmt.bench.log")
        wbytes=$(sed -n 's/^weights_read_bytes: *//p' "$b/manifest.yaml")
        workers=$(sed -n 's/^workers: *//p' "$b/manifest.yaml")
        rows+=("$(python3 - "$model" "$fmt" "$tok_s" "$wbytes" "$workers" "${base_us:-0}" "${base_bytes:-0}" "$hbm" "${read_gbps:-0}" "${pre_s:-0}" <<'EOF'
import json, sys
model, fmt, tok_s, wbytes, workers, base_us, base_bytes, hbm, rd, pre = sys.argv[1:]
tok_s, wbytes, base_us, base_bytes, hbm, rd = float(tok_s), int(wbytes), float(base_us), int(base_bytes), float(hbm), float(rd)
us = 1e6 / tok_s if tok_s > 0 else 0.0
gbps = wbytes / (us * 1e3) if us else 0.0
row = {"model": model, "format": fmt, "workers": int(workers),
       "megac_us_per_token": round(us, 2), "megac_weight_bytes": wbytes, "megac_gbps": round(gbps, 1),
       "megac_hbm_pct": round(100 * gbps / hbm, 1), "megac_ceiling_pct": round(100 * gbps / rd, 1) if rd else None,
       "baseline_us_per_token": base_us, "baseline_weight_bytes": base_bytes,
       "baseline_hbm_pct": round(100 * base_bytes / (base_us * 1e3) / hbm, 1) if base_us else 0,
       "speedup_over_baseline": round(base_us / us, 3) if base_us and us else None,
       "megac_prefill_tok_s": float(pre), "megac_decode_tok_s": tok_s}
print(json.dumps(row))
EOF
)")
        log "$model $fmt: ${rows[-1]}"
    done
done
# megac bench A --versus B ARGS... into LOG; sets ts, vs and sp (A's tok/s,
# B's, A/B); fails when the bench does.
versus() {
    local logf=$1 a=$2 b=$3
    shift 3
    run timeout 240 "$megac" bench "$a" --versus "$b" "$@" --ceiling-mb 64 >"$logf" 2>&1 || return 1
    ts=$(sed -n 's/^tok_s=\([0-9.]*\).*/\1/p' "$logf")
    vs=$(sed -n 's/^versus_tok_s=\([0-9.]*\).*/\1/p' "$logf")
    sp=$(sed -n 's/.*speedup=\([0-9.]*\).*/\1/p' "$logf")
}

# ---- kernel variants against the default kernel of their format, in the same runs ----
# speedup = default tok/s / variant tok/s: above 1, the default kernel is faster.
varrows=()
for v in $variants; do
    vsplit "$v"
    name=$vname
    for model in $models; do
        b=$work/$model.$name.$target.megac
        d=$work/$model.$vfmt.$target.megac
        if [ -e "$b.failed" ] || [ -e "$d.failed" ]; then
            log "variant $name $model: compile FAILED (see $model.$name.compile.log)"
            varrows+=("{\"variant\": \"$name\", \"model\": \"$model\", \"error\": \"compile failed\"}")
            continue
        fi
        if ! versus "$out/$model.$name.bench.log" "$d" "$b" -n "$ntok" --runs 5; then
            log "variant $name $model: bench FAILED (see $model.$name.bench.log)"
            varrows+=("{\"variant\": \"$name\", \"model\": \"$model\", \"error\": \"bench failed\"}")
            continue
        fi
        varrows+=("{\"variant\": \"$name\", \"defines\": \"$vdefs\", \"format\": \"$vfmt\", \"model\": \"$model\", \"default_tok_s\": ${ts:-0}, \"variant_tok_s\": ${vs:-0}, \"default_over_variant\": ${sp:-0}}")
        log "variant $name $model: ${varrows[-1]}"
    done
done
# ---- cycle profiles ----
for model in $models; do
    b=$work/$model.profile.$target.megac
    [ -d "$b" ] || continue
    if MEGAC_CUDA_PROFILE=1 run timeout 120 "$megac" bench "$b" -n "$ntok" --runs 1 --ceiling-mb 64 \
            >"$out/$model.profile.log" 2>&1; then
        prof=$(grep -A3 '^megac profile' "$out/$model.profile.log" | tr -s ' ' | tr '\n' ';')
        log "$model profile: ${prof:-no table (MK_PROFILE counts on a device only)}"
    else
        log "$model profile: bench FAILED (see $model.profile.log)"
    fi
done
# ---- long context: f16 cache and sparse attention against dense ----
# SmolLM2-135M (bf16 weights) decoding from position LONG_CONTEXT (default
# 2000; 0 skips): where attention reads the cache, which the position-1
# benchmarks above hardly do. Each bundle is timed against the dense f32-cache
# one in the same runs (megac bench --versus): speedup = bundle / dense.
long=${LONG_CONTEXT:-2000}
longrows=()
if [ "$long" -gt 0 ]; then
    lm=models/smollm2-135m.yaml
    long_compile() { # NAME [--set ...]: a SmolLM2 bundle with room for the context
        local k=$1
        shift
        run timeout 300 "$megac" compile "$lm" --target "$target" --set quant.default=bf16 --set compile.max_seq=8192 \
            "$@" -o "$work/long.$k.megac" >"$out/long.$k.compile.log" 2>&1 || echo failed >"$work/long.$k.failed"
    }
    log "long context ($long positions): compiling SmolLM2-135M dense, f16 cache, sink_window, streaming, tova"
    # all but the f16 one (the default cache since 2026-12-06) keep an f32
    # cache, so that each row measures one change against the dense f32 one
    f32=(--set compile.kv_dtype=f32)
    long_compile dense "${f32[@]}" &
    long_compile f16 --set compile.kv_dtype=f16 &
    long_compile window "${f32[@]}" --set 'compile.attention=[{layers: all, kind: sink_window, sinks: 4, window: 508}]' &
    long_compile streaming "${f32[@]}" --set 'compile.kv_policy=[{layers: all, policy: streaming, sinks: 4, window: 508}]' &
    long_compile tova "${f32[@]}" --set 'compile.kv_policy=[{layers: all, policy: tova, budget: 512}]' &
    wait
    for k in f16 window streaming tova; do
        if [ -e "$work/long.$k.failed" ] || [ -e "$work/long.dense.failed" ]; then
            log "long $k: compile FAILED (see long.$k.compile.log, long.dense.compile.log)"
            longrows+=("{\"setting\": \"$k\", \"error\": \"compile failed\"}")
            continue
        fi
        if ! versus "$out/long.$k.bench.log" "$work/long.$k.megac" "$work/long.dense.megac" --context "$long" \
                -n "${LONG_TOKENS:-32}" --runs 3; then
            log "long $k: bench FAILED (see long.$k.bench.log)"
            longrows+=("{\"setting\": \"$k\", \"error\": \"bench failed\"}")
            continue
        fi
        longrows+=("{\"setting\": \"$k\", \"context\": $long, \"tok_s\": ${ts:-0}, \"dense_tok_s\": ${vs:-0}, \"speedup\": ${sp:-0}}")
        log "long $k: ${longrows[-1]}"
    done
fi
# The report (gpu-check.json, gpu-check.md, and the markdown on stdout):
# written before ncu (stdout dropped) and again after it, so that a run cut
# during ncu still leaves one.
write_report() {
    printf '%s\n' "${longrows[@]}" >"$out/long.jsonl"
    printf '%s\n' "${varrows[@]}" >"$out/variants.jsonl"
    python3 - "$out" "$target" "$tests_ok" "$gpu_pass" "$gpu_skip" "$hbm" "${read_gbps:-0}" "${rows[@]}" <<'EOF'
import json, sys
out, target, tests_ok, gpu_pass, gpu_skip, hbm, rd = sys.argv[1:8]
rows = [json.loads(r) for r in sys.argv[8:]]
longrows = [json.loads(l) for l in open(f"{out}/long.jsonl") if l.strip()]
varrows = [json.loads(l) for l in open(f"{out}/variants.jsonl") if l.strip()]
rep = {"target": target, "tests_passed": tests_ok == "true", "gpu_tests_passed": int(gpu_pass),
       "gpu_tests_skipped": int(gpu_skip), "hbm_gbps": float(hbm), "read_ceiling_gbps": float(rd), "decode": rows,
       "variants": varrows, "long_context": longrows}
json.dump(rep, open(f"{out}/gpu-check.json", "w"), indent=2)
md = [f"# megac gpu-check ({target})", "",
      f"CUDA tests: {'passed' if tests_ok == 'true' else 'FAILED'} "
      f"({gpu_pass} on the device, {gpu_skip} skipped); see test_cuda_gpu.log", "",
      f"Read ceiling measured: {rd} GB/s (vendor peak {hbm} GB/s).", "",
      "| model | weights | megac us/token | GB/s | % of ceiling | baseline (cuBLAS bf16) us/token | baseline / megac | megac prefill tok/s |",
      "|---|---|---|---|---|---|---|---|"]
for r in rows:
    if "error" in r:
        md.append(f"| {r['model']} | {r['format']} | {r['error']} | | | | | |")
        continue
    md.append(f"| {r['model']} | {r['format']} | {r['megac_us_per_token']} | {r['megac_gbps']} | {r['megac_ceiling_pct']} | "
              f"{r['baseline_us_per_token']} | {r['speedup_over_baseline']} | {r['megac_prefill_tok_s']} |")
md += ["", "GB/s = weight bytes read per token / time per token. megac's time is `megac bench`'s median over 5 runs "
       "and includes the per-step launch, memsets and logits copy; the baseline's is a CUDA graph replayed 300 times. "
       "Prefill: the same tokens fed as a prompt's (`megac bench --prefill`: steps without outputs, no output "
       "matrix, no logits copied)."]
if varrows:
    md += ["", "Kernel variants (`megac bench default --versus variant -n N --runs 5`, the default kernel of "
           "the variant's weight format; MEGAC_CUDA_DEFINES for the variant, set.KEY=V a --set KEY=V):", "",
           "| variant | defines | weights | model | default tok/s | variant tok/s (same runs) | default / variant |",
           "|---|---|---|---|---|---|---|"]
    for r in varrows:
        if "error" in r:
            md.append(f"| {r['variant']} | | | {r['model']} | {r['error']} | | |")
        else:
            md.append(f"| {r['variant']} | {r['defines']} | {r['format']} | {r['model']} | {r['default_tok_s']} | "
                      f"{r['variant_tok_s']} | {r['default_over_variant']} |")
import glob, os
for f in sorted(glob.glob(f"{out}/*.profile.log")):
    prof = [l.rstrip() for l in open(f) if l.startswith(("megac profile", "  "))]
    if prof:
        md += ["", f"Cycle profile, {os.path.basename(f)[:-len('.profile.log')]} bf16 (MK_PROFILE=1, MEGAC_CUDA_PROFILE=1):",
               "", "```"] + prof + ["```"]
if longrows:
    md += ["", "Long context (SmolLM2-135M, bf16 weights, `megac bench X --versus dense --context N -n 32 --runs 3`):", "",
           "| setting | context | tok/s | dense tok/s (same runs) | speedup |", "|---|---|---|---|---|"]
    for r in longrows:
        if "error" in r:
            md.append(f"| {r['setting']} | {r['error']} | | | |")
        else:
            md.append(f"| {r['setting']} | {r['context']} | {r['tok_s']} | {r['dense_tok_s']} | {r['speedup']} |")
import os.path
if os.path.exists(f"{out}/ncu.txt"):
    keep = [l.rstrip() for l in open(f"{out}/ncu.txt") if l.startswith("    ") and "---" not in l]
    if keep:
        md += ["", "Nsight Compute, one decode step of the last model's bf16 kernel (all of it in ncu.txt):", "",
               "```"] + keep[:80] + ["```"]
open(f"{out}/gpu-check.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
EOF
}
bench_ok=true
for r in "${longrows[@]}" "${varrows[@]}"; do case "$r" in *'"error"'*) bench_ok=false ;; esac; done
for r in "${rows[@]}"; do case "$r" in *'"error"'*) bench_ok=false ;; esac; done
write_report >/dev/null
# ---- hardware counters of one step (Nsight Compute) ----
# Last, so that a slow ncu cuts nothing else. The last model's bf16 kernel, one launch after a few: where the cycle
# profile says how long each op takes, these say why (DRAM throughput
# against its peak, what warps stall on, occupancy). Clocks left alone.
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_model=${models##* }
if [ "${NCU:-1}" != 0 ] && [ "$target" != host-cuda ]; then
    b=$work/$ncu_model.bf16.$target.megac
    if [ -n "${DEADLINE:-}" ] && [ $((SECONDS + 150)) -gt "$DEADLINE" ]; then
        log "ncu: skipped: ${SECONDS} s in, and DEADLINE=$DEADLINE leaves less than its 150 s"
    elif [ -z "$ncu_bin" ]; then
        log "ncu: not found; no hardware counters"
    elif [ ! -d "$b" ]; then
        log "ncu: no bf16 bundle of $ncu_model (FORMATS without bf16?)"
    elif run timeout 150 "$ncu_bin" --clock-control none --kernel-name megac_kernel --launch-skip 6 --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
            --section LaunchStats --section SchedulerStats "$megac" bench "$b" -n 12 --runs 1 --ceiling-mb 16 \
            >"$out/ncu.txt" 2>&1; then
        log "ncu: $ncu_model bf16: $(grep -E 'DRAM Throughput|Memory Throughput|Achieved Occupancy' "$out/ncu.txt" |
            tr -s ' ' | tr '\n' ';')"
    else
        log "ncu: FAILED (see ncu.txt): $(tail -2 "$out/ncu.txt" | tr '\n' ' ')"
    fi
fi
rm -rf "$work"
write_report
$tests_ok && $bench_ok
