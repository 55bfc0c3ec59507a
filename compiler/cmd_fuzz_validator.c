/*
 * cmd_fuzz_validator.c - `megac fuzz-validator`: the adversarial campaign
 * that compares the static validator with the model checker (tools/mc).
 *
 * Real lowerings of tiny models (1-2 layers, small dims, 2..W workers),
 * each dense and with a variant of sparse attention and KV eviction, are
 * made once (or, with --model, lowerings of that description with its
 * --set overrides); each schedule of the campaign is one of them,
 * unmutated or with one planted defect of a class (fuzz.h), or a random
 * schedule. The
 * validator says accept/reject, the checker safe/unsafe (or unknown when
 * its state budget runs out; those are counted apart). A false accept is a
 * schedule the validator accepts and the checker shows unsafe; a false
 * reject the reverse. Prints the confusion matrix per class and ends with
 * `schedules=N unsafe=U false_accepts=A false_rejects=R`. Exit 1 when a
 * false accept happened or a real lowering was rejected.
 */
#include "compiler/compile.h"
#include "compiler/cli.h"
#include "compiler/fuzz.h"
#include "tools/mc/mc.h"
#include "validator/validator.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct Cell {
    uint64_t n, acc_safe, acc_unsafe, rej_safe, rej_unsafe, unknown;
} Cell;

#define CAMPAIGN_MAX_SETS 64

typedef struct Campaign {
    uint64_t seed, count;
    int workers_max;
    bool verbose;
    const char *model;          /* --model: lower this description instead of the tiny ones */
    DescOverride set[CAMPAIGN_MAX_SETS];
    int nset;
    Schedule **base;
    int nbase;
    Cell cell[FUZZ_CLASS_COUNT];
    FILE *null;
} Campaign;

#define FUZZ_MAX_COUNT 100000000    /* ~2.5 days at 10,000 schedules in 20 s */

static void fuzz_usage(FILE *out)
{
    fprintf(out, "usage: megac fuzz-validator [--seed S] [--count N] [--workers-max W]\n"
                 "                             [--model MODEL [--set key=value]...] [-v]\n\n"
                 "Adversarial campaign: real lowerings of tiny models (1-2 layers, 2..W workers,\n"
                 "W <= %d; dense, and with sparse attention and KV eviction) with planted\n"
                 "defects, plus random schedules and unmutated lowerings, each judged by the\n"
                 "validator and by the explicit-state model checker.\n"
                 "Prints the confusion matrix per defect class and ends with\n"
                 "  schedules=N unsafe=U false_accepts=A false_rejects=R\n\n"
                 "  --seed S         random seed (default 1)\n"
                 "  --count N        schedules to judge, 1..%d (default 1000)\n"
                 "  --workers-max W  most workers in a lowering (default %d)\n"
                 "  --model M        lower the model M (2..W workers, cpu; as megac lower does)\n"
                 "                   instead of the tiny models; a small max_seq keeps the\n"
                 "                   checker exhaustive\n"
                 "  --set key=value  override a key of M (repeatable), e.g.\n"
                 "                   'compile.kv_policy=[{layers: 1-, policy: h2o, budget: 8}]'\n"
                 "  -v               print every disagreement\n\n"
                 "Exit status: 0 no false accept and every real lowering accepted, 1 otherwise,\n"
                 "2 bad options.\n",
            MC_MAX_WORKERS, FUZZ_MAX_COUNT, MC_MAX_WORKERS);
}

/* Tiny models: dim, hidden, layers, heads, kv_heads, head_dim, vocab, max_seq. */
static const int tiny_models[][8] = {
    {16, 32, 1, 2, 1, 8, 32, 16},
    {32, 48, 2, 4, 2, 8, 48, 16},
    {32, 64, 1, 4, 4, 8, 40, 8},
    {24, 40, 2, 3, 1, 8, 32, 16},
    /* big enough for GEMV stages to be cut into several tiles */
    {128, 256, 1, 4, 2, 32, 256, 16},
    {96, 192, 2, 6, 3, 16, 128, 16},
};

#define TINY_VARIANTS 9

/* Variant v (1..TINY_VARIANTS-1) of sparse attention and eviction knobs:
 * even and odd layers get one each (a layer never has both), sized to the
 * model's max_seq so that caches fill and evict. Variant 0 is dense. */
