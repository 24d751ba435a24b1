"""Context parallelism (issue #17): attention over a sequence split across the ranks of a
torch.distributed process group, the partial results merged with the online-softmax state.

    ta.distributed.context_parallel_attention(q, k, v, *, group=None, causal=False, scale=None,
                                              layout="zigzag", return_lse=False, strategy=None)

Each rank passes its shard of the sequence: q (B, Hq, N/world, D), k, v (B, Hkv, N/world, D),
Hq % Hkv == 0, and gets its shard of the output (and of lse, (B, Hq, N/world), natural log).

Layouts. The global sequence is cut into equal chunks. layout="zigzag": 2·world chunks, rank r holds
chunks r and 2·world−1−r, concatenated in that order along N (so its local N must be even);
layout="contiguous": world chunks, rank r holds chunk r. Without `causal` the layout changes nothing
(attention is blind to the order of keys); with it, contiguous sharding leaves the last rank the most
work (its queries see every key) and the first rank almost none, while zigzag gives every rank the
same: each holds one early and one late chunk. `causal` is the full sequence's mask (global query i
sees global key j iff j <= i, one sequence: q and k shards of the same length).

The ring (strategy "ring"). K/V travel around the ranks: at step t rank r holds the K/V of rank
r − t and sends them on to r + 1 while receiving the next ones from r − 1 (dist.batch_isend_irecv
of dist.P2POp). Each transfer is posted from a side stream as soon as the one before it has
arrived, one step ahead of the compute that needs it (two in the backward), so it overlaps the
compute (_KVRing says why a side stream); world − 1 transfers in all. Per (query chunk, key
chunk) pair: a key chunk before the query chunk is attended in full, the same chunk with the causal
diagonal, a chunk after is skipped (no compute). Each step's pairs become a few calls of the public ta.attention(...,
return_lse=True) on views of q and of the K/V held (so any backend the tensors pick; GQA and head
dims as ta.attention): the own step is the local causal mask (the local chunks ascend, so the
global mask restricted to them is the local causal one), in the forward as two calls by query rows
(_own_calls: a short first kernel lets the first transfer in early); another rank's step is one
full call (zigzag: every query against the other rank's first chunk when that rank is earlier, or
the second local query chunk against both of its chunks when it is later: half a block either way).
Each call's (out, lse) is merged into a float32 (float64 for float64 inputs) accumulator: a
finished result is the online state (m = lse, l = 1) with the accumulator out, so this is the same
merge as split-KV decode, -inf guard included (a row whose keys so far were all masked, lse = -inf,
merges without NaN). On CUDA one Triton kernel does it in one pass (triton/merge_outputs.py, the
online verbs of triton/online.py); elsewhere, and for float64, reference.merge_attention_outputs
(about a dozen torch ops: measured 37.5 vs 34.6 ms a forward on 4 H100s at N = 128k). The
partial outputs arrive in the input dtype (ta.attention's), so 16-bit inputs carry one extra
rounding per partial.

Backward (strategy "ring"): a torch.autograd.Function saves the local q, k, v and the merged out and
lse, and runs the ring again. For each K/V block the library's tiled backward
(attention._backward_impl with backend=None's backward for these tensors: the wgmma kernel where
attention._with_backward selects it, e.g. sm90 with D 64/128 in 16 bits, else the forward's
backend) is given the GLOBAL out and lse: P recomputed from the global lse is then exactly that
block of the global softmax, and delta = rowsum(dO·O) − dlse uses the global O, so the blocks'
gradients add up to the global ones (dlse, the gradient of the returned lse, enters through delta).
Each block's gradients are written in float32 (grad_dtype) and summed unrounded: rounded to 16 bits
per block, a sum of a few partials broke DESIGN §4's rule on dV (4.9e-2 against 4.4e-2 allowed,
2 ranks on two H200s, bf16). dQ accumulates locally; the K/V gradients of a block belong to its
owner: they travel around a second ring (tag 1), each rank adding its contribution to the sums it
receives before passing them on, so that after world − 1 hops the other ranks' gradients of a
rank's K/V arrive at their owner. Each transfer is posted after a step's compute and waited for
after the next step's, and the own step is split (_own_calls): its first part runs while the
first K/V arrive, its rest while the last sums travel home (_ring_backward), so every transfer
overlaps compute. Gradients accumulate and travel in float32 (float64 for float64). The ring's
transfers go through a high-priority twin of an NCCL group (_transfer_group says why). Like any
collective, every rank must run the backward.

The all-gather variant (strategy "allgather"): one dist.all_gather of K/V, reordered into the global
sequence, then per local query chunk one ta.attention over the keys it can see (causal: the chunk's
prefix of the sequence, bottom-right aligned), autograd through ta.attention's own backward; the
backward reduce-scatters the K/V gradients (in float32) back to their owners. Rule, for
strategy=None: all-gather when this rank's K/V shard (2·B·Hkv·N/world·D elements) is at most
ALLGATHER_MAX_BYTES (32 MiB), else the ring. Why: the ring makes world − 1 dependent steps, each
with a latency floor (a P2P round trip, the launches and a merge) that only a step's compute,
growing as (N/world)², can hide; for short sequences it cannot, and one all-gather (bandwidth-
optimal, the same bytes per rank as the ring) wins. The more ranks, the more steps, so the bound is
per shard: the whole K/V it allows grows with the group. Measured on 4 H100s (NVLink, NCCL; causal
zigzag, bf16, B = 1, 16 heads, D = 128, so a shard of N/world tokens holds 8 KiB a token;
benchmarks/results/2026-11-27-h100x4-context_parallel-cut.md), the all-gather against the ring,
forward / forward+backward: 2 ranks, 8k tokens (32 MiB a shard) 1.8× / 1.14×, 16k (64 MiB) 0.77× /
0.96×; 4 ranks, 8k (16 MiB) 3.4× / 2.9×, 16k (32 MiB) 1.9× / 1.7×, 32k (64 MiB) 1.05× / 1.04×,
64k 0.93× / 1.03×. Its cost is memory, the whole K/V on every rank. strategy="ring"/"allgather"
overrides the rule.

Checks (DESIGN §5). Everything ta.attention checks, plus: an initialized process group (group=None:
the default one; else a ProcessGroup this rank belongs to), a known layout and strategy, even local
lengths for zigzag, q and k shards of one length when causal, and tensors the group's backend can
carry (NCCL: CUDA tensors; gloo: CPU tensors: its send/recv read CUDA memory as host memory). Every
rank's shard shapes, dtype, causal, layout, strategy, scale, whether a gradient is needed and
whether the call is compiled must agree: checked ONCE per call signature with one small all_gather
of an integer descriptor, cached (_SIGNATURES, a _plan.PlanCache), never per call (a compiled call:
once per compiled graph, below). A rank whose own arguments are invalid still takes part in that
all_gather (it sends a "rejected" row), so every rank raises instead of one rank raising and the
others waiting in the ring forever. (_SIGNATURES is left out of _plan.clear_all: clearing it
on one rank only would send that rank alone into the check's collective.)

torch.compile. A traced call (torch.compiler.is_compiling()) takes _traced_call, which Dynamo
traces whole: no graph break, fullgraph=True compiles it. What differs from the eager path, and why:
- Checks. _validate runs as traced Python (on the specialized shapes it folds away). The cross-rank
  agreement cannot run in the graph: its verdict is data on the device, and raising on it would take
  a host read (a graph break) or a device assert (a CUDA crash, not an error). So it runs while
  Dynamo traces: _agree_at_trace is torch._dynamo.assume_constant_result, which Dynamo calls for
  real, once per compiled graph, making its answer (None, or the error) a constant of the graph; it
  is the eager _agree, before any collective of the call. Each shard size is specialized
  (operator.index: a guard) so the check holds for the graph's one shape; a new shape recompiles
  and checks again (automatic dynamic shapes do not apply to these sizes, and a size marked with
  torch._dynamo.mark_dynamic is refused: Dynamo's ConstraintViolationError). Being a collective at
  trace time, it needs every rank to compile the same graphs at the same points (SPMD: the same
  code, shapes, strides and grad mode), as torch._dynamo.config.enable_compiler_collectives does;
  a graph loaded without tracing (torch._dynamo.config.caching_precompile) skips it. A rank
  compiling while another calls eagerly fails the check (the descriptor's last field), since their
  transfers would never pair. A bad argument raises on every rank: without fullgraph our own error
  (Dynamo runs the call eagerly); with fullgraph=True inside Dynamo's Unsupported ("Observed
  exception": Dynamo lets no exception leave a fullgraph region).
- Transfers: torch's functional collectives, which Dynamo traces and which have autograd forms. A
  ring step is one all_to_all_single_autograd whose only non-empty splits send to the next rank and
  receive from the previous (dist.batch_isend_irecv has a traced form in torch 2.13, the functional
  batch_p2p_ops, but no autograd one); its backward is the reverse shift, so dK/dV travel back to
  their owners hop by hop, autograd adding each step's own gradient to the one arriving. The
  all-gather is all_gather_single_autograd (all_gather_tensor_autograd before torch 2.13), whose
  backward reduce-scatters the gradients.
- Compute: the eager ring's ta.attention(..., return_lse=True) calls and
  reference.merge_attention_outputs merges, in the same order, written without in-place writes
  (slice_scatter); the gradients are autograd's through them (ta.attention's traced op has its
  tiled backward), not the eager ring backward. Every rank must use every collective's result: one
  it leaves unused is dead code to the compiler there, and autograd never runs its backward there,
  while the other ranks wait in it. So a ring step without a block (contiguous causal: a later
  rank's keys) attends to none of them instead (no rows, an exact no-op).
- Cost. With a gradient, autograd keeps every step's K/V for the backward: the whole sequence's
  K/V per rank, as the all-gather holds (the eager backward runs the ring again instead). Autograd
  gives a gradient its tensor's dtype, so for 16-bit inputs K/V travel in float32 when they need a
  gradient (twice the forward's bytes) and q is cast per block from a float32 copy: the gradients
  are then summed in float32 at every hop and step, as the eager backward sums them. Under
  aot_eager a transfer is waited for right after it is posted (no overlap); Inductor may move the
  wait (torch._inductor.config.reorder_for_compute_comm_overlap, off by default; not measured).
- Results. Under aot_eager the forward (out, lse) is the eager forward bit for bit (the same
  kernels in the same order; the merges' arithmetic is the same); Inductor may fuse the merges, so
  there DESIGN §4's rule holds, not bit equality. The all-gather's gradients are eager's bit for
  bit (the same backward kernels and reduce-scatter); the ring's hold to the rule (a different
  split of the same sums: within 1e-6 of eager's in float32, world sizes 2 and 4).
Verified on the CPU, torch 2.13, gloo (tests/test_distributed.py), at world size 1 (both
strategies: torch._dynamo.explain counts one graph and zero breaks; the forward and backward graphs
hold our attention ops; loss and gradients are eager's bit for bit; bad input raises) and on 2 ranks
(the ring: causal zigzag with GQA and return_lse in float32 and in bfloat16, causal contiguous with
GQA; the all-gather: causal zigzag with GQA and return_lse): fullgraph=True; one forward and one
backward graph, holding the shift and its reverse or the gather and its reduce-scatter, in float32
for bf16 inputs; the rule against the whole sequence in float64; the forward bit for bit eager's;
the check ran once per rank; arguments that differ across ranks, or compiling on one rank only,
raise on both. By hand, not in CI: world size 4 under aot_eager (the three float32 cases: the same
findings), and Inductor (CPU, C++ codegen) at world sizes 2 and 4 (the four cases, the rule; the
forward within 2.4e-7 of eager's). On one H200 (2026-11-26) the GPU test passed: Inductor, two
ranks sharing the GPU (gloo, transfers staged through the CPU), the ring and the all-gather in bf16.

Verified where: on the CPU with gloo at world sizes 1, 2 and 4, including a subgroup, against the
float64 reference of the whole sequence under DESIGN §4's rule, forward and backward, and the merge
kernel under the interpreter (tests/test_distributed.py). On 4 H100s (nvidia-h100-x4, 2026-11-27):
NCCL with one rank per GPU at 2 and 4 ranks, eager (forward and backward; ring and all-gather;
bf16, fp16, float32; D 59 to 128; GQA) and compiled with Inductor, passed at 7620174; the eager
tests again after the side-stream ring (18df875); compute-sanitizer memcheck of the merge kernel,
0 errors (it uses no shared memory: nothing for racecheck). The own step's split (0281ec4) ran on
the GPUs only inside the benchmark, whose check of the ring and the all-gather against one GPU
passed at 4 ranks. Figures: benchmarks/results/2026-11-27-h100x4-*. On 4 H200s (nvidia-h200-x4,
2026-11-28, at c3293f8): the GPU tests of tests/test_distributed.py (NCCL at 1, 2 and 4 ranks
eager, with the profiler showing the wgmma backward and no Triton dK/dV kernel on every rank; two
ranks sharing a GPU; Inductor at 2 and 4 ranks and on one shared GPU), with the high-priority twin
group, float32 partials and the split own step; figures: benchmarks/results/2026-11-28-h200x4-*.
"""
from __future__ import annotations

