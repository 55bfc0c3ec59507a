/*
 * runtime.c - the public API of megac.h: open a bundle (bundle.c checks its
 * files, a backend runs its kernel), step, read logits, tokenize, generate.
 *
 * Every call returns a status and leaves a message in the model (or, for a
 * failed open, in a thread-local buffer read by megac_last_open_error). The
 * runtime never exits the process. Sampling is sampler.c's megac_sample;
 * tokenization is tokenizer.c's.
 */
#include "runtime/backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char open_error[RT_ERR_LEN];

megac_status rt_fail(megac_model *m, megac_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    return st;
}

megac_status rt_loose_fail(megac_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(open_error, sizeof open_error, fmt, ap);
    va_end(ap);
    return st;
}

void rt_loose_clear(void) { open_error[0] = 0; }

/* The backend that runs a target's kernel; NULL if this runtime has none. */
static const RtBackend *backend_for(const char *target)
{
    if (strcmp(target, "cpu") == 0 || strcmp(target, "host-cuda") == 0)
        return &rt_cpu_backend;
    if (strncmp(target, "sm_", 3) == 0)
        return &rt_cuda_backend;
    return NULL;
}

/* Opens the bundle in dir into m; with check_only, only its files are
 * read and checked (megac_bundle_check): no device is looked for, no
 * kernel loaded. */
static megac_status model_open(megac_model *m, const char *dir, bool check_only)
{
    m->dir = strdup(dir);
    m->check_only = check_only;
    if (!m->dir)
        return rt_fail(m, MEGAC_ERR_NOMEM, "out of memory");
    megac_status st = rt_manifest_load(m);
    if (st)
        return st;
    m->be = backend_for(m->man.target);
    if (!m->be)
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s/manifest.yaml:%d:%d: error: unknown target '%s' (this runtime runs cpu, host-cuda or "
                       "sm_XX bundles)",
                       dir, m->man.target_line, m->man.target_col, m->man.target);
    if (check_only)
        return rt_bundle_load(m);
    if ((m->be->prepare && (st = m->be->prepare(m))) || (st = rt_bundle_load(m)))
        return st;
    return m->be->open(m);
}

/* The model's lock is recursive: megac_generate steps through megac_step,
 * and its token callback may call megac_decode on the same model. */
static bool model_mutex_init(megac_model *m)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0)
        return false;
    bool ok = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE) == 0 && pthread_mutex_init(&m->mu, &a) == 0;
    pthread_mutexattr_destroy(&a);
    m->mu_ready = ok;
    return ok;
}

/* megac_open and megac_bundle_check: the model, or NULL with the error in
 * open_error. */
static megac_status model_new(const char *bundle_dir, bool check_only, megac_model **out)
{
    const char *who = check_only ? "megac_bundle_check" : "megac_open";
    *out = NULL;
    if (!bundle_dir || !*bundle_dir) { /* "" would be "/manifest.yaml" */
        snprintf(open_error, sizeof open_error, "%s: no bundle folder given", who);
        return MEGAC_ERR_ARG;
    }
    megac_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(open_error, sizeof open_error, "%s: out of memory", who);
        return MEGAC_ERR_NOMEM;
    }
    m->prompt_end = -1;
    m->pid = getpid();
    if (!model_mutex_init(m)) {
        snprintf(open_error, sizeof open_error, "%s: cannot create the model's mutex", who);
        megac_close(m);
        return MEGAC_ERR_NOMEM;
    }
    megac_status st = model_open(m, bundle_dir, check_only);
    if (st) {
        snprintf(open_error, sizeof open_error, "%s", m->err);
        megac_close(m);
        return st;
    }
    *out = m;
    return MEGAC_OK;
}

megac_status megac_open(const char *bundle_dir, megac_model **out)
{
    open_error[0] = 0;
    if (!out)
        return rt_loose_fail(MEGAC_ERR_ARG, "megac_open: no place for the model given");
    return model_new(bundle_dir, false, out);
}

megac_status megac_bundle_check(const char *bundle_dir)
{
    open_error[0] = 0;
    megac_model *m;
    megac_status st = model_new(bundle_dir, true, &m);
    if (!st)
        megac_close(m); /* no backend state: m->be_state is NULL */
    return st;
}

void megac_close(megac_model *m)
{
    if (!m)
        return;
    if (m->be && m->be_state)
        m->be->close(m);
    rt_bundle_unload(m);
    if (m->mu_ready)
        pthread_mutex_destroy(&m->mu);
    free(m->kv_layout);
    free(m->dir);
    free(m);
}

