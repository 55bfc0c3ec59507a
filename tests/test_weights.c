/*
 * test_weights.c - the weight loaders: llama2.c (the real stories260K and
 * small files written here), safetensors and GGUF fixtures made by
 * tests/fixtures/weights/make_fixtures.py, malformed files built in a temp
 * dir from good ones, and the synthetic generator's determinism.
 */
#include "compiler/weights_impl.h"
#include "compiler/gguf.h"
#include "compiler/quant.h"
#include "gguf_patch.h"
#include "runtime/half.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARED MEGAC_SRC "/../shared"
#define FIXTURES MEGAC_SRC "/tests/fixtures/weights"

/* ---- helpers ---- */

static void desc_tiny(ModelDesc *m, WeightFormat fmt, const char *path)
{
    memset(m, 0, sizeof *m);
    m->name = "tiny";
    m->path = "tiny.yaml";
    m->dim = 16;
    m->hidden_dim = 24;
    m->n_layers = 2;
    m->n_heads = 4;
    m->n_kv_heads = 2;
    m->head_dim = 4;
    m->vocab_size = 32;
    m->max_seq = 8;
    m->norm_eps = 1e-5;
    m->tie_embeddings = true;
    m->rope_theta = 10000;
    m->rope_pairing = ROPE_ADJACENT;
    m->weights_format = fmt;
    m->weights_path = path;
    m->weights_seed = 7;
}

static void desc_stories(ModelDesc *m)
{
    desc_tiny(m, WFMT_LLAMA2C, SHARED "/models/stories260K.bin");
    m->dim = 64;
    m->hidden_dim = 172;
    m->n_layers = 5;
    m->n_heads = 8;
    m->n_kv_heads = 4;
    m->head_dim = 8;
    m->vocab_size = 512;
    m->max_seq = 512;
}

/* Loads (weights_load_ex with flags) with diagnostics captured into buf;
 * returns the load result. */
static bool load_capture_ex(Weights *w, const ModelDesc *m, unsigned flags, char *buf, size_t n)
{
    memset(buf, 0, n);
    FILE *f = fmemopen(buf, n - 1, "w");
    cr_assert_not_null(f);
    Diag d;
    diag_init(&d);
    d.out = f;
    bool ok = weights_load_ex(w, m, flags, NULL, &d);
    fclose(f);
    cr_assert_eq(ok, d.nerrors == 0, "result %d with %d errors: %s", ok, d.nerrors, buf);
    return ok;
}

static bool load_capture(Weights *w, const ModelDesc *m, char *buf, size_t n)
{
    return load_capture_ex(w, m, 0, buf, n);
}

static char tmp_dir[64];

static int tmp_remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Each test runs in its own process; this removes its temp dir after it. */
static void tmp_cleanup(void)
{
    if (tmp_dir[0])
        nftw(tmp_dir, tmp_remove, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(weights, .fini = tmp_cleanup);

static char *tmp_path(const char *name)
{
    char *dir = tmp_dir;
    if (!dir[0]) {
        snprintf(dir, sizeof tmp_dir, "/tmp/megac_wtest_XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
    }
    return xasprintf("%s/%s", dir, name);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    char *p = read_file(path, n);
    cr_assert_not_null(p, "cannot read %s", path);
    return (unsigned char *)p;
}

/* src's bytes (*n of them), and *g the GGUF file parsed from it (for its
 * tensors' offsets into those bytes; gguf_close it). */
static unsigned char *gguf_read_open(const char *src, size_t *n, GgufFile **g)
{
    unsigned char *raw = read_bytes(src, n);
    Diag d;
    diag_init(&d);
    *g = gguf_open(src, &d);
    cr_assert_not_null(*g, "%s", src);
    return raw;
}

static float float_at(const unsigned char *p, size_t off)
{
    float x;
    memcpy(&x, p + off, 4);
    return x;
}

/* ---- llama2.c ---- */

Test(weights, stories260k_llama2c)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip("../shared/models/stories260K.bin is absent");
    ModelDesc m;
    desc_stories(&m);
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    size_t n;
    unsigned char *raw = read_bytes(SHARED "/models/stories260K.bin", &n);
    cr_assert_eq(n, 1056540u);
    /* offsets by hand: header 28; embed 512*64; rms_att 5*64; wq 5*64*64 */
    size_t embed = 28, rms_att = embed + 512 * 64 * 4, wq = rms_att + 5 * 64 * 4;
    size_t wk = wq + 5 * 64 * 64 * 4, wv = wk + 5 * 32 * 64 * 4, wo = wv + 5 * 32 * 64 * 4;
    size_t rms_ffn = wo + 5 * 64 * 64 * 4, w1 = rms_ffn + 5 * 64 * 4, w2 = w1 + 5 * 172 * 64 * 4;
    size_t w3 = w2 + 5 * 64 * 172 * 4, rms_final = w3 + 5 * 172 * 64 * 4;
    cr_assert_eq(w.tok_embed[0], float_at(raw, embed));
    cr_assert_eq(w.tok_embed[511 * 64 + 63], float_at(raw, embed + (511 * 64 + 63) * 4));
    cr_assert_eq(w.layers[0].attn_norm[5], float_at(raw, rms_att + 5 * 4));
    cr_assert_eq(w.layers[3].wq[7 * 64 + 9], float_at(raw, wq + (3 * 64 * 64 + 7 * 64 + 9) * 4));
    cr_assert_eq(w.layers[4].wk[31 * 64 + 63], float_at(raw, wk + (4 * 32 * 64 + 31 * 64 + 63) * 4));
    cr_assert_eq(w.layers[1].wv[100], float_at(raw, wv + (1 * 32 * 64 + 100) * 4));
    cr_assert_eq(w.layers[2].wo[1000], float_at(raw, wo + (2 * 64 * 64 + 1000) * 4));
    cr_assert_eq(w.layers[4].ffn_norm[63], float_at(raw, rms_ffn + (4 * 64 + 63) * 4));
    cr_assert_eq(w.layers[2].w_gate[171 * 64], float_at(raw, w1 + (2 * 172 * 64 + 171 * 64) * 4));
    cr_assert_eq(w.layers[2].w_down[63 * 172 + 171], float_at(raw, w2 + (2 * 64 * 172 + 63 * 172 + 171) * 4));
    cr_assert_eq(w.layers[0].w_up[10999], float_at(raw, w3 + 10999 * 4));
    cr_assert_eq(w.final_norm[17], float_at(raw, rms_final + 17 * 4));
    cr_assert_eq(w.lm_head, w.tok_embed);
    cr_assert_eq(w.pairing, ROPE_ADJACENT);
    int64_t ne;
    cr_assert_eq(weights_tensor(&w, "L3.wq", &ne), w.layers[3].wq);
    cr_assert_eq(ne, 64 * 64);
    cr_assert_eq(weights_tensor(&w, "L4.w_down", &ne), w.layers[4].w_down);
    cr_assert_eq(ne, 64 * 172);
    cr_assert_eq(weights_tensor(&w, "lm_head", &ne), w.tok_embed);
    cr_assert_null(weights_tensor(&w, "L0.bq", NULL));
    cr_assert_null(weights_tensor(&w, "L5.wq", NULL));
    cr_assert_null(weights_tensor(&w, "L1.embed", NULL));
    cr_assert_null(weights_tensor(&w, "wq", NULL));
    cr_assert_eq(w.nbytes, (size_t)(512 * 64 + 5 * (2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 172 * 64) + 64) * 4);
    free(raw);
    weights_free(&w);
}

/* A small llama2.c file for the tiny model: header, then float i*0.001 for
 * the i-th float of the body (so every position is recognizable). */
static char *llama2c_tiny(const char *name, bool shared, size_t *size_out)
{
    ModelDesc m;
    desc_tiny(&m, WFMT_LLAMA2C, NULL);
    int seq = 8;
    int32_t h[7] = {m.dim, m.hidden_dim, m.n_layers, m.n_heads, m.n_kv_heads, shared ? 32 : -32, seq};
    size_t L = 2, dim = 16, kv = 8, hid = 24, V = 32;
    size_t nf = V * dim + L * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hid * dim) + dim + seq * 2 * 2 +
                (shared ? 0 : V * dim);
    size_t size = 28 + nf * 4;
    unsigned char *buf = xmalloc(size);
    memcpy(buf, h, 28);
    for (size_t i = 0; i < nf; i++) {
        float x = (float)i * 0.001f;
        memcpy(buf + 28 + i * 4, &x, 4);
    }
    char *path = tmp_path(name);
    write_bytes(path, buf, size);
    free(buf);
    if (size_out)
        *size_out = size;
    return path;
}

Test(weights, llama2c_unshared_classifier)
{
    size_t size;
    char *path = llama2c_tiny("unshared.bin", false, &size);
    ModelDesc m;
    desc_tiny(&m, WFMT_LLAMA2C, path);
    m.tie_embeddings = false;
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    cr_assert_neq(w.lm_head, w.tok_embed);
    /* wcls is the last vocab*dim floats */
    size_t nf = (size - 28) / 4;
    cr_assert_eq(w.lm_head[0], (float)(nf - 32 * 16) * 0.001f);
    cr_assert_eq(w.lm_head[32 * 16 - 1], (float)(nf - 1) * 0.001f);
    /* layer 1's wk starts after embed, rms_att(2), wq(2), wk(1) */
    size_t off = 32 * 16 + 2 * 16 + 2 * 256 + 128;
    cr_assert_eq(w.layers[1].wk[0], (float)off * 0.001f);
    weights_free(&w);
    free(path);
}

/* Loads `m` (with flags) expecting failure and an error containing `want`. */
static void expect_error_ex(const ModelDesc *m, unsigned flags, const char *want)
{
    Weights w;
    char err[2048];
    cr_assert_not(load_capture_ex(&w, m, flags, err, sizeof err), "loaded, expected: %s", want);
    cr_assert_not_null(strstr(err, want), "expected '%s' in:\n%s", want, err);
    cr_assert_not_null(strstr(err, m->weights_path ? m->weights_path : "tiny.yaml"), "no path in: %s", err);
    int nerr = 0;
    for (const char *p = err; (p = strstr(p, "error: ")); p++)
        nerr++;
    cr_assert_eq(nerr, 1, "expected one error, got:\n%s", err);
    if (getenv("MEGAC_SHOW_ERRORS"))
        fputs(err, stderr);
}

static void expect_error(const ModelDesc *m, const char *want)
{
    expect_error_ex(m, 0, want);
}

/* The same error from a load and from the header-only read that `megac
 * lower` and `validate` make (WEIGHTS_DTYPES_ONLY): it had not opened a
 * llama2.c file at all. */
static void expect_error_both(const ModelDesc *m, const char *want)
{
    expect_error_ex(m, 0, want);
    expect_error_ex(m, WEIGHTS_DTYPES_ONLY, want);
}

Test(weights, llama2c_bad_inputs)
{
    size_t size;
    char *path = llama2c_tiny("good.bin", true, &size);
    size_t n;
    unsigned char *raw = read_bytes(path, &n);
    ModelDesc m;
    desc_tiny(&m, WFMT_LLAMA2C, path);
    Weights w;
    char err[2048];
    cr_assert(load_capture_ex(&w, &m, WEIGHTS_DTYPES_ONLY, err, sizeof err), "%s", err);
    weights_free(&w);

    char *trunc = tmp_path("trunc.bin");
    write_bytes(trunc, raw, size - 4 * 16 * 24);
    desc_tiny(&m, WFMT_LLAMA2C, trunc);
    expect_error_both(&m, "truncated");

    char *hdr = tmp_path("hdr.bin");
    write_bytes(hdr, raw, 20);
    desc_tiny(&m, WFMT_LLAMA2C, hdr);
    expect_error_both(&m, "a llama2.c header alone is 28");

    char *trail = tmp_path("trail.bin");
    unsigned char *big = xcalloc(size + 8, 1);
    memcpy(big, raw, size);
    write_bytes(trail, big, size + 8);
    desc_tiny(&m, WFMT_LLAMA2C, trail);
    expect_error_both(&m, "trailing data");

    desc_tiny(&m, WFMT_LLAMA2C, path);
    m.hidden_dim = 32;
    expect_error_both(&m, "hidden_dim is 24, but the model description says 32");

    desc_tiny(&m, WFMT_LLAMA2C, path);
    m.tie_embeddings = false;
    expect_error_both(&m, "shared with the embedding");

    desc_tiny(&m, WFMT_LLAMA2C, path);
    m.rope_pairing = ROPE_HALF;
    expect_error_both(&m, "RoPE pairing 'adjacent'");

    desc_tiny(&m, WFMT_LLAMA2C, path);
    m.qkv_bias = true;
    expect_error_both(&m, "no q/k/v biases");

    desc_tiny(&m, WFMT_LLAMA2C, "/nonexistent/x.bin");
    expect_error_both(&m, "cannot open");

    char *vmin = tmp_path("vocab_min.bin"); /* vocab_size INT32_MIN: no |vocab| to take */
    int32_t minv = INT32_MIN;
    memcpy(raw + 20, &minv, 4);
    write_bytes(vmin, raw, size);
    desc_tiny(&m, WFMT_LLAMA2C, vmin);
    expect_error_both(&m, "header: vocab_size is -2147483648");
    free(vmin);

    free(big);
    free(raw);
    free(trunc);
    free(hdr);
    free(trail);
    free(path);
}

/* A description that claims a far larger model than its file: a
 * 1.75e9-parameter claim on a llama2.c file of a few KB is refused before
 * anything is mapped, naming the file; a 2.2e8-parameter one (under a GiB
 * of f32, left to the loader) fails on the file's size without the
 * process taking that memory (the f32 views are zero pages until
 * written). Criterion runs each test in its own process, so its peak
 * resident size is this test's. */
Test(weights, claims_beyond_the_file_cost_no_memory)
{
    static const int32_t big[7] = {4096, 11008, 8, 32, 32, 32000, 8}, mid[7] = {2048, 5632, 3, 16, 16, 32000, 8};
    const int32_t *claims[2] = {big, mid};
    const char *want[2] = {"implies 1.75e+09 parameters", "truncated"};
    for (int i = 0; i < 2; i++) { /* a llama2.c header alone, and a description that agrees with it */
        char *path = tmp_path(i ? "mid.bin" : "big.bin");
        write_bytes(path, claims[i], sizeof big);
        ModelDesc m;
        desc_tiny(&m, WFMT_LLAMA2C, path);
        m.dim = claims[i][0], m.hidden_dim = claims[i][1], m.n_layers = claims[i][2], m.n_heads = claims[i][3];
        m.n_kv_heads = claims[i][4], m.vocab_size = claims[i][5], m.max_seq = claims[i][6];
        m.head_dim = m.dim / m.n_heads;
        expect_error(&m, want[i]);
        free(path);
    }
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
    cr_assert_lt(ru.ru_maxrss, 300 * 1024, "peak resident %ld KB", ru.ru_maxrss);
}

/* A NaN or infinity in a tensor is an error naming the tensor (as the
 * checkpoint names it: llama2.c's field and the layer, where it said
 * megac's own 'L0.wq') and the element, not garbage text at run time. */
Test(weights, llama2c_non_finite)
{
    size_t size;
    char *path = llama2c_tiny("nan.bin", true, &size);
    size_t n;
    unsigned char *raw = read_bytes(path, &n);
    size_t wq = 28 + 4 * (32 * 16 + 2 * 16);  /* layer 0's wq follows embed and rms_att */
    float bad[] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        unsigned char *b = xmalloc(n);
        memcpy(b, raw, n);
        memcpy(b + wq + 4 * (size_t)(3 + i), &bad[i], 4);
        write_bytes(path, b, n);
        ModelDesc m;
        desc_tiny(&m, WFMT_LLAMA2C, path);
        char want[128];
        snprintf(want, sizeof want, "error: tensor 'wq (layer 0)' has a non-finite value (NaN or infinity) at "
                 "element %d\n", 3 + i);
        expect_error(&m, want);
        free(b);
    }
    free(raw);
    free(path);
}

