/*
 * run_bundle.c - the bundle engines of `megac run` (cmd_run.c parses the
 * options): decode text with a compiled NAME.megac/ through the runtime.
 *
 * Given a model description instead of a bundle, it first compiles one into
 * .megac-cache/<key>.megac, where the key hashes what the bundle depends
 * on: the description's bytes, the --set overrides, the target, the worker
 * count, and the identity (path, size, modification time) of this megac
 * executable and of the weight, tokenizer and arch files the description names
 * (and a generation_config.json beside a config.json),
 * so a rebuilt compiler or a replaced checkpoint is not served stale.
 *
 * Text goes to stdout as llama2.c's run.c prints it: -n counts positions,
 * BOS included; the prompt's pieces are printed, then each generated piece
 * as it comes (unprintable single bytes skipped), then a newline. Stats go
 * to stderr.
 */
#include "compiler/compile.h"
#include "compiler/driver.h"
#include "compiler/run.h"
#include "runtime/cuda_driver.h"
#include "runtime/megac.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RUN_CACHE_DIR ".megac-cache"

/* The command whose name starts the cache's messages (run_cache_bundle). */
static const char *cache_prog = "megac run";

/* The first error writing the text to stdout (errno's value; 0: none):
 * generation stops at it, and the run says so and fails (text_end). */
static int out_errno;

static bool piece_print(const char *p)
{
    if (!out_errno && !run_piece_write(p, (int)strlen(p)))
        out_errno = errno ? errno : EIO;
    return !out_errno;
}

static int on_token(void *user, int token, const char *text)
{
    (void)user;
    (void)token;
    return !piece_print(text);
}

/* Ends a text on stdout with a newline; false (said on stderr) when
 * writing it, or any of it, failed: a full disk, a closed pipe. */
static bool text_end(void)
{
    if (!out_errno && (putchar('\n') == EOF || fflush(stdout) != 0))
        out_errno = errno ? errno : EIO;
    if (out_errno)
        fprintf(stderr, "megac run: writing the text failed: %s\n", strerror(out_errno));
    return !out_errno;
}

/* The compile target of an engine; NULL (reported) if it has none here. */
const char *run_cuda_target(int major, int minor)
{
    (void)minor;    /* a cubin runs on its major version at its minor or later: sm_80 on 8.6 and 8.9 */
    return major == 8 ? "sm_80" : major == 9 ? "sm_90" : major == 12 ? "sm_120" : NULL;
}

/* The GPU the cuda engine runs on (MEGAC_CUDA_DEVICE, else 0): the target
 * its cubins are built for, and its SM count (the blocks that are all
 * resident at once); NULL after saying why. */
static const char *cuda_device_target(int *sms)
{
    CudaDriver drv;
    char err[256];
    if (!cuda_driver_load(&drv, err, sizeof err)) {
        fprintf(stderr, "%s: --engine cuda needs a GPU: %s (--engine host-cuda runs the same CUDA C on this "
                        "CPU)\n", cache_prog, err);
        return NULL;
    }
    const char *e = getenv("MEGAC_CUDA_DEVICE");
    int ordinal = e && *e && strspn(e, "0123456789") == strlen(e) && strlen(e) <= 4 ? atoi(e) : 0, n = 0;
    int major = 0, minor = 0;
    char name[128] = "?";
    CUdevice dev;
    const char *t = NULL;
    drv.cuDeviceGetCount(&n);
    if (ordinal >= n) {
        fprintf(stderr, "%s: no CUDA device %d: the driver sees %d device(s)\n", cache_prog, ordinal, n);
    } else if (drv.cuDeviceGet(&dev, ordinal) == 0 &&
               drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) == 0 &&
               drv.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) == 0 &&
               drv.cuDeviceGetAttribute(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) == 0) {
        drv.cuDeviceGetName(name, (int)sizeof name, dev);
        if (!(t = run_cuda_target(major, minor)))
            fprintf(stderr, "%s: device %d (%s) is sm_%d%d: megac builds cubins for sm_80 (8.x), sm_90 (9.x) and "
                            "sm_120 (12.x)\n", cache_prog, ordinal, name, major, minor);
    } else {
        fprintf(stderr, "%s: cannot read device %d's compute capability\n", cache_prog, ordinal);
    }
    cuda_driver_unload(&drv);
    return t;
}

/* The target a description is compiled for to run on o's engine, and the
 * worker count (o's, or on a GPU its SM count: every block resident). */
