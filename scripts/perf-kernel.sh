#!/usr/bin/env bash
# perf-kernel.sh - where a CPU bundle's decode spends its time, by
# instruction, on machines without hardware counters (KVM guests).
#
#   scripts/perf-kernel.sh NAME.megac [-- BENCH ARGS...]
#
# Runs `megac bench NAME.megac` (default `-n 64 --runs 5`; anything after
# `--` replaces that) under `perf record -e cpu-clock` (timer sampling, so
# it needs no PMU), then places each sample taken in the bundle's kernel.so
# on an instruction of `objdump -d` of it and prints
#   - the share of the kernel's samples in each of its functions, and
#   - the loops (a backward jump and the bytes it spans) holding at least
#     0.5% of them, the 20 shortest, shortest first, and
#   - the 12 instructions with the most samples,
# so that a stall shows as the instruction after the one that waits (a
# load, a prefetch that found the fill buffers full, a dependent chain).
# The runtime loads a private copy of kernel.so (a memfd, "megac-kernel.so",
# or a temp file it removes), so perf
# cannot symbolize it; the copy's load address comes from the recording's
# mmap events. The timer's interrupts stop one worker at a time and the
# other then waits for it: the wait loop in megac_worker takes ~25% of a
# SmolLM2 step's samples where the cycle profile (-DMEGAC_CPU_PROFILE=ON)
# measures 3-8% without them, so read the waits from that profile and
# the shares within a kernel from this. The bench's ceiling passes run
# in the megac binary and are not counted. MEGAC (default build/compiler/megac)
# picks the binary; PERF_DATA (default a temporary file) keeps the
# recording. Needs perf, objdump and python3.
set -euo pipefail

usage() {
    sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}
[ $# -ge 1 ] || usage 2
case "$1" in -h | --help) usage 0 ;; esac
bundle=$1
shift
bench_args=(-n 64 --runs 5)
if [ $# -gt 0 ]; then
    [ "$1" = "--" ] || { echo "perf-kernel.sh: unexpected '$1' (bench arguments go after --)" >&2; exit 2; }
    shift
    bench_args=("$@")
fi
here=$(cd "$(dirname "$0")/.." && pwd)
megac=${MEGAC:-$here/build/compiler/megac}
for tool in perf objdump python3; do
    command -v "$tool" >/dev/null || { echo "perf-kernel.sh: $tool not found" >&2; exit 1; }
done
[ -x "$megac" ] || { echo "perf-kernel.sh: $megac: no megac binary (build first, or set MEGAC)" >&2; exit 1; }
[ -f "$bundle/kernel.so" ] || { echo "perf-kernel.sh: $bundle: no kernel.so (a CPU bundle from megac compile)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data=${PERF_DATA:-$tmp/perf.data}
perf record -q -e cpu-clock -F 10000 -o "$data" "$megac" bench "$bundle" "${bench_args[@]}" >"$tmp/bench.txt" 2>&1 ||
    { cat "$tmp/bench.txt" >&2; echo "perf-kernel.sh: perf record failed" >&2; exit 1; }
grep -E '^tok_s=' "$tmp/bench.txt" || true
perf script -i "$data" --show-mmap-events 2>/dev/null | grep -E 'MMAP.*r-xp .*(/kernel\.so|/memfd:megac-kernel\.so( \(deleted\))?)$' >"$tmp/mmap.txt" || true
perf script -i "$data" -F ip,dso 2>/dev/null | awk '/kernel\.so/ { print $1 }' >"$tmp/ips.txt"
objdump -d --no-show-raw-insn "$bundle/kernel.so" >"$tmp/kernel.dis"
python3 - "$tmp/mmap.txt" "$tmp/ips.txt" "$tmp/kernel.dis" <<'PY'
import bisect, collections, re, sys

mmap, ips, dis = sys.argv[1:4]
m = re.search(r'\[0x([0-9a-f]+)\(0x[0-9a-f]+\) @ 0x([0-9a-f]+) ', open(mmap).read())
if not m:
    sys.exit("perf-kernel.sh: no mapping of kernel.so in the recording")
base = int(m.group(1), 16) - int(m.group(2), 16)   # address of file offset 0
funcs, insns = [], []
for line in open(dis):
    f = re.match(r'^([0-9a-f]+) <(.*)>:', line)
    if f:
        funcs.append((int(f.group(1), 16), f.group(2)))
    i = re.match(r'\s+([0-9a-f]+):\s+(.*)', line)
    if i:
        insns.append((int(i.group(1), 16), i.group(2)))
samples = collections.Counter(int(x, 16) - base for x in open(ips))
total = sum(samples.values())
if not total:
    sys.exit("perf-kernel.sh: no samples in kernel.so")
starts = [a for a, _ in funcs]
byfunc = collections.Counter()
for a, n in samples.items():
    i = bisect.bisect_right(starts, a) - 1
    byfunc[funcs[i][1] if i >= 0 else '?'] += n
print(f"{total} samples in kernel.so")
for name, n in byfunc.most_common(12):
    print(f"{100 * n / total:6.2f}%  {name}")
addrs = [a for a, _ in insns]
cum = [0]
for a, _ in insns:
    cum.append(cum[-1] + samples.get(a, 0))
loops = []
for a, text in insns:
    j = re.match(r'j\w+\s+([0-9a-f]+)', text)
    if j and int(j.group(1), 16) < a:
        t = int(j.group(1), 16)
        n = cum[bisect.bisect_right(addrs, a)] - cum[bisect.bisect_left(addrs, t)]
        if n / total >= 0.005:
            loops.append((a - t, t, a, n))
print("loops with 0.5% or more (backward jumps), shortest first:")
for span, t, a, n in sorted(loops)[:20]:
    f = funcs[bisect.bisect_right(starts, t) - 1][1]
    print(f"{100 * n / total:6.2f}%  {t:x}-{a:x} ({span} bytes) in {f}")
print("hottest instructions (a stall shows on the one after the waiting one):")
text = dict(insns)
for a, n in samples.most_common(12):
    print(f"{100 * n / total:6.2f}%  {a:x}  {text.get(a, '?')}")
PY