/* ---- synthetic ---- */

static double tensor_sum(const float *p, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)p[i] * (double)((i % 7) + 1);
    return s;
}

Test(weights, synthetic_deterministic)
{
    ModelDesc m;
    desc_tiny(&m, WFMT_SYNTHETIC, NULL);
    m.qkv_bias = true;
    m.tie_embeddings = false;
    Weights a, b;
    char err[1024];
    cr_assert(load_capture(&a, &m, err, sizeof err), "%s", err);
    cr_assert(load_capture(&b, &m, err, sizeof err), "%s", err);
    const char *names[] = {"embed", "L0.wq", "L1.bk", "L1.wo", "L0.ffn_norm", "L1.w_down", "final_norm", "lm_head"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        int64_t na, nb;
        const float *pa = weights_tensor(&a, names[i], &na), *pb = weights_tensor(&b, names[i], &nb);
        cr_assert(pa && pb && pa != pb && na == nb, "%s", names[i]);
        cr_assert_eq(memcmp(pa, pb, (size_t)na * 4), 0, "%s differs between two generations", names[i]);
        cr_assert_eq(tensor_sum(pa, na), tensor_sum(pb, nb));
    }
    /* the formula in synthetic.c's header, recomputed here */
    float u = synthetic_uniform(7, "L0.wq", 5);
    cr_assert_eq(a.layers[0].wq[5], u * (float)(1.0 / sqrt(16.0)));
    float t = 0.1f * synthetic_uniform(7, "L0.ffn_norm", 3);
    cr_assert_eq(a.layers[0].ffn_norm[3], 1.0f + t);
    cr_assert_eq(a.layers[1].w_down[10], synthetic_uniform(7, "L1.w_down", 10) * (float)(1.0 / sqrt(24.0 * 4)));
    /* pinned values (computed by an independent Python version of the
     * formula): the generator must never change silently */
    cr_assert_eq(synthetic_uniform(0, "embed", 0), -0x1.5ae88p-4f, "%a", synthetic_uniform(0, "embed", 0));
    cr_assert_eq(synthetic_uniform(42, "L3.wq", 1000), -0x1.679db0p-1f, "%a", synthetic_uniform(42, "L3.wq", 1000));
    /* a different seed gives different weights */
    m.weights_seed = 8;
    Weights c;
    cr_assert(load_capture(&c, &m, err, sizeof err), "%s", err);
    cr_assert_neq(memcmp(a.layers[0].wq, c.layers[0].wq, 16 * 16 * 4), 0);
    /* range and scale */
    for (int i = 0; i < 32 * 16; i++)
        cr_assert(a.tok_embed[i] >= -1.0f && a.tok_embed[i] < 1.0f);
    weights_free(&a);
    weights_free(&b);
    weights_free(&c);
}

/* ---- fixtures: every tensor against the generator's expected f32 ---- */

static void desc_gguf(ModelDesc *m, const char *path)
{
    desc_tiny(m, WFMT_GGUF, path);
    m->dim = 32;
    m->hidden_dim = 64;
    m->head_dim = 8;
    m->tie_embeddings = false;
}

static void desc_st(ModelDesc *m, const char *path)
{
    desc_tiny(m, WFMT_SAFETENSORS, path);
    m->qkv_bias = true;
    m->tie_embeddings = false;
    m->rope_pairing = ROPE_HALF;
}

static void desc_sharded(ModelDesc *m, const char *path)
{
    desc_tiny(m, WFMT_SAFETENSORS, path);
    m->rope_pairing = ROPE_HALF;
}

/* Compares every slot of w, in slot order, with the expected stream. */
static void expect_all(const Weights *w, const char *expected_path)
{
    size_t n;
    unsigned char *want = read_bytes(expected_path, &n);
    Arena a = {0};
    int ns;
    const WSlot *s = weights_slots(w, &a, &ns);
    size_t off = 0;
    for (int i = 0; i < ns; i++) {
        size_t bytes = (size_t)wslot_nelem(&s[i]) * 4;
        cr_assert_leq(off + bytes, n);
        for (int64_t j = 0; j < wslot_nelem(&s[i]); j++) {
            float x = float_at(want, off + (size_t)j * 4);
            cr_assert_eq(s[i].dst[j], x, "%s[%ld]: %a, expected %a", wslot_canon_name(&a, &s[i]), (long)j,
                         (double)s[i].dst[j], (double)x);
        }
        off += bytes;
    }
    cr_assert_eq(off, n, "expected stream has %zu bytes, the model %zu", n, off);
    arena_free(&a);
    free(want);
}