import collections
import contextlib
import math
import operator
import struct
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from . import _checks, _plan, reference
from .attention import _NoDoubleBackward, _backward_impl, _default_backend, _with_backward, attention

__all__ = ["context_parallel_attention", "ALLGATHER_MAX_BYTES", "LAYOUTS", "STRATEGIES"]

LAYOUTS = ("zigzag", "contiguous")
STRATEGIES = ("ring", "allgather")
# strategy=None: the all-gather variant while this rank's K/V shard is at most this many bytes
# (module docstring: why, and the H100 measurements it comes from).
ALLGATHER_MAX_BYTES = 32 << 20


def _allgather_by_rule(k_shard_numel: int, element_size: int) -> bool:
    """strategy=None's choice: the all-gather while this rank's K and V shards fit ALLGATHER_MAX_BYTES."""
    return 2 * k_shard_numel * element_size <= ALLGATHER_MAX_BYTES


# Test aid, not a supported configuration: route every transfer through CPU copies, so that a gloo
# group carries CUDA tensors. tests/test_distributed.py sets it in the two ranks that share one GPU,
# since NCCL refuses two ranks on one device ("Duplicate GPU detected"). Each transfer then costs a
# device sync and two copies, and nothing overlaps.
_STAGE_THROUGH_CPU = False