static const char *engine_target(const RunOptions *o, int *workers)
{
    *workers = o->workers;
    switch (o->engine) {
    case ENGINE_CPU:
        return "cpu";
    case ENGINE_HOST_CUDA:
        return "host-cuda";
    case ENGINE_CUDA: {
        int sms = 0;
        const char *t = cuda_device_target(&sms);
        const Target *tg = t ? target_lookup(t, NULL) : NULL;
        if (tg && !*workers)    /* at most the target's SMs, whose residency the validator checks */
            *workers = sms < tg->default_workers ? sms : tg->default_workers;
        return t;
    }
    default:
        fprintf(stderr, "%s: engine '%s' cannot run from a description\n", cache_prog, run_engine_name(o->engine));
        return NULL;
    }
}

/* Does the bundle's target run on the engine asked for? The cpu engine
 * (the default for a bundle) also runs host-cuda bundles: both are a
 * kernel.so on CPU threads. */
static bool engine_accepts(RunEngine e, const char *target)
{
    if (e == ENGINE_CPU)
        return strcmp(target, "cpu") == 0 || strcmp(target, "host-cuda") == 0;
    if (e == ENGINE_HOST_CUDA)
        return strcmp(target, "host-cuda") == 0;
    return strncmp(target, "sm_", 3) == 0;
}

/* Folds a file's identity (path, size, modification time) into h. */
static uint64_t fnv_file_id(uint64_t h, const char *path)
{
    struct stat sb;
    if (!path)
        return h;
    h = hash_fnv1a(path, strlen(path) + 1, h);
    if (stat(path, &sb) == 0) {
        int64_t id[3] = {(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec, (int64_t)sb.st_mtim.tv_nsec};
        h = hash_fnv1a(id, sizeof id, h);
    }
    return h;
}

/* The weight, tokenizer and arch (config.json and its generation_config.json,
 * GGUF) files the description names, and an HF tokenizer's chat template
 * files, folded into h (their paths, sizes and modification times);
 * false (errors reported) if the description does not load. */
static bool fnv_model_files(uint64_t *h, const RunOptions *o)
{
    Arena a = {0};
    Diag d;
    diag_init(&d);
    d.prog = cache_prog;
    ModelDesc m;
    bool ok = o->model ? desc_load(&m, &a, o->model, o->sets, o->nsets, &d)
                       : desc_parse(&m, &a, "<embedded>", desc_default_yaml, strlen(desc_default_yaml), o->sets,
                                    o->nsets, &d);
    if (ok)
        *h = fnv_file_id(fnv_file_id(fnv_file_id(fnv_file_id(*h, m.weights_path), m.tok_path), m.arch_path),
                         m.gen_config_path);
    if (ok && m.tok_path) {     /* an HF tokenizer's chat template, beside it */
        char *jinja, *config;
        tok_chat_template_files(m.tok_path, &jinja, &config);
        *h = fnv_file_id(fnv_file_id(*h, jinja), config);
        free(jinja);
        free(config);
    }
    arena_free(&a);
    return ok;
}

/* The cache key of compiling o for `target`; false if the description
 * cannot be read. */
static bool cache_key(const RunOptions *o, const char *target, uint64_t *key)
{
    uint64_t h = HASH_FNV_INIT;
    if (o->model) {
        size_t len;
        char *text = desc_read_text(o->model, &len);
        if (!text) {    /* desc_load says why (a folder without config.json, a bundle without its manifest...) */
            int e = errno;
            Arena a = {0};
            Diag d;
            diag_init(&d);
            d.prog = cache_prog;
            ModelDesc m;
            if (desc_load(&m, &a, o->model, o->sets, o->nsets, &d))
                fprintf(stderr, "%s: %s: cannot read: %s\n", cache_prog, o->model, strerror(e));
            arena_free(&a);
            return false;
        }
        h = hash_fnv1a(text, len, h);
        free(text);
    } else {
        h = hash_fnv1a(desc_default_yaml, strlen(desc_default_yaml), h);
    }
    for (int i = 0; i < o->nsets; i++) {
        h = hash_fnv1a(o->sets[i].key, strlen(o->sets[i].key) + 1, h);
        h = hash_fnv1a(o->sets[i].value, strlen(o->sets[i].value) + 1, h);
    }
    h = hash_fnv1a(target, strlen(target) + 1, h);
    h = hash_fnv1a(&o->workers, sizeof o->workers, h);
    h = fnv_file_id(h, "/proc/self/exe");
    if (!fnv_model_files(&h, o))
        return false;
    *key = h;
    return true;
}

/* How many bundles the cache keeps: MEGAC_CACHE_KEEP, default 8. */
static int cache_keep(void)
{
    const char *e = getenv("MEGAC_CACHE_KEEP");
    char *end;
    long v = e && *e ? strtol(e, &end, 10) : 8;
    /* digits only, as megac's warning (main.c) takes them */
    return e && *e && (*end || strspn(e, "0123456789") != strlen(e) || v < 1 || v > 100000) ? 8 : (int)v;
}

typedef struct {
    char *path;
    struct timespec mtime;
} CacheEntry;

static int cache_entry_newer_first(const void *a, const void *b)
{
    const struct timespec *x = &((const CacheEntry *)a)->mtime, *y = &((const CacheEntry *)b)->mtime;
    if (x->tv_sec != y->tv_sec)
        return x->tv_sec < y->tv_sec ? 1 : -1;
    return (x->tv_nsec < y->tv_nsec) - (x->tv_nsec > y->tv_nsec);
}

/* Marks bundle `dir` as just used and removes the least recently used
 * bundles beyond cache_keep() (a model's bundle can be gigabytes). Only
 * folders named as the cache names them (<16 hex digits>.megac) go. */
static void cache_trim(const char *dir)
{
    utimensat(AT_FDCWD, dir, NULL, 0);
    DIR *d = opendir(RUN_CACHE_DIR);
    if (!d)
        return;
    CacheEntry *v = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        struct stat sb;
        if (len != 22 || strcmp(e->d_name + 16, ".megac") != 0 || strspn(e->d_name, "0123456789abcdef") != 16)
            continue;
        char *p = xasprintf(RUN_CACHE_DIR "/%s", e->d_name);
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            free(p);
            continue;
        }
        if (n == cap)
            v = xrealloc(v, sizeof *v * (cap = cap ? 2 * cap : 16));
        v[n++] = (CacheEntry){p, sb.st_mtim};
    }
    closedir(d);
    qsort(v, n, sizeof *v, cache_entry_newer_first);
    int keep = cache_keep(), removed = 0;
    for (size_t i = 0; i < n; i++) {
        if ((int)i >= keep && strcmp(v[i].path, dir) != 0 && driver_bundle_remove(v[i].path))
            removed++;
        free(v[i].path);
    }
    free(v);
    if (removed)
        fprintf(stderr, "%s: removed %d least recently used cached bundle%s (the cache keeps %d: "
                        "MEGAC_CACHE_KEEP)\n", cache_prog, removed, removed == 1 ? "" : "s", keep);
}