static void skip_without_fixtures(void)
{
    if (access(FIXTURES "/tiny.gguf", R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_fixtures.py");
}

Test(weights, safetensors_single)
{
    skip_without_fixtures();
    ModelDesc m;
    desc_st(&m, FIXTURES "/tiny.safetensors");
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    cr_assert_eq(w.pairing, ROPE_HALF);
    cr_assert_neq(w.lm_head, w.tok_embed);
    cr_assert_not_null(w.layers[1].bv);
    expect_all(&w, FIXTURES "/tiny.safetensors.expected.bin");
    weights_free(&w);
}

/* A sharded checkpoint, by its folder and by its index; its bf16 matrices
 * keep their bytes as well as their f32 views. */
Test(weights, safetensors_sharded)
{
    skip_without_fixtures();
    const char *paths[] = {FIXTURES "/sharded", FIXTURES "/sharded/model.safetensors.index.json"};
    for (int i = 0; i < 2; i++) {
        ModelDesc m;
        desc_sharded(&m, paths[i]);
        Weights w;
        char err[1024];
        cr_assert(load_capture(&w, &m, err, sizeof err), "%s: %s", paths[i], err);
        cr_assert_eq(w.lm_head, w.tok_embed);
        cr_assert_null(w.layers[0].bq);
        expect_all(&w, FIXTURES "/sharded.expected.bin");
        /* its bf16 matrices keep their bytes (quant none stores them so),
         * the f32 ones none */
        static const char *const bf16[] = {"L0.wv", "L0.w_up", "L1.wv", "L1.w_up"};
        for (int j = 0; j < 4; j++) {
            const QTensor *q = weights_qtensor(&w, bf16[j]);
            int64_t n;
            const float *f = weights_tensor(&w, bf16[j], &n);
            cr_assert(q && q->dtype == DT_BF16 && q->nbytes == 2 * (size_t)n, "%s", bf16[j]);
            for (int64_t e = 0; e < n; e++) {
                uint32_t u = (uint32_t)(q->data[2 * e] | q->data[2 * e + 1] << 8) << 16;
                float v;
                memcpy(&v, &u, 4);
                cr_assert_eq(v, f[e], "%s[%lld]", bf16[j], (long long)e);
            }
        }
        cr_assert_null(weights_qtensor(&w, "L0.wq"));
        weights_free(&w);
    }
}

/* A NaN in a sharded checkpoint is reported against the shard that holds
 * it (the last bytes of each shard: its last tensor's last element, a NaN
 * as f32, f16 or bf16), not the folder. */
Test(weights, safetensors_non_finite_names_the_shard)
{
    skip_without_fixtures();
    static const char *const files[] = {"config.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "model.safetensors.index.json"};
    for (int bad = 1; bad <= 2; bad++) {
        char *dir = tmp_path(bad == 1 ? "sh1" : "sh2"), *shard = NULL;
        cr_assert_eq(mkdir(dir, 0700), 0);
        for (int i = 0; i < 4; i++) {
            char *src = xasprintf("%s/sharded/%s", FIXTURES, files[i]), *dst = xasprintf("%s/%s", dir, files[i]);
            size_t n;
            unsigned char *b = read_bytes(src, &n);
            if (i == bad) {
                memset(b + n - 4, 0xff, 4);
                shard = xasprintf("%s: error: tensor '", dst);
            }
            write_bytes(dst, b, n);
            free(b), free(src), free(dst);
        }
        ModelDesc m;
        desc_sharded(&m, dir);
        expect_error(&m, "has a non-finite value");
        Weights w;
        char err[2048];
        cr_assert_not(load_capture(&w, &m, err, sizeof err));
        cr_assert_not_null(strstr(err, shard), "expected the shard (%s) in: %s", shard, err);
        free(shard), free(dir);
    }
}

Test(weights, gguf_all_types)
{
    skip_without_fixtures();
    ModelDesc m;
    desc_gguf(&m, FIXTURES "/tiny.gguf");
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    cr_assert_eq(w.pairing, ROPE_ADJACENT);
    expect_all(&w, FIXTURES "/tiny.gguf.expected.bin");
    weights_free(&w);
}

Test(weights, gguf_neox_arch_pairing)
{
    skip_without_fixtures();
    size_t n;
    unsigned char *raw = read_bytes(FIXTURES "/tiny.gguf", &n);
    unsigned char *a = memmem(raw, n, "llama", 5); /* general.architecture's value comes first */
    cr_assert_not_null(a);
    memcpy(a, "qwen2", 5);
    char *path = tmp_path("qwen2.gguf");
    write_bytes(path, raw, n);
    ModelDesc m;
    desc_gguf(&m, path);
    m.rope_pairing = ROPE_HALF;
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    cr_assert_eq(w.pairing, ROPE_HALF);
    weights_free(&w);
    free(path);
    free(raw);
}

Test(weights, gguf_metadata)
{
    skip_without_fixtures();
    Diag d;
    diag_init(&d);
    GgufFile *g = gguf_open(FIXTURES "/tiny.gguf", &d);
    cr_assert_not_null(g);
    cr_assert_eq(g->version, 3);
    cr_assert_eq(g->alignment, 32);
    GgufStr s;
    cr_assert(gguf_get_str(g, "general.architecture", &s));
    cr_assert(s.len == 5 && memcmp(s.s, "llama", 5) == 0);
    int64_t i;
    cr_assert(gguf_get_int(g, "llama.block_count", &i) && i == 2);
    cr_assert(gguf_get_int(g, "test.u8", &i) && i == 200);
    cr_assert(gguf_get_int(g, "test.i8", &i) && i == -5);
    cr_assert(gguf_get_int(g, "test.i64", &i) && i == -1234567890123);
    cr_assert(gguf_get_int(g, "test.u64", &i) && i == (int64_t)1 << 40);
    cr_assert(gguf_get_int(g, "tokenizer.ggml.bos_token_id", &i) && i == 1);
    double f;
    cr_assert(gguf_get_float(g, "test.f64", &f) && f == 0.1);
    cr_assert(gguf_get_float(g, "llama.rope.freq_base", &f) && f == 10000.0);
    cr_assert(gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &f) && f == (double)1e-5f);
    cr_assert_not(gguf_get_float(g, "test.i8", &f));
    cr_assert_not(gguf_get_int(g, "test.f64", &i));
    cr_assert_not(gguf_get_str(g, "test.u8", &s));
    cr_assert_not(gguf_get_int(g, "no.such.key", &i));
    const GgufKV *b = gguf_find(g, "test.bool");
    cr_assert(b && b->type == GGUF_T_BOOL && b->v.b);
    const GgufKV *tok = gguf_find(g, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->type == GGUF_T_ARRAY && tok->arr_type == GGUF_T_STRING && tok->arr_n == 32);
    cr_assert(tok->strs[1].len == 3 && memcmp(tok->strs[1].s, "<s>", 3) == 0);
    cr_assert(tok->strs[31].len == 5 && memcmp(tok->strs[31].s, "tok28", 5) == 0);
    const GgufKV *sc = gguf_find(g, "tokenizer.ggml.scores");
    cr_assert(sc && sc->arr_type == GGUF_T_F32 && sc->arr_n == 32);
    float x;
    memcpy(&x, (const char *)sc->data + 5 * 4, 4);
    cr_assert_eq(x, -5.0f);
    const GgufTensor *t = gguf_find_tensor(g, "blk.1.ffn_down.weight");
    cr_assert(t && t->ndim == 2 && t->dims[0] == 64 && t->dims[1] == 32 && t->ggml_type == 2);
    cr_assert_eq(t->nbytes, 32 * 64 / 32 * 18);
    cr_assert_null(gguf_find_tensor(g, "blk.2.ffn_down.weight"));
    cr_assert_eq(d.nerrors, 0);
    gguf_close(g);
}

/* ---- malformed safetensors, built from the fixture ---- */

typedef struct {
    char *header;           /* NUL-terminated JSON */
    unsigned char *data;
    size_t ndata;
} StParts;

static StParts st_split(const char *path)
{
    size_t n;
    unsigned char *raw = read_bytes(path, &n);
    uint64_t h;
    memcpy(&h, raw, 8);
    StParts p = {xstrndup((char *)raw + 8, h), xmalloc(n - 8 - h + 1), n - 8 - h};
    memcpy(p.data, raw + 8 + h, p.ndata);
    free(raw);
    return p;
}

static char *st_write(const char *name, const char *header, const unsigned char *data, size_t ndata)
{
    char *path = tmp_path(name);
    uint64_t h = strlen(header);
    unsigned char *buf = xmalloc(8 + h + ndata);
    memcpy(buf, &h, 8);
    memcpy(buf + 8, header, h);
    memcpy(buf + 8 + h, data, ndata);
    write_bytes(path, buf, 8 + h + ndata);
    free(buf);
    return path;
}

/* header with the first `from` after `anchor` replaced by `to` */
static char *str_patch(const char *s, const char *anchor, const char *from, const char *to)
{
    const char *a = strstr(s, anchor);
    cr_assert_not_null(a, "no '%s'", anchor);
    const char *f = strstr(a, from);
    cr_assert_not_null(f, "no '%s' after '%s'", from, anchor);
    return xasprintf("%.*s%s%s", (int)(f - s), s, to, f + strlen(from));
}

/* the "[b,e]" data_offsets text of tensor `name` */
static char *st_offsets(const char *header, const char *name)
{
    char *key = xasprintf("\"%s\":{", name);
    const char *o = strstr(strstr(header, key), "\"data_offsets\":[");
    const char *e = strchr(o, ']');
    free(key);
    o += strlen("\"data_offsets\":");
    return xstrndup(o, (size_t)(e - o + 1));
}

static void st_expect(const char *file, const char *header, const StParts *p, const char *want)
{
    char *path = st_write(file, header, p->data, p->ndata);
    ModelDesc m;
    desc_st(&m, path);
    expect_error(&m, want);
    free(path);
}

Test(weights, safetensors_bad_inputs)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    const char *norm = "\"model.norm.weight\":{";
    char *h, *o, *o2;

    h = str_patch(p.header, "\"dtype\":\"F16\"", "F16", "Q9");
    st_expect("dtype.st", h, &p, "unknown dtype 'Q9'");
    free(h);

    h = str_patch(p.header, norm, "\"F32\"", "\"I32\"");
    st_expect("i32.st", h, &p, "tensor 'model.norm.weight': dtype I32 is not supported");
    free(h);

    o = st_offsets(p.header, "model.norm.weight");
    h = str_patch(p.header, norm, o, "[16000,16064]");
    st_expect("range.st", h, &p, "tensor 'model.norm.weight': data_offsets [16000, 16064] run past the end");
    free(h);
    h = str_patch(p.header, norm, o, "[0,60]");
    st_expect("size.st", h, &p, "tensor 'model.norm.weight': data_offsets span 60 bytes, "
                                 "but F32 of that shape needs 64");
    free(h);

    o2 = st_offsets(p.header, "model.layers.0.input_layernorm.weight");
    h = str_patch(p.header, norm, o, o2);
    st_expect("overlap.st", h, &p, "overlap tensor");
    free(h);
    free(o);
    free(o2);

    h = str_patch(p.header, norm, "\"shape\":[16]", "\"shape\":[4,4]");
    st_expect("shape.st", h, &p, "tensor 'model.norm.weight': shape [4, 4] does not match the model (expected [16])");
    free(h);
    h = str_patch(p.header, "\"model.layers.1.self_attn.q_proj.weight\":{", "\"shape\":[16,16]", "\"shape\":[8,32]");
    st_expect("shape2.st", h, &p,
              "tensor 'model.layers.1.self_attn.q_proj.weight': shape [8, 32] does not match the model "
              "(expected [16, 16])");
    free(h);

    h = str_patch(p.header, "", "\"model.norm.weight\"", "\"model.norm.weigXt\"");
    st_expect("missing.st", h, &p, "tensor 'model.norm.weight' is missing");
    free(h);

    st_expect("json.st", "{\"a\": [1, 2", &p, "expected ',' or ']' in this array");

    /* truncated data, header length past the end, file shorter than 8 */
    char *path = st_write("trunc.st", p.header, p.data, p.ndata - 100);
    ModelDesc m;
    desc_st(&m, path);
    expect_error(&m, "run past the end of the data section");
    free(path);
    path = tmp_path("hlen.st");
    uint64_t big = 1 << 20;
    write_bytes(path, &big, 8);
    desc_st(&m, path);
    expect_error(&m, "header length 1048576 runs past the end of the file (8 bytes)");
    write_bytes(path, &big, 5);
    expect_error(&m, "file is truncated: 5 bytes");
    free(path);

    /* the description disagrees with the file */
    desc_st(&m, FIXTURES "/tiny.safetensors");
    m.qkv_bias = false;
    expect_error(&m, "says qkv_bias: false");
    desc_st(&m, FIXTURES "/tiny.safetensors");
    m.tie_embeddings = true;
    expect_error(&m, "tensor 'lm_head.weight': the file has a separate classifier");
    desc_st(&m, FIXTURES "/tiny.safetensors");
    m.rope_pairing = ROPE_ADJACENT;
    expect_error(&m, "RoPE pairing 'half'");
    desc_st(&m, FIXTURES "/tiny.safetensors");
    m.n_layers = 3;
    expect_error(&m, "tensor 'model.layers.2.input_layernorm.weight' is missing");
    desc_st(&m, FIXTURES);
    expect_error(&m, "no model.safetensors or model.safetensors.index.json");
    free(p.header);
    free(p.data);
}

Test(weights, safetensors_bad_index)
{
    skip_without_fixtures();
    size_t n;
    char *idx = (char *)read_bytes(FIXTURES "/sharded/model.safetensors.index.json", &n);
    char *dir = tmp_path("shards");
    cr_assert_eq(mkdir(dir, 0755), 0);
    /* shard 1 copied, shard 2 absent: its tensors' file cannot be opened */
    size_t ns;
    unsigned char *s1 = read_bytes(FIXTURES "/sharded/model-00001-of-00002.safetensors", &ns);
    char *p1 = xasprintf("%s/model-00001-of-00002.safetensors", dir);
    write_bytes(p1, s1, ns);
    char *pi = xasprintf("%s/model.safetensors.index.json", dir);
    write_bytes(pi, idx, n);
    ModelDesc m;
    desc_sharded(&m, dir);
    expect_error(&m, "model-00002-of-00002.safetensors: error: cannot open weights file");
    /* the index points a tensor at a shard that does not hold it */
    unsigned char *s2 = read_bytes(FIXTURES "/sharded/model-00002-of-00002.safetensors", &ns);
    char *p2 = xasprintf("%s/model-00002-of-00002.safetensors", dir);
    write_bytes(p2, s2, ns);
    free(s2);
    free(p2);
    char *moved = str_patch(idx, "\"model.norm.weight\"", "model-00002", "model-00001");
    write_bytes(pi, moved, strlen(moved));
    expect_error(&m, "tensor 'model.norm.weight' is missing (the index says it is in this file)");
    write_bytes(pi, "{\"metadata\": {}}", 16);
    expect_error(&m, "expected a \"weight_map\" object");
    /* a shard name that is not a string, or leaves the folder */
    static const char *const maps[][2] = {
        {"{\"weight_map\": {\"model.norm.weight\": 5}}", "1:38: error: expected a shard file name (a string)"},
        {"{\"weight_map\": {\"model.norm.weight\": \"a/../../x\"}}",
         "1:38: error: shard path 'a/../../x' leaves the model folder"},
        {"{\"weight_map\": {\"model.norm.weight\": \"/etc/passwd\"}}",
         "1:38: error: shard path '/etc/passwd' leaves the model folder"},
        {"{\"weight_map\": {\"model.norm.weight\": \"..\"}}", "1:38: error: shard path '..' leaves the model folder"},
    };
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
        write_bytes(pi, maps[i][0], strlen(maps[i][0]));
        expect_error(&m, maps[i][1]);
    }
    free(moved);
    free(pi);
    free(p1);
    free(s1);
    free(dir);
    free(idx);
}

/* ---- malformed GGUF, patched from the fixture ---- */

/* Offset of the bytes right after tensor `name`'s name in its info. */
static size_t gguf_info_at(const unsigned char *raw, size_t n, const char *name)
{
    size_t k = strlen(name);
    for (size_t i = 8; i + k <= n; i++)
        if (memcmp(raw + i, name, k) == 0 && raw[i - 8] == k && raw[i + k] < 8)
            return i + k;
    cr_assert_fail("tensor info '%s' not found", name);
    return 0;
}

/* Offset of the bytes right after metadata key `key` (its value's type). */
static size_t gguf_key_at(const unsigned char *raw, size_t n, const char *key)
{
    size_t k = strlen(key);
    for (size_t i = 8; i + k + 4 <= n; i++)
        if (memcmp(raw + i, key, k) == 0 && raw[i - 8] == k && raw[i + k] <= 12)
            return i + k;
    cr_assert_fail("metadata key '%s' not found", key);
    return 0;
}

static void gguf_expect(const char *file, const unsigned char *raw, size_t n, const char *want)
{
    char *path = tmp_path(file);
    write_bytes(path, raw, n);
    ModelDesc m;
    desc_gguf(&m, path);
    expect_error(&m, want);
    free(path);
}

