"""Targets for Nsight Compute: the kernels behind the two open gaps of 2026-11-26 (H200), each run a
few times so `ncu --launch-skip` can take a warm launch.

    ncu --clock-control none --target-processes all --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
        --section LaunchStats --section WarpStateStats -o OUT/NAME \
        python benchmarks/probe_ncu.py NAME

Targets:
  softmax-fp32-triton / softmax-fp32-cuda / softmax-fp32-torch: 65536x128 fp32, the ladder shape
      where every kernel of ours trails torch.softmax in kernel time (79-81% of copy against 89%).
  decode-contiguous / decode-paged64: ta.attention_kvcache at B=1, GQA 32/8, D=128, bf16, 4096
      keys, contiguous and 64-key pages through a shuffled block table (paged 0.88x contiguous in
      kernel time).
  backward-d64 / backward-d128: the Triton attention backward (delta, dK/dV, dQ kernels) of
      ta.attention at bf16, N = 4096, B·N = 16k tokens, H·D = 2048, not causal: the middle of the
      attention_backward suite, 250-272 TFLOP/s on the H200 where cuDNN's is ~450-550. Each run is
      one backward of a forward made once; `--kernel-name regex:attention_bwd_(dkdv|dq)` with
      `--launch-skip 2 --launch-count 2` takes the second run's two big kernels.
  backward-d64-wgmma / backward-d128-wgmma (-causal): the same backward through backend "cuda" (its
      forward, and the wgmma backward flash_bwd_sm90_kernel); `--kernel-name regex:flash_bwd_sm90`.
  backward-d128-cudnn: the same backward through SDPA's cuDNN backend (issue #13's baseline; its
      backward kernel: `--kernel-name regex:cudnn.*dgrad|bprop` or by launch order).
  fwd-d128-wgmma / fwd-d128-wgmma_ws / fwd-d128-triton: the attention forward at bf16, B = 4,
      H = 16, N = 8192, D = 128, not causal (the attention suite's point where cuDNN leads by
      ~1.2x): the cp.async and warp-specialized wgmma kernels forced, and the Triton default.
  fwd-d128-n512-wgmma_ws / fwd-d128-n512-cudnn: the same at B = 64, N = 512 (session 28: the
      persistent wgmma_ws at 0.81x cuDNN in kernel time there), ours and SDPA's cuDNN kernel.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402


def _targets(dev: torch.device) -> dict:
    g = torch.Generator(device=dev).manual_seed(12)
    x = torch.randn(65536, 128, device=dev, generator=g)
    q = torch.randn(1, 32, 1, 128, device=dev, dtype=torch.bfloat16, generator=g)
    kc = torch.randn(1, 4096, 8, 128, device=dev, dtype=torch.bfloat16, generator=g)
    lens = torch.full((1,), 4096, dtype=torch.int32, device=dev)
    table = torch.randperm(64, device=dev, generator=g).view(1, 64).to(torch.int32)
    pool = torch.empty(64, 64, 8, 128, device=dev, dtype=torch.bfloat16)
    pool[table[0].long()] = kc.view(64, 64, 8, 128)
    def backward(d, backend="triton", causal=False):
        state = []  # made at the first call: only the probed target allocates

        def run():
            if not state:
                b, h, n = 4, 2048 // d, 4096
                qkv = [torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
                       for _ in range(3)]
                if backend == "cudnn":
                    from torch.nn.attention import SDPBackend, sdpa_kernel
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        out = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=causal)
                else:
                    out = ta.attention(*qkv, causal=causal, backend=backend)
                state.extend([out, qkv, torch.randn(out.shape, device=dev, dtype=out.dtype, generator=g)])
            out, qkv, dout = state
            return torch.autograd.grad(out, qkv, dout, retain_graph=True)
        return run

    def forward(kernel, b=4, n=8192):
        state = []

        def run():
            if not state:
                state.extend(torch.randn(b, 16, n, 128, device=dev, dtype=torch.bfloat16, generator=g)
                             for _ in range(3))
            if kernel == "triton":
                return ta.attention(*state, backend="triton")
            if kernel == "cudnn":
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(*state)
            from tiled_attn.cuda import attention as cuda_attention
            with cuda_attention.forced_kernel(kernel):
                return ta.attention(*state, backend="cuda")
        return run

    return {
        "fwd-d128-wgmma": forward("wgmma"),
        "fwd-d128-wgmma_ws": forward("wgmma_ws"),
        "fwd-d128-triton": forward("triton"),
        "fwd-d128-n512-wgmma_ws": forward("wgmma_ws", 64, 512),
        "fwd-d128-n512-cudnn": forward("cudnn", 64, 512),
        "backward-d64": backward(64),
        "backward-d128": backward(128),
        "backward-d64-wgmma": backward(64, "cuda"),
        "backward-d128-wgmma": backward(128, "cuda"),
        "backward-d128-wgmma-causal": backward(128, "cuda", True),
        "backward-d128-cudnn": backward(128, "cudnn"),
        "softmax-fp32-triton": lambda: ta.softmax(x, backend="triton"),
        "softmax-fp32-cuda": lambda: ta.softmax(x, backend="cuda"),
        "softmax-fp32-torch": lambda: torch.softmax(x, -1),
        "decode-contiguous": lambda: ta.attention_kvcache(q, kc, kc, lens),
        "decode-paged64": lambda: ta.attention_kvcache(q, pool, pool, lens, block_table=table),
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    dev = torch.device("cuda")
    targets = _targets(dev)
    if len(argv) != 1 or argv[0] not in targets:
        print(f"usage: probe_ncu.py NAME, NAME one of {', '.join(targets)}")
        return 2
    fn = targets[argv[0]]
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
