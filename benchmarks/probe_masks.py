"""A first measurement of issue #15's bars on the GPU, before the `varlen`/`kvcache` suites exist
in the shared harness: eager calls, back to back (triton.testing.do_bench: CUDA events around
repeated calls, so host cost shows where a call is host-bound), bf16.

    python benchmarks/probe_masks.py --out results.json

1. window: causal attention at N = 16k with a sliding window of 256 .. 8192 keys against none:
   the time must grow with the window, not with N (masked tiles skipped).
2. ext: the same dense problem through the extension kernel (a window no row reaches) against the
   dense kernel: the cost of the extensions when unused.
3. varlen: uniform packed sequences against the dense kernel on the same (B, H, N, D) batch
   (bar: >= 0.95x), and ragged lengths counted on valid pairs.
4. kvcache: decode (Nq = 1) against a cache of 4k / 32k keys, contiguous and paged (16/64/256),
   against ta.attention on the dense (B, Hkv, N, D) keys and F.scaled_dot_product_attention
   (bar: paged >= 0.95x contiguous at page >= 64).
5. key padding through ta.scaled_dot_product_attention against F.scaled_dot_product_attention
   with the same mask.
"""
from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import tiled_attn as ta
from tiled_attn.attention import masked_attention

DEV = "cuda"
DT = torch.bfloat16


def t_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=150)


