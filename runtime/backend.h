/*
 * backend.h - the runtime's private header: the bundle manifest, the model
 * object behind megac.h, and the small backend vtable a device plugs into.
 *
 * A bundle is a folder NAME.megac/ holding
 *   manifest.yaml   flat `key: value` lines (see bundle.c for the keys)
 *   schedule.sched  the validated schedule, as text
 *   kernel.so       (cpu, host-cuda) or kernel.sm_XX.cubin (CUDA)
 *   weights.bin     every weight buffer at its schedule offset, 64-aligned
 *   tokenizer.bin   the native tokenizer file (runtime/tokenizer.h)
 *
 * Sections are named by the file that defines them. Nothing here uses the
 * compiler: the runtime builds alone and never exits the process.
 */
#ifndef MEGAC_RT_BACKEND_H
#define MEGAC_RT_BACKEND_H

#include "runtime/kernel_abi.h"
#include "runtime/megac.h"
#include "runtime/tokenizer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define RT_FORMAT_VERSION 3    /* 2: kernel_bytes, kernel_hash; 3: weights_hash */
#define RT_ERR_LEN 1024

/* manifest.yaml, parsed. Strings are owned by the manifest (fixed size). */
typedef struct RtManifest {
    int format;                 /* RT_FORMAT_VERSION */
    char name[128];
    char target[32];            /* "cpu", "host-cuda", "sm_90", ... */
    int target_line, target_col;/* where its key is in manifest.yaml */
    char kernel[128];           /* file name inside the bundle */
    uint64_t kernel_bytes;      /* its size */
    uint64_t kernel_hash;       /* FNV-1a of its bytes */
    uint64_t kernel_abi;        /* MEGAC_KERNEL_ABI the kernel was built for */
    uint64_t schedule_hash;     /* FNV-1a of schedule.sched */
    uint64_t weights_bytes;     /* size of weights.bin */
    uint64_t weights_hash;      /* hash_bulk of weights.bin (`megac validate` checks it; opening does not) */
    uint64_t weights_read_bytes;/* weight bytes the kernel reads per step */
    uint64_t arena_bytes;       /* state, kv, scratch and io buffers */
    uint32_t counters;          /* number of step counters */
    uint32_t workers;
    int vocab, max_seq, bos, eos;
    uint64_t off_tok;           /* arena offsets of the io buffers: tok i32 */
    uint64_t off_logits;        /* logits f32 [vocab] */
    uint64_t off_next;          /* next i32: the kernel's argmax */
} RtManifest;

typedef struct RtBackend RtBackend;

/* The object behind `megac_model *`. */
struct megac_model {
    char *dir;                  /* the bundle folder */
    pthread_mutex_t mu;         /* recursive: serializes step, reset, generate, encode, decode */
    bool mu_ready;
    RtManifest man;
    char kv_dtype[8];           /* the KV cache's elements, as schedule.sched's kv buffers say ("": none) */
    const RtBackend *be;
    void *be_state;             /* owned by the backend */
    char *kernel_image;         /* the kernel file's checked bytes (until the backend opens) */
    size_t kernel_len;
    const void *weights;        /* weights.bin, mapped read-only or read into memory (bundle.c) */
    size_t weights_len;
    bool weights_copied;        /* read into anonymous memory, not mapped from the file */
    bool check_only;            /* megac_bundle_check: files checked, nothing run (weights mapped, not read) */
    Tokenizer *tok;
    pid_t pid;                  /* the process that opened it (steps refused in a forked child) */
    int pos;                    /* position of the next step */
    int prompt_end;             /* position of the prompt's last token, -1: none (MegacArgs.prompt_end) */
    bool no_output;             /* the step being run skips its outputs (MEGAC_STEP_NO_OUTPUT) */
    bool stepped;               /* logits are valid */
    const float *logits;        /* vocab floats after a step (backend-owned) */
    int next;                   /* the kernel's argmax after a step */
    char err[RT_ERR_LEN];
    char piece[512];            /* megac_decode's text */
    TokDrops drops;             /* what the last megac_encode dropped */
    uint64_t *kv_layout;        /* the kernel's megac_kv_layout, checked; NULL: no shift (kv_shift.c) */
};

/* A device backend: opens the kernel, runs one step, closes. */
struct RtBackend {
    const char *name;
    /* Before any bundle file past the manifest is read: finds what the
     * target needs (the CUDA driver and device), so that a bundle for a
     * device that is not there is refused first. NULL: nothing to find. */
    megac_status (*prepare)(megac_model *m);
    /* Loads m->dir/m->man.kernel and prepares to run; checks what the kernel
     * says about itself against the manifest. */
    megac_status (*open)(megac_model *m);
    /* Runs one decode step of `token` at `pos`; then m->logits and m->next
     * hold its results, unless m->no_output (a step without outputs:
     * MegacArgs.flags, and nothing need be copied back). */
    megac_status (*step)(megac_model *m, int token, int pos);
    /* Clears state that lives across steps (KV cache) for a new sequence. */
    megac_status (*reset)(megac_model *m);
    /* Copies len bytes between the arena at offset off and host memory
     * buf: into the arena when to_arena, else out of it (a context shift's
     * rows). The range is within the arena. */
    megac_status (*arena_copy)(megac_model *m, uint64_t off, void *buf, size_t len, bool to_arena);
    void (*close)(megac_model *m);
};

