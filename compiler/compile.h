/*
 * compile.h - the compiler's passes as the driver calls them, in order:
 *   desc_load -> weights_load -> tok_import -> lower_model ->
 *   val_schedule_check -> cg_*_compile -> bundle_write
 */
#ifndef MEGAC_COMPILE_H
#define MEGAC_COMPILE_H

#include "compiler/model.h"
#include "ir/ir.h"
#include "runtime/tokenizer.h"

/* ---- lower.c ---- */
/* The whole decode step of batch 1 for the model, for `workers` workers
 * (0 = the target's default). NULL (with errors in d) if the model cannot
 * be lowered. */
Schedule *lower_model(const ModelDesc *m, const Target *t, int workers, Diag *d);
/* lower_model of the weights as `megac compile` stores them: each
 * matrix's dtype is the one a compile's load leaves (GGUF blocks kept as
 * they are, f16/bf16 tensors, ...), so the schedule is the one a compile
 * of the description builds and validates. Only the files' headers are
 * read (WEIGHTS_DTYPES_ONLY): no tensor's bytes. */
Schedule *lower_model_stored(const ModelDesc *m, const Target *t, int workers, Diag *d);

/* ---- tok_import.c ---- */
/* The tokenizer the description names (llama2.c, HF json, GGUF vocab, or
 * the built-in bytes). NULL with an error naming the file otherwise. */
Tokenizer *tok_import(const ModelDesc *m, Diag *d);
/* The files an HF tokenizer's chat template is read from, beside its
 * tokenizer.json tok_path: chat_template.jinja, else tokenizer_config.json
 * (both xmalloc'd). */
void tok_chat_template_files(const char *tok_path, char **jinja, char **config);

/* ---- chat_template.c ---- */
/* The chat format a chat template (Jinja text) writes, by its markers, and
 * in *default_system (malloc'd, or NULL) the system turn a ChatML template
 * writes when a conversation gives none. */
ChatKind chat_template_kind(const char *tmpl, size_t len, char **default_system);
const char *chat_kind_name(ChatKind k);

/* ---- bundle.c ---- */
/* Writes NAME.megac/: manifest.yaml, schedule.sched, weights.bin (kernel
 * layout, from sched_layout offsets), tokenizer.bin; the kernel file is
 * already in dir. p (may be NULL) hears of each weight buffer written:
 * buffers done, of total, bytes written. */
bool bundle_write(const char *dir, const ModelDesc *m, const Weights *w, const Tokenizer *t,
                  const Schedule *s, const char *kernel_file, const WeightsProgress *p, Diag *d);
/* Weight bytes one step of s reads (the manifest's weights_read_bytes):
 * every weight read access's range at pos 0, except that an embedding
 * gather reads one row (c1 - c0 elements), not the table its access
 * declares. */
uint64_t bundle_read_bytes(const Schedule *s);

#endif