# The forward ring's merges: None = the fused Triton kernel (triton/merge_outputs.py, one pass over
# the accumulator) on CUDA and reference.merge_attention_outputs (torch ops) elsewhere; True = the
# kernel also on the CPU under TRITON_INTERPRET=1 (tests); False = the torch form everywhere (the
# A/B of benchmarks/probe_context_parallel.py).
_FUSED_MERGE: bool | None = None

# The ring's transfers on a high-priority CUDA stream (see _transfer_group): True = for an NCCL
# group, through a twin of it created once with ProcessGroupNCCL.Options(is_high_priority_stream=
# True); False = through the caller's group as it is (the A/B of
# benchmarks/probe_context_parallel.py --ab-priority).
_HIGH_PRIORITY_RING = True
_TWINS: dict = {}  # caller's group -> its high-priority twin (kept for the process's life)

_KV, _DKV = 0, 1  # P2P tags: the K/V ring and the ring of their gradients
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# ------------------------------------------------------------------------------------------------
# the process group and the tensors it can carry
# ------------------------------------------------------------------------------------------------
def _group(group):
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("context_parallel_attention needs an initialized process group: call "
                         "torch.distributed.init_process_group first (group=None is the default group)")
    if group is None:
        return dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be None or a torch.distributed.ProcessGroup, got {type(group).__name__}")
    return group


def _carrier(backend_name: str, device_type: str) -> str | None:
    """The backend that carries `device_type` tensors in a group whose dist.get_backend is
    `backend_name` ("nccl", "gloo", or per device as "cpu:gloo,cuda:nccl"), or None."""
    name = backend_name.lower()
    if ":" not in name:
        return name
    pairs = dict(p.split(":", 1) for p in name.split(","))
    return pairs.get(device_type)


def _check_device(backend_name: str, device: torch.device, staged: bool = False) -> None:
    """q's device can travel through the group's backend: NCCL carries CUDA tensors only, gloo's
    send/recv CPU tensors only. Backends we do not know (mpi, ucc, ...) are trusted."""
    carrier = _carrier(backend_name, device.type)
    if carrier is None:
        raise ValueError(f"q is on {device}, but the group's backend {backend_name!r} has no backend for "
                         f"{device.type} tensors: pass tensors on a device the group serves")
    if carrier == "nccl" and device.type != "cuda":
        raise ValueError(f"q is on {device}, but the group's backend is NCCL, which carries CUDA tensors "
                         "only: move q, k, v to this rank's GPU, or use a gloo group for CPU tensors")
    if carrier == "gloo" and device.type != "cpu" and not staged:
        raise ValueError(f"q is on {device}, but the group's backend is gloo, whose send/recv carry CPU "
                         "tensors only: use an NCCL group for CUDA tensors (init_process_group('nccl') "
                         "or backend='cpu:gloo,cuda:nccl')")


def _check_device_of(group) -> torch.device:
    """Where the signature check's small tensor lives: the CPU where the group carries CPU tensors
    (or everything is staged through it), else this rank's current GPU."""
    if _STAGE_THROUGH_CPU or _carrier(str(dist.get_backend(group)), "cpu") not in (None, "nccl"):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


# ------------------------------------------------------------------------------------------------
# the plan: chunks, the blocks of each ring step, the transport
# ------------------------------------------------------------------------------------------------
class _Block(NamedTuple):
    """One ta.attention call of a ring step: queries q[:, :, q] against keys k[:, :, k] of the K/V
    held; `causal` is the diagonal (bottom-right aligned, as ta.attention's)."""
    q: slice
    k: slice
    causal: bool


def _chunks(layout: str, world: int, rank: int) -> list[int]:
    """The global chunks `rank` holds, in local order. They ascend: _blocks relies on it."""
    return [rank, 2 * world - 1 - rank] if layout == "zigzag" else [rank]


def _owners(layout: str, world: int) -> list[tuple[int, int]]:
    """Global chunk g lives on rank owners[g][0] at its local chunk owners[g][1]."""
    return [o for _, o in sorted((g, (j, a)) for j in range(world)
                                 for a, g in enumerate(_chunks(layout, world, j)))]


def _blocks(q_chunks: list[int], k_chunks: list[int], nq: int, nk: int, causal: bool) -> list[_Block]:
    """The calls that attend queries of `q_chunks` to keys of `k_chunks`."""
    if not causal:
        return [_Block(slice(0, nq), slice(0, nk), False)]
    if q_chunks == k_chunks:  # the own keys: ascending chunks of one size, so the local causal mask
        return [_Block(slice(0, nq), slice(0, nk), True)]
    # Another rank's chunks: never the same chunk as a query's (ranks hold disjoint chunks), so each
    # key chunk is either before (all visible) or after (skipped). The ones before are a prefix of
    # the ascending local order, and consecutive query chunks that see the same prefix share a call.
    c = nq // len(q_chunks)
    blocks: list[_Block] = []
    for a, g in enumerate(q_chunks):
        before = sum(h < g for h in k_chunks)
        if before == 0:
            continue
        keys = slice(0, before * c)
        if blocks and blocks[-1].k == keys and blocks[-1].q.stop == a * c:
            blocks[-1] = _Block(slice(blocks[-1].q.start, (a + 1) * c), keys, False)
        else:
            blocks.append(_Block(slice(a * c, (a + 1) * c), keys, False))
    return blocks


def _steps(layout: str, world: int, rank: int, nq: int, nk: int, causal: bool) -> list[list[_Block]]:
    """steps[t]: the blocks for the K/V of rank − t."""
    mine = _chunks(layout, world, rank)
    return [_blocks(mine, _chunks(layout, world, (rank - t) % world), nq, nk, causal) for t in range(world)]


class _Pending:
    """Transfers posted and not yet waited for: wait() returns the received tensors (on the
    compute device). The sent tensors are held until then: the backend reads them asynchronously."""

    def __init__(self, works, received, sent, device, tag: int):
        self.works, self.received, self.sent, self.device, self.tag = works, received, sent, device, tag

    def wait(self) -> list[torch.Tensor]:
        for w in self.works:
            w.wait()
        self.sent = None
        if self.device is None:
            return self.received
        return [t.to(self.device) for t in self.received]


