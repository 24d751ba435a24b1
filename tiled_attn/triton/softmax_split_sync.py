"""Single-pass split-row softmax: S programs hold a row's S chunks in registers, exchange their
states through global memory and write the output without re-reading x (2·M·N bytes, the floor).

Adds over the two-kernel split: rows too long for one SM (e.g. 131072 fp32 columns = 512 KB) but
short enough for a few SMs' registers are read once instead of twice. Each program publishes its
chunk's state (m, l) to an (M, S) buffer, bumps the row's arrival counter (release), waits until
all S programs of the row have arrived (acquire), merges the S states (merge_many) and normalizes
the chunk it still holds.

Co-residency: the wait is only safe if every program of a row is running at the same time. The
wrapper launches a persistent grid of exactly (programs that fit per SM × SMs) rounded down to a
multiple of S, computed from the compiled kernel's registers and shared memory, with Triton's
cooperative launch (launch_cooperative_grid=True), whose contract is that all programs of the grid
are co-resident or the launch fails with an error instead of hanging. Programs pid = g·S + s form
group g; group g walks rows g, g + G, ... (G groups), all S members in the same order, so the S
programs of a row are the members of one group at the same loop step. As a last guard the wait
gives up after MAX_SPIN polls (a legitimate wait is microseconds): a broken invariant then shows
as a wrong answer in the tests, never a hung GPU. Never used in the interpreter with S > 1 (it
runs programs one after another, so a wait for a later program could not end).
"""
import triton
import triton.language as tl

from .online import identity, merge_many, normalize, update
from .softmax_io import LOG2E, load_tile, row_base, store_tile


@triton.jit
def softmax_split_sync_kernel(x_ptr, y_ptr, m_ptr, l_ptr, count_ptr, M, N, stride_xm, stride_xn,
                              stride_ym, S, MAX_SPIN, BLOCK_N: tl.constexpr,
                              BLOCK_S: tl.constexpr, COL_CONTIG: tl.constexpr):
    pid = tl.program_id(0)
    s = pid % S
    groups = tl.num_programs(0) // S
    cols = s * BLOCK_N + tl.arange(0, BLOCK_N)
    parts = tl.arange(0, BLOCK_S)
    for row in tl.range(pid // S, M, groups):
        rows = row + tl.arange(0, 1)
        row_mask = rows < M
        x = load_tile(row_base(x_ptr, rows, stride_xm), cols, stride_xn, row_mask, N, float("-inf"),
                      COL_CONTIG, True)
        m, l = identity(1)
        m, l, _, _ = update(m, l, x, LOG2E)

        states = rows.to(tl.int64) * S
        tl.store(m_ptr + states + s, m)
        tl.store(l_ptr + states + s, l)
        # Every thread's state store happens before the one-thread release that announces it.
        tl.debug_barrier()
        # acq_rel: releases this program's state, and acquires the others' if it arrives last.
        arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel") + 1
        spins = 0
        while (arrived < S) & (spins < MAX_SPIN):
            arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")
            spins += 1
        tl.debug_barrier()

        # .cg: read the peers' states from L2, never from this SM's (non-coherent) L1.
        in_row = (parts < S)[None, :]
        all_states = states[:, None] + parts[None, :]
        m, l = merge_many(tl.load(m_ptr + all_states, mask=in_row, other=float("-inf"),
                                  cache_modifier=".cg"),
                          tl.load(l_ptr + all_states, mask=in_row, other=0.0, cache_modifier=".cg"),
                          LOG2E)
        store_tile(row_base(y_ptr, rows, stride_ym), cols, row_mask, N, normalize(x, m, l, LOG2E),
                   True)
