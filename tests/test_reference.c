/*
 * test_reference.c - the reference decode: each op against values worked
 * out by hand (rmsnorm, matvec with bias, rope in both pairings, llama3
 * frequency scaling, GQA head mapping, swiglu), then whole models: the
 * stories260K goldens of ../shared (logits of the first 16 positions, the
 * greedy ids from BOS) and well-conditioned activations on synthetic
 * weights.
 */
#include "compiler/reference.h"
#include "compiler/doc.h"
#include "runtime/megac.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#define NEAR(a, b, tol) cr_assert(fabs((double)(a) - (double)(b)) <= (tol), "%s = %.9g, expected %.9g", #a, (double)(a), (double)(b))

/* ---- ops ---- */

Test(ref_ops, rmsnorm)
{
    /* mean(x^2) = 30/4 = 7.5; + eps 0.5 = 8; 1/sqrt(8) = 0.35355339 */
    double x[4] = {1, 2, 3, 4}, out[4];
    float w[4] = {1, 1, 2, 0.5f};
    ref_rmsnorm(x, w, 4, 0.5, out);
    double r = 0.35355339059327373;
    NEAR(out[0], 1 * r, 1e-12);
    NEAR(out[1], 2 * r, 1e-12);
    NEAR(out[2], 6 * r, 1e-12);
    NEAR(out[3], 2 * r, 1e-12);
}

Test(ref_ops, matvec_with_and_without_bias)
{
    float w[6] = {1, 2, 3, 4, 5, 6};    /* 2 rows, 3 cols */
    float b[2] = {0.5f, -1};
    double x[3] = {1, -1, 2}, y[2];
    ref_matvec(w, NULL, x, 2, 3, y);
    NEAR(y[0], 1 - 2 + 6, 0);
    NEAR(y[1], 4 - 5 + 12, 0);
    ref_matvec(w, b, x, 2, 3, y);
    NEAR(y[0], 5.5, 0);
    NEAR(y[1], 10, 0);
}

Test(ref_ops, swiglu_and_add)
{
    double g[3] = {0, 1, -1}, u[3] = {5, 2, 1}, out[3];
    ref_swiglu(g, u, 3, out);
    NEAR(out[0], 0, 0);
    NEAR(out[1], 1.4621171572600098, 1e-12);     /* 2 / (1 + e^-1) */
    NEAR(out[2], -0.2689414213699951, 1e-12);    /* -1 / (1 + e) */
    ref_add(out, u, 3);
    NEAR(out[0], 5, 0);
}

static ModelDesc desc_rope(int hd, double theta)
{
    ModelDesc m;
    memset(&m, 0, sizeof m);
    m.head_dim = hd;
    m.rope_theta = theta;
    m.max_seq = 4;
    return m;
}

Test(ref_ops, rope_freqs_plain)
{
    ModelDesc m = desc_rope(4, 10000);
    double f[2];
    rope_freqs(&m, f);
    NEAR(f[0], 1, 0);
    NEAR(f[1], 0.01, 1e-15);     /* 10000^(-2/4) */
}

/* head_dim 4, theta 10000: pair 0 turns by pos*1 rad, pair 1 by pos*0.01. */
Test(ref_ops, rope_adjacent_pairs)
{
    ModelDesc m = desc_rope(4, 10000);
    double f[2], v[8] = {1, 0, 0, 1, 2, 0, 0, 0};
    rope_freqs(&m, f);
    ref_rope(v, 2, 4, 1, f, ROPE_ADJACENT);
    /* (v0, v1) = (1, 0) by 1 rad; (v2, v3) = (0, 1) by 0.01 rad */
    NEAR(v[0], cos(1.0), 1e-15);
    NEAR(v[1], sin(1.0), 1e-15);
    NEAR(v[2], -sin(0.01), 1e-15);
    NEAR(v[3], cos(0.01), 1e-15);
    NEAR(v[4], 2 * cos(1.0), 1e-15);   /* second head, same rotation */
    NEAR(v[5], 2 * sin(1.0), 1e-15);
}