Test(weights, gguf_bad_inputs)
{
    skip_without_fixtures();
    size_t n;
    unsigned char *raw = read_bytes(FIXTURES "/tiny.gguf", &n);
    unsigned char *b = xmalloc(n);
    uint32_t u32;
    uint64_t u64;

    memcpy(b, raw, n);
    b[0] = 'X';
    gguf_expect("magic.gguf", b, n, "not a GGUF file: it starts with the bytes 58 47 55 46, not 'GGUF'");
    memcpy(b, raw, n);
    b[4] = 4;
    gguf_expect("version.gguf", b, n, "GGUF version 4 is not supported");
    gguf_expect("cut.gguf", raw, 300, "file is truncated");
    gguf_expect("short.gguf", raw, 3000, "runs past the end of the file");
    memcpy(b, raw, n);
    u64 = 1ull << 40; /* the first key's length (after magic, version and the two counts) */
    memcpy(b + 24, &u64, 8);
    gguf_expect("keylen.gguf", b, n, "(at byte 32) runs past the end of the file: it needs 1099511627776 bytes");
    gguf_expect("empty.gguf", raw, 0, "not a GGUF file: 0 bytes long");
    /* array counts past the end: key, u32 type 9, u32 element type, u64 count */
    static const struct {
        const char *key;
        uint64_t count;
        const char *want;
    } arrays[] = {
        {"tokenizer.ggml.tokens", 1ull << 40,
         "an array of 1099511627776 strings, runs past the end of the file: it needs at least 8796093022208 bytes"},
        {"tokenizer.ggml.scores", 1ull << 62,
         "an array of 4611686018427387904 float32, runs past the end of the file: it needs more than 2^64 bytes"},
    };
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        memcpy(b, raw, n);
        memcpy(b + gguf_key_at(raw, n, arrays[i].key) + 8, &arrays[i].count, 8);
        gguf_expect("count.gguf", b, n, arrays[i].want);
    }

    size_t q = gguf_info_at(raw, n, "blk.0.attn_q.weight"); /* u32 ndim, u64 dims[2], u32 type, u64 off */
    memcpy(b, raw, n);
    u64 = 64; /* [32, 32] -> [16, 64]: as many bytes */
    memcpy(b + q + 4, &u64, 8);
    u64 = 16;
    memcpy(b + q + 4 + 8, &u64, 8);
    gguf_expect("shape.gguf", b, n,
                "tensor 'blk.0.attn_q.weight': shape [16, 64] does not match the model (expected [32, 32])");
    gguf_expect("shape.gguf", b, n, /* and where the expected shape came from */
                "tiny.yaml: note: the model's dims are read from here: dim 32, hidden_dim 64, n_heads 4, n_kv_heads 2, "
                "head_dim 8, vocab_size 32");
    memcpy(b, raw, n);
    memcpy(b + q + 4 + 8, &u64, 8); /* [16, 32]: fewer bytes than lie before the next tensor */
    gguf_expect("shrunk.gguf", b, n,
                "tensor 'blk.0.attn_q.weight': 288 bytes of type Q4_0 end 288 bytes before the next tensor "
                "'blk.0.attn_k.weight' starts (is its type right?)");
    memcpy(b, raw, n);
    u32 = 2; /* Q4_1 bytes read as Q4_0 */
    memcpy(b + gguf_info_at(raw, n, "blk.1.ffn_up.weight") + 20, &u32, 4);
    gguf_expect("q40.gguf", b, n, "tensor 'blk.1.ffn_up.weight': 1152 bytes of type Q4_0 end 128 bytes before");
    memcpy(b, raw, n);
    u32 = 1; /* F32 bytes read as F16 */
    memcpy(b + gguf_info_at(raw, n, "output_norm.weight") + 12, &u32, 4);
    gguf_expect("f16.gguf", b, n, "tensor 'output_norm.weight': 64 bytes of type F16 end 64 bytes before");
    {   /* IQ3_S: the block size of Q3_K (lowbit.gguf's attn_k) */
        size_t ln;
        unsigned char *lb = read_bytes(FIXTURES "/lowbit.gguf", &ln);
        u32 = 21;
        memcpy(lb + gguf_info_at(lb, ln, "blk.0.attn_k.weight") + 20, &u32, 4);
        char *path = tmp_path("type.gguf");
        write_bytes(path, lb, ln);
        ModelDesc m;
        Arena a = {0};
        Diag d;
        diag_init(&d);
        cr_assert(desc_load(&m, &a, path, NULL, 0, &d), "%s", path);
        expect_error(&m, "tensor 'blk.0.attn_k.weight': type IQ3_S (21) is not supported");
        arena_free(&a);
        free(path);
        free(lb);
    }
    memcpy(b, raw, n);
    u32 = 99;
    memcpy(b + q + 20, &u32, 4);
    gguf_expect("type99.gguf", b, n, "type unknown (99) is not supported");
    memcpy(b, raw, n);
    u64 = 1 << 30;
    memcpy(b + q + 24, &u64, 8);
    gguf_expect("offset.gguf", b, n,
                "tensor 'blk.0.attn_q.weight': data at offset 1073741824 (576 bytes) runs past the end");
    memcpy(b, raw, n);
    memcpy(&u64, b + q + 24, 8);
    u64 += 1;
    memcpy(b + q + 24, &u64, 8);
    gguf_expect("align.gguf", b, n, "is not aligned");

    size_t a = gguf_info_at(raw, n, "blk.0.attn_norm.weight"), o = gguf_info_at(raw, n, "output_norm.weight");
    memcpy(b, raw, n);
    memcpy(b + o + 4 + 8 + 4, raw + a + 4 + 8 + 4, 8); /* output_norm at attn_norm's offset */
    gguf_expect("overlap.gguf", b, n, "data overlaps tensor");

    memcpy(b, raw, n);
    memcpy(b + gguf_info_at(raw, n, "blk.1.ffn_up.weight") - 6, "uq", 2);
    gguf_expect("missing.gguf", b, n, "tensor 'blk.1.ffn_up.weight' is missing");

    ModelDesc m;
    desc_gguf(&m, FIXTURES "/tiny.gguf");
    m.rope_theta = 500000;
    expect_error(&m, "key 'llama.rope.freq_base' is 10000, but the model description says rope theta 500000");
    desc_gguf(&m, FIXTURES "/tiny.gguf");
    m.n_kv_heads = 4;
    expect_error(&m, "key 'llama.attention.head_count_kv' is 2, but the model description says 4");
    desc_gguf(&m, FIXTURES "/tiny.gguf");
    m.rope_pairing = ROPE_HALF;
    expect_error(&m, "RoPE pairing 'adjacent'");
    free(b);
    free(raw);
}

/* Metadata that disagrees with the description or has the wrong type; an
 * architecture that is not Llama-family. */
Test(weights, gguf_bad_metadata)
{
    skip_without_fixtures();
    size_t n;
    unsigned char *raw = read_bytes(FIXTURES "/tiny.gguf", &n);
    unsigned char *b = xmalloc(n);
    uint32_t u32;
    float f;

    memcpy(b, raw, n);
    u32 = 6; /* block_count typed float32 */
    memcpy(b + test_gguf_kv_at(raw, n, "llama.block_count"), &u32, 4);
    gguf_expect("bc.gguf", b, n, "error: key 'llama.block_count' must be an integer\n");
    memcpy(b, raw, n);
    f = NAN;
    memcpy(b + test_gguf_kv_at(raw, n, "llama.attention.layer_norm_rms_epsilon") + 4, &f, 4);
    gguf_expect("eps.gguf", b, n,
                "error: key 'llama.attention.layer_norm_rms_epsilon' is nan; it must be a positive finite number\n");
    memcpy(b, raw, n);
    f = 500000;
    memcpy(b + test_gguf_kv_at(raw, n, "llama.rope.freq_base") + 4, &f, 4);
    gguf_expect("theta.gguf", b, n,
                "error: key 'llama.rope.freq_base' is 500000, but the model description says rope theta 10000\n");
    memcpy(b, raw, n);
    memcpy(memmem(b, n, "llama", 5), "gemma", 5);
    gguf_expect("gemma.gguf", b, n, "error: architecture 'gemma' is not supported (llama, qwen2, phi3)\n");

    memcpy(b, raw, n);
    u32 = 4; /* shorter than max_seq 8: a warning, as for llama2.c */
    memcpy(b + test_gguf_kv_at(raw, n, "llama.context_length") + 4, &u32, 4);
    char *path = tmp_path("ctx.gguf");
    write_bytes(path, b, n);
    ModelDesc m;
    desc_gguf(&m, path);
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    cr_assert(strstr(err, "ctx.gguf: warning: the model's max_seq 8 exceeds the file's llama.context_length 4\n"),
              "%s", err);
    weights_free(&w);
    free(path);

    /* block_count lowered to 1 and described so: blk.1.* would be dropped */
    memcpy(b, raw, n);
    u32 = 1;
    memcpy(b + test_gguf_kv_at(raw, n, "llama.block_count") + 4, &u32, 4);
    path = tmp_path("bc1.gguf");
    write_bytes(path, b, n);
    desc_gguf(&m, path);
    m.n_layers = 1;
    cr_assert_not(load_capture(&w, &m, err, sizeof err), "a file with a layer more than described loaded");
    cr_assert(strstr(err, "bc1.gguf: error: tensor 'blk.1.attn_norm.weight': the file has more layers than the "
                          "model description's n_layers (1)"),
              "%s", err);
    free(path);
    free(b);
    free(raw);
}

/* A compile's load (WEIGHTS_STORED_ONLY) of a GGUF with quant none
 * stores its layers' matrices as the file does without an f32 view
 * (tiny.gguf: 10 in blocks, 4 in f16 or bf16); a non-finite f16 scale in
 * a block is then reported with the same error at the same element as by
 * the load that dequantizes every element (a load for lowering,
 * WEIGHTS_DTYPES_ONLY, reads no value and sees none). */
Test(weights, gguf_non_finite_blocks_without_f32)
{
    skip_without_fixtures();
    static const struct {
        const char *file, *tensor;
        int block, block_bytes, field;
        uint16_t h;
        int64_t elem;
    } cases[] = {
        {"tiny.gguf", "blk.0.attn_q.weight", 5, 18, 0, 0x7e00, 160},        /* Q4_0 d NaN */
        {"tiny.gguf", "blk.1.ffn_up.weight", 3, 20, 2, 0x7c00, 96},         /* Q4_1 m +inf */
        {"tiny.gguf", "blk.0.attn_output.weight", 0, 34, 0, 0xfc00, 0},     /* Q8_0 d -inf */
        {"kquant.gguf", "blk.0.attn_k.weight", 2, 176, 2, 0x7c00, 512},     /* Q5_K dmin */
        {"kquant.gguf", "blk.1.attn_output.weight", 1, 210, 208, 0x7e00, 256}, /* Q6_K d */
        {"kquant.gguf", "blk.0.ffn_up.weight", 9, 24, 2, 0x7e01, 288},      /* Q5_1 m */
        {"tiny.gguf", "token_embd.weight", 3, 34, 0, 0x7c00, 96},           /* the embedding's Q8_0 d */
        {"lowbit.gguf", "blk.0.attn_q.weight", 3, 84, 82, 0x7c00, 768},     /* Q2_K dmin */
        {"lowbit.gguf", "blk.0.attn_k.weight", 1, 110, 108, 0xfc00, 256},   /* Q3_K d */
        {"lowbit.gguf", "blk.0.attn_v.weight", 7, 18, 0, 0x7e00, 224},      /* IQ4_NL d */
        {"lowbit.gguf", "blk.0.attn_output.weight", 2, 136, 0, 0x7c00, 512}, /* IQ4_XS d */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *src = xasprintf("%s/%s", FIXTURES, cases[i].file), *path = tmp_path(cases[i].file);
        size_t n;
        GgufFile *g;
        unsigned char *raw = gguf_read_open(src, &n, &g);
        Diag d;
        diag_init(&d);
        const GgufTensor *t = gguf_find_tensor(g, cases[i].tensor);
        cr_assert_not_null(t, "%s", cases[i].tensor);
        size_t at = (size_t)((const unsigned char *)t->data - g->map) + (size_t)cases[i].block * cases[i].block_bytes;
        memcpy(raw + at + cases[i].field, &cases[i].h, 2);
        gguf_close(g);
        write_bytes(path, raw, n);
        ModelDesc m;
        Arena a = {0};
        cr_assert(desc_load(&m, &a, path, NULL, 0, &d), "%s", path);
        char full[2048], stored[2048], want[512];
        Weights w;
        cr_assert_not(load_capture_ex(&w, &m, 0, full, sizeof full));
        cr_assert_not(load_capture_ex(&w, &m, WEIGHTS_STORED_ONLY, stored, sizeof stored));
        snprintf(want, sizeof want, "%s: error: tensor '%s' has a non-finite value (NaN or infinity) at element %lld\n",
                 path, cases[i].tensor, (long long)cases[i].elem);
        cr_assert_str_eq(full, want);
        cr_assert_str_eq(stored, want);
        cr_assert(load_capture_ex(&w, &m, WEIGHTS_DTYPES_ONLY, full, sizeof full), "%s", full); /* reads no value */
        weights_free(&w);
        if (i == 0) { /* the unpatched file: a compile keeps its 10 block and 4 f16/bf16 layer matrices, and its
                       * Q8_0 embedding and classifier, without f32 */
            desc_gguf(&m, src);
            cr_assert(weights_load_ex(&w, &m, WEIGHTS_STORED_ONLY, NULL, &d));
            cr_assert_eq(w.stored_kept, 16);
            weights_free(&w);
            cr_assert(weights_load(&w, &m, &d));
            cr_assert_eq(w.stored_kept, 0);
            weights_free(&w);
        }
        arena_free(&a);
        free(raw), free(src), free(path);
    }
}

/* A tied model's file with a classifier of its own (tiny.gguf's Q8_0
 * output.weight) is refused when it differs from the embedding and taken
 * when it equals it, also when a compile's load keeps the embedding from
 * its bytes without an f32 view (then compared dequantized). */