/* Compiles the description into the cache unless it is there (or when
 * `rebuild`: the cached copy does not open); returns the bundle path
 * (xmalloc'd) or NULL after reporting. *cached tells whether it was there.
 * The driver builds the bundle in a private folder and renames it into
 * place, so concurrent runs never see a half-written bundle; when two race,
 * the loser's copy is dropped (keep_existing). Folders that killed runs
 * left behind are swept first. */
static char *bundle_cached(const RunOptions *o, bool rebuild, bool *cached)
{
    RunOptions ow = *o;
    const char *target = engine_target(o, &ow.workers);
    uint64_t key;
    *cached = false;
    o = &ow;    /* with the worker count the engine runs */
    if (!target || !cache_key(o, target, &key))
        return NULL;
    char *dir = xasprintf(RUN_CACHE_DIR "/%016" PRIx64 ".megac", key);
    char *manifest = xasprintf("%s/manifest.yaml", dir);
    bool have = access(manifest, R_OK) == 0;
    free(manifest);
    driver_tmp_sweep(RUN_CACHE_DIR, NULL);
    if (have && !rebuild) {
        fprintf(stderr, "%s: using the cached bundle %s\n", cache_prog, dir);
        *cached = true;
        cache_trim(dir);
        return dir;
    }
    if (!have && access(dir, F_OK) == 0)
        fprintf(stderr, "%s: the cached bundle %s is incomplete; recompiling it\n", cache_prog, dir);
    driver_bundle_remove(dir);
    if (mkdir(RUN_CACHE_DIR, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: cannot create %s: %s\n", cache_prog, RUN_CACHE_DIR, strerror(errno));
        free(dir);
        return NULL;
    }
    CompileOptions co;
    memset(&co, 0, sizeof co);
    co.model = o->model ? o->model : "default";
    co.target = target;
    co.workers = o->workers;
    co.nsets = o->nsets < DRIVER_MAX_SETS ? o->nsets : DRIVER_MAX_SETS;
    memcpy(co.sets, o->sets, sizeof(DescOverride) * (size_t)co.nsets);
    co.out = dir;
    co.keep_existing = true;
    fprintf(stderr, "%s: compiling %s for %s into %s\n", cache_prog, co.model, target, dir);
    if (driver_compile(&co) != 0) {
        free(dir);
        return NULL;
    }
    cache_trim(dir);
    return dir;
}


/* Tokenizes the prompt (BOS first when the tokenizer wants it, then
 * *bos = 1), or with `more` a later turn of a conversation, as the text's
 * continuation (no BOS, no SPM dummy prefix); returns the count or -1
 * (reported). */
static int prompt_encode(megac_model *m, const RunOptions *o, const char *prompt, bool more, int **ids, int *bos)
{
    const char *text = prompt ? prompt : "";
    int cap = (int)strlen(text) + 8;
    *ids = xmalloc(sizeof(int) * (size_t)cap);
    *bos = !more && megac_wants_bos(m, text);
    int n = more ? megac_encode_more(m, text, *ids, cap) : megac_encode(m, text, *bos, *ids, cap), first;
    size_t at;
    int dropped = megac_encode_dropped(m, &first, &at);
    run_drops_warn(text, run_text_name(o), dropped, first, at);
    if (n < 0 || (n == 0 && more))
        fprintf(stderr, "megac run: cannot tokenize the %s: %s\n", more ? "turn" : "prompt",
                n < 0 ? megac_error(m) : "no tokens");
    else if (n == 0)
        run_no_tokens_say(text);
    return n < 1 ? -1 : n;
}

/* Whether the bundle's tokenizer encodes piece as one token (a special
 * token of a chat format). */
static bool bundle_is_special(void *ctx, const char *piece)
{
    int ids[4];
    return megac_encode(ctx, piece, 0, ids, 4) == 1;
}

/* What the bundle's tokenizer says of chat formats (run.h); *eos_copy
 * holds the EOS text (megac_decode's lasts until its next call): free it. */
static RunChat bundle_chat(megac_model *m, char **eos_copy)
{
    RunChat c = {.is_special = bundle_is_special, .ctx = m};
    c.kind = megac_chat_format(m, &c.default_system);
    *eos_copy = megac_eos(m) >= 0 ? xstrdup(megac_decode(m, -1, megac_eos(m))) : NULL;
    c.eos = *eos_copy;
    return c;
}

static void stats_print(const megac_stats *st, const megac_model *m)
{
    double pre = st->prefill_s > 0 ? st->prompt_tokens / st->prefill_s : 0;
    double dec = st->decode_s > 0 ? st->generated_tokens / st->decode_s : 0;
    fprintf(stderr, "prompt tokens: %d, generated tokens: %d, %.1f tok/s (prefill %.1f tok/s, %d worker%s)\n",
            st->prompt_tokens, st->generated_tokens, dec, pre, megac_num_workers(m), megac_num_workers(m) == 1 ? "" : "s");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu > 0 && megac_num_workers(m) > ncpu)
        fprintf(stderr, "megac run: note: %d workers on %ld CPUs: workers take turns on the cores; "
                        "--workers %ld or fewer (a bundle's when it is compiled) is faster\n",
                megac_num_workers(m), ncpu, ncpu);
}

