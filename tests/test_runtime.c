/*
 * test_runtime.c - the runtime on its own, with a hand-written kernel.
 *
 * Each test builds a small bundle in a temp folder: a toy kernel.so written
 * in C below (compiled with the system cc) that follows kernel_abi.h, its
 * manifest, a schedule text, weights.bin and a byte tokenizer. The toy
 * kernel's logits are a function of the weights, token and position that the
 * test recomputes; its workers record their thread ids (worker 0 also the
 * MegacArgs.spin_ns it was given), and one token makes
 * worker 0 wait on a counter nobody signals, to trip the watchdog.
 * Then the bundle is damaged in the ways megac_open must refuse: each
 * manifest key the kernel or the schedule states, edited, must be refused
 * with a message naming the key and the file that disagrees.
 */
#include "compiler/bench.h"
#include "runtime/backend.h"
#include "runtime/megac.h"
#include "runtime/tokenizer.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define V 259           /* vocabulary: the byte tokenizer's size */
#define MAXSEQ 16
#define HANG_TOKEN 258  /* worker 0 waits for a signal that never comes */
#define OFF_TOK 0
#define OFF_NEXT 4
#define OFF_SPIN 16     /* the u64 MegacArgs.spin_ns worker 0 was given */
#define OFF_TIDS 64     /* one i32 per worker */
#define OFF_LOGITS 1024
/* MEGAC_KERNEL_ABI as text, for the manifests, edits and messages below
 * (string constants): an ABI bump edits it here, and the assert says so. */
#define ABI_TEXT "7"
_Static_assert(MEGAC_KERNEL_ABI == 7, "ABI_TEXT must spell MEGAC_KERNEL_ABI");
#define ARENA 4096      /* more than the logits need: a larger vocab still fits */

static const char kernel_src[] =
    "#include <stdint.h>\n"
    "#include <time.h>\n"
    "#include <unistd.h>\n"
    "#include <sys/syscall.h>\n"
    "typedef struct { uint32_t flag, worker, pc, counter, value, threshold; } MegacAbort;\n"
    "typedef struct { const void *weights; void *arena; uint32_t *counters; MegacAbort *abort_info;\n"
    "                 int64_t pos; uint64_t timeout_ns; int64_t prompt_end; uint64_t spin_ns; } MegacArgs;\n"
    "const uint64_t megac_kernel_abi = KABI;\n"
    "const uint64_t megac_schedule_hash = HASH;\n"
    "const uint32_t megac_num_workers = NW;\n"
    "const uint64_t megac_kernel_facts[9] = {NW, 1, ARENA, 259 * 259 * 4, 259, 16, 0, 1024, 4};\n"
    "static uint64_t now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);\n"
    "    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec; }\n"
    "void megac_worker(const MegacArgs *a, uint32_t w) {\n"
    "    char *ar = a->arena; int tok = *(int32_t *)ar;\n"
    "    ((int32_t *)(ar + 64))[w] = (int32_t)syscall(SYS_gettid);\n"
    "    float *lg = (float *)(ar + 1024); const float *W = a->weights;\n"
    "    for (int i = (int)w; i < 259; i += NW) lg[i] = W[tok * 259 + i] + (float)a->pos;\n"
    "    __atomic_fetch_add(&a->counters[0], 1, __ATOMIC_RELEASE);\n"
    "    if (w != 0) return;\n"
    "    *(uint64_t *)(ar + 16) = a->spin_ns;\n"
    "    uint32_t need = tok == 258 ? NW + 1 : NW;\n"
    "    uint64_t dl = now_ns() + (a->timeout_ns ? a->timeout_ns : 2000000000u);\n"
    "    uint32_t c;\n"
    "    while ((c = __atomic_load_n(&a->counters[0], __ATOMIC_ACQUIRE)) < need) {\n"
    "        if (now_ns() > dl) { MegacAbort *x = a->abort_info; x->worker = w; x->pc = 3;\n"
    "            x->counter = 0; x->value = c; x->threshold = need; x->flag = 1; return; }\n"
    "    }\n"
    "    int best = 0; for (int i = 1; i < 259; i++) if (lg[i] > lg[best]) best = i;\n"
    "    *(int32_t *)(ar + 4) = best;\n"
    "}\n";

/* The toy schedule's text: enough of ir/text.c's format to state workers,
 * counters, vocab and max_seq, or (plain) none of them, so that only the
 * kernel's facts are checked. */
static void toy_sched(char *buf, size_t cap, int workers, bool plain)
{
    if (plain)
        snprintf(buf, cap, "# toy schedule of test_runtime.c\n");
    else
        snprintf(buf, cap,
                 "# toy schedule of test_runtime.c\nschedule toy target cpu workers %d\n"
                 "shape dim=4 hidden=4 layers=1 heads=1 kv_heads=1 head_dim=4 vocab=%d max_seq=%d eps=1e-05 "
                 "pairing=adjacent\ncounter c\n",
                 workers, V, MAXSEQ);
}

/* Weight of (token, i): distinct values so the argmax is unique. */
static float toy_weight(int t, int i) { return (float)((t * 37 + i * 101) % 997) / 997.0f; }

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

static void write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static void write_text(const char *dir, const char *name, const char *s) { write_file(dir, name, s, strlen(s)); }

static char *read_whole(const char *dir, const char *name, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    char *p = malloc((size_t)n + 1);
    cr_assert_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* The manifest for the kernel.so now in dir (its size and hash). */
static void write_manifest(const char *dir, int workers, uint64_t hash)
{
    size_t klen;
    char *k = read_whole(dir, "kernel.so", &klen);
    uint64_t khash = fnv1a(k, klen);
    free(k);
    char buf[2048];
    snprintf(buf, sizeof buf,
             "# megac bundle\nformat: 3\nname: toy\ntarget: cpu\nkernel: kernel.so\nkernel_bytes: %zu\n"
             "kernel_hash: %016" PRIx64 "\nkernel_abi: " ABI_TEXT "\n"
             "schedule_hash: %016" PRIx64 "\nweights_bytes: %d\nweights_hash: 0000000000000000\n"
             "weights_read_bytes: %d\narena_bytes: %d\n"
             "counters: 1\nworkers: %d\nvocab: %d\nmax_seq: %d\nbos: 1\neos: 2\n"
             "io_tok: %d\nio_logits: %d\nio_next: %d\n",
             klen, khash, hash, V * V * 4, V * V * 4, ARENA, workers, V, MAXSEQ, OFF_TOK, OFF_LOGITS, OFF_NEXT);
    write_text(dir, "manifest.yaml", buf);
}

static void compile_kernel(const char *dir, int workers, uint64_t hash, unsigned abi)
{
    char src[1024], cmd[4096];
    snprintf(src, sizeof src, "%s/toy_kernel.c", dir);
    write_text(dir, "toy_kernel.c", kernel_src);
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 -D_GNU_SOURCE -O1 -shared -fPIC -DKABI=%uu -DHASH=0x%016" PRIx64 "ull -DNW=%d "
             "-DARENA=%d -o %s/kernel.so %s",
             abi, hash, workers, ARENA, dir, src);
    cr_assert_eq(system(cmd), 0, "cannot compile the toy kernel: %s", cmd);
}

static void write_tokenizer(const char *dir)
{
    Tokenizer *t = tok_new(TOK_BYTES, V);
    const char *names[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++)
        tok_set_piece(t, i, names[i], strlen(names[i]), 0);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tok_set_piece(t, 3 + b, &c, 1, 0);
    }
    tok_set_ids(t, 1, 2);
    tok_finish(t);
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    tok_free(t);
}

/* A complete, consistent toy bundle for `workers` workers in a new temp
 * dir; with a plain schedule (one that states no facts) when plain. */
static char *make_bundle_sched(int workers, bool plain)
{
    char *dir = strdup("/tmp/megac-rt-XXXXXX");
    cr_assert(mkdtemp(dir));
    char sched[512];
    toy_sched(sched, sizeof sched, workers, plain);
    uint64_t h = fnv1a(sched, strlen(sched));
    write_text(dir, "schedule.sched", sched);
    compile_kernel(dir, workers, h, MEGAC_KERNEL_ABI);
    write_manifest(dir, workers, h);
    float *w = malloc(sizeof(float) * V * V);
    for (int t = 0; t < V; t++)
        for (int i = 0; i < V; i++)
            w[t * V + i] = toy_weight(t, i);
    write_file(dir, "weights.bin", w, sizeof(float) * V * V);
    free(w);
    write_tokenizer(dir);
    return dir;
}

static char *make_bundle(int workers) { return make_bundle_sched(workers, false); }