Test(weights, tied_check_of_a_stored_embedding)
{
    skip_without_fixtures();
    const char *src = FIXTURES "/tiny.gguf";
    ModelDesc m;
    desc_gguf(&m, src);
    m.tie_embeddings = true;
    Weights w;
    char full[2048], stored[2048];
    cr_assert_not(load_capture_ex(&w, &m, 0, full, sizeof full));
    cr_assert_not(load_capture_ex(&w, &m, WEIGHTS_STORED_ONLY, stored, sizeof stored));
    cr_assert(strstr(full, "tensor 'output.weight': the file has a separate classifier"), "%s", full);
    cr_assert_str_eq(stored, full);

    size_t n;
    GgufFile *g;
    unsigned char *raw = gguf_read_open(src, &n, &g);
    const GgufTensor *e = gguf_find_tensor(g, "token_embd.weight"), *o = gguf_find_tensor(g, "output.weight");
    cr_assert(e && o && e->ggml_type == o->ggml_type);
    size_t bytes = (size_t)m.vocab_size * dtype_row_bytes(DT_Q8_0, m.dim);
    memcpy(raw + ((const unsigned char *)o->data - g->map), raw + ((const unsigned char *)e->data - g->map), bytes);
    gguf_close(g);
    char *path = tmp_path("tied-copy.gguf");
    write_bytes(path, raw, n);
    desc_gguf(&m, path);
    m.tie_embeddings = true;
    cr_assert(load_capture_ex(&w, &m, WEIGHTS_STORED_ONLY, stored, sizeof stored), "%s", stored);
    cr_assert(w.embed_unwritten);
    weights_free(&w);
    free(raw), free(path);
}

/* A tied model whose knobs split the classifier off (qwen2.gguf's f16
 * embedding, kept from its bytes by a compile's load): the classifier is
 * made from the embedding's values as the load of every f32 view makes
 * it, byte for byte. */
Test(weights, head_split_of_a_stored_embedding)
{
    skip_without_fixtures();
    static const char *const heads[] = {"w8a16", "w4a16-g32", "bf16"};
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) {
        ModelDesc m;
        Arena a = {0};
        Diag d;
        diag_init(&d);
        cr_assert(desc_load(&m, &a, FIXTURES "/qwen2.gguf", NULL, 0, &d));
        cr_assert(m.tie_embeddings);
        cr_assert(quant_spec_parse("none", &m.quant[TCLASS_EMBED]));
        cr_assert(quant_spec_parse(heads[i], &m.quant[TCLASS_LM_HEAD]));
        Weights full, stored;
        char err[2048];
        cr_assert(load_capture_ex(&full, &m, 0, err, sizeof err), "%s", err);
        cr_assert(load_capture_ex(&stored, &m, WEIGHTS_STORED_ONLY, err, sizeof err), "%s", err);
        cr_assert(stored.embed_unwritten && weights_head_separate(&stored));
        const QTensor *hf = weights_qtensor(&full, "lm_head"), *hs = weights_qtensor(&stored, "lm_head");
        cr_assert(hf && hs && hf->dtype == hs->dtype && hf->nbytes == hs->nbytes, "%s", heads[i]);
        cr_assert(memcmp(hf->data, hs->data, hf->nbytes) == 0, "%s: the classifiers differ", heads[i]);
        weights_free(&full);
        weights_free(&stored);
        arena_free(&a);
    }
}

/* A load for lowering (WEIGHTS_DTYPES_ONLY) leaves every tensor in the
 * dtype a compile's load (WEIGHTS_STORED_ONLY) does, and splits lm_head
 * off alike, under knobs that keep a file's blocks, re-block them (Q4_1 as
 * W4A8, Q8_0 as W8A8), regroup Q4_0, quantize and convert, for GGUF and
 * safetensors files, tied and not; it holds no tensor's bytes. */
Test(weights, dtypes_only_as_a_compile_stores)
{
    skip_without_fixtures();
    static const char *const knobs[][TCLASS_COUNT] = {/* embed, attn, mlp, lm_head */
                                                      {"none", "none", "none", "none"},
                                                      {"w4a8-g32", "w4a8-g32", "w4a8-g32", "w4a8-g32"},
                                                      {"f16", "w8a8", "w4a16-g32", "w8a16"},
                                                      {"none", "f32", "w4a16-g128", "bf16"},
                                                      {"w8a16", "bf16", "w8a8", "w8a16"}};
    static const char *const names[] = {"embed", "lm_head", "final_norm", "attn_norm", "ffn_norm", "wq", "wk",
                                        "wv", "wo", "w_gate", "w_up", "w_down"};
    for (int file = 0; file < 4; file++) {
        ModelDesc m;
        if (file == 0)
            desc_gguf(&m, FIXTURES "/tiny.gguf");
        else if (file == 1)
            desc_st(&m, FIXTURES "/tiny.safetensors");
        else
            desc_sharded(&m, FIXTURES "/sharded");
        if (file == 3) /* the sharded checkpoint as if untied: its own (missing) classifier is an error */
            m.tie_embeddings = false;
        for (size_t k = 0; k < sizeof knobs / sizeof *knobs; k++) {
            for (int c = 0; c < TCLASS_COUNT; c++)
                cr_assert(quant_spec_parse(knobs[k][c], &m.quant[c]));
            Weights ws, wd;
            char es[2048], ed[2048];
            bool oks = load_capture_ex(&ws, &m, WEIGHTS_STORED_ONLY, es, sizeof es);
            bool okd = load_capture_ex(&wd, &m, WEIGHTS_DTYPES_ONLY, ed, sizeof ed);
            cr_assert_eq(oks, okd, "file %d, knobs %zu: stored %d (%s), dtypes %d (%s)", file, k, oks, es, okd, ed);
            cr_assert_str_eq(es, ed, "file %d, knobs %zu", file, k);
            if (!oks)
                continue;
            cr_assert_eq(weights_head_separate(&ws), weights_head_separate(&wd), "file %d, knobs %zu", file, k);
            for (int l = -1; l < m.n_layers; l++)
                for (size_t i = l < 0 ? 0 : 3; i < (l < 0 ? 3 : sizeof names / sizeof *names); i++) {
                    char n[32];
                    if (l < 0)
                        snprintf(n, sizeof n, "%s", names[i]);
                    else
                        snprintf(n, sizeof n, "L%d.%s", l, names[i]);
                    cr_assert_eq(weights_dtype(&wd, n), weights_dtype(&ws, n), "file %d, knobs %zu: %s is %s, not %s",
                                 file, k, n, dtype_name(weights_dtype(&wd, n)), dtype_name(weights_dtype(&ws, n)));
                }
            cr_assert_eq(wd.nqt, ws.nqt, "file %d, knobs %zu", file, k);
            for (int i = 0; i < wd.nqt; i++)
                cr_assert_null(wd.qt[i].data, "%s holds bytes", wd.qt[i].name);
            weights_free(&ws);
            weights_free(&wd);
        }
    }
}

/* A Llama-405B shape (4.1e11 parameters) is refused by a load that holds
 * its values, and lowered from a load of dtypes, which maps but never
 * writes an f32 view. */
Test(weights, dtypes_only_of_a_model_too_large_for_f32)
{
    ModelDesc m;
    desc_tiny(&m, WFMT_SYNTHETIC, NULL);
    m.dim = 16384, m.hidden_dim = 53248, m.n_layers = 126, m.n_heads = 128, m.n_kv_heads = 8, m.head_dim = 128;
    m.vocab_size = 128256, m.tie_embeddings = false;
    cr_assert(quant_spec_parse("w4a16-g128", &m.quant[TCLASS_MLP]));
    Weights w;
    char err[1024];
    cr_assert_not(load_capture_ex(&w, &m, WEIGHTS_STORED_ONLY, err, sizeof err));
    cr_assert(strstr(err, "tiny.yaml: error: model too large to hold in f32: 4.06e+11 parameters"), "%s", err);
    cr_assert(load_capture_ex(&w, &m, WEIGHTS_DTYPES_ONLY, err, sizeof err), "%s", err);
    cr_assert_eq(weights_dtype(&w, "L125.w_down"), DT_W4G128);
    cr_assert_eq(weights_dtype(&w, "L125.wq"), DT_F32);
    weights_free(&w);
}

/* A compile's load of a checkpoint's bf16 matrices: stored from the file's
 * bytes without an f32 view (the sharded fixture: 4 of them), and a NaN
 * in one (element 37 of layer 0's v_proj, in the first shard) reported as
 * the load that converts every element reports it (and not read by a
 * load for lowering). */
Test(weights, safetensors_bf16_stored_without_f32)
{
    skip_without_fixtures();
    ModelDesc m;
    desc_sharded(&m, FIXTURES "/sharded");
    Weights w;
    char full[2048], stored[2048];
    cr_assert(load_capture_ex(&w, &m, WEIGHTS_STORED_ONLY, stored, sizeof stored), "%s", stored);
    cr_assert_eq(w.stored_kept, 4);
    cr_assert_eq(weights_dtype(&w, "L1.w_up"), DT_BF16);
    weights_free(&w);

    static const char *const files[] = {"config.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "model.safetensors.index.json"};
    char *dir = tmp_path("bf16nan");
    cr_assert_eq(mkdir(dir, 0700), 0);
    char *shard = NULL;
    for (int i = 0; i < 4; i++) {
        char *src = xasprintf("%s/sharded/%s", FIXTURES, files[i]), *dst = xasprintf("%s/%s", dir, files[i]);
        size_t n;
        unsigned char *b = read_bytes(src, &n);
        if (i == 1) { /* the header's data_offsets of the tensor, past the 8-byte length and the header */
            uint64_t hl;
            memcpy(&hl, b, 8);
            char *hdr = xstrndup((const char *)b + 8, (size_t)hl);
            const char *e = strstr(hdr, "\"model.layers.0.self_attn.v_proj.weight\"");
            cr_assert_not_null(e);
            unsigned long long begin;
            cr_assert_eq(sscanf(strstr(e, "\"data_offsets\"") + 14, " : [ %llu", &begin), 1);
            const uint16_t nan = 0x7fc0;
            memcpy(b + 8 + hl + begin + 2 * 37, &nan, 2);
            free(hdr);
            shard = xstrdup(dst);
        }
        write_bytes(dst, b, n);
        free(b), free(src), free(dst);
    }
    desc_sharded(&m, dir);
    cr_assert_not(load_capture_ex(&w, &m, 0, full, sizeof full));
    cr_assert_not(load_capture_ex(&w, &m, WEIGHTS_STORED_ONLY, stored, sizeof stored));
    char want[1024];
    snprintf(want, sizeof want,
             "%s: error: tensor 'model.layers.0.self_attn.v_proj.weight' has a non-finite value (NaN or infinity) "
             "at element 37\n", shard);
    cr_assert_str_eq(full, want);
    cr_assert_str_eq(stored, want);
    cr_assert(load_capture_ex(&w, &m, WEIGHTS_DTYPES_ONLY, full, sizeof full), "%s", full); /* reads no value */
    weights_free(&w);
    free(shard), free(dir);
}

/* The reference decode on a compile's load (WEIGHTS_STORED_ONLY: matrices
 * kept only as stored, read a row at a time) gives the logits it gives on
 * the full load (every matrix an f32 view), bit for bit, and the bits per
 * weight eval-quant reports are the same: GGUF blocks,
 * K-quants, f16 and bf16 kept as stored, an embedding kept from its bytes,
 * a tied classifier split off it, and matrices quantized anew. */
Test(weights, reference_on_stored_rows_as_on_f32)
{
    skip_without_fixtures();
    static const char *const files[] = {FIXTURES "/tiny.gguf", FIXTURES "/qwen2.gguf", FIXTURES "/llama3.gguf",
                                        FIXTURES "/kquant.gguf", FIXTURES "/hf-llama3", FIXTURES "/sharded"};
    static const char *const knobs[][TCLASS_COUNT] = {/* embed, attn, mlp, lm_head */
                                                      {"none", "none", "none", "none"},
                                                      {"none", "w4a16-g32", "w8a16", "w8a16"},
                                                      {"w8a16", "bf16", "w4a16-g128", "none"}};
    int stored_total = 0;
    for (size_t f = 0; f < sizeof files / sizeof *files; f++)
        for (size_t k = 0; k < sizeof knobs / sizeof *knobs; k++) {
            ModelDesc m;
            Arena a = {0};
            Diag d;
            diag_init(&d);
            cr_assert(desc_load(&m, &a, files[f], NULL, 0, &d), "%s", files[f]);
            for (int c = 0; c < TCLASS_COUNT; c++)
                cr_assert(quant_spec_parse(knobs[k][c], &m.quant[c]));
            Weights full, stored;
            char err[2048];
            cr_assert(load_capture_ex(&full, &m, 0, err, sizeof err), "%s: %s", files[f], err);
            cr_assert(load_capture_ex(&stored, &m, WEIGHTS_STORED_ONLY, err, sizeof err), "%s: %s", files[f], err);
            int no_view = (stored.tok_embed == NULL) + (weights_head_separate(&stored) && stored.lm_head == NULL);
            for (int l = 0; l < m.n_layers; l++) {
                const LayerWeights *lw = &stored.layers[l];
                const float *mats[] = {lw->wq, lw->wk, lw->wv, lw->wo, lw->w_gate, lw->w_up, lw->w_down};
                for (size_t i = 0; i < sizeof mats / sizeof *mats; i++)
                    no_view += mats[i] == NULL;
            }
            stored_total += no_view;
            cr_assert_eq(quant_bits_per_weight(&full), quant_bits_per_weight(&stored), "%s, knobs %zu", files[f], k);
            RefState *rf = ref_new(&full), *rs = ref_new(&stored);
            int n = m.max_seq < 6 ? m.max_seq : 6;
            for (int pos = 0; pos < n; pos++) {
                int tok = (7 * pos + 3) % m.vocab_size;
                const float *lf = ref_step(rf, tok, pos), *ls = ref_step(rs, tok, pos);
                cr_assert(memcmp(lf, ls, sizeof(float) * (size_t)m.vocab_size) == 0,
                          "%s, knobs %zu, position %d: the logits differ (%d matrices without a view)", files[f], k,
                          pos, no_view);
            }
            ref_free(rf);
            ref_free(rs);
            weights_free(&full);
            weights_free(&stored);
            arena_free(&a);
        }
    /* every file keeps some matrices only as stored under some knobs */
    cr_assert_gt(stored_total, 6 * 8, "only %d matrices were read from their stored rows", stored_total);
}

/* ---- the data section tiled exactly, and the header's names and numbers ---- */

/* The tensors' [begin, end) ranges must tile the data section: first at 0,
 * each next where the previous ended, the last at its end. Checked from
 * the offsets and the file size alone, so a load for lowering refuses the
 * same files. Small files of zeros, one error each. */
Test(weights, safetensors_data_section_tiled)
{
    static const struct {
        const char *header;
        size_t ndata;
        const char *want;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
         "error: tensor 'b': data_offsets [12, 20] leave a hole of 4 bytes after tensor 'a' [0, 8]\n"},
        {"{\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[4,12]}}", 12,
         "error: tensor 'b': data_offsets [4, 12]: the first tensor begins at byte 4, not 0\n"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 10,
         "error: the data section has 2 bytes after the last tensor's end (tensor 'a' [0, 8], of 10 bytes)\n"},
        {"{\"__metadata__\":{\"format\":\"pt\"}}", 4, "error: the data section has 4 bytes, but the header lists "
                                                       "no tensor\n"},
        /* an empty tensor inside another, as the reference reader counts it */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
         "error: tensor 'e': data_offsets [4, 4] overlap tensor 'a' [0, 8]\n"},
        /* overlaps are reported before holes: 'b' comes after a hole, 'c' inside 'b' */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
         "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 16,
         "error: tensor 'b': data_offsets [8, 16] overlap tensor 'c' [8, 12]\n"},
        /* two with one range: named in name order */
        {"{\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "error: tensor 'y': data_offsets [0, 8] overlap tensor 'x' [0, 8]\n"},
    };
    unsigned char zeros[32] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        StParts p = {NULL, zeros, cases[i].ndata};
        char *path = st_write("tile.st", cases[i].header, p.data, p.ndata);
        ModelDesc m;
        desc_st(&m, path);
        char *want = xasprintf("%s: %s", path, cases[i].want);
        for (int dtypes_only = 0; dtypes_only < 2; dtypes_only++) {
            Weights w;
            char err[1024];
            cr_assert_not(load_capture_ex(&w, &m, dtypes_only ? WEIGHTS_DTYPES_ONLY : 0, err, sizeof err),
                          "case %zu loaded", i);
            cr_assert_str_eq(err, want, "case %zu", i);
        }
        free(want);
        free(path);
    }
}

