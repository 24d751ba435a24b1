"""A model of how the persistent wgmma_ws forward deals its query tiles to CTAs, against one CTA per
tile (the hardware's dealing) and a global tile counter (a dynamic scheduler): the makespan of each,
relative to a perfect split, for causal or full launches. No GPU: pure arithmetic.

    PYTHONPATH=. python benchmarks/model_ws_schedule.py            # the table the traits cite
    PYTHONPATH=. python benchmarks/model_ws_schedule.py --d 192 --n 16384 --bh 20 --causal

Tile cost: its key tiles + 0.5 (a tile's fixed start and end, ~half a key tile at N = 512 by the
persistent grid's measured gain). The persistent order is WsSchedule::tile
(csrc/attention/sm90/flash_fwd_sm90_ws_kernel.cuh): sections of `section` (batch, head) pairs
(ws_schedule: as many as have K and V in half the L2), in each the query tiles from the last to the
first, every pair at one tile before the next; CTA c takes tiles c, c + grid, ... One CTA per tile:
the launch order (the query tiles of a pair from the last, pair after pair) taken by whichever SM
frees first. The counter: the persistent order taken by whichever CTA frees first.
"""
from __future__ import annotations

import argparse
import heapq

SMS = 132
L2_BYTES = 60 << 20  # the H200's (the H100's is 50 MiB)
# (head dim) -> (query rows, keys) per tile: flash_fwd_sm90_ws_traits.cuh's defaults.
TILES = {64: (192, 112), 96: (128, 128), 128: (128, 128), 192: (128, 64), 256: (128, 64)}


def tile_cost(m_block: int, block_m: int, block_n: int, n: int, causal: bool) -> float:
    keys = min(n, (m_block + 1) * block_m) if causal else n
    return -(-keys // block_n) + 0.5


def persistent_order(m_blocks: int, slots: int, section: int) -> list[int]:
    """The m block of each tile in WsSchedule::tile's order."""
    order = []
    for first in range(0, slots, section):
        pairs = min(section, slots - first)
        order += [m_blocks - 1 - rank // pairs for rank in range(m_blocks * pairs)]
    return order


def greedy(costs: list[float], workers: int) -> float:
    """Makespan of taking costs in order by whichever worker frees first."""
    free = [0.0] * workers
    for c in costs:
        heapq.heapreplace(free, free[0] + c)
    return max(free)


def makespans(d: int, n: int, bh: int, causal: bool, sms: int = SMS, l2: int = L2_BYTES) -> dict:
    block_m, block_n = TILES[d]
    m_blocks = -(-n // block_m)
    section = max(1, min(bh, l2 // 2 // (n * d * 4)))
    order = persistent_order(m_blocks, bh, section)
    costs = [tile_cost(m, block_m, block_n, n, causal) for m in order]
    grid = min(len(costs), sms)
    static = [0.0] * grid
    for i, c in enumerate(costs):
        static[i % grid] += c
    launch = [tile_cost(m, block_m, block_n, n, causal) for _ in range(bh) for m in range(m_blocks - 1, -1, -1)]
    ideal = sum(costs) / grid
    return {"m_blocks": m_blocks, "section": section, "static": max(static) / ideal,
            "one_cta_per_tile": greedy(launch, sms) / ideal, "counter": greedy(costs, grid) / ideal}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="*", default=[64, 96, 128])
    ap.add_argument("--n", type=int, nargs="*", default=[512, 1024, 2048, 4096, 16384])
    ap.add_argument("--bh", type=int, nargs="*", default=[1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024])
    ap.add_argument("--causal", action="store_true", default=True)
    ap.add_argument("--full", dest="causal", action="store_false", help="non-causal launches")
    args = ap.parse_args(argv)
    print("Worst makespan over the B·H values, relative to one CTA per tile (its B·H in brackets):")
    print(f"{'D':>4} {'N':>6} {'m_blocks':>8}  {'persistent, static':>20}  {'persistent, counter':>20}")
    for d in args.d:
        for n in args.n:
            rows = [(makespans(d, n, bh, args.causal), bh) for bh in args.bh]
            static = max((r["static"] / r["one_cta_per_tile"], bh) for r, bh in rows)
            counter = max((r["counter"] / r["one_cta_per_tile"], bh) for r, bh in rows)
            print(f"{d:>4} {n:>6} {rows[0][0]['m_blocks']:>8}  {static[0]:>12.3f} ({static[1]:>4})"
                  f"  {counter[0]:>12.3f} ({counter[1]:>4})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