static void tiny_knobs(ModelDesc *m, int v)
{
    int S = m->max_seq;
    AttnSpec quest = {.kind = ATTN_QUEST, .page = S / 4, .budget = S / 2};
    AttnSpec sw = {.kind = ATTN_SINK_WINDOW, .sinks = 2, .window = S / 4};
    KvPolicy h2o = {.kind = KV_H2O, .budget = S / 2, .window = S / 4}, tova = {.kind = KV_TOVA, .budget = S / 2};
    KvPolicy stream = {.kind = KV_STREAMING, .sinks = 1, .window = S / 2 - 1};
    KvPolicy snap = {.kind = KV_SNAPKV, .budget = S / 2, .window = S / 8 > 0 ? S / 8 : 1};
    KvPolicy ada = snap;
    ada.adaptive = true, ada.alpha = 0.2;
    AttnSpec anchor = {.kind = ATTN_KASCADE, .budget = S / 4};
    AttnSpec reuse = {.kind = ATTN_KASCADE_REUSE, .head_map = m->n_kv_heads > 1 && m->n_kv_heads <= ATTN_MAX_HEAD_MAP};
    for (int h = 0; reuse.head_map && h < m->n_kv_heads; h++) /* kv heads read the anchor's in reverse */
        reuse.heads[h] = (uint8_t)(m->n_kv_heads - 1 - h);
    m->kv_dtype = v == 2 || v == 5 || v == 8 ? DT_F16 : v == 6 ? DT_BF16 : DT_F32; /* half caches too */
    for (int l = 0; l < m->n_layers; l++) {
        bool odd = l % 2;
        switch (v) {
        case 1: odd ? (void)(m->kv[l] = h2o) : (void)(m->attn[l] = quest); break;
        case 2: odd ? (void)(m->attn[l] = sw) : (void)(m->kv[l] = h2o); break;
        case 3: odd ? (void)(m->attn[l] = quest) : (void)(m->kv[l] = tova); break;
        case 4: m->kv[l] = stream; break;
        case 5: odd ? (void)(m->kv[l] = tova) : (void)(m->attn[l] = sw); break;
        case 6: odd ? (void)(m->kv[l] = snap) : (void)(m->attn[l] = quest); break;
        case 7: /* Kascade: even layers anchors, odd ones reuse the one before's rows, head map reversed */
            m->attn[l] = odd ? reuse : anchor;
            m->attn[l].anchor = odd ? l - 1 : 0;
            break;
        case 8: odd ? (void)(m->kv[l] = ada) : (void)(m->attn[l] = anchor); break;
        default: break;
        }
    }
}

static bool base_add(Campaign *c, Schedule *s)
{
    if (s)
        c->base[c->nbase++] = s;
    return s != NULL;
}

/* Each tiny model for 2..W workers, dense and with one knob variant. */
static bool base_build_tiny(Campaign *c, Diag *d)
{
    size_t nm = sizeof tiny_models / sizeof tiny_models[0];
    c->base = xcalloc(2 * nm * (size_t)c->workers_max, sizeof *c->base);
    for (size_t i = 0; i < nm; i++)
        for (int w = 2; w <= c->workers_max; w++) {
            const int *x = tiny_models[i];
            ModelDesc m = {.name = "tiny", .dim = x[0], .hidden_dim = x[1], .n_layers = x[2], .n_heads = x[3],
                           .n_kv_heads = x[4], .head_dim = x[5], .vocab_size = x[6], .max_seq = x[7],
                           .norm_eps = 1e-5, .tie_embeddings = true, .rope_theta = 10000, .act_dtype = DT_F32,
                           /* split attention merged both ways (auto is stage on the CPU) */
                           .attn_combine = (i + (size_t)w) % 2 ? COMBINE_IN_O : COMBINE_STAGE};
            if (!base_add(c, lower_model(&m, target_lookup("cpu", d), w, d)))
                return false;
            tiny_knobs(&m, 1 + (int)(i + (size_t)w) % (TINY_VARIANTS - 1));
            if (!base_add(c, lower_model(&m, target_lookup("cpu", d), w, d)))
                return false;
        }
    return true;
}