/* Opens a bundle; NULL after reporting why (quietly when `quiet`: the
 * caller reports). */
static megac_model *bundle_open(const char *bundle, bool quiet)
{
    megac_model *m;
    if (megac_open(bundle, &m) == MEGAC_OK)
        return m;
    if (!quiet)
        fprintf(stderr, "%s: %s\n", cache_prog, megac_last_open_error());
    return NULL;
}

char *run_cache_open(const RunOptions *o, const char *prog, megac_model **m)
{
    const char *was = cache_prog;
    cache_prog = prog;
    bool cached;
    char *dir = bundle_cached(o, false, &cached);
    *m = dir ? bundle_open(dir, cached) : NULL;
    if (dir && !*m && cached) {  /* damaged on disk: once more, so one bad entry does not fail every later run */
        fprintf(stderr, "%s: the cached bundle %s does not open (%s); discarding it and recompiling\n", prog, dir,
                megac_last_open_error());
        free(dir);
        dir = bundle_cached(o, true, &cached);
        *m = dir ? bundle_open(dir, false) : NULL;
    }
    if (!*m) {
        free(dir);
        dir = NULL;
    }
    cache_prog = was;
    return dir;
}

/* ---- --interactive ---- */

/* What a conversation has put in the cache: tok[0, n), one per position
 * (megac_position(m) is n between turns); `head` positions of the first
 * turn's prompt (its BOS, any --system, the first user line: never
 * dropped; -1 before it), and where each unit that may be dropped began
 * (at[0, nat)): the first reply, then each later turn with its reply. */
typedef struct {
    int *tok;
    size_t n, cap;
    int head;
    size_t *at, nat, atcap;
} Conv;

/* A reply's tokens as they come (printed, and kept for the history). */
typedef struct {
    int *tok;
    size_t n, cap;
} Reply;

