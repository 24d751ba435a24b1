"""Single-pass split-row softmax: S co-resident programs share a row, exchange their partial states
through global memory and normalize their chunks without a second kernel.

Adds over the two-kernel split: a row too long for one SM but short enough for a few SMs (e.g.
131072 fp32 columns = 512 KB = 16 programs × 32 KB of registers) is read from DRAM once instead of
twice. Each program folds its chunk into a state (m, l), publishes it to an (M, S) buffer, bumps the
row's arrival counter (release), waits until all S programs of the row have arrived (acquire),
merges the S states (merge_many) and writes its chunk.

A chunk is CHUNK = T·BLOCK_N columns. Its last tile stays in registers across the wait, so with
T = 1 (the wrapper's choice whenever the row fits the co-resident programs) x is read exactly once.
With T > 1 the first T − 1 tiles are re-read after the wait, in reverse, while they are still in L2:
between a program's first read of a tile and its re-read, the GPU reads at most (co-resident
programs × CHUNK) elements, which the config keeps well under L2 (50 MB on the H100). Rows longer
than the co-resident programs can hold in registers thus still take one kernel.

PREFETCH (T = 1 only, enforced by the wrapper): the next row's tile is loaded into a second set of
registers right after this row's arrival, so the wait and the merge overlap a load instead of
idling the SM. STAGES pipelines the T − 1 tile loop (cp.async); KEEP / LAST / STORE are the cache
hints of the tiles re-read later, of the last reads and of the output (softmax_io.py).

Co-residency (why the wait cannot deadlock): a program waits only for the S − 1 other members of its
own group, so the wait ends if every program of the grid is running at once. The wrapper launches
at most as many programs as the driver's occupancy calculator says fit on the device at once
(cuOccupancyMaxActiveBlocksPerMultiprocessor × SMs), rounded down to a multiple of S, with a
cooperative launch (launch_cooperative_grid=True): the driver's contract is that all programs of a
cooperative grid are co-resident, and it refuses the launch (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
which the wrapper turns into the two-kernel split) rather than run a grid that does not fit.
Programs pid = g·S + s form group g; group g walks rows g, g + G, ... (G groups), all S members in
the same order, so the S programs of a row are the members of one group at the same loop step.
As a last guard the wait gives up after MAX_SPIN polls (a legitimate wait is microseconds): the
row's output is then written as NaN and `fail_ptr` counted up, so a broken invariant is a visible
error (softmax.py:split_sync_failures) and never a hung GPU. Never used in the interpreter with
S > 1 (it runs programs one after another, so a wait for a later program could not end).
"""
import triton
import triton.language as tl

from .online import identity, merge_many, normalize, update
from .softmax_io import LOG2E, load_tile, row_base, store_tile


# N stays a runtime integer: Triton turns an argument equal to 1 into a constant, which has no
# .dtype for the column type below, and kernel="split" takes rows of one column (H200 tests).
@triton.jit(do_not_specialize=["N"])
def softmax_split_sync_kernel(x_ptr, y_ptr, m_ptr, l_ptr, count_ptr, fail_ptr, M, N, stride_xm,
                              stride_xn, stride_ym, S, CHUNK, MAX_SPIN, BLOCK_N: tl.constexpr,
                              BLOCK_S: tl.constexpr, COL_CONTIG: tl.constexpr,
                              STAGES: tl.constexpr = 1, PREFETCH: tl.constexpr = False,
                              KEEP: tl.constexpr = "", LAST: tl.constexpr = "",
                              STORE: tl.constexpr = "", LOG: tl.constexpr = False):
    ACC: tl.constexpr = x_ptr.dtype.element_ty == tl.float32  # online.py: float32's accurate verbs
    pid = tl.program_id(0)
    s = pid % S
    groups = tl.num_programs(0) // S
    # Columns in N's integer type (softmax_io.py); N − start, not start + CHUNK, which can pass
    # 2^31 − 1 on a row below 2^31 columns.
    start = s.to(N.dtype) * CHUNK
    offs = tl.arange(0, BLOCK_N)
    # Tiles before the register tile: full (inside [start, N)) and walked unmasked. The register
    # tile ends the chunk; only the row's last chunk can run past N, so `cols < N` masks it.
    n_loop = (tl.minimum(N - start, CHUNK) - 1) // BLOCK_N
    last_start = start + n_loop * BLOCK_N
    parts = tl.arange(0, BLOCK_S)
    in_row = (parts < S)[None, :]

    first = pid // S + tl.arange(0, 1)
    if PREFETCH:
        x_last = load_tile(row_base(x_ptr, first, stride_xm), last_start + offs, stride_xn, first < M, N,
                           float("-inf"), COL_CONTIG, True, LAST)
    for row in tl.range(pid // S, M, groups):
        rows = row + tl.arange(0, 1)
        row_mask = rows < M
        x_base = row_base(x_ptr, rows, stride_xm)
        m, l = identity(1, ACC)
        for t in tl.range(0, n_loop, num_stages=STAGES):
            x = load_tile(x_base, start + t * BLOCK_N + offs, stride_xn, row_mask, N,
                          float("-inf"), COL_CONTIG, False, KEEP)
            m, l, _, _ = update(m, l, x, LOG2E, ACCURATE=ACC)
        if not PREFETCH:
            x_last = load_tile(x_base, last_start + offs, stride_xn, row_mask, N, float("-inf"),
                               COL_CONTIG, True, LAST)
        m, l, _, _ = update(m, l, x_last, LOG2E, ACCURATE=ACC)

        states = rows.to(tl.int64) * S
        tl.store(m_ptr + states + s, m)
        tl.store(l_ptr + states + s, l)
        # Every thread's state store happens before the one-thread release that announces it.
        tl.debug_barrier()
        # acq_rel: releases this program's state, and acquires the others' if it arrives last.
        arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel") + 1
        if PREFETCH:
            nxt = rows + groups
            x_next = load_tile(row_base(x_ptr, nxt, stride_xm), last_start + offs, stride_xn, nxt < M, N,
                               float("-inf"), COL_CONTIG, True, LAST)
        spins = 0
        while (arrived < S) & (spins < MAX_SPIN):
            arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")
            spins += 1
        tl.debug_barrier()
        complete = arrived >= S
        if not complete:
            tl.atomic_add(fail_ptr, 1)

        # .cg: read the peers' states from L2, never from this SM's (non-coherent) L1.
        all_states = states[:, None] + parts[None, :]
        m, l = merge_many(tl.load(m_ptr + all_states, mask=in_row, other=float("-inf"),
                                  cache_modifier=".cg"),
                          tl.load(l_ptr + all_states, mask=in_row, other=0.0, cache_modifier=".cg"),
                          LOG2E, ACC)
        # A wait that timed out leaves the state incomplete: NaN, never a plausible wrong answer.
        l = tl.where(complete, l, float("nan"))
        y_base = row_base(y_ptr, rows, stride_ym)
        store_tile(y_base, last_start + offs, row_mask, N, normalize(x_last, m, l, LOG2E, ACC, LOG),
                   True, STORE)
        for t in tl.range(0, n_loop, num_stages=STAGES):
            cols = start + (n_loop - 1 - t) * BLOCK_N + offs
            x = load_tile(x_base, cols, stride_xn, row_mask, N, 0.0, COL_CONTIG, False, LAST)
            store_tile(y_base, cols, row_mask, N, normalize(x, m, l, LOG2E, ACC, LOG), False, STORE)
        if PREFETCH:
            x_last = x_next