/* The --model description (with its --set overrides) for 2..W workers,
 * its weights in the dtypes a compile stores them in (as megac lower). */
static bool base_build_model(Campaign *c, Diag *d)
{
    Arena arena = {0};
    ModelDesc *m = ARENA_NEW(&arena, ModelDesc);
    bool ok = desc_load(m, &arena, c->model, c->set, c->nset, d);
    c->base = xcalloc((size_t)c->workers_max, sizeof *c->base);
    for (int w = 2; ok && w <= c->workers_max; w++)
        ok = base_add(c, lower_model_stored(m, target_lookup("cpu", d), w, d));
    arena_free(&arena);
    return ok;
}

static bool base_build(Campaign *c)
{
    Diag d;
    diag_init(&d);
    d.prog = "megac fuzz-validator";
    bool ok = c->model ? base_build_model(c, &d) : base_build_tiny(c, &d);
    return ok && c->nbase > 0;
}

/* A schedule of class k, or NULL when no base offers a site for it. */
static Schedule *campaign_make(Campaign *c, FuzzClass k, FuzzRng *r)
{
    if (k == FUZZ_RANDOM)
        return fuzz_random(r, c->workers_max);
    if (k == FUZZ_RANDOM_DAG)
        return fuzz_random_dag(r, c->workers_max);
    for (int tries = 0; tries < 16; tries++) {
        Schedule *s = fuzz_clone(c->base[fuzz_below(r, (uint32_t)c->nbase)]);
        if (k == FUZZ_NONE || fuzz_mutate(s, k, r))
            return s;
        sched_free(s);
    }
    return NULL;
}

static void campaign_judge(Campaign *c, FuzzClass k, Schedule *s, uint64_t i)
{
    Diag d;
    diag_init(&d);
    d.prog = "megac fuzz-validator";
    d.out = c->null;
    const Target *t = target_lookup(s->target, &d);
    ValOptions vo = {.target = t};
    ValResult vr;
    McOptions mo = {.target = t, .max_states = 2000000};
    McResult mr;
    bool accept = val_schedule_check(s, &vo, &d, &vr);
    McVerdict v = mc_check(s, &mo, &mr);
    Cell *cell = &c->cell[k];
    cell->n++;
    if (v == MC_UNKNOWN)
        cell->unknown++;
    else if (accept)
        *(v == MC_SAFE ? &cell->acc_safe : &cell->acc_unsafe) += 1;
    else
        *(v == MC_SAFE ? &cell->rej_safe : &cell->rej_unsafe) += 1;
    bool disagree = v != MC_UNKNOWN && accept != (v == MC_SAFE);
    if (c->verbose && (disagree || (k == FUZZ_NONE && !accept) || v == MC_UNKNOWN)) {
        fprintf(stderr, "#%llu %s: validator %s (structure %d deadlock %d race %d uninit %d residency %d), checker %s: %s\n",
                (unsigned long long)i, fuzz_class_names[k], accept ? "accepts" : "rejects", vr.nstructure,
                vr.ndeadlock, vr.nrace, vr.nuninit, vr.nresidency,
                v == MC_SAFE ? "safe" : v == MC_UNSAFE ? "UNSAFE" : "unknown", mr.why);
        if (disagree && s->nworkers <= MC_MAX_WORKERS)
            sched_print(s, stderr);
    }
}

static void campaign_report(const Campaign *c, double secs)
{
    Cell tot = {0};
    printf("%-26s %7s %9s %11s %9s %11s %8s\n", "class", "n", "acc/safe", "acc/UNSAFE", "rej/safe", "rej/unsafe",
           "unknown");
    for (int k = 0; k < FUZZ_CLASS_COUNT; k++) {
        const Cell *x = &c->cell[k];
        printf("%-26s %7llu %9llu %11llu %9llu %11llu %8llu\n", fuzz_class_names[k], (unsigned long long)x->n,
               (unsigned long long)x->acc_safe, (unsigned long long)x->acc_unsafe, (unsigned long long)x->rej_safe,
               (unsigned long long)x->rej_unsafe, (unsigned long long)x->unknown);
        tot.n += x->n, tot.acc_safe += x->acc_safe, tot.acc_unsafe += x->acc_unsafe;
        tot.rej_safe += x->rej_safe, tot.rej_unsafe += x->rej_unsafe, tot.unknown += x->unknown;
    }
    const Cell *none = &c->cell[FUZZ_NONE];
    printf("seed %llu, %d real lowerings (%llu judged, %llu rejected by the validator), %llu unknown to the "
           "checker, %.1f s\n",
           (unsigned long long)c->seed, c->nbase, (unsigned long long)none->n,
           (unsigned long long)(none->rej_safe + none->rej_unsafe), (unsigned long long)tot.unknown, secs);
    printf("schedules=%llu unsafe=%llu false_accepts=%llu false_rejects=%llu\n", (unsigned long long)tot.n,
           (unsigned long long)(tot.acc_unsafe + tot.rej_unsafe), (unsigned long long)tot.acc_unsafe,
           (unsigned long long)tot.rej_safe);
}