/* The fuzzer's finds on the fixture: 100 junk bytes appended, and the
 * header length 4 short (its last 4 bytes spaces), which reads every
 * tensor 4 bytes early. */
Test(weights, safetensors_trailing_bytes_and_short_header_length)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    unsigned char *more = xmalloc(p.ndata + 100);
    memcpy(more, p.data, p.ndata);
    memset(more + p.ndata, 0x5a, 100);
    StParts q = {p.header, more, p.ndata + 100};
    st_expect("trailing.st", p.header, &q,
              "error: the data section has 100 bytes after the last tensor's end (tensor "
              "'model.layers.0.post_attention_layernorm.weight' [13320, 13384], of 13484 bytes)");

    char *padded = xasprintf("%s    ", p.header);
    char *path = st_write("shift4.st", padded, p.data, p.ndata);
    size_t n;
    unsigned char *raw = read_bytes(path, &n);
    uint64_t h = strlen(padded) - 4;
    memcpy(raw, &h, 8);
    write_bytes(path, raw, n);
    ModelDesc m;
    desc_st(&m, path);
    expect_error(&m, "error: the data section has 4 bytes after the last tensor's end");
    /* the same header with its length right loads */
    h += 4;
    memcpy(raw, &h, 8);
    write_bytes(path, raw, n);
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    weights_free(&w);
    free(raw), free(path), free(padded), free(more), free(p.header), free(p.data);
}

/* The HF folder the fuzzer found: hf-llama3 with its header length 4
 * short, refused by describe's, lower's and run's loads alike. */
Test(weights, safetensors_hf_folder_short_header_length)
{
    skip_without_fixtures();
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    char *dir = tmp_path("hf");
    cr_assert_eq(mkdir(dir, 0700), 0);
    for (int i = 0; i < 3; i++) {
        char *src = xasprintf("%s/hf-llama3/%s", FIXTURES, files[i]), *dst = xasprintf("%s/%s", dir, files[i]);
        size_t n;
        unsigned char *b = read_bytes(src, &n);
        if (i == 1) {
            uint64_t h;
            memcpy(&h, b, 8);
            cr_assert(memcmp(b + 8 + h - 4, "    ", 4) == 0, "the fixture's header ends without padding");
            h -= 4;
            memcpy(b, &h, 8);
        }
        write_bytes(dst, b, n);
        free(b), free(src), free(dst);
    }
    ModelDesc m;
    Arena a = {0};
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&m, &a, dir, NULL, 0, &d), "%s", dir);
    char *want = xasprintf("%s/model.safetensors: error: the data section has 4 bytes after the last tensor's end",
                           dir);
    for (int dtypes_only = 0; dtypes_only < 2; dtypes_only++) {
        Weights w;
        char err[1024];
        cr_assert_not(load_capture_ex(&w, &m, dtypes_only ? WEIGHTS_DTYPES_ONLY : 0, err, sizeof err));
        cr_assert(strncmp(err, want, strlen(want)) == 0, "expected '%s' in:\n%s", want, err);
    }
    free(want), free(dir);
    arena_free(&a);
}

/* Empty tensors are legal where the previous tensor ends: at 0, between
 * two tensors, and at the data section's end. */
Test(weights, safetensors_empty_tensors_at_boundaries)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    char *o = st_offsets(p.header, "model.norm.weight");
    unsigned long long begin, end;
    cr_assert_eq(sscanf(o, "[%llu,%llu]", &begin, &end), 2);
    char *h = xasprintf("{\"empty.first\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                        "\"empty.mid\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[%llu,%llu]},"
                        "\"empty.last\":{\"dtype\":\"U8\",\"shape\":[0,0],\"data_offsets\":[%zu,%zu]},%s",
                        begin, begin, p.ndata, p.ndata, p.header + 1);
    char *path = st_write("empty.st", h, p.data, p.ndata);
    ModelDesc m;
    desc_st(&m, path);
    Weights w;
    char err[1024];
    cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
    expect_all(&w, FIXTURES "/tiny.safetensors.expected.bin");
    weights_free(&w);
    free(path), free(h), free(o), free(p.header), free(p.data);
}

/* The good fixtures tile their data sections: tiny, the sharded folder
 * (each shard), hf-llama3, by a full load and a load for lowering. */
Test(weights, safetensors_fixtures_tile_their_data)
{
    skip_without_fixtures();
    for (int f = 0; f < 3; f++) {
        ModelDesc m;
        Arena a = {0};
        Diag d;
        diag_init(&d);
        if (f == 0)
            desc_st(&m, FIXTURES "/tiny.safetensors");
        else if (f == 1)
            desc_sharded(&m, FIXTURES "/sharded");
        else
            cr_assert(desc_load(&m, &a, FIXTURES "/hf-llama3", NULL, 0, &d));
        for (int dtypes_only = 0; dtypes_only < 2; dtypes_only++) {
            Weights w;
            char err[1024];
            cr_assert(load_capture_ex(&w, &m, dtypes_only ? WEIGHTS_DTYPES_ONLY : 0, err, sizeof err), "%d: %s", f,
                      err);
            weights_free(&w);
        }
        arena_free(&a);
    }
}


/* A sharded checkpoint whose index (in a new folder `sub`) is `idx`: its
 * load fails with `want`. */
static void index_expect(const char *sub, const char *idx, const char *want)
{
    char *dir = tmp_path(sub);
    cr_assert_eq(mkdir(dir, 0700), 0);
    char *pi = xasprintf("%s/model.safetensors.index.json", dir);
    write_bytes(pi, idx, strlen(idx));
    ModelDesc m;
    desc_sharded(&m, dir);
    expect_error(&m, want);
    free(pi), free(dir);
}

/* A tensor name holding a NUL ("\u0000") would compare equal to its
 * prefix and shadow the real tensor (here placed first, with its own
 * 64 bytes, so that without the check the shadow is what loads); an
 * "__metadata__\u0000" key would be skipped as metadata. Both refused at
 * the key, in a header and in an index's weight_map. */
Test(weights, safetensors_nul_in_tensor_name)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    unsigned char *more = xcalloc(p.ndata + 64, 1);
    memcpy(more, p.data, p.ndata);
    StParts q = {p.header, more, p.ndata + 64};
    char *h = xasprintf("{\"model.norm.weight\\u0000x\":{\"dtype\":\"F32\",\"shape\":[16],"
                        "\"data_offsets\":[%zu,%zu]},%s", p.ndata, p.ndata + 64, p.header + 1);
    st_expect("nul.st", h, &q, ":1:2: error: tensor name 'model.norm.weight\\u0000...' contains a NUL character "
                               "(byte 17 of the name)");
    free(h);
    h = xasprintf("{\"__metadata__\\u0000\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[%zu,%zu]},%s",
                  p.ndata, p.ndata + 64, p.header + 1);
    st_expect("nulmeta.st", h, &q, ":1:2: error: tensor name '__metadata__\\u0000...' contains a NUL character "
                                   "(byte 12 of the name)");
    free(h);

    index_expect("nulidx", "{\"weight_map\": {\"model.norm.weight\": \"a.safetensors\",\n"
                           "  \"model.norm.weight\\u0000\": \"b.safetensors\"}}",
                 "model.safetensors.index.json:2:3: error: tensor name 'model.norm.weight\\u0000...' contains a NUL "
                 "character (byte 17 of the name)");
    free(more), free(p.header), free(p.data);
}

/* Two entries with one name are refused (doc.c's duplicate keys), in the
 * header as in the index. */
Test(weights, safetensors_duplicate_tensor_names)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    const char *norm = strstr(p.header, "\"model.norm.weight\":{");
    cr_assert_not_null(norm);
    const char *close = strchr(norm, '}');
    char *h = xasprintf("{%.*s},%s", (int)(close - norm), norm, p.header + 1);
    st_expect("dup.st", h, &p, "error: duplicate key 'model.norm.weight'");
    free(h);
    index_expect("dupidx", "{\"weight_map\": {\"model.norm.weight\": \"a.safetensors\",\n"
                           "  \"model.norm.weight\": \"b.safetensors\"}}",
                 "model.safetensors.index.json:2:3: error: duplicate key 'model.norm.weight'");
    free(p.header), free(p.data);
}

/* JSON numbers have no leading zeros: "[00,N]" or a shape "[016]" is
 * refused though it would read as the right value; "0" itself is fine
 * (the fixture's first tensor begins at it). */
Test(weights, safetensors_leading_zero_numbers)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    char *h = str_patch(p.header, "", "\"data_offsets\":[0,", "\"data_offsets\":[00,");
    st_expect("zero0.st", h, &p, "error: tensor 'model.layers.0.mlp.down_proj.weight': data_offsets must be two "
                                 "integers, begin <= end");
    free(h);
    char *o = st_offsets(p.header, "model.norm.weight");
    char *o2 = xasprintf("[0%s", o + 1);
    h = str_patch(p.header, "\"model.norm.weight\":{", o, o2);
    st_expect("zero1.st", h, &p, "error: tensor 'model.norm.weight': data_offsets must be two integers, begin <= end");
    free(h);
    h = str_patch(p.header, "\"model.norm.weight\":{", "\"shape\":[16]", "\"shape\":[016]");
    st_expect("zero2.st", h, &p, "error: tensor 'model.norm.weight': shape entry 0 is not a valid dimension");
    free(h);
    free(o), free(o2), free(p.header), free(p.data);
}

/* A FIFO named as the weights is refused as not a regular file, at once:
 * opening it waited for a writer that never came (found by fuzzing). */