/* A NULL model fails every call: the message goes to this thread's buffer. */
#define NEED_MODEL(m, who, ret)                                                  \
    do {                                                                         \
        if (!(m)) {                                                              \
            rt_loose_fail(MEGAC_ERR_ARG, "%s: no model given", who);             \
            return ret;                                                          \
        }                                                                        \
    } while (0)

const char *megac_error(const megac_model *m) { return m ? m->err : open_error; }
const char *megac_last_open_error(void) { return open_error; }

/* Facts of a NULL model: 0, or -1 for the token ids. */
int megac_vocab_size(const megac_model *m) { return m ? m->man.vocab : 0; }
int megac_max_seq(const megac_model *m) { return m ? m->man.max_seq : 0; }
int megac_bos(const megac_model *m) { return m ? m->man.bos : -1; }
int megac_eos(const megac_model *m) { return m ? m->man.eos : -1; }

/* BOS, EOS, or a token the tokenizer marks as ending generation. */
static bool model_is_stop(const megac_model *m, int tok)
{
    return tok >= 0 && (tok == m->man.bos || tok == m->man.eos || (m->tok && tok_is_stop(m->tok, tok)));
}

int megac_is_stop(const megac_model *m, int token) { return m && model_is_stop(m, token); }
int megac_num_workers(const megac_model *m) { return m ? (int)m->man.workers : 0; }
uint64_t megac_weights_bytes(const megac_model *m) { return m ? m->man.weights_bytes : 0; }
int megac_weights_in_memory(const megac_model *m) { return m && m->weights_copied; }
int megac_position(const megac_model *m) { return m ? m->pos : 0; }

/* Takes m's lock in the process that opened m; in a forked child, false
 * after saying why: its worker threads (a device's context) stayed in the
 * parent, and the lock itself may be held there by a thread that did not
 * fork (the child would wait on it forever). */
static bool model_lock(megac_model *m)
{
    if (getpid() != m->pid) {
        rt_fail(m, MEGAC_ERR_ARG, "this model was opened by process %d: after fork() the child must open the bundle "
                "itself", (int)m->pid);
        return false;
    }
    pthread_mutex_lock(&m->mu);
    return true;
}

megac_status megac_reset(megac_model *m)
{
    NEED_MODEL(m, "megac_reset", MEGAC_ERR_ARG);
    if (!model_lock(m))
        return MEGAC_ERR_ARG;
    m->err[0] = 0;
    m->pos = 0;
    m->prompt_end = -1;
    m->stepped = false;
    megac_status st = m->be->reset(m);
    pthread_mutex_unlock(&m->mu);
    return st;
}