static void remove_bundle(char *dir)
{
    if (getenv("MEGAC_TEST_KEEP")) {     /* for debugging: leave it */
        fprintf(stderr, "kept %s\n", dir);
        free(dir);
        return;
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    free(dir);
}

/* Opening `dir` must fail with `st` and a message containing a and b. */
static void expect_refusal(const char *dir, megac_status st, const char *a, const char *b)
{
    megac_model *m = NULL;
    megac_status got = megac_open(dir, &m);
    const char *msg = megac_last_open_error();
    cr_assert_eq(got, st, "status %d, expected %d: %s", got, st, msg);
    cr_assert_null(m);
    cr_assert(strstr(msg, a), "message lacks '%s': %s", a, msg);
    cr_assert(strstr(msg, b), "message lacks '%s': %s", b, msg);
}

static int toy_argmax(int tok)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (toy_weight(tok, i) > toy_weight(tok, best))
            best = i;
    return best;
}

Test(runtime, steps_match_the_toy_kernel)
{
    char *dir = make_bundle(3);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_num_workers(m), 3);
    cr_assert_eq(megac_vocab_size(m), V);
    cr_assert_eq(megac_weights_bytes(m), (uint64_t)V * V * 4);
    cr_assert_null(megac_logits(m));
    int toks[] = {1, 72, 3, 200, 257};
    for (int s = 0; s < 5; s++) {
        cr_assert_eq(megac_step(m, toks[s]), MEGAC_OK, "%s", megac_error(m));
        const float *lg = megac_logits(m);
        for (int i = 0; i < V; i++)
            cr_assert_eq(lg[i], toy_weight(toks[s], i) + (float)s, "step %d logit %d", s, i);
        cr_assert_eq(megac_argmax(m), toy_argmax(toks[s]));
        cr_assert_eq(megac_position(m), s + 1);
    }
    cr_assert_eq(megac_reset(m), MEGAC_OK);
    cr_assert_eq(megac_position(m), 0);
    megac_close(m);
    remove_bundle(dir);
}

/* A host kernel's weights are read into memory by default (huge pages
 * asked for) and mapped from weights.bin with MEGAC_WEIGHTS_MMAP=1; the
 * kernel reads the same values either way. */
Test(runtime, weights_read_into_memory_or_mapped)
{
    char *dir = make_bundle(2);
    for (int mapped = 0; mapped < 2; mapped++) {
        if (mapped)
            setenv("MEGAC_WEIGHTS_MMAP", "1", 1);
        megac_model *m;
        cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
        cr_assert_eq(megac_weights_in_memory(m), !mapped, "mapped=%d", mapped);
        int toks[] = {5, 257, 0};
        for (int s = 0; s < 3; s++) {
            cr_assert_eq(megac_step(m, toks[s]), MEGAC_OK, "%s", megac_error(m));
            const float *lg = megac_logits(m);
            for (int i = 0; i < V; i++)
                cr_assert_eq(lg[i], toy_weight(toks[s], i) + (float)s, "mapped=%d step %d logit %d", mapped, s, i);
        }
        megac_close(m);
    }
    unsetenv("MEGAC_WEIGHTS_MMAP");
    cr_assert_eq(megac_weights_in_memory(NULL), 0);
    remove_bundle(dir);
}

Test(runtime, bad_tokens_and_positions_are_errors)
{
    char *dir = make_bundle(1);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_step(m, V), MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(m), "vocabulary"));
    cr_assert_eq(megac_step(m, -1), MEGAC_ERR_ARG);
    for (int i = 0; i < MAXSEQ; i++)
        cr_assert_eq(megac_step(m, 5), MEGAC_OK);
    cr_assert_eq(megac_step(m, 5), MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(m), "context"), "%s", megac_error(m));
    megac_close(m);
    remove_bundle(dir);
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Workers are the same W threads every step, and they sleep between steps:
 * the process burns (almost) no CPU time while no step runs; they take no
 * signals. */
Test(runtime, workers_persist_and_park_between_steps)
{
    char *dir = make_bundle(4);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_step(m, 10), MEGAC_OK, "%s", megac_error(m));
    int32_t tids[4];
    const char *arena = (const char *)megac_logits(m) - OFF_LOGITS;
    memcpy(tids, arena + OFF_TIDS, sizeof tids);
    for (int i = 0; i < 4; i++) {
        cr_assert_neq(tids[i], (int32_t)getpid(), "worker %d ran on the caller's thread", i);
        for (int j = 0; j < i; j++)
            cr_assert_neq(tids[i], tids[j], "workers %d and %d share a thread", i, j);
    }
    double c0 = cpu_seconds();
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    double idle = cpu_seconds() - c0;
    cr_assert_lt(idle, 0.03, "the process used %.3f s of CPU in 0.3 s of idle time: workers spin", idle);
    for (int s = 0; s < 5; s++) {
        cr_assert_eq(megac_step(m, 20 + s), MEGAC_OK, "%s", megac_error(m));
        int32_t again[4];
        memcpy(again, arena + OFF_TIDS, sizeof again);
        cr_assert_arr_eq(again, tids, sizeof tids, "step %d ran on new threads", s);
    }
    /* the workers block every signal (SigBlk of /proc/self/task/TID/status):
     * a SIGINT goes to the application's threads, not to a worker whose
     * handler would run beside the application's work */
    for (int i = 0; i < 4; i++) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tids[i]);
        FILE *f = fopen(path, "r");
        cr_assert(f, "%s", path);
        unsigned long long blk = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &blk) == 1)
                break;
        fclose(f);
        cr_assert(blk & (1ull << (SIGINT - 1)) && blk & (1ull << (SIGTERM - 1)) && blk & (1ull << (SIGHUP - 1)),
                  "worker %d blocks %#llx", i, blk);
    }
    megac_close(m);
    remove_bundle(dir);
}

/* MegacArgs.spin_ns, what the kernel's waits spin for before they sleep:
 * non-zero only where each worker has an allowed CPU of its own and
 * MEGAC_NO_SPIN is unset (kernel_body.c's waits, test_cpu_ops.c). */
static uint64_t spin_ns_given(int workers)
{
    char *dir = make_bundle(workers);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_step(m, 10), MEGAC_OK, "%s", megac_error(m));
    uint64_t v;
    memcpy(&v, (const char *)megac_logits(m) - OFF_LOGITS + OFF_SPIN, sizeof v);
    megac_close(m);
    remove_bundle(dir);
    return v;
}

Test(runtime, waits_spin_only_with_a_cpu_per_worker)
{
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int ncpu = CPU_COUNT(&allowed);
    const char *env = getenv("MEGAC_NO_SPIN");
    char *saved = env ? strdup(env) : NULL;
    unsetenv("MEGAC_NO_SPIN");
    cr_assert_gt(spin_ns_given(1), 0, "1 worker on %d CPUs: waits spin", ncpu);
    if ((OFF_LOGITS - OFF_TIDS) / 4 > ncpu)
        cr_assert_eq(spin_ns_given(ncpu + 1), 0, "%d workers on %d CPUs: waits sleep", ncpu + 1, ncpu);
    setenv("MEGAC_NO_SPIN", "1", 1);
    cr_assert_eq(spin_ns_given(1), 0, "MEGAC_NO_SPIN=1: waits sleep");
    setenv("MEGAC_NO_SPIN", "0", 1);
    cr_assert_gt(spin_ns_given(1), 0, "MEGAC_NO_SPIN=0 is off (it was on whatever its value)");
    if (saved)
        setenv("MEGAC_NO_SPIN", saved, 1);
    else
        unsetenv("MEGAC_NO_SPIN");
    free(saved);
}

Test(runtime, watchdog_abort_is_reported_not_hung)
{
    char *dir = make_bundle(2);
    /* the healthy step 7 must fit too, on a loaded sanitized CI machine */
    setenv("MEGAC_WATCHDOG_MS", "1000", 1);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    unsetenv("MEGAC_WATCHDOG_MS");
    cr_assert_eq(megac_step(m, 7), MEGAC_OK, "%s", megac_error(m));
    cr_assert_eq(megac_step(m, HANG_TOKEN), MEGAC_ERR_KERNEL);
    const char *e = megac_error(m);
    cr_assert(strstr(e, "worker 0") && strstr(e, "pc 3") && strstr(e, "counter 0") && strstr(e, "at 2") &&
                  strstr(e, "threshold 3"),
              "%s", e);
    cr_assert_eq(megac_position(m), 1, "a failed step must not advance");
    cr_assert_eq(megac_step(m, 9), MEGAC_OK, "after an abort: %s", megac_error(m));
    cr_assert_eq(megac_argmax(m), toy_argmax(9));
    megac_close(m);
    remove_bundle(dir);
}

/* MEGAC_WATCHDOG_MS: plain milliseconds, at most RT_WATCHDOG_MAX_MS (a
 * huge value meant as "never" wrapped around to 448 us before); anything
 * else leaves the kernel's default. */