static int on_reply_token(void *user, int token, const char *text)
{
    Reply *r = user;
    VEC_PUSH(r->tok, r->n, r->cap, token);
    return on_token(NULL, token, text);
}

/* After megac_generate fed ids[0, n) and sampled r: the cache took the
 * prompt and every reply token but, when the reply was cut, its last;
 * returns that one (-1 when none is left over). */
static int conv_take(Conv *c, megac_model *m, const int *ids, int n, const Reply *r)
{
    for (int i = 0; i < n; i++)
        VEC_PUSH(c->tok, c->n, c->cap, ids[i]);
    size_t fed = (size_t)megac_position(m) - c->n;
    for (size_t i = 0; i < fed && i < r->n; i++)
        VEC_PUSH(c->tok, c->n, c->cap, r->tok[i]);
    return fed < r->n ? r->tok[fed] : -1;
}

/* Makes room for `want` more positions within `steps` by dropping the
 * oldest units after the first prompt (whole; the current one, the last
 * begun, too unless keep_last), as few as that needs; where dropping all
 * it may does not make room for `want`, all it may, if that makes room
 * for `least`. Then shifts the cache over them (megac_shift), or, where
 * it cannot be shifted or `reread`, reads what is kept into a reset cache
 * again. Returns 1 (room made, or there already), 0 (nothing changed: not
 * even `least` can be had), -1 after reporting a failed step. */
static int conv_shift(Conv *c, megac_model *m, size_t want, size_t least, int steps, bool keep_last, bool reread)
{
    if (c->head < 0)
        return 0;
    size_t head = (size_t)c->head, last = keep_last && c->nat ? c->nat - 1 : c->nat, j = 0;
#define CONV_KEPT(j) (head + (c->n - ((j) < c->nat ? c->at[j] : c->n)))
    while (j < last && CONV_KEPT(j) + want > (size_t)steps)
        j++;
    if (CONV_KEPT(j) + least > (size_t)steps)
        return 0;
    if (j == 0)
        return 1;
    size_t from = j < c->nat ? c->at[j] : c->n;
#undef CONV_KEPT
    size_t dropped = from - head;
    /* the cache holds c->n positions between turns and where a reply is cut */
    megac_status st = MEGAC_ERR_UNSUPPORTED;
    const char *why = "";
    if (!reread && (size_t)megac_position(m) == c->n && (st = megac_shift(m, (int)head, (int)dropped)) ==
                                                          MEGAC_ERR_UNSUPPORTED)
        why = " (this bundle's cache cannot be shifted)";
    if (st != MEGAC_OK && st != MEGAC_ERR_UNSUPPORTED) {
        fprintf(stderr, "megac run: %s\n", megac_error(m));
        return -1;
    }
    memmove(c->tok + head, c->tok + from, sizeof(int) * (c->n - from));
    c->n -= dropped;
    memmove(c->at, c->at + j, sizeof(size_t) * (c->nat - j));
    c->nat -= j;
    for (size_t i = 0; i < c->nat; i++)
        c->at[i] -= dropped;
    /* on a terminal a reply's text (keep_last: it goes on) is mid-line there */
    fprintf(stderr, "%smegac run: the context is full: dropped the %zu oldest turn%s (%zu tokens, the first prompt "
                    "kept); %s the %zu kept%s%s\n", keep_last && isatty(STDOUT_FILENO) ? "\n" : "", j,
            j == 1 ? "" : "s", dropped, st == MEGAC_OK ? "shifted" : "reading", c->n,
            st == MEGAC_OK ? " down over them" : " again", why);
    if (st == MEGAC_OK)
        return 1;
    st = megac_reset(m);
    for (size_t i = 0; i < c->n && st == MEGAC_OK; i++)
        st = megac_feed(m, c->tok[i]);
    if (st != MEGAC_OK) {
        fprintf(stderr, "megac run: %s\n", megac_error(m));
        return -1;
    }
    return 1;
}

/* The positions a turn leaves its reply before the conversation drops
 * older turns to make room: a quarter of the window, at most 512. */
static int conv_reserve(int steps)
{
    return steps / 4 < 512 ? steps / 4 : 512;
}

/* A turn's statistics over the pieces of its reply (cut where the window
 * ended): the turn's own prompt tokens, every reply token, all the time
 * (a later piece's prefill, the token carried over the shift, counted as
 * decoding). */
static void stats_add(megac_stats *total, const megac_stats *piece, bool first_piece)
{
    if (first_piece) {
        *total = *piece;
        return;
    }
    total->generated_tokens += piece->generated_tokens;
    total->decode_s += piece->prefill_s + piece->decode_s; /* its "prompt": the reply's token carried over a shift */
    total->stop_token = piece->stop_token;
}

