#!/usr/bin/env python3
"""fuzz-loaders.py: a mutation campaign against megac's readers (a
developer's tool, not run by the test suite). It damages a seed input (a
file or the files of a folder) N times at random and runs one megac command
on each result; a finding is an exit by signal, a sanitizer report, a run
past 60 s, or a failure that prints nothing. Each finding is kept under
OUT (default /tmp/megac-fuzz) and printed with its first lines of stderr.

Mutations: cut short, bytes overwritten (mostly in the first 4 KiB, where
the headers are), 4- or 8-byte fields set to 0, 1, 2^31-1, 2^32-1, 2^63-1,
2^64-1 and the like, junk inserted, a run deleted, text characters changed.

  python3 scripts/fuzz-loaders.py MEGAC SEED N MODE [RNG_SEED]
    MODE: run (megac run SEED --engine reference -n 3 --temp 0: header,
          weights, tokenizer and a forward pass), describe, validate (a
          .sched), lower (a .yaml)
  e.g. with an ASan+UBSan build of megac (cmake -DMEGAC_SANITIZE=ON):
    python3 scripts/fuzz-loaders.py build-asan/compiler/megac \\
        tests/fixtures/weights/llama3.gguf 300 run 11
A llama2.c checkpoint is fuzzed with the tok512.bin beside it copied, as is.
"""
import os
import random
import shutil
import subprocess
import sys


def mutate(rng, b):
    b = bytearray(b)
    k = rng.randrange(6)
    if k == 0 and len(b) > 1:
        return bytes(b[:rng.randrange(len(b))])
    if k == 1:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(min(len(b), 4096) if rng.random() < 0.8 else len(b))
            b[i] = rng.randrange(256)
        return bytes(b)
    if k == 2:
        i = rng.randrange(min(len(b), 4096))
        v = rng.choice([0, 1, 0xff, 65536, 0x7fffffff, 0x80000000, 0xffffffff, 2**32,
                        0x7fffffffffffffff, 0xffffffffffffffff])
        w = rng.choice([4, 8])
        b[i:i + w] = (v & (2**(8 * w) - 1)).to_bytes(w, 'little')
        return bytes(b)
    if k == 3:
        i = rng.randrange(len(b) + 1)
        return bytes(b[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + b[i:])
    if k == 4:
        i = rng.randrange(len(b))
        return bytes(b[:i] + b[min(len(b), i + rng.randint(1, 64)):])
    for _ in range(rng.randint(1, 4)):
        b[rng.randrange(min(len(b), 4096))] = ord(rng.choice('0123456789-.e"{}[]:,\n\t x\\'))
    return bytes(b)


def main():
    if len(sys.argv) < 5 or sys.argv[4] not in ('run', 'describe', 'validate', 'lower'):
        sys.exit(__doc__)
    megac, seed, n, mode = os.path.abspath(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = random.Random(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
    out = os.environ.get('OUT', '/tmp/megac-fuzz')
    work = os.path.join(out, 'work%d' % os.getpid())
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, ASAN_OPTIONS='detect_leaks=1', UBSAN_OPTIONS='print_stacktrace=1')
    tok = os.path.join(os.path.dirname(seed), 'tok512.bin')
    if seed.endswith('.bin') and os.path.exists(tok):
        shutil.copy(tok, work)
    found = 0
    for it in range(n):
        if os.path.isdir(seed):
            target = os.path.join(work, 'm')
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(seed, target)
            f = os.path.join(target, rng.choice(sorted(os.listdir(target))))
        else:
            target = f = os.path.join(work, 'm' + os.path.splitext(seed)[1])
            shutil.copy(seed, f)
        with open(f, 'rb') as h:
            data = h.read()
        with open(f, 'wb') as h:
            h.write(mutate(rng, data))
        cmd = {'run': [megac, 'run', target, '--engine', 'reference', '-n', '3', '--temp', '0'],
               'describe': [megac, 'describe', target], 'validate': [megac, 'validate', target],
               'lower': [megac, 'lower', target, '-o', os.path.join(work, 'o.sched')]}[mode]
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=60, env=env, cwd=work)
            err, rc = p.stderr.decode('utf-8', 'replace'), p.returncode
            bad = rc < 0 or rc >= 128 or any(s in err for s in ('Sanitizer', 'runtime error:'))
            if rc != 0 and not err.strip():
                bad, err = True, '(failed, and printed nothing)'
        except subprocess.TimeoutExpired:
            bad, err, rc = True, '(still running after 60 s)', None
        if bad:
            found += 1
            keep = os.path.join(out, 'find-%s-%d' % (os.path.basename(seed.rstrip('/')), it))
            if os.path.isdir(target):
                shutil.copytree(target, keep, dirs_exist_ok=True)
            else:
                shutil.copy(target, keep + os.path.splitext(seed)[1])
            print('FINDING %s (exit %s): %s' % (keep, rc, err[:600]), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print('%s, %s: %d runs, %d findings' % (seed, mode, n, found))
    sys.exit(1 if found else 0)


if __name__ == '__main__':
    main()