Test(runtime, watchdog_setting_is_parsed_with_care)
{
    static const struct {
        const char *v;
        uint64_t ns;
    } cases[] = {{"250", 250000000ull},  {"0", 0},       {"", 0},        {"abc", 0},
                 {"-5", 0},              {"12ms", 0},    {" 7", 0},
                 {"18446744073710", RT_WATCHDOG_MAX_MS * 1000000ull},
                 {"99999999999999999999999", RT_WATCHDOG_MAX_MS * 1000000ull}};
    unsetenv("MEGAC_WATCHDOG_MS");
    cr_assert_eq(rt_watchdog_ns(), 0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        setenv("MEGAC_WATCHDOG_MS", cases[i].v, 1);
        cr_assert_eq(rt_watchdog_ns(), cases[i].ns, "'%s'", cases[i].v);
    }
    unsetenv("MEGAC_WATCHDOG_MS");
}

typedef struct {
    int n, stop_after;
    int toks[64];
} Collected;

static int collect(void *user, int token, const char *text)
{
    Collected *c = user;
    cr_assert(text);
    c->toks[c->n++] = token;
    return c->n == c->stop_after;
}

Test(runtime, generate_greedy_streams_tokens)
{
    char *dir = make_bundle(2);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    int prompt[] = {1, 40, 41};
    Collected c = {0, 100, {0}};
    megac_sampler greedy = {0, 0, 1, 0};
    megac_stats st;
    cr_assert_eq(megac_generate(m, prompt, 3, 6, &greedy, collect, &c, &st), MEGAC_OK, "%s", megac_error(m));
    int expect = toy_argmax(41);
    int nexp = 0;
    for (int i = 0; i < 6 && expect != 1 && expect != 2; i++) {
        cr_assert_eq(c.toks[i], expect, "token %d", i);
        nexp++;
        expect = toy_argmax(expect);
    }
    cr_assert_eq(c.n, nexp);
    cr_assert_eq(st.prompt_tokens, 3);
    cr_assert_eq(st.generated_tokens, nexp);
    cr_assert_eq(st.stop_token, nexp < 6 ? expect : -1, "the stop token that ended it");
    /* the callback stops it */
    cr_assert_eq(megac_reset(m), MEGAC_OK);
    Collected c2 = {0, 2, {0}};
    cr_assert_eq(megac_generate(m, prompt, 3, 6, &greedy, collect, &c2, &st), MEGAC_OK);
    cr_assert_eq(c2.n, 2);
    cr_assert_eq(st.stop_token, -1, "the callback stopped it, no stop token");
    megac_close(m);
    remove_bundle(dir);
}

/* Rewrites `name` in dir with `from` replaced by `to`. */
static void edit_file(const char *dir, const char *name, const char *from, const char *to)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *at = strstr(buf, from);
    cr_assert(at, "'%s' not in %s", from, path);
    char out[4096];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    write_text(dir, name, out);
}

Test(runtime, refuses_mismatched_bundles)
{
    char *dir = make_bundle(2);
    char path[1024];
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    megac_close(m);

    edit_file(dir, "manifest.yaml", "format: 3", "format: 4");
    expect_refusal(dir, MEGAC_ERR_FORMAT, "manifest.yaml:2:", "format 4");
    edit_file(dir, "manifest.yaml", "format: 4", "format: 3");

    edit_file(dir, "schedule.sched", "toy", "tox");
    expect_refusal(dir, MEGAC_ERR_FORMAT, "schedule.sched", "does not match");
    edit_file(dir, "schedule.sched", "tox", "toy");

    snprintf(path, sizeof path, "%s/weights.bin", dir);
    cr_assert_eq(truncate(path, V * V * 4 - 64), 0);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "weights.bin", "but the manifest says");
    cr_assert_eq(truncate(path, V * V * 4), 0);

    edit_file(dir, "manifest.yaml", "kernel_abi: " ABI_TEXT, "kernel_abi: 9");
    expect_refusal(dir, MEGAC_ERR_FORMAT, "manifest.yaml", "kernel_abi 9");
    edit_file(dir, "manifest.yaml", "kernel_abi: 9", "kernel_abi: " ABI_TEXT);

    edit_file(dir, "manifest.yaml", "vocab: 259", "vocab: 259\nvocab_size: 3");
    expect_refusal(dir, MEGAC_ERR_FORMAT, "manifest.yaml:17:", "unknown key 'vocab_size'");
    edit_file(dir, "manifest.yaml", "\nvocab_size: 3", "");

    edit_file(dir, "manifest.yaml", "eos: 2\n", "");
    expect_refusal(dir, MEGAC_ERR_FORMAT, "manifest.yaml", "missing key 'eos'");
    edit_file(dir, "manifest.yaml", "bos: 1\n", "bos: 1\neos: 2\n");

    /* the schedule would refuse this vocab first: a plain one states none */
    char *plain = make_bundle_sched(2, true);
    edit_file(plain, "manifest.yaml", "vocab: 259", "vocab: 258");
    expect_refusal(plain, MEGAC_ERR_FORMAT, "tokenizer.bin", "259 tokens, more than the model's vocabulary of 258");
    remove_bundle(plain);

    edit_file(dir, "manifest.yaml", "target: cpu", "target: tpu");
    expect_refusal(dir, MEGAC_ERR_FORMAT, "manifest.yaml", "unknown target 'tpu'");
    /* a CUDA target goes to the CUDA backend: no driver here, or a kernel.so
     * that is no cubin on a GPU machine; either way a refusal, not a crash */
    edit_file(dir, "manifest.yaml", "target: tpu", "target: sm_90");
    megac_status st = megac_open(dir, &m);
    cr_assert(st != MEGAC_OK && m == NULL && megac_last_open_error()[0], "status %d", st);
    edit_file(dir, "manifest.yaml", "target: sm_90", "target: cpu");

    edit_file(dir, "manifest.yaml", "io_logits: 1024", "io_logits: 4000");
    expect_refusal(dir, MEGAC_ERR_FORMAT, "manifest.yaml:21:12: error: io_logits: 4000", "does not fit the arena");
    edit_file(dir, "manifest.yaml", "io_logits: 4000", "io_logits: 1024");

    /* a kernel built for another schedule, with manifest and schedule agreeing */
    char sched[512];
    toy_sched(sched, sizeof sched, 2, false);
    uint64_t h = fnv1a(sched, strlen(sched));
    compile_kernel(dir, 2, 0x1234, MEGAC_KERNEL_ABI);
    write_manifest(dir, 2, h);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "kernel.so", "0000000000001234");
    compile_kernel(dir, 2, h, MEGAC_KERNEL_ABI + 1);
    write_manifest(dir, 2, h);
    char abi_other[32];
    snprintf(abi_other, sizeof abi_other, "kernel ABI %u", MEGAC_KERNEL_ABI + 1);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "kernel.so", abi_other);
    char cmd[2048];
    write_text(dir, "empty.c", "int megac_not_a_kernel;\n");
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o %s/kernel.so %s/empty.c", dir, dir);
    cr_assert_eq(system(cmd), 0);
    write_manifest(dir, 2, h);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "kernel.so", "does not export 'megac_kernel_abi'");
    snprintf(path, sizeof path, "%s/kernel.so", dir);
    cr_assert_eq(unlink(path), 0);
    expect_refusal(dir, MEGAC_ERR_IO, "kernel.so", "cannot read the kernel: No such file or directory (the "
                   "manifest's kernel: kernel.so)");
    compile_kernel(dir, 2, h, MEGAC_KERNEL_ABI);
    write_manifest(dir, 2, h);

    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    cr_assert_eq(unlink(path), 0);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "tokenizer.bin", "");

    cr_assert_eq(megac_open(dir, &m), MEGAC_ERR_FORMAT);
    remove_bundle(dir);
    expect_refusal("/nonexistent/x.megac", MEGAC_ERR_IO, "/nonexistent/x.megac/manifest.yaml", "cannot read");
}

/* One edit of a manifest line and the file whose facts refuse it. */
typedef struct {
    const char *from, *to;
    const char *file;           /* with the full toy schedule */
    const char *plain_file;     /* with a schedule that states nothing */
    const char *says;           /* in the message */
} Tamper;

