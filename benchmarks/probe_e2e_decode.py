"""Where a generate() step's time goes, "tiled_attn" against "sdpa" (the e2e suite's decode rows).

    PYTHONPATH=. python benchmarks/probe_e2e_decode.py [--out DIR] [--passes 9] [--batches 1 8]

Why: the e2e suite of 2026-11-27 (H100) read decode tokens/s 1.09x "sdpa" at batch 1 but 0.91x at
batch 8 for the Llama-3.2-1B shape (0.91x is ~1.9 ms a step slower; our attention call's host cost
is below F.sdpa's at these shapes, so 16 attention calls a step cannot explain it by their cost
alone). This measures, for each batch, `--passes` interleaved generate() passes of each model
(tokens/s per pass, so noise and drift show), then for one generate() of each model: torch.profiler's
CPU ops by self time and CUDA kernels by total time (is a kernel slow, or the host?), and cProfile's
top functions by own time of ours. Same models, prompt (128) and new tokens (64) as the suite.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import end_to_end, suite_e2e  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--passes", type=int, default=9)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--small", action="store_true", help="the suite's small Llama instead of the 1B shape")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = suite_e2e.SMALL if args.small else suite_e2e.LLAMA_3_2_1B_SHAPE
    ours, theirs = end_to_end._models(cfg, device, torch.bfloat16)
    models = {"tiled_attn": ours, "sdpa": theirs}
    gen = torch.Generator().manual_seed(0)
    report = []

    def say(line=""):
        print(line, flush=True)
        report.append(line)

    for b in args.batches:
        p = torch.randint(0, cfg["vocab_size"], (b, 128), generator=gen).to(device)

        def generate(m, p=p):
            with torch.no_grad():
                return m.generate(input_ids=p, attention_mask=torch.ones_like(p), do_sample=False,
                                  max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)
        outs = {k: generate(m) for k, m in models.items()}  # warm-up; greedy: the same tokens
        say(f"## batch {b}: same tokens generated: {torch.equal(outs['tiled_attn'], outs['sdpa'])}")
        rates = {k: [] for k in models}
        for _ in range(args.passes):
            for k, m in models.items():
                rates[k].append(b * args.new_tokens / end_to_end._timed(lambda m=m: generate(m), device))
        for k, r in rates.items():
            say(f"{k:10s} tokens/s median {statistics.median(r):8.1f}  passes " + " ".join(f"{x:.0f}" for x in r))
        say(f"ratio of medians {statistics.median(rates['tiled_attn']) / statistics.median(rates['sdpa']):.3f}")
        # Each pass of one model runs right after the other's: their ratio shares the host's state
        # of that moment, so the median of the pair ratios is the drift-free comparison.
        pairs = sorted(a / c for a, c in zip(rates["tiled_attn"], rates["sdpa"]))
        say(f"pair ratios (tiled_attn / sdpa, each pass with the next): median {statistics.median(pairs):.3f}, "
            f"quartiles {pairs[len(pairs) // 4]:.3f}-{pairs[(3 * len(pairs)) // 4]:.3f}, "
            f"{sum(x >= 1 for x in pairs)} of {len(pairs)} >= 1")
        from torch.profiler import ProfilerActivity, profile
        for k, m in models.items():
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=acts) as prof:
                generate(m)
                end_to_end._sync(device)
            avg = prof.key_averages()
            say(f"\n### batch {b} {k}: CPU ops by self time (one generate, {args.new_tokens} steps)")
            say(avg.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
            say(f"### batch {b} {k}: CUDA kernels by total time")
            say(avg.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60))
        pr = cProfile.Profile()
        pr.enable()
        generate(ours)
        end_to_end._sync(device)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        say(f"### batch {b} tiled_attn: cProfile, own time\n" + s.getvalue())
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "probe_e2e_decode.txt").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