Test(ref_ops, rope_rotate_half_pairs)
{
    ModelDesc m = desc_rope(4, 10000);
    double f[2], v[4] = {1, 0, 0, 1};
    rope_freqs(&m, f);
    ref_rope(v, 1, 4, 1, f, ROPE_HALF);
    /* (v0, v2) = (1, 0) by 1 rad; (v1, v3) = (0, 1) by 0.01 rad */
    NEAR(v[0], cos(1.0), 1e-15);
    NEAR(v[2], sin(1.0), 1e-15);
    NEAR(v[1], -sin(0.01), 1e-15);
    NEAR(v[3], cos(0.01), 1e-15);
}

Test(ref_ops, rope_position_zero_is_identity)
{
    ModelDesc m = desc_rope(4, 10000);
    double f[2], v[4] = {0.3, -1, 2, 7};
    rope_freqs(&m, f);
    ref_rope(v, 1, 4, 0, f, ROPE_HALF);
    NEAR(v[0], 0.3, 0);
    NEAR(v[3], 7, 0);
}

/* head_dim 6: freq_i = theta^(-i/3). theta is chosen so that freq_1 =
 * 2*pi/32 (wavelength 32). With orig 64, low 1, high 4, factor 8:
 *   pair 0: wavelength 2*pi < 64/4      -> unchanged (1)
 *   pair 1: wavelength 32 in [16, 64]   -> smooth = (64/32 - 1)/(4 - 1) = 1/3,
 *           freq' = (2/3) f/8 + (1/3) f = (5/12) f
 *   pair 2: wavelength 32^2/(2*pi) > 64 -> f/8 */
Test(ref_ops, rope_llama3_scaling)
{
    double f1 = 2 * M_PI / 32;
    ModelDesc m = desc_rope(6, pow(f1, -3));
    m.rope_scaling = ROPE_SCALING_LLAMA3;
    m.rope_factor = 8;
    m.rope_low_freq_factor = 1;
    m.rope_high_freq_factor = 4;
    m.rope_orig_max_pos = 64;
    double f[3];
    rope_freqs(&m, f);
    NEAR(f[0], 1, 1e-15);
    NEAR(f[1], f1 * 5 / 12, 1e-15);
    NEAR(f[2], f1 * f1 / 8, 1e-15);
}

Test(ref_ops, rope_table)
{
    ModelDesc m = desc_rope(4, 10000);
    float t[4 * 2 * 2];     /* [S=4][hd/2=2][cos, sin] */
    rope_table_fill(&m, t);
    NEAR(t[0], 1, 0);                           /* pos 0: cos 0 */
    NEAR(t[1], 0, 0);
    NEAR(t[3 * 4 + 0], cosf(3.0f), 1e-7);       /* pos 3, pair 0 */
    NEAR(t[3 * 4 + 3], sinf(0.03f), 1e-7);      /* pos 3, pair 1 */
}

/* 4 q heads over 2 kv heads (hd 2), 2 cached positions. Every q head is
 * (1, 0); scale 1/sqrt(2). kv head 0: k = (0,0), (sqrt2*ln3, 0) -> scores
 * 0, ln 3 -> weights 1/4, 3/4; v = (4,0), (0,8) -> (1, 6).
 * kv head 1: k = 0, 0 -> weights 1/2, 1/2; v = (2,2), (6,-2) -> (4, 0).
 * q heads 0,1 read kv head 0 and q heads 2,3 read kv head 1. */
Test(ref_ops, attention_gqa_head_mapping)
{
    double q[8] = {1, 0, 1, 0, 1, 0, 1, 0};
    double kc[2 * 4] = {0, 0, 0, 0, sqrt(2.0) * log(3.0), 0, 0, 0};
    double vc[2 * 4] = {4, 0, 2, 2, 0, 8, 6, -2};
    double scores[2], out[8];
    ref_attention(q, kc, vc, 4, 2, 2, 2, scores, out);
    double want[8] = {1, 6, 1, 6, 4, 0, 4, 0};
    for (int i = 0; i < 8; i++)
        NEAR(out[i], want[i], 1e-12);
}

Test(ref_ops, attention_single_position_copies_v)
{
    double q[4] = {3, -1, 0.5, 2}, kc[2] = {7, 7}, vc[2] = {-1, 5}, scores[1], out[4];
    ref_attention(q, kc, vc, 2, 1, 2, 1, scores, out);
    NEAR(out[0], -1, 0);
    NEAR(out[1], 5, 0);
    NEAR(out[2], -1, 0);
    NEAR(out[3], 5, 0);
}