static const Tamper tampers[] = {
    {"counters: 1", "counters: 0", "schedule.sched", "kernel.so", "says counters: 0"},
    {"counters: 1", "counters: 5", "schedule.sched", "kernel.so", "counters 1, but"},
    {"workers: 2", "workers: 3", "schedule.sched", "kernel.so", "workers 2, but"},
    {"arena_bytes: 4096", "arena_bytes: 3000", "kernel.so", "kernel.so", "arena_bytes 4096, but"},
    {"arena_bytes: 4096", "arena_bytes: 9000", "kernel.so", "kernel.so", "says arena_bytes: 9000"},
    /* unsigned, as written (it read -9223372036854775808: fuzz campaign F5) */
    {"arena_bytes: 4096", "arena_bytes: 9223372036854775808", "kernel.so", "kernel.so",
     "says arena_bytes: 9223372036854775808:"},
    {"max_seq: 16", "max_seq: 100000", "schedule.sched", "kernel.so", "max_seq 16, but"},
    {"vocab: 259", "vocab: 300", "schedule.sched", "kernel.so", "vocab 259, but"},
    {"io_logits: 1024", "io_logits: 1088", "kernel.so", "kernel.so", "io_logits 1024, but"},
    {"io_next: 4", "io_next: 8", "kernel.so", "kernel.so", "io_next 4, but"},
    {"bos: 1", "bos: 259", "manifest.yaml", "manifest.yaml", "bos: 259 is not -1 or a token id"},
    {"bos: 1", "bos: -5", "manifest.yaml", "manifest.yaml", "bos: -5 is not -1"},
    {"eos: 2", "eos: 9999", "manifest.yaml", "manifest.yaml", "eos: 9999 is not -1"},
    {"eos: 2", "eos: -2", "manifest.yaml", "manifest.yaml", "eos: -2 is not -1"},
    {"format: 3", "format: 2", "manifest.yaml:2:", "manifest.yaml:2:", "format 2, but this runtime reads format 3"},
    {"kernel_abi: " ABI_TEXT, "kernel_abi: 1", "manifest.yaml", "manifest.yaml", "kernel_abi 1, but this runtime speaks"},
};

/* Each manifest key the schedule or the kernel states, edited, is refused
 * by the file that disagrees, naming the key; the edit undone, the bundle
 * opens again. With a schedule that states nothing, the kernel's facts
 * alone refuse them. */
Test(runtime, refuses_manifest_keys_the_kernel_disagrees_with)
{
    for (int plain = 0; plain < 2; plain++) {
        char *dir = make_bundle_sched(2, plain);
        for (size_t i = 0; i < sizeof tampers / sizeof tampers[0]; i++) {
            const Tamper *t = &tampers[i];
            edit_file(dir, "manifest.yaml", t->from, t->to);
            expect_refusal(dir, MEGAC_ERR_FORMAT, plain ? t->plain_file : t->file, t->says);
            edit_file(dir, "manifest.yaml", t->to, t->from);
            megac_model *m;
            cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "after undoing '%s': %s", t->to, megac_last_open_error());
            megac_close(m);
        }
        remove_bundle(dir);
    }
}

/* A truncated or altered kernel.so is refused before dlopen maps it (which
 * died of SIGBUS): its size, then its hash, against the manifest. */
Test(runtime, refuses_a_damaged_kernel)
{
    char *dir = make_bundle(2);
    size_t len;
    char *k = read_whole(dir, "kernel.so", &len);
    char path[1024], want[128];
    snprintf(path, sizeof path, "%s/kernel.so", dir);
    cr_assert_eq(truncate(path, 5000), 0);
    snprintf(want, sizeof want, "5000 bytes, but the manifest says kernel_bytes: %zu", len);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "kernel.so", want);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "kernel.so", "damaged; recompile it");
    k[len / 2] ^= 0x40;
    write_file(dir, "kernel.so", k, len);
    expect_refusal(dir, MEGAC_ERR_FORMAT, "kernel.so", "but the manifest says kernel_hash: ");
    k[len / 2] ^= 0x40;
    write_file(dir, "kernel.so", k, len);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    megac_close(m);
    free(k);
    remove_bundle(dir);
}

/* The manifest's target is checked before anything past the manifest is
 * read: with weights.bin cut short, an unknown target is refused at
 * manifest.yaml's target key, and a CUDA target on a machine without a
 * driver says so (not that the weights are short). megac_bundle_target
 * reads the target and where it is from the manifest alone. */
Test(runtime, target_is_checked_before_the_bundle_loads)
{
    char *dir = make_bundle(1);
    char path[1024], want[1200];
    snprintf(path, sizeof path, "%s/weights.bin", dir);
    cr_assert_eq(truncate(path, 64), 0);
    edit_file(dir, "manifest.yaml", "target: cpu", "target: tpu_1");
    snprintf(want, sizeof want, "%s/manifest.yaml:4:1: error: unknown target 'tpu_1'", dir);
    expect_refusal(dir, MEGAC_ERR_FORMAT, want, "cpu, host-cuda or sm_XX");
    edit_file(dir, "manifest.yaml", "target: tpu_1", "target: sm_90");
    char target[8];
    int line = 0, col = 0;
    cr_assert_eq(megac_bundle_target(dir, target, sizeof target, &line, &col), MEGAC_OK, "%s",
                 megac_last_open_error());
    cr_assert(strcmp(target, "sm_90") == 0 && line == 4 && col == 1, "'%s' at %d:%d", target, line, col);
    cr_assert_eq(megac_bundle_target(dir, target, 4, NULL, NULL), MEGAC_ERR_ARG);
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cu)
        dlclose(cu);    /* a driver: the open goes on to the files */
    else
        expect_refusal(dir, MEGAC_ERR_DEVICE, "cannot run target sm_90", "no CUDA driver");
    remove_bundle(dir);
}

/* /dev/zero or a FIFO in place of any of a bundle's files is refused as
 * not a regular file, not read without end or waited on (a kernel.so or
 * weights.bin that was /dev/zero was compared by its stat size: "0 bytes,
 * but the manifest says"); so is a manifest whose kernel: names a folder
 * (found by fuzzing). A kernel.so cut short, its manifest rewritten to
 * match the cut, is refused before dlopen, which would die of SIGBUS on it. */
Test(runtime, refuses_special_files_and_a_cut_kernel)
{
    char *dir = make_bundle(2);
    static const struct {
        const char *name;
        megac_status st;
    } files[] = {{"schedule.sched", MEGAC_ERR_IO}, {"tokenizer.bin", MEGAC_ERR_FORMAT}, {"manifest.yaml", MEGAC_ERR_IO},
                 {"kernel.so", MEGAC_ERR_IO}, {"weights.bin", MEGAC_ERR_IO}};
    for (int kind = 0; kind < 3; kind++) {  /* /dev/zero, a FIFO, a socket (open said "No such device or address") */
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            char path[1024], keep[1100];
            snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
            snprintf(keep, sizeof keep, "%s.orig", path);
            cr_assert_eq(rename(path, keep), 0);
            int sock = -1;
            if (kind == 2) {
                struct sockaddr_un sa = {.sun_family = AF_UNIX};
                cr_assert_lt(strlen(path), sizeof sa.sun_path);
                strcpy(sa.sun_path, path);
                sock = socket(AF_UNIX, SOCK_STREAM, 0);
                cr_assert(sock >= 0 && bind(sock, (struct sockaddr *)&sa, sizeof sa) == 0, "%s", path);
            } else {
                cr_assert_eq(kind ? mkfifo(path, 0600) : symlink("/dev/zero", path), 0);
            }
            expect_refusal(dir, files[i].st, files[i].name, "not a regular file");
            if (sock >= 0)
                close(sock);
            cr_assert_eq(unlink(path), 0);
            cr_assert_eq(rename(keep, path), 0);
        }
    }
    edit_file(dir, "manifest.yaml", "kernel: kernel.so", "kernel: .");
    expect_refusal(dir, MEGAC_ERR_IO, "/.: cannot read the kernel: not a regular file (a folder)",
                   "the manifest's kernel: . must name the kernel file");
    edit_file(dir, "manifest.yaml", "kernel: .", "kernel: kernel.so");
    size_t slen, klen;
    char *sched = read_whole(dir, "schedule.sched", &slen), *k = read_whole(dir, "kernel.so", &klen);
    cr_assert_gt(klen, 8192);
    write_file(dir, "kernel.so", k, 4096);
    write_manifest(dir, 2, fnv1a(sched, slen));
    expect_refusal(dir, MEGAC_ERR_FORMAT, "kernel.so", "not a whole ELF file");
    free(sched);
    free(k);
    remove_bundle(dir);
}

/* Runs a shell command; its output (cut to cap) into out, and pclose's status. */
static int cmd_output(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    size_t n = 0;
    char line[512];
    out[0] = '\0';
    while (fgets(line, sizeof line, p))
        if (n + 1 < cap) {
            snprintf(out + n, cap - n, "%s", line);
            n += strlen(out + n);
        }
    return pclose(p);
}

/* `megac bench` on the toy bundle: its last line has the four figures;
 * the ratio is the median of the runs' own, within their min and max. */