def _transfer_group(group, staged: bool):
    """The group the ring's transfers go through: `group`, or for a plain NCCL group (while
    _HIGH_PRIORITY_RING) a twin over the same ranks whose NCCL streams have high priority.

    Why: a transfer and the step's compute kernel become ready together (both wait for the
    transfer before), and a GPU hands out the blocks of kernels of equal priority in launch order:
    when the compute kernel wins, the NCCL kernel gets SMs only at that kernel's last wave, and the
    next step waits for its K/V (_KVRing). The blocks of a higher-priority stream are dispatched as
    soon as any SM frees up, so the transfer runs beside the compute kernel instead. NCCL's stream
    priority is fixed when a group is created (ProcessGroupNCCL.Options.is_high_priority_stream, or
    TORCH_NCCL_HIGH_PRIORITY=1 for every group), so a caller's group made without it gets a twin:
    dist.new_group over its ranks, once per group per process (use_local_synchronization: only its
    members take part). Every rank creates it at the same point, the first plan of the group, right
    after the signature check that every rank runs together. Its cost is one more NCCL
    communicator (its buffers on each GPU). A group already on high-priority streams, a gloo or
    mixed group, or _HIGH_PRIORITY_RING = False: the caller's group. Measured on 4 H200s at 128k
    (benchmarks/results/2026-11-28-h200x4-probe-*): 1-5% faster calls with the twin, in an A/B
    whose order favoured it (the probe now rotates it): not yet shown to matter."""
    if staged or not _HIGH_PRIORITY_RING or dist.get_backend(group) != "nccl":
        return group
    twin = _TWINS.get(group)
    if twin is None:
        try:
            if group._get_backend(torch.device("cuda")).options.is_high_priority_stream:
                _TWINS[group] = group
                return group
        except Exception:  # noqa: BLE001 -- no such accessor in this torch: make the twin
            pass
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = True
        twin = _TWINS[group] = dist.new_group(dist.get_process_group_ranks(group), pg_options=opts,
                                              use_local_synchronization=True)
    return twin


class _Comm:
    """The group's transfers as the ring and the all-gather variant use them."""

    def __init__(self, group, world: int, rank: int, staged: bool, ring: bool = False):
        """ring: the transfers of a plan (through _transfer_group's twin where it applies); else the
        caller's group as it is (the signature check's one all_gather)."""
        self.world, self.rank, self.staged = world, rank, staged
        self.group = _transfer_group(group, staged) if ring and world > 1 else group
        self.next = dist.get_global_rank(group, (rank + 1) % world)
        self.prev = dist.get_global_rank(group, (rank - 1) % world)
        self._side: dict = {}

    def side_stream(self, device: torch.device):
        """The CUDA stream the K/V ring posts its transfers from (None off CUDA or staged): see _KVRing."""
        if self.staged or device.type != "cuda":
            return None
        if device not in self._side:
            self._side[device] = torch.cuda.Stream(device)
        return self._side[device]

    def post(self, tensors, tag: int) -> _Pending:
        """Send `tensors` to the next rank and receive as many of the same shapes from the previous
        one, posted now (one batch_isend_irecv), waited for by the caller later."""
        device = tensors[0].device if self.staged else None
        sent = [t.cpu() if self.staged else t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in sent]
        ops = ([dist.P2POp(dist.isend, t, self.next, self.group, tag) for t in sent]
               + [dist.P2POp(dist.irecv, t, self.prev, self.group, tag) for t in received])
        return _Pending(dist.batch_isend_irecv(ops), received, sent, device, tag)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """(world, *t.shape): every rank's t, by rank."""
        if self.world == 1:
            return t.unsqueeze(0)
        src = t.cpu() if self.staged else t.contiguous()
        out = src.new_empty((self.world * t.shape[0],) + tuple(t.shape[1:]))  # gloo takes the cat form only
        _all_gather(out, src, group=self.group)
        return out.view((self.world,) + tuple(t.shape)).to(t.device)

    def reduce_scatter(self, t: torch.Tensor) -> torch.Tensor:
        """t (world, *shape), rank j's part at t[j]: this rank's part summed over the ranks."""
        if self.world == 1:
            return t[0]
        src = t.cpu() if self.staged else t.contiguous()
        out = src.new_empty(tuple(t.shape[1:]))
        _reduce_scatter(out, src.flatten(0, 1), group=self.group)
        return out.to(t.device)


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class _KVRing:
    """The K/V of the ring's steps, each transfer posted `ahead` steps before the compute that needs it.

    Why a side stream. A transfer (batch_isend_irecv) makes the NCCL stream wait for everything
    enqueued on the stream it is posted from; posted from the compute stream, the transfer for step
    t + 1 waited for step t's kernel, and then competed with step t + 1's kernel for SMs. A GPU
    hands a kernel's blocks out in launch order, so the NCCL kernel (8 blocks of ~100 KB shared
    memory, beside attention blocks of ~230 KB) got SMs only at the last wave of that kernel and
    step t + 2 waited for the transfer. Posted from a side stream that waits only for the previous
    transfer, each transfer is queued as soon as its data has arrived (the compute stream waits for
    that transfer's event alone). Measured on 4 H100s, N = 128k, 16 heads, D = 128 (benchmarks/
    results/2026-11-27-h100x4-probe-context-parallel-{a,b}.txt): a forward 34.6 -> 33.1 ms, its
    kernels 26.5 ms; with the own step split too (_own_calls) 31.5 ms in the next run. What is left
    is not explained yet: a single profiled call shows no exposed transfer on ranks that started
    together, and no trace of back-to-back calls was taken.
    `ahead`: 1 in the forward. The backward's gradient ring shares the NCCL stream (same peers) and
    posts after each step's compute; with `ahead` = 2 the K/V transfers are queued before the
    gradient transfer of the step before, so they never wait behind a step's compute.
    Off CUDA (gloo, or staged through the CPU) the same calls run in order on the one stream.
    """

    def __init__(self, comm: "_Comm", k, v, ahead: int):
        self.comm, self.left = comm, comm.world - 1
        self.side = comm.side_stream(k.device)
        self.latest, self.pending = [k, v], None
        self.ready: collections.deque = collections.deque()  # (received K/V, its arrival event)
        if self.side is not None:  # the caller's k, v are written before they are sent
            self.side.wait_stream(torch.cuda.current_stream(k.device))
        for _ in range(ahead):
            self._post()

    def _post(self) -> None:
        """Post the next transfer (it sends the latest K/V held); nothing once every one is posted."""
        if self.left == 0:
            return
        self.left -= 1
        with _on(self.side):
            if self.pending is not None:
                self._arrived()
            self.pending = self.comm.post(self.latest, _KV)

    def _arrived(self) -> None:
        # buffers allocated on the side stream, waited for there: the compute stream takes them next
        self.latest, self.pending = self.pending.wait(), None
        event = None
        if self.side is not None:
            event = torch.cuda.Event()
            event.record(self.side)
        self.ready.append((self.latest, event))

    def step(self) -> list[torch.Tensor]:
        """The next step's K/V, ready on the compute stream; posts the transfer `ahead` steps on."""
        self._post()
        if not self.ready:
            with _on(self.side):
                self._arrived()
        kv, event = self.ready.popleft()
        if event is not None:
            compute = torch.cuda.current_stream(kv[0].device)
            compute.wait_event(event)
            for t in kv:
                t.record_stream(compute)
        return kv