/* ---- whole steps on a hand-made model ---- */

/* dim 2, one layer, one head of 2, vocab 2, eps 0. All projections are zero
 * except bv = (1, 1) and wo = I, and lm_head = I. Attention then returns bv
 * at every position, so after the layer x = embed[tok] + (1, 1), and the
 * logits are x / rms(x): for token 0, (2, 1) / sqrt(2.5). */
typedef struct {
    ModelDesc m;
    Weights w;
    LayerWeights l;
    float embed[4], ones[2], zeros[4], eye[4], bv[2];
} TinyModel;

static void tiny_init(TinyModel *t, bool bias)
{
    memset(t, 0, sizeof *t);
    ModelDesc *m = &t->m;
    m->dim = 2, m->hidden_dim = 1, m->n_layers = 1, m->n_heads = 1, m->n_kv_heads = 1;
    m->head_dim = 2, m->vocab_size = 2, m->max_seq = 300, m->rope_theta = 10000;
    float e[4] = {1, 0, 0, 1};
    memcpy(t->embed, e, sizeof e);
    memcpy(t->eye, e, sizeof e);
    t->ones[0] = t->ones[1] = 1;
    t->bv[0] = t->bv[1] = 1;
    LayerWeights *l = &t->l;
    l->attn_norm = l->ffn_norm = t->ones;
    l->wq = l->wk = l->wv = l->w_gate = l->w_up = l->w_down = t->zeros;
    l->wo = t->eye;
    if (bias)
        l->bq = l->bk = t->zeros, l->bv = t->bv;
    t->w.m = m;
    t->w.tok_embed = t->embed;
    t->w.layers = l;
    t->w.final_norm = t->ones;
    t->w.lm_head = t->eye;
    t->w.pairing = ROPE_ADJACENT;
}

Test(ref_model, qkv_bias_reaches_the_output)
{
    TinyModel t;
    tiny_init(&t, true);
    RefState *s = ref_new(&t.w);
    const float *lg = ref_step(s, 0, 0);
    NEAR(lg[0], 2 / sqrt(2.5), 1e-6);
    NEAR(lg[1], 1 / sqrt(2.5), 1e-6);
    lg = ref_step(s, 1, 1);
    NEAR(lg[0], 1 / sqrt(2.5), 1e-6);
    NEAR(lg[1], 2 / sqrt(2.5), 1e-6);
    ref_free(s);

    tiny_init(&t, false);
    s = ref_new(&t.w);
    lg = ref_step(s, 0, 0);
    NEAR(lg[0], sqrt(2.0), 1e-6);
    NEAR(lg[1], 0, 1e-6);
    ref_free(s);
}

/* The KV cache grows past its first allocation and reset starts over. */
Test(ref_model, reset_and_cache_growth)
{
    TinyModel t;
    tiny_init(&t, true);
    RefState *s = ref_new(&t.w);
    float first[2];
    for (int pos = 0; pos < 200; pos++) {
        const float *lg = ref_step(s, pos % 2, pos);
        if (pos == 0)
            memcpy(first, lg, sizeof first);
    }
    ref_reset(s);
    const float *lg = ref_step(s, 0, 0);
    NEAR(lg[0], first[0], 0);
    NEAR(lg[1], first[1], 0);
    ref_free(s);
}

/* ---- whole models ---- */

#define SHARED MEGAC_SRC "/../shared"