Test(runtime, bench_reports_rate_and_ceiling)
{
    char *dir = make_bundle(2);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s bench %s -n 8 --runs 3 --ceiling-mb 32 2>&1", MEGAC_BIN, dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char line[512], last[512] = "";
    double rmed = -1, rlo = -1, rhi = -1;
    bool once = false;
    while (fgets(line, sizeof line, p)) {
        sscanf(line, "ratio to the ceiling: median %lf of the runs' own (min %lf, max %lf)", &rmed, &rlo, &rhi);
        once |= !strncmp(line, "read ceiling:", 13) && strstr(line, "1 sweep over 32.0 MiB");
        snprintf(last, sizeof last, "%s", line);
    }
    cr_assert(once, "--ceiling-mb 32: a 32 MiB buffer read once a pass");
    cr_assert_eq(pclose(p), 0, "%s: %s", cmd, last);
    double tok_s, gbps, ceil, ratio;
    cr_assert_eq(sscanf(last, "tok_s=%lf gbps=%lf ceiling_gbps=%lf ratio=%lf", &tok_s, &gbps, &ceil, &ratio), 4,
                 "%s", last);
    cr_assert(tok_s > 0 && gbps > 0 && ceil > 0, "%s", last);
    cr_assert_float_eq(gbps, tok_s * V * V * 4 / 1e9, 1e-3 + 1e-3 * gbps, "%s", last);
    cr_assert(rlo > 0 && rlo <= rmed && rmed <= rhi, "the runs' ratios: %g <= %g <= %g", rlo, rmed, rhi);
    cr_assert_float_eq(ratio, rmed, 1e-3, "%s", last);
    remove_bundle(dir);
}

/* A model that names no BOS (an HF tokenizer.json without bos_token_id)
 * is timed from its EOS: bench asked for token -1 and failed. And the
 * bytes a step reads are the schedule's, whatever the manifest's
 * weights_read_bytes says (nothing hashes it: 2^62 had the ceiling probe
 * map 2 GiB and report 4.6e14 GB/s). */
Test(runtime, bench_a_model_without_bos_or_with_an_edited_read_figure)
{
    char *dir = make_bundle(2);
    edit_file(dir, "manifest.yaml", "bos: 1", "bos: -1");
    char cmd[2048], out[8192], want[64];
    snprintf(want, sizeof want, "weights_read_bytes: %d", V * V * 4);
    edit_file(dir, "manifest.yaml", want, "weights_read_bytes: 4611686018427387904");
    snprintf(cmd, sizeof cmd, "%s bench %s -n 4 --runs 1 --ceiling-mb 8 2>&1 | tail -1", MEGAC_BIN, dir);
    cr_assert_eq(cmd_output(cmd, out, sizeof out), 0, "%s", out);
    double tok_s, gbps;
    cr_assert_eq(sscanf(out, "tok_s=%lf gbps=%lf", &tok_s, &gbps), 2, "%s", out);
    cr_assert_float_eq(gbps, tok_s * V * V * 4 / 1e9, 1e-3 + 1e-3 * gbps, "%s", out);
    remove_bundle(dir);
}

/* `megac bench A --versus B` times both (taking turns at going first):
 * the rates and the ratio come out for each, and a B that does not open
 * is named in the error. */
Test(runtime, bench_versus_reports_both)
{
    char *a = make_bundle(2), *b = make_bundle(1);
    char cmd[2048], line[512], vline[512] = "", last[512] = "";
    snprintf(cmd, sizeof cmd, "%s bench %s --versus %s -n 8 --runs 4 --ceiling-mb 32 2>&1", MEGAC_BIN, a, b);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    while (fgets(line, sizeof line, p)) {
        if (!strncmp(line, "versus_tok_s=", 13))
            snprintf(vline, sizeof vline, "%s", line);
        snprintf(last, sizeof last, "%s", line);
    }
    cr_assert_eq(pclose(p), 0, "%s: %s", cmd, last);
    double vt, sp, tok_s, gbps, ceil, ratio;
    cr_assert_eq(sscanf(vline, "versus_tok_s=%lf speedup=%lf", &vt, &sp), 2, "no versus line; last: %s", last);
    cr_assert_eq(sscanf(last, "tok_s=%lf gbps=%lf ceiling_gbps=%lf ratio=%lf", &tok_s, &gbps, &ceil, &ratio), 4,
                 "%s", last);
    cr_assert(vt > 0 && sp > 0 && tok_s > 0, "%s%s", vline, last);
    snprintf(cmd, sizeof cmd, "%s bench %s --versus %s/none -n 8 --runs 2 --ceiling-mb 32 2>&1", MEGAC_BIN, a, b);
    char all[4096];
    cr_assert_neq(cmd_output(cmd, all, sizeof all), 0, "%s", all);
    cr_assert(strstr(all, "/none"), "the error names the bundle: %s", all);
    remove_bundle(a);
    remove_bundle(b);
}

/* `megac bench --prefill` also feeds the decoded tokens as a prompt's: a
 * prefill line with its rate and its ratio to the decode rate (the median
 * of the runs' own, within their min and max), before the last line. */
