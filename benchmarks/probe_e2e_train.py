"""Where a transformers training step's time goes, "tiled_attn" against "sdpa" (issue 13: the e2e
training step is 0.90x "sdpa" on the H100 though the attention kernels are a small share of it).

    python benchmarks/probe_e2e_train.py --out DIR [--config llama-3.2-1b-shape] [--n 2048] [--steps 6]

The models are benchmarks/end_to_end.py's (random weights from suite_e2e's config, one deep copy
per attn_implementation, bf16). After a warm-up, both steps (forward + backward of the LM loss, as
the e2e suite's `step`) are timed interleaved, wall clock per step with a device sync (the suite's
timing), then one step of each is profiled (torch.profiler, CPU + CUDA). Per model: the step's wall
time; the GPU's busy time (union of kernel intervals) and idle time inside the step; kernel time by
kind (our attention kernels, torch's SDPA kernels, GEMMs, elementwise / reductions, copies,
other); the count of kernel launches; the host (CPU) time of the top-level autograd/attention ops.
Then the kernels whose total time differs most between the two steps, and the host ops whose
self CPU time differs most. Writes DIR/probe-e2e-train.json and .txt (the summary, also printed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import end_to_end as E  # noqa: E402
from benchmarks import suite_e2e  # noqa: E402
from benchmarks.probe_context_parallel import _measure, _union  # noqa: E402

CONFIGS = {"llama-3.2-1b-shape": suite_e2e.LLAMA_3_2_1B_SHAPE, "small": suite_e2e.SMALL}


def kind(name: str) -> str:
    low = name.lower()
    if any(k in name for k in E.OURS_KERNELS):
        return "ours (attention)"
    if any(k in low for k in E.TORCH_SDPA_KERNELS):
        return "torch sdpa"
    if "gemm" in low or "cutlass" in low or "sm90_xmma" in low or "nvjet" in low or "cublas" in low:
        return "gemm"
    if "memcpy" in low or "memset" in low or "copy" in low or "cat" in low:
        return "copy / fill"
    if "elementwise" in low or "reduce" in low or "softmax" in low or "norm" in low:
        return "elementwise / reduce"
    return "other"


def profile_step(step, device) -> dict:
    from torch.profiler import ProfilerActivity, profile
    E._sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        E._sync(device)
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    iv = [(e.time_range.start, e.time_range.end) for e in kernels]
    span = (max(e for _, e in iv) - min(s for s, _ in iv)) if iv else 0.0
    busy = _measure(_union(iv))
    by_kind: dict = {}
    by_name: dict = {}
    for e in kernels:
        dur = e.time_range.end - e.time_range.start
        by_kind[kind(e.name)] = by_kind.get(kind(e.name), 0.0) + dur
        by_name[e.name[:90]] = by_name.get(e.name[:90], 0.0) + dur
    host = {}
    for a in prof.key_averages():
        if a.self_cpu_time_total > 0:
            host[a.key[:90]] = a.self_cpu_time_total
    return {"kernel_span_us": span, "gpu_busy_us": busy, "gpu_idle_in_span_us": span - busy,
            "kernels": len(kernels), "kernel_us_by_kind": by_kind, "kernel_us_by_name": by_name,
            "host_self_us_by_op": host}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", default="llama-3.2-1b-shape", choices=sorted(CONFIGS))
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (no kernels to see)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    ours, theirs = E._models(CONFIGS[args.config], device, torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, CONFIGS[args.config]["vocab_size"], (1, args.n), generator=gen).to(device)

    def step(m):
        m.train()
        m.zero_grad(set_to_none=True)
        m(input_ids=x, labels=x).loss.backward()
        m.eval()
    models = {"tiled_attn": ours, "sdpa": theirs}
    samples: dict = {}
    E._pair({k: (lambda m=m: step(m)) for k, m in models.items()}, args.steps, device, warmup=2, samples=samples)
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "config": args.config, "n": args.n,
              "command": " ".join(sys.argv), "step_ms": {k: [s * 1e3 for s in v] for k, v in samples.items()},
              "profiles": {k: profile_step(lambda m=m: step(m), device) for k, m in models.items()}}
    (args.out / "probe-e2e-train.json").write_text(json.dumps(result, indent=1))
    text = _text(result)
    (args.out / "probe-e2e-train.txt").write_text(text)
    print(text)


def _text(r: dict) -> str:
    lines = [f"{r['device']}: {r['config']} training step, N={r['n']}, bf16; {r['command']}", ""]
    for k, v in r["step_ms"].items():
        lines.append(f"  {k:10s} step {statistics.median(v):8.2f} ms (median of {len(v)}; "
                     f"{', '.join('%.1f' % x for x in v)})")
    lines.append("")
    p = r["profiles"]
    kinds = sorted({kk for v in p.values() for kk in v["kernel_us_by_kind"]})
    lines.append(f"  {'profiled step (ms)':28s}" + "".join(f"{k:>14s}" for k in p))
    for label, key in (("kernel span", "kernel_span_us"), ("GPU busy", "gpu_busy_us"),
                       ("GPU idle inside the span", "gpu_idle_in_span_us")):
        lines.append(f"  {label:28s}" + "".join(f"{p[k][key] / 1e3:14.2f}" for k in p))
    lines.append(f"  {'kernel launches':28s}" + "".join(f"{p[k]['kernels']:14d}" for k in p))
    for kk in kinds:
        lines.append(f"  {kk:28s}" + "".join(f"{p[k]['kernel_us_by_kind'].get(kk, 0.0) / 1e3:14.2f}" for k in p))
    a, b = p["tiled_attn"], p["sdpa"]
    for title, key in (("kernels whose total differs most (ms, tiled_attn - sdpa)", "kernel_us_by_name"),
                       ("host ops whose self CPU time differs most (ms, tiled_attn - sdpa)", "host_self_us_by_op")):
        names = set(a[key]) | set(b[key])
        diff = sorted(names, key=lambda n: -abs(a[key].get(n, 0.0) - b[key].get(n, 0.0)))[:14]
        lines += ["", title]
        lines += [f"  {(a[key].get(n, 0.0) - b[key].get(n, 0.0)) / 1e3:+9.3f}  ours {a[key].get(n, 0.0) / 1e3:8.3f}"
                  f"  sdpa {b[key].get(n, 0.0) / 1e3:8.3f}  {n}" for n in diff]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