static bool shared_present(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

/* stories260K as its llama2.c header and run.c describe it. */
static void desc_stories(ModelDesc *m)
{
    memset(m, 0, sizeof *m);
    m->name = "stories260K";
    m->path = "stories260K (test)";
    m->dim = 64, m->hidden_dim = 172, m->n_layers = 5, m->n_heads = 8, m->n_kv_heads = 4;
    m->head_dim = 8, m->vocab_size = 512, m->max_seq = 512, m->norm_eps = 1e-5;
    m->tie_embeddings = true;
    m->rope_theta = 10000;
    m->rope_pairing = ROPE_ADJACENT;
    m->weights_format = WFMT_LLAMA2C;
    m->weights_path = SHARED "/models/stories260K.bin";
    m->bos_id = 1, m->eos_id = 2;
}

static void weights_load_ok(Weights *w, const ModelDesc *m)
{
    Diag d;
    diag_init(&d);
    cr_assert(weights_load(w, m, &d), "weights of %s did not load", m->name);
}

/* The ids of stories260K_greedy.json ("greedy_token_ids"). */
static int golden_ids(int *ids, int cap)
{
    Doc doc;
    Diag d;
    diag_init(&d);
    cr_assert(doc_load(&doc, SHARED "/golden/stories260K_greedy.json", &d));
    DocNode *seq = doc_get(doc.root, "greedy_token_ids");
    cr_assert(seq && seq->kind == DOC_SEQ && seq->n <= cap);
    for (int i = 0; i < seq->n; i++) {
        int64_t v;
        cr_assert(doc_int(&doc, &d, seq->items[i], &v));
        ids[i] = (int)v;
    }
    int n = seq->n;
    doc_free(&doc);
    return n;
}

Test(ref_golden, stories260k_logits_first16)
{
    if (!shared_present(SHARED "/models/stories260K.bin") ||
        !shared_present(SHARED "/golden/stories260K_logits_first16.f32"))
        cr_skip_test("../shared (stories260K.bin and its goldens) is absent");
    static float want[16][512];
    FILE *f = fopen(SHARED "/golden/stories260K_logits_first16.f32", "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(want, sizeof want, 1, f), 1);
    fclose(f);
    int ids[300];
    cr_assert_geq(golden_ids(ids, 300), 16);
    ModelDesc m;
    Weights w;
    desc_stories(&m);
    weights_load_ok(&w, &m);
    RefState *s = ref_new(&w);
    double worst = 0;
    for (int pos = 0; pos < 16; pos++) {
        const float *lg = ref_step(s, ids[pos], pos);
        for (int i = 0; i < 512; i++)
            worst = fmax(worst, fabs((double)lg[i] - want[pos][i]));
    }
    cr_assert_leq(worst, 1e-4, "largest logit difference %g", worst);
    ref_free(s);
    weights_free(&w);
}

/* Greedy from BOS reproduces the 255 ids of run.c (ids[0] is BOS). */
Test(ref_golden, stories260k_greedy_from_bos)
{
    if (!shared_present(SHARED "/models/stories260K.bin") ||
        !shared_present(SHARED "/golden/stories260K_greedy.json"))
        cr_skip_test("../shared (stories260K.bin and its goldens) is absent");
    int ids[300];
    int n = golden_ids(ids, 300);
    cr_assert_eq(n, 256);
    ModelDesc m;
    Weights w;
    desc_stories(&m);
    weights_load_ok(&w, &m);
    RefState *s = ref_new(&w);
    megac_sampler greedy = {.temperature = 0, .top_p = 1};
    uint64_t rng = 0;
    int tok = ids[0];
    for (int pos = 0; pos + 1 < n; pos++) {
        int next = megac_sample(ref_step(s, tok, pos), m.vocab_size, &greedy, &rng);
        cr_assert_eq(next, ids[pos + 1], "position %d: got %d, run.c has %d", pos + 1, next, ids[pos + 1]);
        tok = next;
    }
    ref_free(s);
    weights_free(&w);
}

/* Logits of a few steps are finite with a standard deviation in [0.1, 100]. */
static void assert_well_conditioned(const ModelDesc *m, int nsteps)
{
    Weights w;
    weights_load_ok(&w, m);
    RefState *s = ref_new(&w);
    for (int pos = 0; pos < nsteps; pos++) {
        const float *lg = ref_step(s, (pos * 7919 + 1) % m->vocab_size, pos);
        double sum = 0, sq = 0;
        for (int i = 0; i < m->vocab_size; i++) {
            cr_assert(isfinite(lg[i]), "%s: logit %d at pos %d is %g", m->name, i, pos, lg[i]);
            sum += lg[i];
        }
        double mean = sum / m->vocab_size;
        for (int i = 0; i < m->vocab_size; i++)
            sq += (lg[i] - mean) * (lg[i] - mean);
        double sd = sqrt(sq / m->vocab_size);
        cr_assert(sd >= 0.1 && sd <= 100, "%s: logit std %g at pos %d", m->name, sd, pos);
    }
    ref_free(s);
    weights_free(&w);
}

/* SmolLM2-135M shapes (HF config), synthetic weights. */
Test(ref_synthetic, smollm2_135m_shapes_well_conditioned)
{
    ModelDesc m;
    memset(&m, 0, sizeof m);
    m.name = "synthetic SmolLM2-135M";
    m.path = "smollm2 (test)";
    m.dim = 576, m.hidden_dim = 1536, m.n_layers = 30, m.n_heads = 9, m.n_kv_heads = 3;
    m.head_dim = 64, m.vocab_size = 49152, m.max_seq = 8, m.norm_eps = 1e-5;
    m.tie_embeddings = true;
    m.rope_theta = 100000;
    m.rope_pairing = ROPE_HALF;
    m.weights_format = WFMT_SYNTHETIC;
    m.weights_seed = 1;
    m.bos_id = m.eos_id = -1;
    assert_well_conditioned(&m, 3);
}

/* The embedded default model (synthetic weights, no files). */
Test(ref_synthetic, default_model_well_conditioned)
{
    Arena a = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&m, &a, NULL, NULL, 0, &d) && desc_check(&m, &d));
    assert_well_conditioned(&m, 8);
    arena_free(&a);
}