Test(runtime, bench_prefill_reports_its_rate)
{
    char *dir = make_bundle(2);
    char cmd[2048], line[512], pline[512] = "", pfl[512] = "", last[512] = "";
    snprintf(cmd, sizeof cmd, "%s bench %s -n 8 --runs 3 --prefill --ceiling-mb 32 2>&1", MEGAC_BIN, dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    while (fgets(line, sizeof line, p)) {
        if (!strncmp(line, "prefill_tok_s=", 14))
            snprintf(pline, sizeof pline, "%s", line);
        if (!strncmp(line, "prefill: ", 9))
            snprintf(pfl, sizeof pfl, "%s", line);
        snprintf(last, sizeof last, "%s", line);
    }
    cr_assert_eq(pclose(p), 0, "%s: %s", cmd, last);
    double pt, sp, med, lo, hi, tok_s, gbps, ceil, ratio;
    cr_assert_eq(sscanf(pline, "prefill_tok_s=%lf prefill_speedup=%lf", &pt, &sp), 2, "no prefill line; last: %s",
                 last);
    cr_assert(strstr(pfl, "the same 8 tokens fed as a prompt's"), "%s", pfl);
    const char *r = strstr(pfl, "); ");
    cr_assert(r && sscanf(r, "); %lf of the decode rate (per run: min %lf, max %lf)", &med, &lo, &hi) == 3, "%s", pfl);
    cr_assert(pt > 0 && lo > 0 && lo <= med && med <= hi, "%s", pfl);
    cr_assert_float_eq(sp, med, 1e-3, "%s%s", pfl, pline);
    cr_assert_eq(sscanf(last, "tok_s=%lf gbps=%lf ceiling_gbps=%lf ratio=%lf", &tok_s, &gbps, &ceil, &ratio), 4,
                 "%s", last);
    remove_bundle(dir);
}

/* A --context past the model's says what was fed instead, and -n past
 * what is left says what was timed. */
Test(runtime, bench_context_past_the_model_is_noted)
{
    char *dir = make_bundle(2);
    char cmd[2048], all[8192];
    snprintf(cmd, sizeof cmd, "%s bench %s -n 8 --runs 1 --context 100000 --ceiling-mb 1 2>&1", MEGAC_BIN, dir);
    cr_assert_eq(cmd_output(cmd, all, sizeof all), 0, "%s", all);
    char want[160];
    int last = MAXSEQ - 1;
    snprintf(want, sizeof want, "note: --context 100000 is more than the model's context allows (%d positions); fed %d",
             MAXSEQ, last);
    cr_assert(strstr(all, want), "%s", all);
    snprintf(want, sizeof want, "note: -n 8 (after --context %d) is more than the model's context allows; timed 1 tokens",
             last);
    cr_assert(strstr(all, want), "%s", all);
    snprintf(want, sizeof want, "decode: 1 tokens x 1 runs from position %d:", last);
    cr_assert(strstr(all, want), "%s", all);
    remove_bundle(dir);
}

/* bench's ratios (--versus's speed ratio, the ratio to the ceiling) are
 * medians of each run's own: rates that drift between runs (this machine's
 * memory has two levels) pair within a run, not by rank. Runs (1, 2), (4, 1), (2, 4): 0.5, 4, 0.5; ranked, they
 * would pair 1/1, 2/2, 4/4. */
Test(runtime, bench_ratio_pairs_each_run)
{
    const double num[3] = {1, 4, 2}, den[3] = {2, 1, 4};
    double lo, hi, med = bench_ratio_median(num, den, 3, &lo, &hi);
    cr_assert_float_eq(med, 0.5, 1e-12);
    cr_assert_float_eq(lo, 0.5, 1e-12);
    cr_assert_float_eq(hi, 4.0, 1e-12);
    cr_assert(num[1] == 4 && den[1] == 1, "the rates are left in run order");
}

/* The read ceiling's working set is the step's: a model's weight bytes
 * (so a model that fits in the last-level cache meets a ceiling read from
 * there too, as its weights are), within 1 MiB .. 2 GiB, each pass reading
 * what the decode run reads (at least 512 MiB, at most 16 GiB); and a pass
 * sweeps its buffer that many times. */
Test(runtime, bench_ceiling_follows_the_step)
{
    size_t pass = 0;
    cr_assert_eq(bench_ceiling_size(145000000ULL, 64, &pass), 145000000);
    cr_assert_eq(pass, 145000000ULL * 64);
    cr_assert_eq(bench_ceiling_size(1000, 8, &pass), 1 << 20, "no buffer under 1 MiB");
    cr_assert_eq(pass, 512ULL << 20, "a pass reads at least 512 MiB");
    cr_assert_leq(bench_ceiling_size(10000000000ULL, 32, &pass), 2ULL << 30, "no buffer over 2 GiB");
    cr_assert_eq(pass, 16ULL << 30, "a pass reads at most 16 GiB");
    BenchCeiling *c = bench_ceiling_new(2 << 20, 9 << 20, 2, 4);
    cr_assert(c);
    cr_assert_eq(bench_ceiling_bytes(c), 2 << 20);
    cr_assert_eq(bench_ceiling_sweeps(c), 5, "9 MiB a pass over 2 MiB: five sweeps");
    cr_assert_gt(bench_ceiling_pass(c), 0);
    bench_ceiling_free(c);

    /* without --ceiling-mb the toy bundle's own bytes size the buffer */
    char *dir = make_bundle(2);
    char cmd[2048], line[512], rc_line[512] = "";
    snprintf(cmd, sizeof cmd, "%s bench %s -n 4 --runs 1 2>&1", MEGAC_BIN, dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    while (fgets(line, sizeof line, p))
        if (!strncmp(line, "read ceiling:", 13))
            snprintf(rc_line, sizeof rc_line, "%s", line);
    cr_assert_eq(pclose(p), 0, "%s", cmd);
    cr_assert(strstr(rc_line, "512 sweeps over 1.0 MiB"), "the toy's weights are under 1 MiB: %s", rc_line);
    remove_bundle(dir);
}

/* The runtime builds and runs alone: the runtime sources with only libc, pthreads
 * and libdl (no compiler, IR or LLVM code) opens the toy bundle and steps. */
Test(runtime, builds_alone)
{
    char *dir = make_bundle(2);
    static const char main_src[] =
        "#include \"runtime/megac.h\"\n"
        "#include <stdio.h>\n"
        "int main(int argc, char **argv) {\n"
        "    megac_model *m;\n"
        "    if (argc < 2 || megac_open(argv[1], &m)) { fprintf(stderr, \"%s\\n\", megac_last_open_error()); return 1; }\n"
        "    int ok = megac_step(m, 72) == MEGAC_OK;\n"
        "    printf(\"%d %d\\n\", ok, megac_argmax(m));\n"
        "    megac_close(m);\n"
        "    return !ok;\n"
        "}\n";
    write_text(dir, "main.c", main_src);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 -D_GNU_SOURCE -O1 -I%s -o %s/alone %s/main.c %s/runtime/*.c -lpthread -ldl -lm && "
             "%s/alone %s",
             MEGAC_SRC, dir, dir, MEGAC_SRC, dir, dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    int ok = -1, next = -1;
    cr_assert_eq(fscanf(p, "%d %d", &ok, &next), 2, "%s", cmd);
    cr_assert_eq(pclose(p), 0, "%s", cmd);
    cr_assert_eq(ok, 1);
    cr_assert_eq(next, toy_argmax(72));
    remove_bundle(dir);
}

/* Sampling at temperature > 0 goes through megac_sample with the seed: the
 * same seed gives the same tokens, and they stay in the vocabulary. */
Test(runtime, generate_sampling_follows_the_seed)
{
    char *dir = make_bundle(2);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    int prompt[] = {1, 50};
    megac_sampler s = {1.5f, 0, 1.0f, 42};
    Collected a = {0, 100, {0}}, b = {0, 100, {0}};
    cr_assert_eq(megac_generate(m, prompt, 2, 12, &s, collect, &a, NULL), MEGAC_OK, "%s", megac_error(m));
    cr_assert_eq(megac_reset(m), MEGAC_OK);
    cr_assert_eq(megac_generate(m, prompt, 2, 12, &s, collect, &b, NULL), MEGAC_OK, "%s", megac_error(m));
    cr_assert_gt(a.n, 0);
    cr_assert_eq(a.n, b.n);
    cr_assert_arr_eq(a.toks, b.toks, sizeof(int) * (size_t)a.n);
    for (int i = 0; i < a.n; i++)
        cr_assert(a.toks[i] >= 0 && a.toks[i] < V && a.toks[i] != 1 && a.toks[i] != 2);
    cr_assert_eq(megac_position(m), 2 + a.n - (a.n == 12 ? 1 : 0));
    megac_close(m);
    remove_bundle(dir);
}

/* Bad sampler settings are refused before any step runs; NaN logits stop
 * generation with an error that names the position, not a garbage token. */
Test(runtime, generate_refuses_bad_samplers_and_nan_logits)
{
    char *dir = make_bundle(2);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    int prompt[] = {1, 50};
    megac_sampler bad[] = {{NAN, 0, 1, 42}, {INFINITY, 0, 1, 42}, {-1, 0, 1, 42}, {1, 0, NAN, 42}, {1, -5, 1, 42}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(megac_generate(m, prompt, 2, 5, &bad[i], NULL, NULL, NULL), MEGAC_ERR_ARG, "case %zu", i);
        cr_assert(strstr(megac_error(m), "megac_generate: t"), "%s", megac_error(m));
        cr_assert_eq(megac_position(m), 0, "case %zu: a step ran", i);
    }
    /* a prompt token outside the vocabulary, or more prompt than the
     * context has left: refused before any step (it had fed the tokens
     * before the bad one; past INT_MAX - pos, prompt_end overflowed) */
    int badtok[] = {1, 5, -1};
    cr_assert_eq(megac_generate(m, badtok, 3, 5, NULL, NULL, NULL, NULL), MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(m), "prompt token 2 is -1, outside the vocabulary [0, 259)"), "%s", megac_error(m));
    cr_assert_eq(megac_position(m), 0);
    cr_assert_eq(megac_step(m, 1), MEGAC_OK);
    cr_assert_eq(megac_generate(m, prompt, MAXSEQ, 5, NULL, NULL, NULL, NULL), MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(m), "a prompt of 16 tokens does not fit in the 15 positions left"), "%s",
              megac_error(m));
    cr_assert_eq(megac_generate(m, prompt, INT_MAX, 5, NULL, NULL, NULL, NULL), MEGAC_ERR_ARG);
    cr_assert_eq(megac_position(m), 1);
    cr_assert_eq(megac_is_stop(m, -1), 0);
    megac_close(m);
    float *w = malloc(sizeof(float) * V * V);
    for (int t = 0; t < V; t++)
        for (int i = 0; i < V; i++)
            w[t * V + i] = toy_weight(t, i);
    w[50 * V + 7] = NAN;
    write_file(dir, "weights.bin", w, sizeof(float) * V * V);
    free(w);
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    megac_sampler greedy = {0, 0, 1, 0}, warm = {1, 0, 1, 42};
    cr_assert_eq(megac_generate(m, prompt, 2, 5, &greedy, NULL, NULL, NULL), MEGAC_ERR_KERNEL);
    cr_assert(strstr(megac_error(m), "position 1") && strstr(megac_error(m), "token 7 has nan"), "%s",
              megac_error(m));
    cr_assert_eq(megac_reset(m), MEGAC_OK);
    cr_assert_eq(megac_generate(m, prompt, 2, 5, &warm, NULL, NULL, NULL), MEGAC_ERR_KERNEL);
    cr_assert(strstr(megac_error(m), "position 1"), "%s", megac_error(m));
    /* megac_step says so too (it returned MEGAC_OK, the argmax a token of
     * NaN logits); the step counts, a feed reads no logits */
    cr_assert_eq(megac_reset(m), MEGAC_OK);
    cr_assert_eq(megac_step(m, 1), MEGAC_OK);
    cr_assert_eq(megac_step(m, 50), MEGAC_ERR_KERNEL);
    cr_assert(strstr(megac_error(m), "the logits at position 1 are not finite: token 7 has nan"), "%s",
              megac_error(m));
    cr_assert_eq(megac_position(m), 2);
    cr_assert_eq(megac_feed(m, 50), MEGAC_OK);
    megac_close(m);
    remove_bundle(dir);
}

/* fork() from a token callback, inside megac_generate: the child's copy of
 * the model's lock is held by a thread it does not have; its step must be
 * refused before that lock (it waited forever); 1 for the child's exit. */
static int fork_in_callback(void *user, int token, const char *text)
{
    megac_model *m = user;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        _exit(megac_step(m, 2) == MEGAC_ERR_ARG && megac_decode(m, -1, 65)[0] == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's step under the held lock: status %d",
              status);
    return 1;
}

/* A model belongs to the process that opened it: in a forked child its
 * steps (they waited forever on worker threads that stayed in the parent),
 * resets and shifts are refused, and the parent's go on. */
Test(runtime, a_forked_child_cannot_step_the_parents_model)
{
    char *dir = make_bundle(2);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_step(m, 1), MEGAC_OK);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(20);
        megac_status st = megac_step(m, 2);
        bool said = strstr(megac_error(m), "after fork() the child must open the bundle itself") != NULL;
        /* a reset or shift would touch the parent's device context, on a GPU */
        _exit(st == MEGAC_ERR_ARG && said && megac_reset(m) == MEGAC_ERR_ARG && megac_shift(m, 0, 0) == MEGAC_ERR_ARG
                  ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's step: status %d", status);
    cr_assert_eq(megac_step(m, 2), MEGAC_OK, "%s", megac_error(m));
    int prompt[] = {1};
    cr_assert_eq(megac_generate(m, prompt, 1, 3, NULL, fork_in_callback, m, NULL), MEGAC_OK, "%s", megac_error(m));
    megac_close(m);
    remove_bundle(dir);
}

/* The kernel is loaded from a memfd (nothing on disk), through the path
 * /proc/self/fd/N. A library left loaded from an earlier model's memfd of
 * the same number (here: a handle of the test's own keeps it) is not
 * taken for the next model's: that number is passed over. */
Test(runtime, a_kernel_left_loaded_under_a_memfd_path_is_not_reused)
{
    char *dir = make_bundle(2), *next = make_bundle(3), path[64] = "", link[256];
    megac_model *a, *b;
    cr_assert_eq(megac_open(dir, &a), MEGAC_OK, "%s", megac_last_open_error());
    for (int fd = 3; fd < 1024 && !path[0]; fd++) {
        char p[64];
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(p, link, sizeof link - 1);
        if (n > 0 && (link[n] = 0, strstr(link, "/memfd:megac-kernel.so")))
            snprintf(path, sizeof path, "%s", p);
    }
    cr_assert(path[0], "the kernel was not loaded from a memfd");
    void *keep = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    cr_assert_not_null(keep, "%s", dlerror());
    megac_close(a);     /* its memfd's number is free again; its library stays */
    cr_assert_eq(megac_open(next, &b), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_num_workers(b), 3);
    cr_assert_eq(megac_step(b, 72), MEGAC_OK, "%s", megac_error(b));
    cr_assert_eq(megac_argmax(b), toy_argmax(72));
    megac_close(b);
    dlclose(keep);
    remove_bundle(dir);
    remove_bundle(next);
}

/* A bundle recompiled (replaced by rename, as megac compile does) while a
 * model of it is open: a new open gets the new kernel.so, not the library
 * dlopen already holds under the same path. */
Test(runtime, reopening_a_recompiled_bundle_loads_the_new_kernel)
{
    char *dir = make_bundle(2), *next = make_bundle(3), old[1100];
    megac_model *a, *b;
    cr_assert_eq(megac_open(dir, &a), MEGAC_OK, "%s", megac_last_open_error());
    snprintf(old, sizeof old, "%s.old", dir);
    cr_assert_eq(rename(dir, old), 0);
    cr_assert_eq(rename(next, dir), 0);
    cr_assert_eq(megac_open(dir, &b), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_num_workers(b), 3);
    cr_assert_eq(megac_step(b, 72), MEGAC_OK, "%s", megac_error(b));
    cr_assert_eq(megac_argmax(b), toy_argmax(72));
    cr_assert_eq(megac_step(a, 72), MEGAC_OK, "%s", megac_error(a));
    cr_assert_eq(megac_argmax(a), toy_argmax(72));
    megac_close(a);
    megac_close(b);
    remove_bundle(dir);
    remove_bundle(strdup(old));
    free(next);
}

/* NULL models and pointers are MEGAC_ERR_ARG, not a crash; a success
 * clears the message a failure left. */
Test(runtime, null_arguments_and_stale_errors)
{
    cr_assert_eq(megac_open("x", NULL), MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(NULL), "megac_open"), "%s", megac_error(NULL));
    cr_assert_eq(megac_step(NULL, 1), MEGAC_ERR_ARG);
    cr_assert_str_eq(megac_error(NULL), "megac_step: no model given");
    cr_assert_eq(megac_reset(NULL), MEGAC_ERR_ARG);
    cr_assert_eq(megac_set_prompt_end(NULL, 3), MEGAC_ERR_ARG);
    cr_assert_eq(megac_generate(NULL, (int[]){1}, 1, 1, NULL, NULL, NULL, NULL), MEGAC_ERR_ARG);
    cr_assert_eq(megac_encode(NULL, "hi", 1, (int[4]){0}, 4), -1);
    cr_assert_str_eq(megac_decode(NULL, -1, 5), "");
    cr_assert_eq(megac_vocab_size(NULL), 0);
    cr_assert_eq(megac_eos(NULL), -1);
    cr_assert_null(megac_logits(NULL));
    cr_assert_eq(megac_argmax(NULL), -1);
    char *dir = make_bundle(1);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    int ids[8];
    cr_assert_eq(megac_encode(m, NULL, 1, ids, 8), -1);
    cr_assert_eq(megac_encode(m, "hi", 1, NULL, 8), -1);
    cr_assert_eq(megac_generate(m, NULL, 2, 1, NULL, NULL, NULL, NULL), MEGAC_ERR_ARG);
    cr_assert_eq(megac_step(m, -1), MEGAC_ERR_ARG);
    cr_assert_eq(megac_set_prompt_end(m, -2), MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(m), "megac_set_prompt_end: position -2 is not in the context of 16 (-1 for none)"),
              "%s", megac_error(m));
    cr_assert_eq(megac_set_prompt_end(m, 16), MEGAC_ERR_ARG); /* past the context: it would never be reached */
    megac_model *none = NULL;
    cr_assert_eq(megac_open("", &none), MEGAC_ERR_ARG); /* it read "/manifest.yaml" */
    cr_assert_str_eq(megac_last_open_error(), "megac_open: no bundle folder given");
    cr_assert_eq(megac_set_prompt_end(m, 15), MEGAC_OK);
    cr_assert_eq(megac_set_prompt_end(m, 5), MEGAC_OK);
    cr_assert_eq(megac_step(m, 1), MEGAC_OK);
    cr_assert_str_eq(megac_error(m), "", "a stale message after a success");
    cr_assert_eq(megac_encode(m, "hello", 1, ids, 1), -1);
    cr_assert_gt(megac_encode(m, "hi", 1, ids, 8), 0);
    cr_assert_str_eq(megac_error(m), "");
    megac_close(m);
    remove_bundle(dir);
}

