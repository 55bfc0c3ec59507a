#!/usr/bin/env python3
"""Writes a scratch GGUF at a Llama model's shapes with random k-quant blocks,
laid out as llama.cpp's Q4_K_M mix lays them out (Q4_K for most matrices;
Q6_K for the embedding, which is also the output matrix, and for attn_v and
ffn_down of every other layer), so that megac's k-quant kernels can be timed
at real shapes without downloading a model. The weights are random: the
text it generates means nothing, only its speed does.

    pip install numpy gguf
    python3 scripts/scratch-kquant-gguf.py OUT.gguf [--shape llama-3.2-1b]
    megac bench OUT.gguf -n 32 --runs 5

Shapes: llama-3.2-1b (dim 2048, 16 layers, 638 MB with a 32000-token
vocabulary) and smollm2-135m-256 (SmolLM2-135M with dim 768, so that every
matrix can be Q4_K: its 576 is no multiple of 256, the k-quants' block).
"""
import argparse
import sys

try:
    import numpy as np
    import gguf
except ImportError as e:
    sys.exit(f"scratch-kquant-gguf.py: {e}: pip install numpy gguf")

SHAPES = {
    # dim, hidden, layers, heads, kv heads, vocab, context
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 32000, 2048),
    "smollm2-135m-256": (768, 1536, 30, 12, 4, 49152, 2048),
}

Q = gguf.GGMLQuantizationType


def f16_bytes(rng, n, lo, hi):
    """n random positive f16 scales in [lo, hi), as bytes (2 each)."""
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def q4_k(rng, rows, k):
    """rows x k weights as Q4_K blocks (256 weights, 144 bytes): d, dmin,
    12 bytes of 6-bit scales and mins, 128 bytes of nibbles."""
    n = rows * k // 256
    b = np.empty((n, 144), np.uint8)
    b[:, 0:2] = f16_bytes(rng, n, 2e-4, 6e-4)
    b[:, 2:4] = f16_bytes(rng, n, 1e-4, 3e-4)
    b[:, 4:144] = rng.integers(0, 256, (n, 140), dtype=np.uint8)
    return b.reshape(rows, k // 256 * 144)


def q6_k(rng, rows, k):
    """rows x k weights as Q6_K blocks (256 weights, 210 bytes): 128 bytes
    of low nibbles, 64 of high bits, 16 int8 scales, d."""
    n = rows * k // 256
    b = np.empty((n, 210), np.uint8)
    b[:, 0:192] = rng.integers(0, 256, (n, 192), dtype=np.uint8)
    b[:, 192:208] = rng.integers(-64, 64, (n, 16), dtype=np.int8).view(np.uint8)
    b[:, 208:210] = f16_bytes(rng, n, 1e-4, 3e-4)
    return b.reshape(rows, k // 256 * 210)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    dim, hid, nl, nh, nkv, vocab, ctx = SHAPES[a.shape]
    if dim % 256 or hid % 256:
        sys.exit(f"{a.shape}: dims must be multiples of 256 for k-quants")
    kv = dim // nh * nkv
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"scratch-{a.shape}-q4_k_m")
    w.add_block_count(nl)
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hid)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    toks += [f"t{i}" for i in range(vocab - len(toks))]
    w.add_token_list(toks)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(name, rows, k, six):
        w.add_tensor(name, q6_k(rng, rows, k) if six else q4_k(rng, rows, k), raw_dtype=Q.Q6_K if six else Q.Q4_K)

    mat("token_embd.weight", vocab, dim, True)
    for l in range(nl):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, np.float32))
        mat(p + "attn_q.weight", dim, dim, False)
        mat(p + "attn_k.weight", kv, dim, False)
        mat(p + "attn_v.weight", kv, dim, l % 2 == 0)
        mat(p + "attn_output.weight", dim, dim, False)
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, np.float32))
        mat(p + "ffn_gate.weight", hid, dim, False)
        mat(p + "ffn_up.weight", hid, dim, False)
        mat(p + "ffn_down.weight", dim, hid, l % 2 == 0)
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: {a.shape}, {nl} layers, Q4_K with Q6_K embedding/output and every other attn_v, ffn_down")


if __name__ == "__main__":
    main()