/* getline(3) on stdin that stops past max bytes (-2; a line of /dev/zero
 * had taken all memory): the line's length, -1 at the end or an error. */
static ssize_t line_read(char **line, size_t *cap, size_t max)
{
    size_t n = 0;
    int ch = 0;
    flockfile(stdin);
    while (n <= max && (ch = getc_unlocked(stdin)) != EOF) {
        if (n + 2 > *cap) {
            *cap = *cap ? 2 * *cap : 4096;
            *line = xrealloc(*line, *cap);
        }
        (*line)[n++] = (char)ch;
        if (ch == '\n')
            break;
    }
    funlockfile(stdin);
    if (n)
        (*line)[n] = 0;
    return n > max ? -2 : n ? (ssize_t)n : -1;
}

/* The next user turn from standard input (its line ending removed; empty
 * lines skipped): 1, 0 at the end of the input, -1 when it cannot be read
 * (said on stderr), 2 for a line that is not a turn (a NUL byte; said). */
static int turn_read(char **line, size_t *cap, bool tty)
{
    for (;;) {
        if (tty) {
            fputs("> ", stderr);
            fflush(stderr);
        }
        errno = 0;
        ssize_t got = line_read(line, cap, RUN_MAX_TEXT);
        if (got == -2) {
            fprintf(stderr, "megac run: a line of more than 256 MiB on standard input (the most megac reads as "
                            "a turn); the conversation ends here\n");
            return -1;
        }
        if (got < 0 && ferror(stdin)) {
            fprintf(stderr, "megac run: cannot read standard input: %s\n", strerror(errno ? errno : EIO));
            return -1;
        }
        if (got < 0)
            return 0;
        size_t len = strlen(*line);
        if (len < (size_t)got) {
            fprintf(stderr, "megac run: a line with a NUL byte at offset %zu: a turn is text; the line is "
                            "skipped\n", len);
            return 2;
        }
        while (got > 0 && ((*line)[got - 1] == '\n' || (*line)[got - 1] == '\r'))
            (*line)[--got] = 0;
        if (got > 0)
            return 1;
    }
}

/* --interactive: a user turn a line of standard input (the first may be
 * --prompt; empty lines are skipped), each reply generated from the
 * position the conversation reached (megac_generate continues there: the
 * turn is fed as a prompt, the cache keeps everything before it). When a
 * turn and room for its reply (conv_reserve) no longer fit in the `steps`
 * positions, or a reply reaches their end, the oldest turns (the first
 * reply, then whole turns) are dropped, the first turn's prompt kept, and
 * the cache shifted over them (or, with --no-context-shift or a cache that
 * cannot shift, the rest read again from position 0; said on stderr), and
 * the reply goes on. A line that is not a turn it can take (a NUL byte, more text than
 * megac reads, no tokens, more tokens than dropping every earlier turn
 * makes room for) is skipped, said on stderr, and the status is then 2 at
 * the end. Ends at the end of the input (status 0), when
 * standard input or stdout fails (2, 1), or when --prompt, the first
 * turn, does not fit (2, as run's prompt). A reply that fills the window
 * beside the first prompt is cut there (said), and the next turn drops it
 * with the older ones. */