Test(weights, a_fifo_is_refused_not_waited_on, .timeout = 30)
{
    char *fifo = tmp_path("weights.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0, "%s", strerror(errno));
    for (int i = 0; i < 3; i++) {
        ModelDesc m;
        if (i == 0)
            desc_tiny(&m, WFMT_LLAMA2C, fifo);
        else if (i == 1)
            desc_gguf(&m, fifo);
        else
            desc_st(&m, fifo);
        expect_error(&m, "not a regular file");
    }
    unlink(fifo);
    free(fifo);
}

/* ---- AWQ and GPTQ checkpoints (make_hf_quant.py) ---- */

static void skip_without_hf_quant(void)
{
    if (access(FIXTURES "/awq/model.safetensors", R_OK) != 0 || access(FIXTURES "/gptq.expected.bin", R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_hf_quant.py");
}

/* Their matrices arrive as W4G<group> rows whose dequantization is the
 * checkpoint's s * (q - z) (numpy's, in the .expected.bin) bit for bit,
 * kept as stored by a full load, a compile's load and a lowering's (which
 * reads no data), the embedding and norms as F16. */
Test(weights, awq_and_gptq_checkpoints_load_exactly)
{
    skip_without_hf_quant();
    const struct {
        const char *dir, *expected;
        DType t;
    } ck[] = {{FIXTURES "/awq", FIXTURES "/awq.expected.bin", DT_W4G32},
              {FIXTURES "/gptq", FIXTURES "/gptq.expected.bin", DT_W4G64}};
    static const char *const mats[] = {"L0.wq", "L0.wk", "L0.wv", "L0.wo", "L1.w_gate", "L1.w_up", "L1.w_down"};
    for (int c = 0; c < 2; c++) {
        ModelDesc m;
        Arena a = {0};
        Diag d;
        diag_init(&d);
        cr_assert(desc_load(&m, &a, ck[c].dir, NULL, 0, &d), "%s", ck[c].dir);
        Weights full;
        char err[1024];
        cr_assert(load_capture(&full, &m, err, sizeof err), "%s: %s", ck[c].dir, err);
        expect_all(&full, ck[c].expected);
        cr_assert_eq(weights_dtype(&full, "embed"), DT_F16);
        for (int flags = WEIGHTS_STORED_ONLY; flags <= WEIGHTS_DTYPES_ONLY; flags++) {
            Weights w;
            cr_assert(load_capture_ex(&w, &m, (unsigned)flags, err, sizeof err), "%s %d: %s", ck[c].dir, flags, err);
            for (size_t i = 0; i < sizeof mats / sizeof *mats; i++) {
                const QTensor *q = weights_qtensor(&full, mats[i]), *s = weights_qtensor(&w, mats[i]);
                cr_assert(q && s && q->dtype == ck[c].t && s->dtype == ck[c].t, "%s %s: not %s", ck[c].dir, mats[i],
                          dtype_name(ck[c].t));
                if (flags == WEIGHTS_STORED_ONLY)
                    cr_assert(memcmp(q->data, s->data, q->nbytes) == 0, "%s %s: other bytes", ck[c].dir, mats[i]);
            }
            weights_free(&w);
        }
        weights_free(&full);
        arena_free(&a);
    }
}

/* A copy of fixture folder `src` (config.json, model.safetensors) in the
 * test's temp folder as `name`, its config.json's first `from` after
 * `anchor` replaced by `to` (anchor NULL: the config left as it is);
 * returns the folder. */
static char *hfq_copy(const char *src, const char *name, const char *anchor, const char *from, const char *to)
{
    char *dir = tmp_path(name), *cfg = xasprintf("%s/config.json", src), *st = xasprintf("%s/model.safetensors", src);
    cr_assert(mkdir(dir, 0755) == 0 || errno == EEXIST);
    size_t n;
    unsigned char *c = read_bytes(cfg, &n), *b = read_bytes(st, &n);
    char *c2 = anchor ? str_patch((char *)c, anchor, from, to) : xstrdup((char *)c);
    char *dcfg = xasprintf("%s/config.json", dir), *dst = xasprintf("%s/model.safetensors", dir);
    write_bytes(dcfg, c2, strlen(c2));
    write_bytes(dst, b, n);
    free(c), free(b), free(c2), free(cfg), free(st), free(dcfg), free(dst);
    return dir;
}

/* Loading folder `dir` fails with `want` (a prefix of the messages; "%s"
 * in it stands for dir). */
static void hfq_expect(const char *dir, const char *want)
{
    ModelDesc m;
    Arena a = {0};
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&m, &a, dir, NULL, 0, &d), "%s", dir);
    Weights w;
    char err[2048];
    cr_assert_not(load_capture(&w, &m, err, sizeof err), "%s loaded", dir);
    char *exp = xasprintf(want, dir);
    cr_assert(strstr(err, exp), "expected\n%s\nin:\n%s", exp, err);
    free(exp);
    arena_free(&a);
}

Test(weights, awq_and_gptq_refusals)
{
    skip_without_hf_quant();
    static const struct {
        const char *src, *name, *anchor, *from, *to, *want; /* the config's first `from` after `anchor` made `to` */
    } cases[] = {
        {"awq", "bnb", "\"quant_method\"", "\"awq\"", "\"bitsandbytes\"",
         "%s/config.json:21:21: error: quantization_config: quant_method 'bitsandbytes' is not supported (megac "
         "reads AWQ and GPTQ 4-bit checkpoints)"},
        {"awq", "bits8", "\"bits\"", "4", "8",
         "%s/config.json:22:13: error: quantization_config.bits: 8-bit weights are not supported (only 4)"},
        {"awq", "g256", "\"group_size\"", "32", "256",
         "%s/config.json:23:19: error: quantization_config.group_size: 256 is not supported (32, 64 or 128)"},
        /* not an integer at all: said so (it read "an integer from -1 to 1048576") */
        {"awq", "glist", "\"group_size\"", "32", "[32]",
         "%s/config.json:23:19: error: quantization_config.group_size: expected an integer, found a list"},
        {"awq", "gemv", "\"version\"", "\"gemm\"", "\"gemv\"",
         "%s/config.json:24:16: error: quantization_config.version: AWQ's 'gemv' packing is not supported (only "
         "gemm)"},
        {"gptq", "marlin", "\"checkpoint_format\"", "\"gptq\"", "\"marlin\"",
         "%s/config.json:26:26: error: quantization_config.checkpoint_format: 'marlin' is not supported (gptq or "
         "gptq_v2)"},
        /* no quantization_config: the quantized tensors are not guessed at */
        {"awq", "noqc", "\"quantization_config\"", "\"quantization_config\"", "\"x_quantization\"",
         "%s/model.safetensors: error: tensor 'model.layers.0.self_attn.q_proj.qweight': the matrix is stored "
         "quantized, but there is no quantization_config in a config.json beside the weights to say how"},
        /* the AWQ tensors read as GPTQ's: their shapes do not fit */
        {"awq", "asgptq", "\"quant_method\"", "\"awq\"", "\"gptq\"",
         "%s/model.safetensors: error: tensor 'model.layers.0.self_attn.q_proj.qweight': shape [64, 8], expected "
         "[8, 64]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *src = xasprintf("%s/%s", FIXTURES, cases[i].src);
        char *d = hfq_copy(src, cases[i].name, cases[i].anchor, cases[i].from, cases[i].to);
        hfq_expect(d, cases[i].want);
        free(d), free(src);
    }
}

/* checkpoint_format gptq_v2 stores the zeros themselves: the same file
 * read so has every group's zero one less, nothing else changed. */
Test(weights, gptq_v2_zeros_as_stored)
{
    skip_without_hf_quant();
    char *d = hfq_copy(FIXTURES "/gptq", "v2", "\"checkpoint_format\"", "\"gptq\"", "\"gptq_v2\"");
    const char *dirs[2] = {FIXTURES "/gptq", d};
    Weights w[2];
    Arena a = {0};
    for (int i = 0; i < 2; i++) {
        ModelDesc m;
        Diag dg;
        diag_init(&dg);
        cr_assert(desc_load(&m, &a, dirs[i], NULL, 0, &dg));
        char err[1024];
        cr_assert(load_capture(&w[i], &m, err, sizeof err), "%s: %s", dirs[i], err);
    }
    const QTensor *q1 = weights_qtensor(&w[0], "L1.w_down"), *q2 = weights_qtensor(&w[1], "L1.w_down");
    cr_assert(q1 && q2 && q1->dtype == DT_W4G64 && q2->dtype == DT_W4G64 && q1->nbytes == q2->nbytes);
    size_t gb = dtype_row_bytes(DT_W4G64, 64);
    for (size_t i = 0; i < q1->nbytes; i++)
        cr_assert_eq(q2->data[i] + (i % gb == 2), q1->data[i], "byte %zu (record byte %zu)", i, i % gb);
    weights_free(&w[0]);
    weights_free(&w[1]);
    arena_free(&a);
    free(d);
}

/* Writes n bytes at byte `at` of tensor `name` in DIR/model.safetensors
 * (the header and every other byte as they were); returns the file's path. */
static char *hfq_patch(const char *dir, const char *name, size_t at, const void *bytes, size_t n)
{
    char *st = xasprintf("%s/model.safetensors", dir);
    size_t len;
    unsigned char *raw = read_bytes(st, &len);
    uint64_t h;
    memcpy(&h, raw, 8);
    char *header = xstrndup((char *)raw + 8, h), *o = st_offsets(header, name);
    unsigned long long begin, end;
    cr_assert_eq(sscanf(o, "[%llu,%llu]", &begin, &end), 2);
    cr_assert_leq(begin + at + n, end);
    memcpy(raw + 8 + h + begin + at, bytes, n);
    write_bytes(st, raw, len);
    free(raw), free(header), free(o);
    return st;
}

/* GPTQ's act order: a g_idx that is not row / group_size regroups rows,
 * which megac's groups cannot; the load is refused at the first such row. */
Test(weights, gptq_act_order_refused)
{
    skip_without_hf_quant();
    char *d = hfq_copy(FIXTURES "/gptq", "actorder", NULL, NULL, NULL);
    int32_t one = 1; /* row 0 in group 1 */
    free(hfq_patch(d, "model.layers.1.mlp.up_proj.g_idx", 0, &one, 4));
    hfq_expect(d, "%s/model.safetensors: error: tensor 'model.layers.1.mlp.up_proj.g_idx': g_idx[0] is 1, not 0 "
                  "(row / group_size): act-order checkpoints that regroup rows are not supported");
    free(d);
}

/* A scale that is an infinity: refused by a full load (its f32 view) and
 * by a compile's (its stored groups), naming the tensor. */
Test(weights, awq_infinite_scale_refused)
{
    skip_without_hf_quant();
    char *d = hfq_copy(FIXTURES "/awq", "infscale", NULL, NULL, NULL);
    uint16_t inf = 0x7c00; /* group 1 of row 3: scales[1][3] */
    char *st = hfq_patch(d, "model.layers.0.mlp.down_proj.scales", 2 * (1 * 64 + 3), &inf, 2);
    ModelDesc m;
    Arena a = {0};
    Diag dg;
    diag_init(&dg);
    cr_assert(desc_load(&m, &a, d, NULL, 0, &dg));
    for (int flags = 0; flags <= WEIGHTS_STORED_ONLY; flags++) {
        Weights w;
        char err[2048];
        cr_assert_not(load_capture_ex(&w, &m, (unsigned)flags, err, sizeof err));
        char *want = xasprintf("%s: error: tensor 'model.layers.0.mlp.down_proj.%s' has a non-finite value (NaN or "
                               "infinity) at element %d", st, flags ? "qweight" : "weight", 3 * 128 + 32);
        cr_assert(strstr(err, want), "expected\n%s\nin:\n%s", want, err);
        free(want);
    }
    arena_free(&a);
    free(st), free(d);
}

/* ---- tensor names no slot takes ---- */

/* tiny.gguf with one more tensor, `name` (an F32 vector of 4 zeros, after
 * the others), written as `file` in the test's temp folder; returns its
 * path. */
static char *gguf_with_tensor(const char *src, const char *file, const char *name)
{
    size_t n;
    GgufFile *g;
    unsigned char *raw = gguf_read_open(src, &n, &g);
    const GgufTensor *last = &g->tensors[g->ntensors - 1];
    size_t info_end = (size_t)((const unsigned char *)last->name.s - g->map) + last->name.len + 4 +
                      8 * last->ndim + 4 + 8;
    size_t data = (size_t)((const unsigned char *)g->tensors[0].data - g->map) - g->tensors[0].offset;
    uint64_t end = 0, al = g->alignment, k = strlen(name), ntensors = g->ntensors + 1, dim = 4, off;
    for (uint64_t i = 0; i < g->ntensors; i++)
        if (g->tensors[i].offset + g->tensors[i].nbytes > end)
            end = g->tensors[i].offset + g->tensors[i].nbytes;
    off = (end + al - 1) / al * al;
    uint32_t ndim = 1, type = 0; /* F32 */
    size_t info = 8 + k + 4 + 8 + 4 + 8, start = (info_end + info + al - 1) / al * al;
    unsigned char *b = xcalloc(start + off + 16, 1), *p = b + info_end;
    memcpy(b, raw, info_end);
    memcpy(b + 8, &ntensors, 8);
    memcpy(p, &k, 8), memcpy(p + 8, name, k), p += 8 + k;
    memcpy(p, &ndim, 4), memcpy(p + 4, &dim, 8), memcpy(p + 12, &type, 4), memcpy(p + 16, &off, 8);
    memcpy(b + start, raw + data, end);
    gguf_close(g);
    char *path = tmp_path(file);
    write_bytes(path, b, start + off + 16);
    free(b), free(raw);
    return path;
}

/* A GGUF tensor whose name is empty, or a layer's whose layer the model
 * lacks (at or past n_layers, negative, not a number), would be dropped
 * without a word: refused by a load and by a lowering's header-only read,
 * naming the file and the tensor. */
Test(weights, gguf_tensor_names_outside_the_model)
{
    skip_without_fixtures();
    static const struct {
        const char *name, *want;
    } cases[] = {
        {"blk.5.attn_q.weight", "error: tensor 'blk.5.attn_q.weight': the file has more layers than the model "
                                "description's n_layers (2)\n"},
        {"blk.2.ffn_foo", "error: tensor 'blk.2.ffn_foo': the file has more layers than the model description's "
                          "n_layers (2)\n"},
        {"blk.99999999999999999999.attn_q.weight", "error: tensor 'blk.99999999999999999999.attn_q.weight': the "
                                                   "file has more layers"},
        {"blk.-1.attn_q.weight", "error: tensor 'blk.-1.attn_q.weight': a layer's tensor needs its layer number "
                                 "(0 to 1) and '.' after 'blk.'\n"},
        {"blk.01.attn_q.weight", "error: tensor 'blk.01.attn_q.weight': a layer's tensor needs its layer number"},
        {"blk.x.attn_q.weight", "error: tensor 'blk.x.attn_q.weight': a layer's tensor needs its layer number"},
        {"blk.1", "error: tensor 'blk.1': a layer's tensor needs its layer number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *path = gguf_with_tensor(FIXTURES "/tiny.gguf", "names.gguf", cases[i].name);
        ModelDesc m;
        desc_gguf(&m, path);
        char *want = xasprintf("%s: %s", path, cases[i].want);
        expect_error_both(&m, want);
        free(want), free(path);
    }
    Diag d;
    diag_init(&d);
    GgufFile *g = gguf_open(FIXTURES "/tiny.gguf", &d);
    cr_assert_not_null(g);
    char *path = gguf_with_tensor(FIXTURES "/tiny.gguf", "empty.gguf", "");
    ModelDesc m;
    desc_gguf(&m, path);
    char *want = xasprintf("%s: error: tensor %d (counting from 0) has an empty name\n", path, (int)g->ntensors);
    expect_error_both(&m, want);
    gguf_close(g);
    free(want), free(path);
}

/* Names neither the model nor the loader knows are dropped with one
 * warning naming the first and their count; a layer's attn_rot_embd (an
 * HF checkpoint's inv_freq, converted) is dropped silently. */
Test(weights, gguf_unknown_tensors_warned_once)
{
    skip_without_fixtures();
    char *one = gguf_with_tensor(FIXTURES "/tiny.gguf", "one.gguf", "blk.1.ffn_foo.weight");
    char *two = gguf_with_tensor(one, "two.gguf", "foo.weight");
    char *rot = gguf_with_tensor(FIXTURES "/tiny.gguf", "rot.gguf", "blk.0.attn_rot_embd");
    const char *paths[] = {one, two, rot};
    for (int i = 0; i < 3; i++) {
        ModelDesc m;
        desc_gguf(&m, paths[i]);
        for (unsigned flags = 0; flags <= WEIGHTS_DTYPES_ONLY; flags += WEIGHTS_DTYPES_ONLY) {
            Weights w;
            char err[1024];
            cr_assert(load_capture_ex(&w, &m, flags, err, sizeof err), "%s", err);
            char *want = i == 0 ? xasprintf("%s: warning: ignoring 1 tensor the model does not use: "
                                            "'blk.1.ffn_foo.weight'\n", one)
                       : i == 1 ? xasprintf("%s: warning: ignoring 2 tensors the model does not use: "
                                            "'blk.1.ffn_foo.weight' and others\n", two)
                                : xstrdup("");
            cr_assert_str_eq(err, want);
            free(want);
            weights_free(&w);
        }
    }
    free(one), free(two), free(rot);
}

/* The same in a safetensors header (a config's num_hidden_layers lowered
 * below the file's) and an index's weight_map; an old HF Llama
 * checkpoint's rotary_emb.inv_freq (tiny.safetensors holds them) and the
 * parts of AWQ and GPTQ matrices are known and dropped silently. */
Test(weights, safetensors_tensor_names_outside_the_model)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    static const struct {
        const char *name, *want;
    } cases[] = {
        {"model.layers.7.input_layernorm.weight", "error: tensor 'model.layers.7.input_layernorm.weight': the file "
                                                  "has more layers than the model description's n_layers (2)\n"},
        {"model.layers.-1.input_layernorm.weight", "error: tensor 'model.layers.-1.input_layernorm.weight': a "
                                                   "layer's tensor needs its layer number (0 to 1) and '.' after "
                                                   "'model.layers.'\n"},
        {"", "error: tensor 0 (counting from 0) has an empty name\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *h = xasprintf("{\"%s\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},%s", cases[i].name,
                            p.header + 1);
        char *path = st_write("names.safetensors", h, p.data, p.ndata);
        ModelDesc m;
        desc_st(&m, path);
        char *want = xasprintf("%s: %s", path, cases[i].want);
        expect_error_both(&m, want);
        free(want), free(path), free(h);
    }

    char *h = xasprintf("{\"model.layers.1.mlp.foo.weight\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":"
                        "[0,0]},%s", p.header + 1);
    char *path = st_write("unknown.safetensors", h, p.data, p.ndata);
    const char *loads[] = {FIXTURES "/tiny.safetensors", path};
    for (int i = 0; i < 2; i++) {
        ModelDesc m;
        desc_st(&m, loads[i]);
        Weights w;
        char err[1024];
        cr_assert(load_capture(&w, &m, err, sizeof err), "%s", err);
        char *want = i ? xasprintf("%s: warning: ignoring 1 tensor the model does not use: "
                                   "'model.layers.1.mlp.foo.weight'\n", path)
                       : xstrdup("");
        cr_assert_str_eq(err, want);
        free(want);
        weights_free(&w);
    }
    free(path), free(h);

    index_expect("layersidx", "{\"weight_map\": {\"model.norm.weight\": \"a.safetensors\",\n"
                              "  \"model.layers.2.mlp.up_proj.weight\": \"a.safetensors\"}}",
                 "model.safetensors.index.json: error: tensor 'model.layers.2.mlp.up_proj.weight': the file has "
                 "more layers than the model description's n_layers (2)\n");
    free(p.header), free(p.data);

    if (access(FIXTURES "/awq/model.safetensors", R_OK) != 0)
        return;
    const char *quant[] = {FIXTURES "/awq", FIXTURES "/gptq"};
    for (int i = 0; i < 2; i++) {
        ModelDesc m;
        Arena a = {0};
        Diag d;
        diag_init(&d);
        cr_assert(desc_load(&m, &a, quant[i], NULL, 0, &d), "%s", quant[i]);
        Weights w;
        char err[1024];
        cr_assert(load_capture_ex(&w, &m, WEIGHTS_DTYPES_ONLY, err, sizeof err), "%s", err);
        cr_assert_str_eq(err, "", "%s", quant[i]);
        weights_free(&w);
        arena_free(&a);
    }
}

/* A quantization_config megac refuses is an error at its key also beside
 * a checkpoint of floats (hf-llama3's), which never reads a quantized
 * tensor: by a load and by a lowering's header-only read. */
Test(weights, quantization_config_checked_on_a_float_checkpoint)
{
    if (access(FIXTURES "/hf-llama3/model.safetensors", R_OK) != 0)
        cr_skip("tests/fixtures/weights/hf-llama3 absent");
    static const struct {
        const char *name, *qc, *want;
    } cases[] = {
        {"bnb", "{\"quant_method\": \"bnb\", \"bits\": 4}",
         "%s/config.json:15:43: error: quantization_config: quant_method 'bnb' is not supported (megac reads AWQ "
         "and GPTQ 4-bit checkpoints)\n"},
        {"awq7", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 7}",
         "%s/config.json:15:75: error: quantization_config.group_size: 7 is not supported (32, 64 or 128)\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *to = xasprintf("\"quantization_config\": %s,\n  \"hidden_act\"", cases[i].qc);
        char *dir = hfq_copy(FIXTURES "/hf-llama3", cases[i].name, "\"hidden_act\"", "\"hidden_act\"", to);
        ModelDesc m;
        Arena a = {0};
        Diag d;
        diag_init(&d);
        cr_assert(desc_load(&m, &a, dir, NULL, 0, &d), "%s", dir);
        char *want = xasprintf(cases[i].want, dir);
        for (unsigned flags = 0; flags <= WEIGHTS_DTYPES_ONLY; flags += WEIGHTS_DTYPES_ONLY) {
            Weights w;
            char err[2048];
            cr_assert_not(load_capture_ex(&w, &m, flags, err, sizeof err), "%s loaded", dir);
            cr_assert(strstr(err, want), "expected\n%s\nin:\n%s", want, err);
        }
        free(want), free(to), free(dir);
        arena_free(&a);
    }
}

/* A tied model whose file also holds a classifier of the wrong shape (or
 * of a dtype megac cannot load) is refused by a lowering's header-only
 * read as by a load, not only once `megac run` reads the values. */
Test(weights, tied_classifier_shape_checked_by_a_header_only_read)
{
    skip_without_fixtures();
    StParts p = st_split(FIXTURES "/tiny.safetensors");
    char *h = str_patch(p.header, "\"lm_head.weight\"", "[32,16]", "[16,32]");
    char *path = st_write("head.safetensors", h, p.data, p.ndata);
    ModelDesc m;
    desc_st(&m, path);
    m.tie_embeddings = true;
    char *want = xasprintf("%s: error: tensor 'lm_head.weight': shape [16, 32] does not match the model (expected "
                           "[32, 16])\n", path);
    expect_error_both(&m, want);
    free(want), free(path), free(h);

    h = str_patch(p.header, "\"lm_head.weight\"", "\"BF16\"", "\"I16\"");
    path = st_write("head-i16.safetensors", h, p.data, p.ndata);
    desc_st(&m, path);
    m.tie_embeddings = true;
    want = xasprintf("%s: error: tensor 'lm_head.weight': dtype I16 is not supported (only F32, F16 and BF16)\n",
                     path);
    expect_error_both(&m, want);
    free(want), free(path), free(h);
    free(p.header), free(p.data);
}

/* Phi-3 ships q, k and v as one matrix (qkv_proj; GGUF attn_qkv) and gate
 * and up as another (gate_up_proj; GGUF ffn_up of twice the rows, no
 * ffn_gate): the loaders read each part out of its rows. make_phi3.py
 * fused hf-llama3's matrices (gate and up as f16), so the parts are
 * hf-llama3's, bit for bit (gate and up as their f16 roundings), from
 * the HF folder and the GGUF alike, and a load for lowering sees their
 * stored dtypes and shapes. */
Test(weights, phi3_fused_matrices_are_split)
{
    if (access(FIXTURES "/phi3.gguf", R_OK) != 0 || access(FIXTURES "/hf-phi3/model.safetensors", R_OK) != 0)
        cr_skip("phi3 fixtures absent; run tests/fixtures/weights/make_phi3.py");
    const char *paths[3] = {FIXTURES "/hf-llama3", FIXTURES "/hf-phi3", FIXTURES "/phi3.gguf"};
    ModelDesc m[3];
    Weights w[3];
    Arena a = {0};
    char err[2048];
    for (int i = 0; i < 3; i++) {
        Diag d;
        diag_init(&d);
        cr_assert(desc_load(&m[i], &a, paths[i], NULL, 0, &d), "%s", paths[i]);
        cr_assert(load_capture(&w[i], &m[i], err, sizeof err), "%s: %s", paths[i], err);
    }
    const ModelDesc *mm = &m[0];
    size_t nq = (size_t)mm->n_heads * mm->head_dim * mm->dim, nkv = (size_t)mm->n_kv_heads * mm->head_dim * mm->dim;
    size_t nff = (size_t)mm->hidden_dim * mm->dim;
    for (int l = 0; l < mm->n_layers; l++) {
        const LayerWeights *L = &w[0].layers[l];
        for (int i = 1; i < 3; i++) {
            const LayerWeights *P = &w[i].layers[l];
            cr_assert(!memcmp(P->wq, L->wq, nq * 4) && !memcmp(P->wk, L->wk, nkv * 4) &&
                      !memcmp(P->wv, L->wv, nkv * 4), "%s layer %d: q, k, v", paths[i], l);
            for (size_t e = 0; e < nff; e++) {
                cr_assert_eq(P->w_gate[e], half_f16_to_f32(half_f32_to_f16(L->w_gate[e])), "%s L%d gate %zu",
                             paths[i], l, e);
                cr_assert_eq(P->w_up[e], half_f16_to_f32(half_f32_to_f16(L->w_up[e])), "%s L%d up %zu", paths[i],
                             l, e);
            }
        }
    }
    for (int i = 0; i < 3; i++)
        weights_free(&w[i]);
    Weights lw;
    cr_assert(load_capture_ex(&lw, &m[2], WEIGHTS_DTYPES_ONLY, err, sizeof err), "%s", err);
    const QTensor *up = weights_qtensor(&lw, "L1.w_up"), *gate = weights_qtensor(&lw, "L1.w_gate");
    cr_assert(up && gate && up->dtype == DT_F16 && gate->dtype == DT_F16 && up->rows == mm->hidden_dim &&
              gate->rows == mm->hidden_dim, "as stored: f16 parts of hidden_dim rows");
    weights_free(&lw);
    arena_free(&a);
}
