/*
 * rope.c - rotary position embedding frequencies and the "rope" table.
 *
 * Pair i of a head (i in [0, head_dim/2)) turns by the angle pos * freq_i
 * with freq_i = theta^(-2i/head_dim). Which two lanes form pair i is the
 * pairing convention (ROPE_ADJACENT: 2i, 2i+1; ROPE_HALF: i, i + hd/2); the
 * frequencies do not depend on it.
 *
 * Llama-3.x scaling (`rope_type: llama3`), with wavelen = 2*pi/freq,
 * orig = rope_orig_max_pos, low/high = the low/high frequency factors:
 *   wavelen < orig/high   -> freq unchanged (high frequencies)
 *   wavelen > orig/low    -> freq / factor  (low frequencies)
 *   otherwise             -> smooth = (orig/wavelen - low) / (high - low),
 *                            freq' = (1 - smooth) * freq/factor + smooth * freq
 *
 * Frequency factors (a GGUF's rope_freqs.weight): freq_i / factors[i].
 *
 * LongRoPE (Phi-3 128k, Phi-3.5; transformers' longrope): freq_i divided by
 * the short factors where max_seq is at most the original context, else
 * by the long ones; every cos and sin of the table times the attention
 * factor (sqrt(1 + ln(max_pos / orig) / ln(orig)) unless the config gives
 * one), so q.k grows by its square as transformers' attention_scaling
 * makes it. The table's rows are then no pure rotations: a KV shift
 * (runtime/kv_shift.c) turns keys by the row made a unit again.
 */
#include "compiler/model.h"

#include <math.h>
#include <stdlib.h>

/* Applies the llama3 rescaling to one frequency. */
static double rope_llama3_scale(const ModelDesc *m, double freq)
{
    double orig = m->rope_orig_max_pos, low = m->rope_low_freq_factor;
    double high = m->rope_high_freq_factor, factor = m->rope_factor;
    double wavelen = 2.0 * M_PI / freq;
    if (wavelen < orig / high)
        return freq;
    if (wavelen > orig / low)
        return freq / factor;
    double smooth = (orig / wavelen - low) / (high - low);
    return (1.0 - smooth) * freq / factor + smooth * freq;
}

void rope_freqs(const ModelDesc *m, double *freq)
{
    ASSERT(m->head_dim > 0 && m->head_dim % 2 == 0);
    int half = m->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = pow(m->rope_theta, -2.0 * i / m->head_dim);
        if (m->rope_scaling == ROPE_SCALING_LLAMA3)
            f = rope_llama3_scale(m, f);
        else if (m->rope_scaling == ROPE_SCALING_FACTORS)
            f /= m->rope_freq_factors[i];
        else if (m->rope_scaling == ROPE_SCALING_LONGROPE)
            f /= m->max_seq > m->rope_orig_max_pos ? m->rope_long_factors[i] : m->rope_freq_factors[i];
        freq[i] = f;
    }
}

void rope_table_fill(const ModelDesc *m, float *out)
{
    int half = m->head_dim / 2;
    double *freq = xmalloc(sizeof(double) * (size_t)half);
    rope_freqs(m, freq);
    double g = rope_attn_scale(m);
    for (int64_t pos = 0; pos < m->max_seq; pos++) {
        float *row = out + pos * half * 2;
        for (int i = 0; i < half; i++) {
            double a = (double)pos * freq[i];
            row[2 * i] = (float)(g * cos(a));
            row[2 * i + 1] = (float)(g * sin(a));
        }
    }
    free(freq);
}