static int bundle_converse(const RunOptions *o, megac_model *m, int steps)
{
    megac_sampler s = {o->temperature, o->top_k, o->top_p, o->seed};
    uint64_t rng = 0; /* one draw sequence over the conversation (megac_generate_rng) */
    char *line = NULL;
    size_t cap = 0;
    const char *turn = o->prompt && *o->prompt ? o->prompt : NULL;
    bool first = true, tty = isatty(STDIN_FILENO);
    int rc = 0, skipped = 0;
    Conv c = {.head = -1};
    Reply r = {0};
    char *eos;
    RunChat chat = bundle_chat(m, &eos);
    char *probe = run_turn_text(o, "", true, &chat);    /* a chat format, before any input */
    if (!probe) {
        free(eos);
        return 2;
    }
    free(probe);
    for (;;) {
        bool given = turn != NULL;      /* --prompt: refused as run's prompt, not skipped */
        if (!turn) {
            int got = turn_read(&line, &cap, tty);
            if (got == 2) {
                skipped++;
                continue;
            }
            if (got < 0)
                rc = 2;
            if (got <= 0)
                break;
            turn = line;
        }
        char *text = run_turn_text(o, turn, first, &chat);
        int *ids = NULL, n = -1, bos = 0;
        if (text)       /* no BOS inside a conversation */
            n = prompt_encode(m, o, text, !first, &ids, &bos);
        free(text);
        if (n >= 1 && !first && n + conv_reserve(steps) > steps - megac_position(m) &&
            conv_shift(&c, m, (size_t)(n + conv_reserve(steps)), (size_t)n + 1, steps, false, o->no_shift) < 0) {
            rc = 1;
            free(ids);
            break;
        }
        int left = steps - megac_position(m);
        if (n >= 1 && n >= left)
            fprintf(stderr, "megac run: the turn's %d tokens do not fit in the %d positions left of %d (-n; 0: the "
                            "model's context)%s\n", n, left, steps,
                    given   ? ""
                    : first ? "; the line is skipped"
                            : ", even with every earlier turn but the first prompt dropped; the line is skipped");
        if (n < 1 || n >= left) {
            free(ids);
            turn = NULL;
            if (given) {
                rc = 2;     /* as run's prompt (nothing ran) */
                break;
            }
            skipped++;
            continue;
        }
        VEC_PUSH(c.at, c.nat, c.atcap, c.n + (first ? (size_t)n : 0)); /* the first unit: the first reply */
        if (first)
            c.head = n;
        megac_stats st, piece;
        const int *in = ids;
        int nin = n, n_new = left - n + 1, pending, carry;
        bool ended = false, cut = false;
        for (bool first_piece = true;; first_piece = false) { /* the reply, shifted on as often as it reaches the
                                                                 end of the window */
            r.n = 0;
            megac_status g = megac_generate_rng(m, in, nin, n_new, &s, &rng, on_reply_token, &r, &piece);
            if (g == MEGAC_OK)
                stats_add(&st, &piece, first_piece);
            if (g != MEGAC_OK || out_errno) {
                if (text_end() && g != MEGAC_OK)
                    fprintf(stderr, "megac run: %s\n", megac_error(m));
                rc = 1;
                ended = true;
                break;
            }
            pending = conv_take(&c, m, in, nin, &r);
            if (piece.generated_tokens < n_new)
                break;
            /* cut at the window's end: room for the rest, its last token fed again first */
            int sh = pending < 0 ? 0 : conv_shift(&c, m, (size_t)conv_reserve(steps) + 1, 2, steps, true, o->no_shift);
            if (sh < 0) {
                rc = 1;
                ended = true;
                break;
            }
            if (sh == 0) { /* the reply fills the window beside the first prompt: cut there */
                cut = true;
                break;
            }
            carry = pending;
            in = &carry;
            nin = 1;
            n_new = steps - megac_position(m);
        }
        free(ids);
        if (ended)
            break;
        if (!text_end()) {
            rc = 1;
            break;
        }
        stats_print(&st, m);
        if (cut) /* the next turn drops it (with older ones) to make room */
            fprintf(stderr, "megac run: the reply used up the %d positions (-n; 0: the model's context) beside the "
                            "first prompt: it is cut there\n", steps);
        first = false;
        turn = NULL;
    }
    if (skipped && !rc) {
        fprintf(stderr, "megac run: %d line%s of the input %s skipped (above)\n", skipped, skipped == 1 ? "" : "s",
                skipped == 1 ? "was" : "were");
        rc = 2;
    }
    free(line);
    free(eos);
    free(c.tok), free(c.at), free(r.tok);
    return rc;
}

