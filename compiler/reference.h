/*
 * reference.h - the single ops of the reference decode (reference.c), one
 * function per op, exposed so that tests can check each against hand-made
 * values and backends can check theirs op by op. Activations are double;
 * weights are the f32 tensors of `Weights`; every sum accumulates in double.
 * The whole-model entry points (ref_new, ref_step, ...) are in model.h.
 */
#ifndef MEGAC_REFERENCE_H
#define MEGAC_REFERENCE_H

#include "compiler/model.h"

/* out[0:dim] = table[tok][0:dim] */
void ref_embed(const float *table, int dim, int tok, double *out);
/* out[0:n] = x * w / sqrt(mean(x^2) + eps) */
void ref_rmsnorm(const double *x, const float *w, int n, double eps, double *out);
/* y[0:rows] = W[rows][cols] . x (+ b when b is not NULL) */
void ref_matvec(const float *w, const float *b, const double *x, int rows, int cols, double *y);
/* Rotates nheads heads of hd lanes each in place at position pos; freq holds
 * hd/2 frequencies (rope_freqs). */
void ref_rope(double *v, int nheads, int hd, int pos, const double *freq, RopePairing p);
/* Causal attention of one query position over npos cached rows.
 * q: (n_heads*hd); kc, vc: (npos, n_kv_heads*hd); q head h reads kv head
 * h / (n_heads/n_kv_heads); scores: scratch of npos; out: (n_heads*hd). */
void ref_attention(const double *q, const double *kc, const double *vc, int n_heads,
                   int n_kv_heads, int hd, int npos, double *scores, double *out);
/* out[0:n] = silu(g) * u, silu(x) = x / (1 + exp(-x)) */
void ref_swiglu(const double *g, const double *u, int n, double *out);
/* a[0:n] += b[0:n] */
void ref_add(double *a, const double *b, int n);

#endif