# torch 2.13 renamed these (the old names warn); older torch has only the old ones.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Plan:
    """A checked signature: the ring's steps (steps[t]: the blocks for the K/V of rank − t), or the
    all-gather variant's chunk order, and the transport."""

    __slots__ = ("comm", "world", "rank", "scale", "causal", "backend", "allgather", "steps", "chunks",
                 "owners", "acc_dtype", "merges")

    def __init__(self, q, k, group, causal: bool, scale: float, layout: str, allgather: bool, staged: bool):
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.comm = _Comm(group, self.world, self.rank, staged, ring=True)
        self.scale, self.causal, self.allgather = scale, causal, allgather
        # The backward's kernels: backend=None's backward for these tensors, as ta.attention's own
        # autograd picks it (attention._with_backward: the wgmma backward where it is selected, e.g.
        # sm90 with D 64/128 in 16 bits; otherwise the forward's backend, Triton on CUDA). The
        # blocks' own checks (cuda.attention_backward.covers) still send a block it does not cover
        # (an odd stride) to the Triton kernels.
        fwd = _default_backend(q)
        both = _with_backward(q, None, fwd)
        self.backend = both[1] if isinstance(both, tuple) else both
        self.acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        nq, nk = q.shape[2], k.shape[2]
        self.chunks = _chunks(layout, self.world, self.rank)
        self.steps = _steps(layout, self.world, self.rank, nq, nk, causal)
        self.owners = _owners(layout, self.world)
        self.merges: dict = {}  # the forward's merge launches (_merge_into), built at first use


# ------------------------------------------------------------------------------------------------
# the ring: forward and backward
# ------------------------------------------------------------------------------------------------
def _fused(acc: torch.Tensor) -> bool:
    if acc.dtype != torch.float32 or _FUSED_MERGE is False:
        return False
    return acc.is_cuda or (_FUSED_MERGE is True and _checks.triton_interpret())