def flops(pairs: float, d: int, heads: int) -> float:
    return 4.0 * pairs * d * heads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []

    def rec(group, case, ms, **kw):
        rows.append(dict(group=group, case=case, ms=ms, **kw))
        extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items())
        print(f"{group:8s} {case:44s} {ms:8.3f} ms  {extra}", flush=True)

    # 1-2. window scaling and the ext kernel's overhead
    b, h, n, d = 1, 16, 16384, 128
    q, k, v = (torch.randn(b, h, n, d, device=DEV, dtype=DT) for _ in range(3))
    base = t_ms(lambda: ta.attention(q, k, v, causal=True))
    rec("window", "causal, no window (dense kernel)", base, tflops=flops(n * (n + 1) / 2, d, b * h) / base / 1e9)
    ext = t_ms(lambda: ta.attention(q, k, v, causal=True, window=(n + 1, -1)))
    rec("ext", "causal, unreachable window (ext kernel)", ext, vs_dense=base / ext)
    for w in (256, 1024, 4096, 8192):
        ms = t_ms(lambda: ta.attention(q, k, v, causal=True, window=(w, -1)))
        pairs = sum(min(i + 1, w + 1) for i in range(0, n, 64)) * 64
        rec("window", f"causal window left={w}", ms, vs_full=base / ms, tflops=flops(pairs, d, b * h) / ms / 1e9)
    sc = t_ms(lambda: ta.attention(q, k, v, causal=True, softcap=30.0))
    rec("softcap", "causal softcap=30", sc, vs_dense=base / sc)
    slopes = torch.rand(h, device=DEV)
    al = t_ms(lambda: ta.attention(q, k, v, causal=True, alibi_slopes=slopes))
    rec("alibi", "causal alibi", al, vs_dense=base / al)
    del q, k, v

    # 3. varlen
    hq, hkv, d = 32, 8, 128
    for causal in (False, True):
        bs, n = 8, 2048
        q = torch.randn(bs, hq, n, d, device=DEV, dtype=DT)
        k = torch.randn(bs, hkv, n, d, device=DEV, dtype=DT)
        v = torch.randn_like(k)
        dense = t_ms(lambda: ta.attention(q, k, v, causal=causal))
        qp, kp, vp = (t.transpose(1, 2).reshape(bs * n, t.shape[1], d).contiguous() for t in (q, k, v))
        cu = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=DEV)
        vl = t_ms(lambda: ta.attention_varlen(qp, kp, vp, cu, cu, n, n, causal=causal))
        pairs = bs * (n * (n + 1) / 2 if causal else n * n)
        rec("varlen", f"uniform 8x2048 causal={causal}", vl, vs_dense=dense / vl,
            tflops=flops(pairs, d, hq) / vl / 1e9, dense_tflops=flops(pairs, d, hq) / dense / 1e9)
        gen = torch.Generator().manual_seed(1)
        lens = [int(x) for x in torch.randint(128, 4096, (8,), generator=gen)]
        tot = sum(lens)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=DEV)
        qp, kp, vp = (torch.randn(tot, hh, d, device=DEV, dtype=DT) for hh in (hq, hkv, hkv))
        vl = t_ms(lambda: ta.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens), causal=causal))
        pairs = sum(L * (L + 1) / 2 if causal else L * L for L in lens)
        rec("varlen", f"ragged {lens} causal={causal}", vl, tflops=flops(pairs, d, hq) / vl / 1e9)
        del q, k, v, qp, kp, vp

    # 4. kvcache decode
    for bs in (1, 8, 32):
        for nk in (4096, 32768):
            q = torch.randn(bs, hq, 1, d, device=DEV, dtype=DT)
            kc = torch.randn(bs, nk, hkv, d, device=DEV, dtype=DT)
            vc = torch.randn_like(kc)
            lens = torch.full((bs,), nk, dtype=torch.int32, device=DEV)
            bytes_ = 2 * bs * nk * hkv * d * 2
            cont = t_ms(lambda: ta.attention_kvcache(q, kc, vc, lens))
            rec("kvcache", f"B={bs} Nk={nk} contiguous", cont, GBs=bytes_ / cont / 1e6)
            k4, v4 = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
            dec = t_ms(lambda: ta.attention(q, k4, v4))
            rec("kvcache", f"B={bs} Nk={nk} ta.attention dense", dec, GBs=bytes_ / dec / 1e6, vs_contig=cont / dec)
            sd = t_ms(lambda: F.scaled_dot_product_attention(q, k4, v4, enable_gqa=True))
            rec("kvcache", f"B={bs} Nk={nk} F.sdpa", sd, GBs=bytes_ / sd / 1e6)
            for page in (16, 64, 256):
                per = nk // page
                perm = torch.randperm(bs * per, device=DEV)
                table = perm.reshape(bs, per).to(torch.int32)
                kpg = torch.empty(bs * per, page, hkv, d, device=DEV, dtype=DT)
                vpg = torch.empty_like(kpg)
                kpg[table.long()] = kc.reshape(bs, per, page, hkv, d)
                vpg[table.long()] = vc.reshape(bs, per, page, hkv, d)
                pg = t_ms(lambda: ta.attention_kvcache(q, kpg, vpg, lens, block_table=table))
                rec("kvcache", f"B={bs} Nk={nk} paged {page}", pg, GBs=bytes_ / pg / 1e6, vs_contig=cont / pg)
                del kpg, vpg
            del q, kc, vc, k4, v4

    # 5. key padding through the SDPA drop-in
    bs, n = 4, 2048
    q = torch.randn(bs, hq, n, d, device=DEV, dtype=DT)
    k = torch.randn(bs, hkv, n, d, device=DEV, dtype=DT)
    kr = k.repeat_interleave(hq // hkv, 1)
    mask = torch.ones(bs, 1, 1, n, dtype=torch.bool, device=DEV)
    for i, L in enumerate((512, 1024, 1536, 2048)):
        mask[i, ..., :n - L] = False  # left padding
    ours = t_ms(lambda: ta.scaled_dot_product_attention(q, kr, kr, attn_mask=mask))
    theirs = t_ms(lambda: F.scaled_dot_product_attention(q, kr, kr, attn_mask=mask))
    rec("sdpa", "key padding (4, 32, 2048, 128) left-padded", ours, vs_torch=theirs / ours, torch_ms=theirs)
    masked = t_ms(lambda: masked_attention(q, k, k, mask[:, 0, 0], causal=True))
    rec("sdpa", "key padding + causal, GQA (masked_attention)", masked)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
