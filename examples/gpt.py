"""A small GPT on ta.nn.Attention: forward throughput against the same model on torch's SDPA.

    python examples/gpt.py                       # CUDA (bf16, GPT-2-medium-ish) when present, else a
                                                 # tiny float32 model on the CPU (a few seconds)
    python examples/gpt.py --layers 4 --dim 512 --heads 8 --kv-heads 2 --seq 1024 --batch 4
    python examples/gpt.py --compile             # torch.compile both models first

Both models share one set of weights: the torch one differs only in its attention step
(`_attend`, overridden to call torch.nn.functional.scaled_dot_product_attention). The script prints
the largest logit difference between the two, then tokens/s for each (inference, no grad: the
tiled_attn forward kernels run; in training ta.nn.Attention runs our forward and backward).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import tiled_attn as ta


class TorchSDPAAttention(ta.nn.Attention):
    """ta.nn.Attention with torch's SDPA as the attention step: the baseline."""

    def _attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                              enable_gqa=k.shape[1] != q.shape[1])


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim, heads, kv_heads, attention_cls):
        super().__init__()
        self.norm1 = nn.RMSNorm(dim)
        self.attn = attention_cls(dim, heads, kv_heads, causal=True, rope_theta=10000.0)
        self.norm2 = nn.RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, bias=False), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * dim, dim, bias=False))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, attention_cls=ta.nn.Attention):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, attention_cls) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):  # (B, N) int -> (B, N, vocab) logits
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def tokens_per_second(model, tokens, iters, warmup) -> float:
    sync = torch.cuda.synchronize if tokens.is_cuda else (lambda: None)
    with torch.inference_mode():
        for _ in range(warmup):
            model(tokens)
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            model(tokens)
        sync()
    return tokens.numel() * iters / (time.perf_counter() - start)


def main(argv=None):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--vocab", type=int, default=32000 if cuda else 512)
    p.add_argument("--dim", type=int, default=1024 if cuda else 128)
    p.add_argument("--layers", type=int, default=8 if cuda else 2)
    p.add_argument("--heads", type=int, default=16 if cuda else 4)
    p.add_argument("--kv-heads", type=int, default=4 if cuda else 2)
    p.add_argument("--seq", type=int, default=2048 if cuda else 128)
    p.add_argument("--batch", type=int, default=8 if cuda else 2)
    p.add_argument("--iters", type=int, default=20 if cuda else 3)
    p.add_argument("--warmup", type=int, default=3 if cuda else 1)
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    torch.manual_seed(args.seed)
    sizes = (args.vocab, args.dim, args.layers, args.heads, args.kv_heads)
    ours = GPT(*sizes).to(device, dtype).eval()
    theirs = GPT(*sizes, attention_cls=TorchSDPAAttention).to(device, dtype).eval()
    theirs.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    params = sum(p.numel() for p in ours.parameters())
    print(f"GPT: {args.layers} layers, dim {args.dim}, {args.heads} heads ({args.kv_heads} kv), "
          f"{params / 1e6:.1f}M params, batch {args.batch} x {args.seq} tokens, {dtype} on {device}")
    if args.compile:
        ours, theirs = torch.compile(ours, fullgraph=True), torch.compile(theirs, fullgraph=True)
    with torch.inference_mode():
        diff = (ours(tokens).float() - theirs(tokens).float()).abs().max().item()
    print(f"max |logits(tiled_attn) - logits(torch SDPA)| = {diff:.3e}")
    rates = {name: tokens_per_second(m, tokens, args.iters, args.warmup)
             for name, m in (("tiled_attn", ours), ("torch SDPA", theirs))}
    for name, rate in rates.items():
        print(f"{name:>11}: {rate:12,.0f} tokens/s")
    print(f"tiled_attn / torch SDPA: {rates['tiled_attn'] / rates['torch SDPA']:.2f}x")


if __name__ == "__main__":
    main()