/* ---- runtime.c ---- */
/* Sets m->err (printf style) and returns st. */
megac_status rt_fail(megac_model *m, megac_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Errors of calls without a model (a failed open, a NULL model, megac_sample)
 * go to this thread's buffer, read by megac_error(NULL). */
megac_status rt_loose_fail(megac_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rt_loose_clear(void);

/* ---- kv_shift.c ---- */
/* Takes the kernel's megac_kv_layout (nwords words; v NULL where the kernel
 * has none) into m->kv_layout after checking it against the manifest and
 * weights.bin (a malformed one is MEGAC_ERR_FORMAT, naming file); a layout
 * of zero layers leaves it NULL. */
megac_status rt_kv_layout_set(megac_model *m, const uint64_t *v, size_t nwords, const char *file);
/* megac_shift's work on a model with a layout, its arguments checked
 * (0 <= keep, 0 <= n, keep + n <= m->pos): moves and turns the rows;
 * m->pos is the caller's. */
megac_status rt_kv_shift(megac_model *m, int keep, int n);

/* ---- sampler.c ---- */
/* Why a sampler's settings are refused (static text), or NULL. */
const char *rt_sampler_error(const megac_sampler *s);
/* The first logit that is NaN or +Inf (or 0 when all are -Inf), or -1. */
int rt_logits_bad(const float *logits, int n);
/* p[i] = exp((logits[i] - max) / temp) for the n logits (n >= 1, none NaN
 * or +Inf), 0 where that is below e^-708 (and for -Inf); returns their
 * sum. The sampler's weights (exposed for its tests). */
double rt_sample_weights(const float *logits, int n, double temp, double *p);
/* megac_sample on logits that rt_logits_bad passed and settings that
 * rt_sampler_error passed (n >= 1): the token, or -MEGAC_ERR_NOMEM. */
int rt_sample_checked(const float *logits, int n, const megac_sampler *s, uint64_t *rng_state);

/* ---- bundle.c ---- */
/* Parses manifest.yaml text; errors name `path` and the line. */
megac_status rt_manifest_parse(RtManifest *man, const char *path, const char *text, size_t len,
                               char *err, size_t errlen);
/* Reads manifest.yaml into m->man and checks that its numbers describe a
 * model this runtime can drive. */
megac_status rt_manifest_load(megac_model *m);
/* After rt_manifest_load: checks schedule.sched against its hash and the
 * kernel file against its size and hash, maps weights.bin (size checked)
 * and loads tokenizer.bin. The kernel's checked bytes stay in
 * m->kernel_image for the backend (rt_bundle_unload frees them). */
megac_status rt_bundle_load(megac_model *m);
/* Refuses a manifest key that disagrees with facts[MEGAC_NFACTS] (kernel_abi.h),
 * which `file` reports: "FILE: error: WHO counters 22, but manifest.yaml says
 * counters: 0". MEGAC_FACT_NONE in facts is not checked. */
megac_status rt_facts_check(megac_model *m, const uint64_t *facts, const char *file, const char *who);
void rt_bundle_unload(megac_model *m);
uint64_t rt_fnv1a(const void *p, size_t n);
/* The wait deadline MEGAC_WATCHDOG_MS asks for, in ns: 0 (the kernel's
 * default) when unset, empty, 0 or not a plain decimal number; at most
 * RT_WATCHDOG_MAX_MS (about 11.6 days: "never" in practice). */
#define RT_WATCHDOG_MAX_MS 1000000000ull
uint64_t rt_watchdog_ns(void);
/* `dir/name` into buf; false if it does not fit. */
bool rt_path(char *buf, size_t cap, const char *dir, const char *name);
/* v[i] (one value per counter) summed by the counter's stage: its name in
 * dir/schedule.sched up to the first '.' ("qkv.3" and "qkv.7" are stage
 * "qkv"), stages in the order of their first counter, at most max of them
 * (the rest are left out). Returns how many, or -1 when the schedule
 * cannot be read or declares other than nctrs counters. For profiles. */
typedef struct RtStageSum {
    char name[32];
    uint64_t sum;
    uint32_t nctrs;
} RtStageSum;
int rt_stage_sums(const char *dir, const uint64_t *v, uint32_t nctrs, RtStageSum *out, int max);

/* ---- cpu_backend.c ---- */
extern const RtBackend rt_cpu_backend;

/* ---- cuda_backend.c ---- */
extern const RtBackend rt_cuda_backend;

#endif
