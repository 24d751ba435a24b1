"""Context parallelism (issue 17): ta.distributed.context_parallel_attention over 1 to 8 GPUs of one
host (B=1, 16 heads, D=128, causal, bf16, zigzag), tokens/s, scaling efficiency against one GPU and
the ratio to torch's context_parallel with SDPA (benchmarks/context_parallel.py spawns one NCCL group
per world size; with fewer than 2 GPUs it reports skipped). 8k to 64k bracket the all-gather rule
(distributed.ALLGATHER_MAX_BYTES = 32 MiB of K/V a rank: 8k tokens at 2 ranks, 16k at 4); 32k to 1M
is the issue's range.

    python -m benchmarks --suite context_parallel [--quick]
    TILED_ATTN_CP_SEQ_LENS=131072,262144 TILED_ATTN_CP_WORLDS=1,4 python -m benchmarks --suite context_parallel

The whole suite takes longer than a 10-minute device call on 4 H100s (one GPU's 1M-token forward and
backward alone is ~45 s a call, measured twice): run it in parts with the two variables above (on 4
H200s, 2026-11-28: 32k-256k at W = 1, 2, 4 in 89 s; 512k and 1M at W = 4 and 1 in 187 s).
"""
from . import context_parallel

SEQ_LENS = (8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)
QUICK = (16384, 131072)

# The all-gather variant up to 64k (8× the rule's threshold: where the rule's number comes from);
# the one-GPU SDPA baseline (for reference, in no ratio) up to 256k.
SUITE = context_parallel.ContextParallelSuite(seq_lens=SEQ_LENS, quick_seq_lens=QUICK, worlds=(1, 2, 4, 8),
                                              heads=16, head_dim=128,
                                              max_n={context_parallel.ALLGATHER: 65536, context_parallel.SDPA: 262144})