/* One model stepped from several threads: calls are serialized, none hangs
 * (two callers in the worker pool at once used to wait forever), and every
 * step still computes the toy kernel's logits. */
typedef struct {
    megac_model *m;
    int ok, bad;
} StepJob;

static void *step_job_run(void *p)
{
    StepJob *j = p;
    for (int i = 0; i < 300; i++) {
        megac_status st = megac_step(j->m, 1 + i % 200);
        if (st == MEGAC_ERR_ARG)    /* the context is full: start over */
            st = megac_reset(j->m);
        else if (st == MEGAC_OK)
            j->ok++;
        j->bad += st != MEGAC_OK;
    }
    return NULL;
}

Test(runtime, one_model_from_several_threads_is_serialized, .timeout = 60)
{
    char *dir = make_bundle(2);
    megac_model *m;
    cr_assert_eq(megac_open(dir, &m), MEGAC_OK, "%s", megac_last_open_error());
    StepJob jobs[3] = {{m, 0, 0}, {m, 0, 0}, {m, 0, 0}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, step_job_run, &jobs[i]), 0);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(jobs[i].bad, 0, "thread %d: %s", i, megac_error(m));
        cr_assert_gt(jobs[i].ok, 0);
    }
    cr_assert_eq(megac_reset(m), MEGAC_OK);
    cr_assert_eq(megac_step(m, 72), MEGAC_OK, "%s", megac_error(m));
    cr_assert_eq(megac_argmax(m), toy_argmax(72));
    megac_close(m);
    remove_bundle(dir);
}