def _merge_meta(d: int) -> dict:
    """The merge kernel's tile for head dim d: 16 elements of each operand a thread (4 warps), since
    a memory-bound pass wants many warps resident (64 a thread took 255 registers, sm_90a)."""
    import triton
    block_d = triton.next_power_of_2(d)
    return dict(HEAD_DIM=d, BLOCK_M=max(1, 2048 // block_d), BLOCK_D=block_d)


def _merge_into(plan: _Plan, where, out, lse, o, l) -> None:
    """out, lse (the float32/64 accumulator's rows of one block) become their merge with a block's
    (o, l): the Triton kernel in one pass where _fused says so, else the torch form."""
    if not _fused(out):
        out[...], lse[...] = reference.merge_attention_outputs(out, lse, o.to(out.dtype), l.to(lse.dtype))
        return
    # One launch per block of the plan; the strides of ta.attention's results are its plan's, so
    # they are part of the key rather than assumed.
    key = (where, o.stride(), l.stride())
    launch = plan.merges.get(key)
    if launch is None:
        import triton

        from .triton.launch import Launch
        from .triton.merge_outputs import merge_outputs_kernel
        b, h, n, d = out.shape
        meta = _merge_meta(d)
        launch = plan.merges[key] = Launch(merge_outputs_kernel, (triton.cdiv(n, meta["BLOCK_M"]), b * h), meta,
                                           out.device)
    launch(out, lse, o, l, *out.stride(), *lse.stride(), *o.stride(), *l.stride(), out.shape[1], out.shape[2])


def _own_calls(blocks: list[_Block], nq: int) -> list[_Block]:
    """The own step (one block over every row: _steps) as two calls by query rows (the forward's
    here; the backward computes the second after the other steps, _ring_backward): rows
    [0, h) against keys [0, h) (causal: the local mask's first part, a quarter of the step's
    work) and rows [h, nq) against every key (causal bottom-right: row h + i sees keys <= h + i).
    Why: the first transfer and the own step's kernel become ready together at the start of a
    call (the transfer waits for the caller's k, v); a GPU hands out blocks in launch order, so
    when the kernel wins, the NCCL kernel gets SMs only at that kernel's last wave and every later
    step waits for its transfer (a model of the dispatch that predicts 4 H100s' 33 ms a forward at
    N = 128k, kernels 26.5). A short first call puts that last wave early. Measured after: 31.5 ms
    (the model predicted ~28; module _KVRing's docstring)."""
    (blk,) = blocks
    h = nq // 2
    if h == 0:
        return blocks
    if blk.causal:
        return [_Block(slice(0, h), slice(0, h), True), _Block(slice(h, nq), blk.k, True)]
    return [_Block(slice(0, h), blk.k, False), _Block(slice(h, nq), blk.k, False)]


def _ring_forward(plan: _Plan, q, k, v):
    b, h, nq, _ = q.shape
    acc_t = plan.acc_dtype
    if plan.world == 1:  # one step, one block over every row: ta.attention's own result
        (blk,), = plan.steps
        o, l = attention(q, k, v, causal=blk.causal, scale=plan.scale, return_lse=True)
        return o, l.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
    ring = _KVRing(plan.comm, k, v, ahead=1)
    # (B, N, H, D) in memory like ta.attention's output (.to(q.dtype) below keeps the layout); the
    # own step's calls write every row once, the later steps merge into them.
    out = torch.empty(b, nq, h, v.shape[-1], dtype=acc_t, device=q.device).transpose(1, 2)
    lse = torch.empty((b, h, nq), dtype=acc_t, device=q.device)
    kv = [k, v]
    for t, blocks in enumerate(plan.steps):
        if t:
            kv = ring.step()
        for i, blk in enumerate(blocks if t else _own_calls(blocks, nq)):
            o, l = attention(q[:, :, blk.q], kv[0][:, :, blk.k], kv[1][:, :, blk.k], causal=blk.causal,
                             scale=plan.scale, return_lse=True)
            if t == 0:
                out[:, :, blk.q].copy_(o)
                lse[:, :, blk.q].copy_(l)
            else:
                _merge_into(plan, (t, i), out[:, :, blk.q], lse[:, :, blk.q], o, l)
    return out.to(q.dtype), lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def _ring_backward(plan: _Plan, q, k, v, out, lse, grad_out, grad_lse):
    """The gradients of the ring, in the order that hides its transfers: the own step's first part
    (_own_calls: a quarter of its work when causal) while the first K/V arrive, then the steps of
    the other ranks' K/V, then the own step's rest while this rank's K/V gradients make their last
    hop home. The gradients of another rank's K/V travel along the ring (tag _DKV): rank r, at the
    step that holds owner o's K/V, adds its block's gradients to the sums received from r − 1 and
    sends them on; after the last step they reach the owner, which adds its own step's. (With the
    own step first, as before, that last hop came after every rank's last kernel: 10-12 ms idle
    of a 155 ms call on 4 H200s at N = 128k, benchmarks/results/2026-11-28-h200x4-probe-*.)"""
    acc_t = plan.acc_dtype

    def block_grads(kv, blk):
        nq_b, nk_b = blk.q.stop - blk.q.start, blk.k.stop - blk.k.start
        dlse = None if grad_lse is None else grad_lse[:, :, blk.q]
        # lse sliced along N is strided; the backward kernels read it as a dense (B, H, Nq). float32
        # gradients: a partial is summed unrounded (the module doc)
        g = _backward_impl(grad_out[:, :, blk.q], q[:, :, blk.q], kv[0][:, :, blk.k], kv[1][:, :, blk.k],
                           out[:, :, blk.q], lse[:, :, blk.q].contiguous(), dlse, plan.scale, blk.causal,
                           nk_b - nq_b, plan.backend, False, grad_dtype=acc_t)
        dq[:, :, blk.q] += g[0]
        return g[1], g[2]

    def add_into(dkv, blk, g):
        dkv[0][:, :, blk.k] += g[0]
        dkv[1][:, :, blk.k] += g[1]

    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    own = [torch.zeros(x.shape, dtype=acc_t, device=x.device) for x in (k, v)]
    # (one rank: one call, nothing to hide)
    first, *rest = _own_calls(plan.steps[0], q.shape[2]) if plan.world > 1 else plan.steps[0]
    ring = _KVRing(plan.comm, k, v, ahead=2) if plan.world > 1 else None
    add_into(own, first, block_grads((k, v), first))
    sums = None  # the K/V gradients of the step's owner, from the ranks before
    for blocks in plan.steps[1:]:
        kv = ring.step()
        dkv = [torch.zeros(x.shape, dtype=acc_t, device=x.device) for x in kv]
        for blk in blocks:
            add_into(dkv, blk, block_grads(kv, blk))
        if sums is not None:
            for acc, s in zip(dkv, sums.wait()):
                acc += s
        sums = plan.comm.post(dkv, _DKV)
    for blk in rest:
        add_into(own, blk, block_grads((k, v), blk))
    if sums is not None:  # after world − 1 hops: the other ranks' gradients of this rank's K/V
        for acc, s in zip(own, sums.wait()):
            acc += s
    return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """The ring forward with autograd recording; the backward is the ring backward. `lse_grad`:
    lse is returned to the caller, so its gradient flows too."""

    @staticmethod
    def forward(ctx, q, k, v, plan, lse_grad):
        out, lse = _ring_forward(plan, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.lse_grad = plan, lse_grad
        if not lse_grad:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        with torch.no_grad():
            dq, dk, dv = _ring_backward(ctx.plan, q, k, v, out, lse, grad_out,
                                        grad_lse if ctx.lse_grad else None)
        if torch.is_grad_enabled():  # create_graph=True: a double backward must raise, not be wrong
            dq, dk, dv = _NoDoubleBackward.apply(dq, dk, dv, q, k, v, grad_out)
        return dq, dk, dv, None, None


# ------------------------------------------------------------------------------------------------
# the all-gather variant
# ------------------------------------------------------------------------------------------------
def _to_global(owners, per: int, shards: torch.Tensor) -> torch.Tensor:
    """(world, ..., N/world, D) shards by rank, `per` chunks each -> (..., N, D) in the global
    sequence's order (owners: _owners)."""
    c = shards.shape[-2] // per
    return torch.cat([shards[j, ..., a * c:(a + 1) * c, :] for j, a in owners], dim=-2)


def _to_shards(owners, per: int, full: torch.Tensor) -> torch.Tensor:
    """_to_global's inverse: (..., N, D) -> (world, ..., N/world, D)."""
    c = full.shape[-2] // len(owners)
    pieces = {o: full[..., g * c:(g + 1) * c, :] for g, o in enumerate(owners)}
    return torch.stack([torch.cat([pieces[(j, a)] for a in range(per)], dim=-2)
                        for j in range(len(owners) // per)])


class _GatherKV(torch.autograd.Function):
    """k, v shards -> the whole sequence's k, v on every rank; backward: each rank's part of the
    summed gradients (one reduce-scatter, in float32 or float64)."""

    @staticmethod
    def forward(ctx, k, v, plan):
        ctx.plan, ctx.dtype = plan, k.dtype
        full = _to_global(plan.owners, len(plan.chunks), plan.comm.all_gather(torch.stack((k, v))))
        return full[0], full[1]

    @staticmethod
    def backward(ctx, dk, dv):
        plan = ctx.plan  # (autograd materializes a missing gradient as zeros)
        parts = _to_shards(plan.owners, len(plan.chunks), torch.stack((dk, dv)).to(plan.acc_dtype))
        mine = plan.comm.reduce_scatter(parts)
        return mine[0].to(ctx.dtype), mine[1].to(ctx.dtype), None


def _allgather_attention(plan: _Plan, q, k, v, return_lse: bool):
    kf, vf = _GatherKV.apply(k, v, plan)
    return _attend_gathered(q, kf, vf, plan.causal, plan.scale, plan.chunks, return_lse)


def _attend_gathered(q, kf, vf, causal: bool, scale: float, chunks: list[int], return_lse: bool):
    """This rank's queries against the whole sequence's K/V: (out, lse or None)."""
    if not causal:
        res = attention(q, kf, vf, scale=scale, return_lse=return_lse)
        return res if return_lse else (res, None)
    c = q.shape[2] // len(chunks)
    # query chunk g sees the sequence's first (g + 1)·c keys, its own chunk's causally: bottom-right
    parts = [attention(q[:, :, a * c:(a + 1) * c], kf[:, :, :(g + 1) * c], vf[:, :, :(g + 1) * c], causal=True,
                       scale=scale, return_lse=return_lse) for a, g in enumerate(chunks)]
    if not return_lse:
        return torch.cat(parts, dim=2), None
    return torch.cat([o for o, _ in parts], dim=2), torch.cat([l for _, l in parts], dim=2)


# ------------------------------------------------------------------------------------------------
# validation and the signature check across ranks
# ------------------------------------------------------------------------------------------------
def _validate(q, k, v, causal, scale, layout, return_lse, strategy) -> float:
    """This rank's arguments on their own (DESIGN §5); returns the scale."""
    _checks.check_attention(q, k, v, scale, None)
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {_checks._names(LAYOUTS)}, got {layout!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be None (the size rule) or one of {_checks._names(STRATEGIES)}, "
                         f"got {strategy!r}")
    nq, nk = q.shape[2], k.shape[2]
    if causal and nq != nk:
        raise ValueError(f"causal attention over one sequence needs q and k shards of the same length, got "
                         f"q's N/world = {nq} and k's {nk}")
    if layout == "zigzag":
        for name, n in (("q", nq), ("k", nk)):
            if n % 2:
                raise ValueError(f"layout='zigzag' holds two equal chunks per rank, so {name}'s local "
                                 f"sequence length must be even, got {n} (pad the sequence to a multiple "
                                 "of 2·world, or use layout='contiguous')")
    return _scale(q.shape[-1], scale)


def _scale(d: int, scale) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


# The descriptor's fields: (what must agree, its slice of the row, how to show it).
_FIELDS = (
    ("q's shard shape (B, Hq, N/world, D)", slice(1, 5), tuple),
    ("k's and v's shard shape (B, Hkv, N/world, D)", slice(5, 9), tuple),
    ("the dtype of q, k, v", slice(9, 10), lambda r: _checks._dtype_name(_DTYPES[r[0]])),
    ("causal", slice(10, 11), lambda r: bool(r[0])),
    ("layout", slice(11, 12), lambda r: LAYOUTS[r[0]]),
    ("strategy", slice(12, 13), lambda r: ((None,) + STRATEGIES)[r[0]]),
    ("scale", slice(13, 14), lambda r: struct.unpack("<d", struct.pack("<q", r[0]))[0]),
    ("whether a gradient is needed (every rank must run the backward ring)", slice(14, 15), lambda r: bool(r[0])),
    # the compiled call's transfers are collectives, the eager ring's P2P: mixed, they would never pair up
    ("whether the call is compiled (torch.compile) or eager", slice(15, 16),
     lambda r: "compiled" if r[0] else "eager"),
)
_ROW = 16


def _descriptor(q_shape, k_shape, dtype, causal, scale: float, layout, strategy, needs_grad: bool,
                traced: bool = False) -> list[int]:
    return [1, *q_shape, *k_shape, _DTYPES.index(dtype), int(causal), LAYOUTS.index(layout),
            ((None,) + STRATEGIES).index(strategy), struct.unpack("<q", struct.pack("<d", scale))[0],
            int(needs_grad), int(traced)]


def _agree(group, mine: list[int] | None, error: Exception | None) -> None:
    """All-gather every rank's descriptor (a rank that rejected its arguments sends a zero row);
    raise this rank's own error, or that another rank rejected its arguments, or the first field
    on which two ranks differ. Every rank raises alike, so none is left waiting in the ring."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    row = torch.tensor(mine if mine is not None else [0] * _ROW, dtype=torch.int64,
                       device=_check_device_of(group))
    rows = _Comm(group, world, rank, False).all_gather(row).tolist()
    if error is not None:
        raise error
    bad = [j for j, r in enumerate(rows) if r[0] == 0]
    if bad:
        raise ValueError(f"rank {bad[0]} of the group rejected its arguments to context_parallel_attention "
                         "(its own error says why): every rank raises here rather than wait in the ring")
    for name, where, show in _FIELDS:
        for j, r in enumerate(rows):
            if r[where] != rows[rank][where]:
                raise ValueError(f"{name} must be the same on every rank of the group, got "
                                 f"{show(rows[rank][where])} on rank {rank} and {show(r[where])} on rank {j}")


# Never cleared by _plan.clear_all on one rank alone (module docstring). (The list's remove() would
# compare caches as dicts: at import every cache is empty, so it took out the first one, the softmax
# plans, which tests then kept from one test to the next.)
_SIGNATURES = _plan.PlanCache("context parallel", clear_all=False)


def _plan_for(q, k, v, group, causal, scale, layout, return_lse, strategy, needs_grad: bool) -> _Plan:
    group = _group(group)
    staged = _STAGE_THROUGH_CPU
    try:
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal,
               type(causal), scale, type(scale), layout, return_lse, type(return_lse), strategy, needs_grad,
               group, staged)
        plan = _SIGNATURES.get(key)
    except (AttributeError, TypeError):  # not tensors, an unhashable argument: validation names it
        key = plan = None
    if plan is not None:
        return plan
    if dist.get_rank(group) < 0:
        raise ValueError("group must be a process group this rank belongs to (dist.get_rank(group) is -1)")
    mine = error = None
    try:
        s = _validate(q, k, v, causal, scale, layout, return_lse, strategy)
        _check_device(str(dist.get_backend(group)), q.device, staged)
        mine = _descriptor(q.shape, k.shape, q.dtype, causal, s, layout, strategy, needs_grad)
    except (TypeError, ValueError) as err:
        error = err
    _agree(group, mine, error)
    world = dist.get_world_size(group)
    allgather = (strategy == "allgather" if strategy is not None
                 else _allgather_by_rule(k.numel(), k.element_size()))
    return _SIGNATURES.put(key, _Plan(q, k, group, causal, s, layout, allgather, staged))


# ------------------------------------------------------------------------------------------------
# the traced path (torch.compile): functional collectives, autograd through the pieces
# ------------------------------------------------------------------------------------------------
# torch 2.13 renamed the autograd-capable gather all_gather_single_autograd (the old name warns
# outside compile); older torch has only the old one.
_gather_autograd = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
_ERROR_TYPES = {"TypeError": TypeError, "ValueError": ValueError}


@torch._dynamo.assume_constant_result
def _agree_at_trace(group_name: str, mine: tuple | None, error: tuple[str, str] | None, staged: bool):
    """The cross-rank check of a compiled call, run for real while Dynamo traces (once per compiled
    graph; its result is a constant of the graph): what _plan_for does per signature, with the
    device check, whose dist.get_backend Dynamo cannot trace. Returns None, or (type name, message)
    of the error every rank raises alike. An exception leaving this function would reach the user as
    Dynamo's InternalTorchDynamoError, so the traced code raises it."""
    group = dist.distributed_c10d._resolve_process_group(group_name)
    if dist.get_rank(group) < 0:
        return ("ValueError", "group must be a process group this rank belongs to (dist.get_rank(group) is -1)")
    err = None if error is None else _ERROR_TYPES[error[0]](error[1])
    row = None
    if err is None:
        q_shape, k_shape, dtype, device, causal, scale, layout, strategy, needs_grad = mine
        try:
            _check_device(str(dist.get_backend(group)), device, staged)
            row = _descriptor(q_shape, k_shape, dtype, causal, scale, layout, strategy, needs_grad, True)
        except (TypeError, ValueError) as e:
            err = e
    try:
        _agree(group, row, err)
    except (TypeError, ValueError) as e:
        return (type(e).__name__, str(e))
    return None


def _shift(x: torch.Tensor, group, world: int, rank: int, staged: bool) -> torch.Tensor:
    """The ring's transfer as a collective: x to the next rank, the previous rank's x back. An
    all_to_all whose only non-empty splits are those two (batch_isend_irecv, the eager ring's, has a
    traceable form but no autograd one); its backward is the reverse shift, which carries each
    gradient back toward its owner."""
    n = x.shape[0]
    send = [n if j == (rank + 1) % world else 0 for j in range(world)]
    recv = [n if j == (rank - 1) % world else 0 for j in range(world)]
    y = funcol.all_to_all_single_autograd(x.cpu() if staged else x.contiguous(), recv, send, group)
    return y.to(x.device) if staged else y


def _traced_ring(q, k, v, group, world: int, rank: int, steps, scale: float, acc_t, q_up: bool, kv_up: bool):
    """The ring's forward as _ring_forward computes it (the same ta.attention calls and merges, in
    the same order), written functionally (slice_scatter, not in-place slices: autograd records it),
    its transfers _shift. q_up, kv_up: carry q and K/V in acc_t, so that their gradients are summed in
    it (autograd gives a tensor's gradient its own dtype; the eager backward sums in float32 too)."""
    b, h, nq, _ = q.shape
    staged = _STAGE_THROUGH_CPU
    out = torch.zeros(b, nq, h, v.shape[-1], dtype=acc_t, device=q.device).transpose(1, 2)
    lse = torch.full((b, h, nq), float("-inf"), dtype=acc_t, device=q.device)
    qa = q.to(acc_t) if q_up else q
    kv = None if world == 1 else torch.stack((k, v)).to(acc_t) if kv_up else torch.stack((k, v))
    held = (k, v)
    for t, blocks in enumerate(steps):
        incoming = _shift(kv, group, world, rank, staged) if t + 1 < world else None
        # A step with no block (contiguous causal: a later rank's keys) attends to none of its keys
        # instead, an exact no-op (no rows): a collective whose result one rank never uses is dead
        # code to the compiler there, and autograd would never run its backward there, while the
        # ranks that use theirs wait in it for this one.
        # the eager forward's calls (world size 1: one; else step 0 in two, _own_calls), so that the
        # results agree bit for bit
        calls = _own_calls(blocks, nq) if t == 0 and world > 1 else blocks
        for blk in calls or (_Block(slice(0, 0), slice(0, 0), False),):
            qb = qa[:, :, blk.q].to(q.dtype) if q_up else q[:, :, blk.q]
            o, l = attention(qb, held[0][:, :, blk.k], held[1][:, :, blk.k], causal=blk.causal, scale=scale,
                             return_lse=True)
            o, l = reference.merge_attention_outputs(out[:, :, blk.q], lse[:, :, blk.q], o.to(acc_t), l.to(acc_t))
            if blk.q.start == 0 and blk.q.stop == nq:
                out, lse = o, l
            else:
                out = out.slice_scatter(o, dim=2, start=blk.q.start, end=blk.q.stop)
                lse = lse.slice_scatter(l, dim=2, start=blk.q.start, end=blk.q.stop)
        if incoming is not None:
            kv = incoming
            held = (kv[0].to(k.dtype), kv[1].to(v.dtype)) if kv_up else (kv[0], kv[1])
    return out.to(q.dtype), lse


def _traced_gather(k, v, group, world: int, owners, per: int, kv_up: bool, acc_t):
    """_GatherKV as a collective: the gather's backward is the reduce-scatter of the K/V gradients
    (summed in acc_t with kv_up)."""
    x = torch.stack((k, v))
    if world > 1:
        if kv_up:
            x = x.to(acc_t)
        staged = _STAGE_THROUGH_CPU
        full = _gather_autograd(x.cpu() if staged else x.contiguous(), 0, group)
        full = full.to(k.device) if staged else full
        x = _to_global(owners, per, full.view((world,) + tuple(x.shape)))
        if kv_up:
            x = x.to(k.dtype)
    return x[0], x[1]


def _traced_call(q, k, v, group, causal, scale, layout, return_lse, strategy):
    """context_parallel_attention under torch.compile (module docstring): validated and checked
    across ranks while Dynamo traces, then the ring or the all-gather from functional collectives;
    autograd differentiates it."""
    group = _group(group)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                 for t in (q, k, v))
    mine = error = None
    try:
        _validate(q, k, v, causal, scale, layout, return_lse, strategy)
        # operator.index makes Dynamo specialize on each size (a guard): the check holds for this
        # graph's one shape, as eager's holds per signature, and a SymInt (a dimension that
        # automatic dynamic shapes made symbolic) cannot be a traced constant. So everything below
        # takes its sizes from these ints.
        qs, ks = tuple(operator.index(n) for n in q.shape), tuple(operator.index(n) for n in k.shape)
        s = _scale(qs[3], scale)
        mine = (qs, ks, q.dtype, q.device, causal, s, layout, strategy, needs_grad)
    except (TypeError, ValueError) as err:
        error = (type(err).__name__, str(err))
    rejected = _agree_at_trace(group.group_name, mine, error, _STAGE_THROUGH_CPU)
    if rejected is not None:
        raise _ERROR_TYPES[rejected[0]](rejected[1])
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    # 16-bit inputs whose gradients are sums over steps or ranks (not at world size 1): carried in
    # acc_t so that the sums are (_traced_ring)
    up = torch.is_grad_enabled() and world > 1 and q.dtype != acc_t
    kv_up = up and (k.requires_grad or v.requires_grad)
    allgather = (strategy == "allgather" if strategy is not None
                 else _allgather_by_rule(math.prod(ks), k.element_size()))
    if allgather:
        chunks = _chunks(layout, world, rank)
        kf, vf = _traced_gather(k, v, group, world, _owners(layout, world), len(chunks), kv_up, acc_t)
        out, lse = _attend_gathered(q, kf, vf, causal, s, chunks, return_lse)
    else:
        q_up = up and q.requires_grad
        steps = _steps(layout, world, rank, qs[2], ks[2], causal)
        out, lse = _traced_ring(q, k, v, group, world, rank, steps, s, acc_t, q_up, kv_up)
    return (out, lse) if return_lse else out


# ------------------------------------------------------------------------------------------------
# the entry point
# ------------------------------------------------------------------------------------------------
def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                               causal: bool = False, scale: float | None = None, layout: str = "zigzag",
                               return_lse: bool = False, strategy: str | None = None):
    """Attention over a sequence sharded across the ranks of `group` (module docstring: the ring,
    the layouts, the merge, the backward, the all-gather rule).

    Args:
        q: this rank's query shard (B, Hq, N/world, D); k, v: its key/value shard (B, Hkv, Nk/world,
           D), Hq % Hkv == 0; dtypes and head dims as ta.attention. Every rank passes the same shapes.
        group: a torch.distributed ProcessGroup, None for the default one. Its backend must carry
           the tensors' device (NCCL: CUDA, with torch.cuda.set_device(this rank's GPU) called
           first, as NCCL's P2P ops require; gloo: CPU). For an NCCL group whose streams are not
           high-priority, the first ring call makes a twin of it that is (one more NCCL
           communicator, once per group: _transfer_group).
        causal: the whole sequence's causal mask (global query i sees key j iff j <= i; then
           Nq == Nk).
        scale: defaults to 1/sqrt(D).
        layout: how the sequence is sharded: "zigzag" (2·world chunks, rank r holds chunks r and
           2·world−1−r, in that order: equal causal work on every rank; local N even) or
           "contiguous" (rank r holds chunk r).
        return_lse: also return this shard's lse (B, Hq, N/world), float32 (float64 for float64),
           natural log; differentiable.
        strategy: None (the all-gather while this rank's K/V shard is at most ALLGATHER_MAX_BYTES,
           else the ring), "ring" or "allgather".

    Returns this rank's shard of the output (B, Hq, N/world, D), and lse with return_lse.
    Differentiable in q, k, v (every rank must run the backward: it is collective). A call is a
    collective: every rank of the group calls it with its shard, in the same order as the others.
    Under torch.compile it is traced whole, from functional collectives (module docstring).
    """
    if _plan._is_compiling():
        return _traced_call(q, k, v, group, causal, scale, layout, return_lse, strategy)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                 for t in (q, k, v))
    plan = _plan_for(q, k, v, group, causal, scale, layout, return_lse, strategy, needs_grad)
    if plan.allgather:
        out, lse = _allgather_attention(plan, q, k, v, return_lse)
    elif needs_grad:
        out, lse = _RingAttention.apply(q, k, v, plan, return_lse)
    else:
        out, lse = _ring_forward(plan, q, k, v)
    return (out, lse) if return_lse else out