/* Generates with the opened bundle, prints; returns the exit status. */
static int bundle_generate(const RunOptions *o, const char *bundle, megac_model *m)
{
    if (o->model_is_bundle && o->workers && o->workers != megac_num_workers(m)) {
        fprintf(stderr, "megac run: %s has %d workers; recompile it with --workers %d\n", bundle,
                megac_num_workers(m), o->workers);
        return 2;
    }
    if (o->interactive) {
        int want = o->steps_given ? o->steps : 0;
        int steps = want > 0 && want < megac_max_seq(m) ? want : megac_max_seq(m);
        if (want > steps)
            fprintf(stderr, "megac run: note: -n %d is more than the model's context; the conversation's window is "
                            "%d positions\n", want, steps);
        return bundle_converse(o, m, steps);
    }
    int *ids = NULL, bos = 0, n = -1;
    char *eos;
    RunChat chat = bundle_chat(m, &eos);
    char *text = run_prompt_text(o, &chat);
    free(eos);
    if (text)
        n = prompt_encode(m, o, text, false, &ids, &bos);
    free(text);
    int W = megac_max_seq(m), steps = o->steps > 0 ? o->steps : W;
    /* past the context: the cache shifted as often as it fills, where it can */
    bool past = steps > W && !o->no_shift && megac_shift(m, 0, 0) == MEGAC_OK;
    if (steps > W && !past) {
        fprintf(stderr, "megac run: note: -n %d is more than the model's context; running %d positions%s\n", steps, W,
                o->no_shift ? "" : " (this bundle's cache cannot be shifted)");
        steps = W;
    }
    int rc = 2;
    if (n < 1 || !run_prompt_fits(n, steps < W ? steps : W, W))
        goto out;
    for (int i = bos; i < n && piece_print(megac_decode(m, i ? ids[i - 1] : -1, ids[i])); i++)
        ;
    megac_sampler s = {o->temperature, o->top_k, o->top_p, o->seed};
    uint64_t rng = 0; /* one draw sequence over the run, as the reference engine draws (megac_generate_rng) */
    megac_stats st, piece;
    megac_status r = MEGAC_OK;
    Reply last = {0};
    const int *in = ids;
    int nin = n, carry, left = steps - n + 1; /* tokens still to generate */
    for (bool first = true; !out_errno; first = false) {
        last.n = 0;
        r = megac_generate_rng(m, in, nin, left, &s, &rng, on_reply_token, &last, &piece);
        if (r != MEGAC_OK)
            break;
        stats_add(&st, &piece, first);
        left -= piece.generated_tokens;
        if (!past || left <= 0 || piece.stop_token >= 0 || out_errno || megac_position(m) < W || !last.n)
            break;
        /* the window is full: keep the prompt (BOS alone where it takes
         * more than half the window), drop half of what follows, go on
         * from the last token, which was chosen but not fed */
        int keep, drop;
        if (!run_shift_plan(n, ids[0] == megac_bos(m), W, &keep, &drop))
            break;
        if ((r = megac_shift(m, keep, drop)) != MEGAC_OK)
            break;
        if (isatty(STDOUT_FILENO))
            fputc('\n', stderr);
        fprintf(stderr, "megac run: the context is full (%d positions): dropped %d after the first %d; shifted the "
                        "%d kept down over them\n", W, drop, keep, megac_position(m) - keep);
        carry = last.tok[last.n - 1];
        in = &carry;
        nin = 1;
    }
    free(last.tok);
    if (!text_end()) {
        rc = 1;
        goto out;
    }
    if (r != MEGAC_OK) {
        fprintf(stderr, "megac run: %s\n", megac_error(m));
        rc = 1;
        goto out;
    }
    if (st.stop_token >= 0)
        run_stop_say(st.stop_token, megac_bos(m), megac_eos(m));
    stats_print(&st, m);
    rc = 0;
out:
    free(ids);
    return rc;
}

/* A description: compiled into the cache (or found there: run_cache_open). */
static int run_cached(const RunOptions *o)
{
    if (!run_chat_known(o))     /* before a compile, not after it */
        return 2;
    megac_model *m;
    char *dir = run_cache_open(o, "megac run", &m);
    int rc = m ? bundle_generate(o, dir, m) : 2;
    if (m)
        megac_close(m);
    free(dir);
    return rc;
}

/* Whether the bundle's manifest names a target the engine runs (without
 * --engine: any target an engine runs); if not, says so at the manifest's
 * target key, before the bundle is opened. */
static bool bundle_target_fits(const char *bundle, const RunOptions *o)
{
    char target[64];
    int line = 0, col = 0;
    if (megac_bundle_target(bundle, target, sizeof target, &line, &col) != MEGAC_OK) {
        fprintf(stderr, "megac run: %s\n", megac_last_open_error());
        return false;
    }
    /* the engine of the target's own kind, NULL for an unknown target */
    const char *fit = strncmp(target, "sm_", 3) == 0              ? "cuda"
                      : !strcmp(target, "cpu") || !strcmp(target, "host-cuda") ? target
                                                                      : NULL;
    if ((fit && !o->engine_given) || engine_accepts(o->engine, target))
        return true; /* without --engine, megac_open runs a bundle on its own */
    char *path = xasprintf("%s/manifest.yaml", bundle);
    SrcFile src = {.path = path};
    bool quoted = srcfile_load(&src, path);
    Diag d;
    diag_init(&d);
    d.prog = "megac run";
    if (fit)
        diag_error(&d, &src, line, col, "the bundle was compiled for target '%s', not for engine '%s'; run it with "
                   "--engine %s", target, run_engine_name(o->engine), fit);
    else
        diag_error(&d, &src, line, col, "unknown target '%s': no engine runs it (cpu, host-cuda or sm_XX bundles)",
                   target);
    if (quoted)
        srcfile_free(&src);
    free(path);
    return false;
}

int run_bundle(const RunOptions *o)
{
    if (!o->model_is_bundle)
        return run_cached(o);
    if (!bundle_target_fits(o->model, o))
        return 2;
    megac_model *m = bundle_open(o->model, false);
    if (!m)
        return 2;
    int rc = bundle_generate(o, o->model, m);
    megac_close(m);
    return rc;
}
