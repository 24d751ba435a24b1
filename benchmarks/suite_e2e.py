"""End to end (issue 12): transformers' LlamaForCausalLM, "tiled_attn" vs "sdpa", and
examples/gpt.py's GPT (benchmarks/end_to_end.py runs it: prefill, a left-padded prefill, decode
tokens/s, a training step, with proof of which attention kernels ran). Random weights from these
configs; nothing downloaded."""
from . import end_to_end

LLAMA_3_2_1B_SHAPE = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                          rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=16384)
SMALL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=64, vocab_size=32000, max_position_embeddings=16384)

# the padded prefill: batch 4, left-padded to 2048 with an attention_mask (bar: >= 1.0x "sdpa")
PADDED = (512, 1024, 1536, 2048)

SUITE = end_to_end.E2ESuite({"llama-3.2-1b-shape": LLAMA_3_2_1B_SHAPE, "small": SMALL}, padded=PADDED,
                            pad_side="left")