static void campaign_free(Campaign *c)
{
    for (int i = 0; i < c->nbase; i++)
        sched_free(c->base[i]);
    free(c->base);
    cli_sets_free(c->set, c->nset);
    if (c->null)
        fclose(c->null);
}

static int campaign_run(Campaign *c)
{
    FuzzRng r = {c->seed * 0x9e3779b97f4a7c15ull + 0x1234567ull};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!base_build(c)) {
        fprintf(stderr, "megac fuzz-validator: lowering %s failed\n", c->model ? c->model : "a tiny model");
        return 2;
    }
    c->null = fopen("/dev/null", "w");
    if (!c->null) {
        fprintf(stderr, "megac fuzz-validator: cannot open /dev/null: %s\n", strerror(errno));
        return 2;
    }
    for (uint64_t i = 0; i < c->count; i++) {
        FuzzClass k = (FuzzClass)(i % FUZZ_CLASS_COUNT);
        Schedule *s = campaign_make(c, k, &r);
        if (!s)
            s = campaign_make(c, k = FUZZ_RANDOM, &r);
        campaign_judge(c, k, s, i);
        sched_free(s);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    campaign_report(c, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    uint64_t fa = 0;
    for (int k = 0; k < FUZZ_CLASS_COUNT; k++)
        fa += c->cell[k].acc_unsafe;
    const Cell *none = &c->cell[FUZZ_NONE];
    return fa == 0 && none->rej_safe + none->rej_unsafe == 0 ? 0 : 1;
}

int cmd_fuzz_validator(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fuzz_usage(stdout);
        return 0;
    }
    Campaign c = {.seed = 1, .count = 1000, .workers_max = MC_MAX_WORKERS};
    for (int i = 1; i < argc; i++) {
        uint64_t v = 0;
        bool has = i + 1 < argc && cli_parse_u64(argv[i + 1], &v);
        if (!strcmp(argv[i], "--seed") && has)
            c.seed = v, i++;
        else if (!strcmp(argv[i], "--count") && has && v >= 1 && v <= FUZZ_MAX_COUNT)
            c.count = v, i++;
        else if (!strcmp(argv[i], "--workers-max") && has && v >= 2 && v <= MC_MAX_WORKERS)
            c.workers_max = (int)v, i++;
        else if (!strcmp(argv[i], "-v"))
            c.verbose = true;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            c.model = argv[++i];
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (!cli_set_add("fuzz-validator", argv[++i], c.set, &c.nset, CAMPAIGN_MAX_SETS)) {
                campaign_free(&c);
                return 2;
            }
        } else {
            bool known = !strcmp(argv[i], "--seed") || !strcmp(argv[i], "--count") ||
                         !strcmp(argv[i], "--workers-max") || !strcmp(argv[i], "--set") ||
                         !strcmp(argv[i], "--model");
            if (known && i + 1 < argc)
                fprintf(stderr, "megac fuzz-validator: bad value for %s: '%s'\n", argv[i], argv[i + 1]);
            else
                cli_bad_arg("fuzz-validator", argv[i], known);
            fuzz_usage(stderr);
            campaign_free(&c);
            return 2;
        }
    }
    if (c.nset > 0 && !c.model) {
        fprintf(stderr, "megac fuzz-validator: --set needs --model\n");
        campaign_free(&c);
        return 2;
    }
    int rc = campaign_run(&c);
    campaign_free(&c);
    return rc;
}