/* Reorders the rows of each head from adjacent pairs (2i, 2i+1) to
 * rotate-half order (i, i + hd/2), as HF checkpoints store q and k. */
static void rows_adjacent_to_half(float *w, int nheads, int hd, int cols)
{
    size_t row = (size_t)cols * sizeof(float);
    float *tmp = xmalloc(row * (size_t)hd);
    for (int h = 0; h < nheads; h++) {
        float *head = w + (size_t)h * hd * cols;
        for (int i = 0; i < hd / 2; i++) {
            memcpy(tmp + (size_t)i * cols, head + (size_t)(2 * i) * cols, row);
            memcpy(tmp + (size_t)(i + hd / 2) * cols, head + (size_t)(2 * i + 1) * cols, row);
        }
        memcpy(head, tmp, row * (size_t)hd);
    }
    free(tmp);
}

/* The same model in HF layout with rotate-half RoPE gives the same logits:
 * q.k is unchanged when q and k lanes are permuted alike. */
Test(ref_golden, stories260k_pairings_agree)
{
    if (!shared_present(SHARED "/models/stories260K.bin"))
        cr_skip_test("../shared/models/stories260K.bin is absent");
    ModelDesc m;
    Weights a, b;
    desc_stories(&m);
    weights_load_ok(&a, &m);
    weights_load_ok(&b, &m);
    for (int l = 0; l < m.n_layers; l++) {
        rows_adjacent_to_half(b.layers[l].wq, m.n_heads, m.head_dim, m.dim);
        rows_adjacent_to_half(b.layers[l].wk, m.n_kv_heads, m.head_dim, m.dim);
    }
    b.pairing = ROPE_HALF;
    RefState *sa = ref_new(&a), *sb = ref_new(&b);
    int tok = 1;
    for (int pos = 0; pos < 24; pos++) {
        const float *la = ref_step(sa, tok, pos), *lb = ref_step(sb, tok, pos);
        for (int i = 0; i < m.vocab_size; i++)
            cr_assert(fabsf(la[i] - lb[i]) <= 1e-5f, "pos %d logit %d: %g vs %g", pos, i, la[i], lb[i]);
        tok = (tok * 31 + 7) % m.vocab_size;
    }
    /* and the rows really moved: the HF rows under adjacent RoPE differ */
    b.pairing = ROPE_ADJACENT;
    RefState *sc = ref_new(&b);
    ref_reset(sa);
    double diff = 0;
    for (int pos = 0; pos < 8; pos++) {
        const float *la = ref_step(sa, 5 + pos, pos), *lc = ref_step(sc, 5 + pos, pos);
        for (int i = 0; i < m.vocab_size; i++)
            diff = fmax(diff, fabs((double)la[i] - lc[i]));
    }
    cr_assert_gt(diff, 1e-3, "wrong pairing should change the logits");
    ref_free(sa);
    ref_free(sb);
    ref_free(sc);
    weights_free(&a);
    weights_free(&b);
}