/* The manifest parser on its own: every line's error names file:line. */
static const char good_manifest[] =
    "# c\r\nformat: 3\r\nname: \"x y\"\ntarget: cpu\nkernel: kernel.so\nkernel_bytes: 7\n"
    "kernel_hash: 0123456789abcdef\nkernel_abi: " ABI_TEXT "\n"
    "schedule_hash: 00000000DEADbeef\nweights_bytes: 10\nweights_hash: 0123456789ABCDEF\nweights_read_bytes: 9\n"
    "arena_bytes: 4096\n"
    "counters: 3\nworkers: 2\nvocab: 5\nmax_seq: 8\nbos: -1\neos: 2\nio_tok: 0\nio_logits: 64\nio_next: 4\n";

static void expect_manifest_error(const char *from, const char *to, const char *msg)
{
    char text[2048], err[512];
    const char *at = strstr(good_manifest, from);
    cr_assert(at, "%s", from);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good_manifest), good_manifest, to, at + strlen(from));
    RtManifest man;
    cr_assert_eq(rt_manifest_parse(&man, "m.yaml", text, strlen(text), err, sizeof err), MEGAC_ERR_FORMAT, "%s",
                 text);
    cr_assert_str_eq(err, msg);
}

Test(runtime, manifest_parser)
{
    RtManifest man;
    char err[512];
    cr_assert_eq(rt_manifest_parse(&man, "m.yaml", good_manifest, strlen(good_manifest), err, sizeof err), MEGAC_OK,
                 "%s", err);
    cr_assert_str_eq(man.name, "x y");
    cr_assert_eq(man.schedule_hash, 0xdeadbeefull);
    cr_assert_eq(man.bos, -1);
    cr_assert_eq(man.counters, 3);
    cr_assert_eq(man.off_logits, 64);
    cr_assert_eq(man.kernel_bytes, 7);
    cr_assert_eq(man.kernel_hash, 0x0123456789abcdefull);
    expect_manifest_error("counters: 3", "counters: -3",
                          "m.yaml:14:11: error: bad value '-3' for 'counters' (expected a decimal integer in "
                          "0..4294967295)");
    expect_manifest_error("counters: 3", "counters: 3x",
                          "m.yaml:14:11: error: bad value '3x' for 'counters' (expected a decimal integer in "
                          "0..4294967295)");
    expect_manifest_error("workers: 2", "workers: 4294967296",
                          "m.yaml:15:10: error: bad value '4294967296' for 'workers' (expected a decimal integer in "
                          "0..4294967295)");
    expect_manifest_error("vocab: 5\n", "vocab: 5\nvocab: 6\n",
                          "m.yaml:17:1: error: duplicate key 'vocab' (first on line 16)");
    expect_manifest_error("eos: 2", "eos 2", "m.yaml:19:1: error: expected `key: value` (a lowercase key, a colon, "
                          "its value)");
    expect_manifest_error("eos: 2", "Eos: 2", "m.yaml:19:1: error: expected `key: value` (a lowercase key, a colon, "
                          "its value)");
    expect_manifest_error("name: \"x y\"", "name:", "m.yaml:3:6: error: bad value '' for 'name' (expected a non-empty "
                          "string)");
    expect_manifest_error("kernel_hash: 0123456789abcdef", "kernel_hash: 0123456789abcdefg",
                          "m.yaml:7:14: error: bad value '0123456789abcdefg' for 'kernel_hash' (expected a "
                          "hexadecimal number of at most 16 digits)");
    expect_manifest_error("io_next: 4\n", "", "m.yaml: error: missing key 'io_next' (a bundle's manifest.yaml has "
                          "every key; recompile the bundle)");
}

/* A value the manifest's syntax allows but the runtime cannot drive names
 * its key, the value and the range allowed, at the value's line:col (a
 * bundle of 5000 workers said only "workers, vocab and max_seq must be
 * positive", found by fuzzing); the checks between keys point at the
 * value at fault too. */
Test(runtime, manifest_values_out_of_range)
{
    expect_manifest_error("workers: 2", "workers: 5000",
                          "m.yaml:15:10: error: workers: 5000 is outside the allowed range 1..4096");
    expect_manifest_error("workers: 2", "workers: 0", "m.yaml:15:10: error: workers: 0 is outside the allowed range "
                          "1..4096");
    expect_manifest_error("vocab: 5", "vocab: 0", "m.yaml:16:8: error: vocab: 0 is outside the allowed range "
                          "1..2147483647");
    expect_manifest_error("max_seq: 8", "max_seq: -8", "m.yaml:17:10: error: max_seq: -8 is outside the allowed "
                          "range 1..2147483647");
    expect_manifest_error("eos: 2", "eos:   5", "m.yaml:19:8: error: eos: 5 is not -1 or a token id below vocab: 5");
    expect_manifest_error("kernel_abi: " ABI_TEXT, "kernel_abi: 9",
                          "m.yaml:8:13: error: kernel_abi 9, but this runtime speaks ABI " ABI_TEXT ": recompile the bundle");
    expect_manifest_error("kernel: kernel.so", "kernel: ../k.so",
                          "m.yaml:5:9: error: kernel '../k.so' must name a file in the bundle (printable ASCII, no "
                          "'/')");
    /* what a manifest holds is quoted with its control bytes and non-ASCII
     * escaped (a terminal's escape sequences reached it: fuzz campaign F6) */
    expect_manifest_error("kernel: kernel.so", "kernel: k\x1b]0;x\x07.so",
                          "m.yaml:5:9: error: kernel 'k\\x1b]0;x\\x07.so' must name a file in the bundle "
                          "(printable ASCII, no '/')");
    expect_manifest_error("counters: 3", "counters: 3\xc3\xa9\x1b",
                          "m.yaml:14:11: error: bad value '3\\xc3\\xa9\\x1b' for 'counters' (expected a decimal "
                          "integer in 0..4294967295)");
    expect_manifest_error("eos: 2", "e\x7fos: 2", "m.yaml:19:1: error: expected `key: value` (a lowercase key, a "
                          "colon, its value)");
    expect_manifest_error("io_logits: 64", "io_logits: 66", "m.yaml:21:12: error: io_logits: 66 is not a multiple "
                          "of 4");
    expect_manifest_error("io_logits: 64", "io_logits: 4084",
                          "m.yaml:21:12: error: io_logits: 4084: its 20-byte io buffer does not fit the arena of "
                          "4096 bytes (arena_bytes)");
}

/* A NUL byte in a manifest's line is refused at its place (the value
 * stopped there, and the rest was lost unseen: 'target: cpu\0garbage' was
 * taken as cpu; fuzz campaign F4). */
Test(runtime, manifest_nul_byte)
{
    char text[2048], err[512];
    const char *at = strstr(good_manifest, "target: cpu");
    size_t head = (size_t)(at - good_manifest), n = 0;
    memcpy(text, good_manifest, head);
    n = head;
    memcpy(text + n, "target: cpu\0garbage", 19);
    n += 19;
    size_t rest = strlen(at + strlen("target: cpu"));
    memcpy(text + n, at + strlen("target: cpu"), rest);
    n += rest;
    RtManifest man;
    cr_assert_eq(rt_manifest_parse(&man, "m.yaml", text, n, err, sizeof err), MEGAC_ERR_FORMAT);
    cr_assert_str_eq(err, "m.yaml:4:12: error: a NUL byte in the line (a manifest is text)");
}

/* The CUDA profile's waits by stage: counters summed by their name up to
 * the first '.', in the order of their first counter; a schedule with
 * another counter count, or none, gives -1. */
Test(runtime, stage_sums_group_counters_by_name)
{
    char *dir = strdup("/tmp/megac-rt-XXXXXX");
    cr_assert(mkdtemp(dir));
    write_text(dir, "schedule.sched",
               "schedule s target sm_90 workers 2\nbuffer x f32 [4] state\ncounter embed\ncounter qkv.0\n"
               "counter attn.0.0\ncounter attn.0.1\ncounter qkv.1\ncounter o.0\nworker 0\n  signal embed +1\n");
    const uint64_t v[6] = {1, 2, 4, 8, 16, 32};
    RtStageSum g[8];
    cr_assert_eq(rt_stage_sums(dir, v, 6, g, 8), 4);
    const char *names[4] = {"embed", "qkv", "attn", "o"};
    const uint64_t sums[4] = {1, 18, 12, 32};
    const uint32_t counts[4] = {1, 2, 2, 1};
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(g[i].name, names[i]);
        cr_assert_eq(g[i].sum, sums[i], "%s: %" PRIu64, names[i], g[i].sum);
        cr_assert_eq(g[i].nctrs, counts[i], "%s", names[i]);
    }
    cr_assert_eq(rt_stage_sums(dir, v, 6, g, 2), 2, "stages past max are left out");
    cr_assert_eq(g[1].sum, 18);
    cr_assert_eq(rt_stage_sums(dir, v, 5, g, 8), -1, "the schedule declares 6 counters");
    remove_bundle(dir);
    cr_assert_eq(rt_stage_sums("/nonexistent-megac-dir", v, 6, g, 8), -1);
}