megac_status megac_shift(megac_model *m, int keep, int n)
{
    NEED_MODEL(m, "megac_shift", MEGAC_ERR_ARG);
    if (!model_lock(m))
        return MEGAC_ERR_ARG;
    m->err[0] = 0;
    megac_status st = MEGAC_OK;
    if (keep < 0 || n < 0 || keep > m->pos || n > m->pos - keep)
        st = rt_fail(m, MEGAC_ERR_ARG, "megac_shift: cannot drop positions [%d, %d + %d) of the %d in the cache", keep,
                     keep, n, m->pos);
    else if (!m->kv_layout)
        st = rt_fail(m, MEGAC_ERR_UNSUPPORTED, "megac_shift: this bundle's KV cache cannot be shifted (a layer evicts "
                     "rows or keeps state about them: kv_policy, Quest pages); reset and feed the kept tokens instead");
    else if (n > 0 && (st = rt_kv_shift(m, keep, n)) != MEGAC_OK) {
        /* part of the cache may have moved: start over rather than step on it */
        size_t len = strlen(m->err);
        snprintf(m->err + len, sizeof m->err - len, " (the cache was reset: position 0)");
        m->be->reset(m);
        m->pos = 0;
        m->stepped = false;
        m->prompt_end = -1;
    } else if (n > 0) {
        m->pos -= n;
        m->stepped = false;
        m->prompt_end = -1;
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

/* One step; `outputs` false: a step without outputs (megac_feed). Logits
 * that are not finite are refused, naming the position (the step counts:
 * its cache rows are written): they come from a diverging model, or from
 * k or v past what an f16 cache holds (stored as infinities), and no token
 * is right. */
static megac_status model_step(megac_model *m, int token, bool outputs)
{
    m->err[0] = 0;
    if (token < 0 || token >= m->man.vocab)
        return rt_fail(m, MEGAC_ERR_ARG, "token %d is outside the vocabulary [0, %d)", token, m->man.vocab);
    if (m->pos >= m->man.max_seq)
        return rt_fail(m, MEGAC_ERR_ARG, "position %d is past the context of %d tokens", m->pos, m->man.max_seq);
    m->stepped = false;
    m->no_output = !outputs;
    megac_status st = m->be->step(m, token, m->pos);
    m->no_output = false;
    if (st)
        return st;
    m->pos++;
    m->stepped = outputs;
    int bad = outputs ? rt_logits_bad(m->logits, m->man.vocab) : -1;
    if (bad >= 0)
        return rt_fail(m, MEGAC_ERR_KERNEL,
                       "the logits at position %d are not finite: token %d has %g%s; or the weights were damaged "
                       "after compilation (`megac validate %s` checks their hash)",
                       m->pos - 1, bad, (double)m->logits[bad],
                       strcmp(m->kv_dtype, "f16") == 0
                           ? " (this bundle's KV cache is f16, which holds values up to 65504: where a model's k or v "
                             "grow past that, compile.kv_dtype: bf16 or f32 holds them)"
                           : "",
                       m->dir);
    return MEGAC_OK;
}

megac_status megac_set_prompt_end(megac_model *m, int pos)
{
    NEED_MODEL(m, "megac_set_prompt_end", MEGAC_ERR_ARG);
    if (!model_lock(m))
        return MEGAC_ERR_ARG;
    m->err[0] = 0;
    megac_status st = pos < -1 || pos >= m->man.max_seq
                          ? rt_fail(m, MEGAC_ERR_ARG, "megac_set_prompt_end: position %d is not in the context of %d "
                                    "(-1 for none)", pos, m->man.max_seq)
                          : MEGAC_OK;
    if (!st)
        m->prompt_end = pos;
    pthread_mutex_unlock(&m->mu);
    return st;
}

static megac_status model_step_locked(megac_model *m, int token, bool outputs)
{
    if (!model_lock(m))
        return MEGAC_ERR_ARG;
    megac_status st = model_step(m, token, outputs);
    pthread_mutex_unlock(&m->mu);
    return st;
}

megac_status megac_step(megac_model *m, int token)
{
    NEED_MODEL(m, "megac_step", MEGAC_ERR_ARG);
    return model_step_locked(m, token, true);
}

megac_status megac_feed(megac_model *m, int token)
{
    NEED_MODEL(m, "megac_feed", MEGAC_ERR_ARG);
    return model_step_locked(m, token, false);
}

const float *megac_logits(const megac_model *m) { return m && m->stepped ? m->logits : NULL; }
int megac_argmax(const megac_model *m) { return m && m->stepped ? m->next : -1; }

int megac_chat_format(const megac_model *m, const char **default_system)
{
    if (default_system)
        *default_system = NULL;
    return m ? (int)tok_chat(m->tok, default_system) : 0;
}

int megac_wants_bos(const megac_model *m, const char *text)
{
    return m ? tok_default_bos(m->tok, text) : 0;
}

/* megac_encode (add_bos 1, 0, -1) and megac_encode_more (add_bos 2: a
 * continuation), named fn in their messages. */
static int rt_encode(megac_model *m, const char *fn, const char *text, int add_bos, int *ids, int cap)
{
    if (!text || !ids || cap < 0) {
        rt_fail(m, MEGAC_ERR_ARG, "%s: %s", fn, !text ? "no text given" : !ids ? "no ids array given" : "cap is negative");
        return -1;
    }
    if (!model_lock(m))
        return -1;
    m->err[0] = 0;
    int n = add_bos == 2 ? tok_encode_more(m->tok, text, ids, cap, &m->drops)
                         : tok_encode_drops(m->tok, text, add_bos < 0 ? tok_default_bos(m->tok, text) : add_bos != 0,
                                            ids, cap, &m->drops);
    if (n < 0)
        rt_fail(m, MEGAC_ERR_ARG, "%s: the %s takes more than the %d token%s ids has room for", fn,
                add_bos == 2 ? "text" : "prompt", cap, cap == 1 ? "" : "s");
    pthread_mutex_unlock(&m->mu);
    return n;
}

int megac_encode(megac_model *m, const char *text, int add_bos, int *ids, int cap)
{
    NEED_MODEL(m, "megac_encode", -1);
    return rt_encode(m, "megac_encode", text, add_bos < 0 ? -1 : add_bos != 0, ids, cap);
}

int megac_encode_more(megac_model *m, const char *text, int *ids, int cap)
{
    NEED_MODEL(m, "megac_encode_more", -1);
    return rt_encode(m, "megac_encode_more", text, 2, ids, cap);
}

int megac_encode_dropped(const megac_model *m, int *first, size_t *at)
{
    NEED_MODEL(m, "megac_encode_dropped", 0);
    if (first)
        *first = m->drops.n ? m->drops.first : -1;
    if (at)
        *at = m->drops.n ? m->drops.first_at : 0;
    return m->drops.n;
}

const char *megac_decode(megac_model *m, int prev_token, int token)
{
    NEED_MODEL(m, "megac_decode", "");
    if (!model_lock(m))
        return "";
    m->piece[0] = 0;
    if (token >= 0 && token < tok_vocab(m->tok))    /* ids past the tokenizer's: no text */
        tok_decode(m->tok, prev_token, token, m->piece, sizeof m->piece);
    pthread_mutex_unlock(&m->mu);
    return m->piece;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The next token after a step (whose logits model_step found finite): the
 * kernel's argmax when greedy. */
static megac_status generate_pick(megac_model *m, const megac_sampler *s, uint64_t *rng, int *tok)
{
    if (!s || s->temperature == 0.0f) {
        *tok = megac_argmax(m);
        return MEGAC_OK;
    }
    rt_loose_clear();
    *tok = rt_sample_checked(m->logits, m->man.vocab, s, rng);     /* checked above, and the settings at the start */
    if (*tok < 0)
        return rt_fail(m, (megac_status)-*tok, "%s", megac_error(NULL));
    return MEGAC_OK;
}

static megac_status model_generate(megac_model *m, const int *prompt, int nprompt, int n_new, const megac_sampler *s,
                                   uint64_t *rng, megac_token_cb cb, void *user, megac_stats *st)
{
    megac_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    st->stop_token = -1;
    m->err[0] = 0;
    if (!prompt)
        return rt_fail(m, MEGAC_ERR_ARG, "megac_generate: no prompt given");
    if (nprompt < 1)
        return rt_fail(m, MEGAC_ERR_ARG, "megac_generate needs at least one prompt token (BOS)");
    if (s && rt_sampler_error(s))
        return rt_fail(m, MEGAC_ERR_ARG, "megac_generate: %s", rt_sampler_error(s));
    if (nprompt > m->man.max_seq - m->pos)
        return rt_fail(m, MEGAC_ERR_ARG, "megac_generate: a prompt of %d tokens does not fit in the %d positions "
                       "left of the context's %d", nprompt, m->man.max_seq - m->pos, m->man.max_seq);
    for (int i = 0; i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= m->man.vocab)
            return rt_fail(m, MEGAC_ERR_ARG, "megac_generate: prompt token %d is %d, outside the vocabulary [0, %d)",
                           i, prompt[i], m->man.vocab);
    double t0 = now_s();
    megac_status rc;
    m->prompt_end = m->pos + nprompt - 1;
    for (int i = 0; i < nprompt; i++)     /* only the last prompt token's outputs are read */
        if ((rc = model_step(m, prompt[i], i == nprompt - 1)))
            return rc;
    st->prompt_tokens = nprompt;
    double t1 = now_s();
    st->prefill_s = t1 - t0;
    int prev = prompt[nprompt - 1];
    for (int i = 0; i < n_new; i++) {
        int tok = -1;
        if ((rc = generate_pick(m, s, rng, &tok)))
            return rc;
        if (tok < 0 || tok >= m->man.vocab)
            return rt_fail(m, MEGAC_ERR_KERNEL, "the kernel chose token %d, outside the vocabulary", tok);
        if (model_is_stop(m, tok)) {
            st->stop_token = tok;
            break;
        }
        st->generated_tokens++;
        if (cb && cb(user, tok, megac_decode(m, prev, tok)))
            break;
        prev = tok;
        if (i + 1 == n_new || m->pos >= m->man.max_seq)
            break;
        if ((rc = model_step(m, tok, true)))
            return rc;
    }
    st->decode_s = now_s() - t1;
    return MEGAC_OK;
}

megac_status megac_generate(megac_model *m, const int *prompt, int nprompt, int n_new, const megac_sampler *s,
                            megac_token_cb cb, void *user, megac_stats *st)
{
    uint64_t rng = 0; /* 0: megac_sample seeds it from s->seed, as the reference engine does */
    return megac_generate_rng(m, prompt, nprompt, n_new, s, &rng, cb, user, st);
}

megac_status megac_generate_rng(megac_model *m, const int *prompt, int nprompt, int n_new, const megac_sampler *s,
                                uint64_t *rng_state, megac_token_cb cb, void *user, megac_stats *st)
{
    NEED_MODEL(m, "megac_generate", MEGAC_ERR_ARG);
    if (!rng_state)
        return rt_fail(m, MEGAC_ERR_ARG, "megac_generate_rng: no sampler state given");
    if (!model_lock(m))
        return MEGAC_ERR_ARG;
    megac_status rc = model_generate(m, prompt, nprompt, n_new, s, rng_state, cb, user, st);
    pthread_mutex_unlock(&m->mu);
    return rc;
}
