"""The Triton attention forward: pick a kernel and its config (configs.TRITON_ATTENTION), launch.

Called by tiled_attn/attention.py after validation, with preallocated `out` (B, Hq, Nq, D) (any
strides) and a contiguous float32 `lse` (B, Hq, Nq). Inputs are used through their strides: a q/k/v
split from a packed (B, N, 3, H, D) tensor and transposed is read in place, never copied.

Two kernels: attention_fwd.py (one program per query tile; training/prefill shapes) and
attention_decode.py (GQA group packed into the tile's rows, keys split over programs, partial states
merged; short queries against long keys). The decode row of the config table says when the second
one applies and how many splits to use.

Host cost (DESIGN §3): `plan_forward` does everything that depends only on the shapes, strides,
dtype, device, mask and the config table — the kernel, its constexprs, the grid, the split count,
the workspace size — and returns the launches as a function, which tiled_attn/attention.py caches
per signature; a call then costs the output allocations and the launches through their compiled
kernels (launch.py). A TMA descriptor is made per call (it holds the tensor) without its
constructor's checks, which the plan made once; the split-KV workspace is one allocation.
"""
from __future__ import annotations

import functools
import itertools
import os

import torch

from .. import _plan, configs
from . import online
from .launch import Launch, interpreted
from .attention_decode import attention_decode_ext_kernel, attention_decode_kernel, attention_merge_kernel
from .attention_fwd import attention_fwd_d2_kernel, attention_fwd_ext_kernel, attention_fwd_kernel

__all__ = ["plan_forward", "attention_forward", "config", "plan"]

# tl.dot needs every tile dimension >= 16 (the smallest MMA shape Triton emits).
MIN_DOT = 16
# Above this stride, offsets inside one tile (up to 256 rows × stride) can pass 2^31: use int64.
WIDE_STRIDE = 2 ** 31 // 256
# The float32 q·k is summed in chunks of this many head dims (attention_fwd.py: numerics).
SPLIT_D_CHUNK = 16
# The merge kernel loads up to this many partials of a row at once (more: a loop of such tiles),
# and at most MERGE_TILE_ELEMS float32 values ([BLOCK_S, BLOCK_D]: 64 registers a thread at 4 warps).
MAX_MERGE_TILE = 64
MERGE_TILE_ELEMS = 8192


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """The smallest power of two >= n (triton.next_power_of_2 without its @jit dispatch: ~5 µs a
    call, and a plan makes a dozen)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def merge_tile(splits: int, block_d: int) -> int:
    """BLOCK_S of the merge kernel for `splits` partials of BLOCK_D values each."""
    return max(1, min(MAX_MERGE_TILE, MERGE_TILE_ELEMS // block_d, _pow2(splits)))


def d_class(d: int) -> str:
    return "d64" if d <= 64 else "d128" if d <= 128 else "d256"


def head_parts(d: int) -> tuple[int, int] | None:
    """(BLOCK_D, BLOCK_D2) of attention_fwd_d2_kernel for head dim d, when d is the sum of two
    powers of two >= MIN_DOT that is no power of two itself (48, 80, 96, 144, 160, 192): the
    padded single tile would multiply zero columns (a third of the work at 96 and 192); None
    otherwise."""
    first = 1 << (d.bit_length() - 1) if d > 0 else 0
    rest = d - first
    if first >= MIN_DOT and rest >= MIN_DOT and rest & (rest - 1) == 0:
        return first, rest
    return None


def size_class(n_k: int) -> str:
    return "short" if n_k <= 1024 else "long"


# (kernel, arch, dtype, d class, causal, size class) -> the completed row: a plan is made per new
# shape (a decode loop makes one per step), the row only per class. Cleared with the plans when a
# config table changes (configs._Table).
_ROWS = _plan.PlanCache("triton attention config rows")


def config(kernel: str, device: torch.device, dtype: torch.dtype, d: int, causal: bool, n_k: int,
           arch: str | None = None) -> dict:
    """The TRITON_ATTENTION row for this call (exact key first, then wildcards; arch before 'any'),
    completed with TRITON_ATTENTION_DEFAULTS for the fields it leaves out. `arch` overrides the
    device's (offline compile checks)."""
    arch = arch or configs.arch(device)
    exact = (configs.dtype_key(dtype), d_class(d), causal, size_class(n_k))
    key = (kernel, arch) + exact
    row = _ROWS.get(key)
    if row is None:
        row = _ROWS.put(key, _find_row(kernel, arch, exact))
    return row


def _find_row(kernel: str, arch: str, exact: tuple) -> dict:
    for a in (arch, "any"):
        for rest in itertools.product(*((e, "*") for e in exact)):
            row = configs.TRITON_ATTENTION.get((kernel, a) + rest)
            if row is not None:
                return {**configs.TRITON_ATTENTION_DEFAULTS, **row}
    raise KeyError(f"no TRITON_ATTENTION config for {(kernel, arch) + exact}: add a row to "
                   "tiled_attn/configs.py")


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return os.cpu_count() or 1  # the interpreter: one "SM" per core


def _effective_causal(causal: bool, offset: int, n_q: int, n_k: int) -> tuple[bool, int]:
    """Clamp the offset to where it changes the mask (so i + offset cannot overflow int32), and drop
    the mask when every query sees every key (offset >= Nk - 1)."""
    if not causal or offset >= n_k - 1:
        return False, 0
    return True, max(offset, -n_q)


def decode_splits(programs: int, n_seen: int, cfg: dict, sms: int) -> int:
    """Key splits per (batch, kv head, row tile) of the split-KV decode, `programs` of those.

    One for n_seen <= min_split_keys: a split adds the merge kernel's launch and the partials'
    allocation, ~10 µs of host time per eager call, more than such a short cache's kernel takes
    (H200, 2026-11-26: splitting 256 keys made ta.attention's decode call 36 µs of host against
    F.sdpa's 24, and the Llama-3.2-1B-shaped generate() at batch 1 0.77x "sdpa"). Above it, the
    grid gets up to one program per SM (splits as short as one key tile), and up to `waves` per
    SM where each split still reads min_split_keys keys; never more: the split count is floored,
    so the grid is never a wave and a bit, whose tail costs as much as the wave.
    Measured on the H200 (benchmarks/tune_decode_splits.py, 2026-11-26; GQA 32/8, D = 128, 132
    SMs, 3 programs resident per SM): the kernel time is best at 256 programs for B = 16 and 32
    (splits 2 and 1) and 12-18% worse at 384-512; at B = 1, 16 splits (128 programs) are best up
    to 16k keys (4096 keys: 32 splits 6% and 8 splits 18% slower) and 32-33 splits from 32k keys
    on (17 splits: 20% slower). The earlier rule (the ceiling of waves·SMs / programs, splits of
    >= min_split_keys) gave B = 32 two splits and B = 8 five, 4-18% slower."""
    if n_seen <= cfg["min_split_keys"]:
        return 1
    one_wave = max(1, sms // max(programs, 1))
    full = max(1, int(cfg["waves"] * sms) // max(programs, 1))
    return max(1, min(full, max(one_wave, _cdiv(n_seen, cfg["min_split_keys"]))))


def plan(q: torch.Tensor, k: torch.Tensor, causal: bool, causal_offset: int, *,
         kernel: str | None = None, num_splits: int | None = None) -> dict:
    """Which kernel runs, with which launch parameters. `kernel`/`num_splits` force a choice (the
    tests use them to exercise the split-KV path on small shapes)."""
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    group = hq // hkv
    causal, offset = _effective_causal(causal, causal_offset, n_q, n_k)
    if kernel is None:
        dec = config("decode", q.device, q.dtype, d, causal, n_k)
        kernel = "decode" if n_q * group <= dec["max_rows"] or n_q <= dec["max_q"] else "fwd"
    cfg = config(kernel, q.device, q.dtype, d, causal, n_k)
    p = {"kernel": kernel, "causal": causal, "offset": offset, "group": group,
         "BLOCK_D": max(MIN_DOT, _pow2(d)), "BLOCK_D2": 0, **cfg}
    if kernel == "fwd":
        p["m_tiles"] = _cdiv(n_q, cfg["BLOCK_M"])
        # Two head-dim parts: 16-bit inputs (float32 chunks its dot by SPLIT_D instead).
        parts = head_parts(d) if cfg["TWO_PARTS"] and q.dtype != torch.float32 else None
        if parts is not None:
            p["BLOCK_D"], p["BLOCK_D2"] = parts
        return p
    rows = n_q * group
    p["BLOCK_M"] = max(MIN_DOT, min(cfg["BLOCK_M"], _pow2(rows)))
    p["m_tiles"] = _cdiv(rows, p["BLOCK_M"])
    # Keys some query can see: a causal mask hides the end of the keys from every row.
    n_seen = min(n_k, n_q + offset) if causal else n_k
    if num_splits is None:
        num_splits = decode_splits(b * hkv * p["m_tiles"], n_seen, cfg, _sm_count(q.device))
    num_splits = max(1, min(num_splits, _cdiv(max(n_seen, 1), cfg["BLOCK_N"])))
    p["split_len"] = _cdiv(_cdiv(max(n_seen, 1), num_splits), cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    p["num_splits"] = _cdiv(max(n_seen, 1), p["split_len"])
    return p


def _launch_plan(q, k, causal, causal_offset, kernel, num_splits, positive_scale, interpret) -> dict:
    """Everything about a launch that does not depend on the tensors' addresses or strides."""
    b, hq, n_q, d = q.shape
    p = plan(q, k, causal, causal_offset, kernel=kernel, num_splits=num_splits)
    fp32 = q.dtype == torch.float32
    upcast = q.dtype == torch.bfloat16 and interpret  # see attention_fwd.kv_loop
    # RAW scores (unscaled, the verbs take the scale) need scale > 0 for the max to commute with it;
    # float32 always uses them when it can (fewer roundings in the exponent: attention_fwd.py).
    raw = positive_scale and (bool(p["FMA"]) or fp32)
    split_d = p["BLOCK_D"] // SPLIT_D_CHUNK if fp32 else 1
    const = dict(
        CAUSAL=p["causal"], BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], HEAD_DIM=d,
        BLOCK_D=p["BLOCK_D"], EVEN_D=p["BLOCK_D"] == d,
        # float32: a true fp32 product (TF32 would break the numerics rule against torch's fp32).
        PRECISION="ieee" if fp32 or upcast else "tf32",
        UPCAST=upcast, RAW=raw, FMA=raw and bool(p["FMA"]), LATE_L=bool(p["LATE_L"]),
        SPLIT_D=split_d, ACCURATE=fp32, num_warps=p["num_warps"], num_stages=p["num_stages"])
    if p["BLOCK_D2"]:  # attention_fwd_d2_kernel: both parts whole, 16-bit
        del const["EVEN_D"], const["SPLIT_D"], const["ACCURATE"]
        const["BLOCK_D2"] = p["BLOCK_D2"]
    lp = {"kernel": p["kernel"], "const": const, "offset": p["offset"], "group": p["group"],
          "m_tiles": p["m_tiles"], "n_q": n_q, "n_k": k.shape[2], "d": d, "heads": hq,
          # TMA: 16-bit only (the chunked float32 dot loads K in another shape), never in the
          # interpreter's UPCAST mode, nor where the kernel is shorter than the host cost of its
          # two descriptors (configs.TRITON_TMA_MIN_FLOPS); the per-call alignment check may still
          # refuse it.
          "tma": (p["ADDR"] == "tma" and not fp32 and not upcast
                  and _flops(b, hq, n_q, k.shape[2], d, p["causal"]) >= configs.TRITON_TMA_MIN_FLOPS),
          "addr": "offs" if p["ADDR"] == "tma" else p["ADDR"]}
    if p["kernel"] == "fwd":
        lp["grid"] = (b * hq * p["m_tiles"],)
        return lp
    splits = p["num_splits"]
    rows = b * hq * n_q
    lp.update(splits=splits, split_len=p["split_len"], rows=rows,
              grid=(b * (hq // p["group"]) * p["m_tiles"] * splits,),
              workspace=rows * splits * (d + 2),
              merge_grid=(rows,),
              merge_const=dict(BLOCK_S=merge_tile(splits, p["BLOCK_D"]), HEAD_DIM=d,
                               BLOCK_D=p["BLOCK_D"], UPCAST=upcast, RAW=raw, ACCURATE=fp32,
                               num_warps=p["merge_warps"]))
    return lp


def _flops(b: int, hq: int, n_q: int, n_k: int, d: int, causal: bool) -> float:
    """The forward's matmul FLOPs (Q·Kᵀ and P·V), halved under a causal mask."""
    return 4.0 * b * hq * n_q * n_k * d / (2 if causal else 1)


def _tma_layout_ok(t: torch.Tensor) -> bool:
    """Hopper TMA's rules for a (B, H, N, D) tensor descriptor that a plan's signature decides:
    16-byte aligned strides, unit stride on D (the base address, 16-byte aligned too, is checked
    per call)."""
    s = t.stride()
    es = t.element_size()
    return s[3] == 1 and (s[0] * es) % 16 == 0 and (s[1] * es) % 16 == 0 and (s[2] * es) % 16 == 0


def _descriptor(t: torch.Tensor, shape: list, strides: list, block: list):
    """A TMA TensorDescriptor of t without its constructor's checks (the plan made them once)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    d = TensorDescriptor.__new__(TensorDescriptor)
    d.__dict__.update(base=t, shape=shape, strides=strides, block_shape=block, padding="zero")
    return d


def plan_forward(q, k, v, out, lse, scale: float, causal: bool, causal_offset: int, *,
                 kernel: str | None = None, num_splits: int | None = None, mods=None, store_lse: bool = True):
    """run(q, k, v, out, lse): the launches of attention of q over k, v into out (B, Hq, Nq, D) and
    lse (B, Hq, Nq), for tensors with these shapes, strides, dtype and device (see module doc).
    With `mods` (tiled_attn.attention.Mods: a window, softcap, ALiBi, a key mask, packed sequences,
    a KV cache) the plan is plan_forward_ext's and run takes the extra tensors too.
    `store_lse=False`: the kernels write no lse, and run's `lse` may be any tensor of the call (an
    inference call's plan then allocates one output, not two)."""
    if mods is not None:
        return plan_forward_ext(q, k, v, out, lse, scale, causal, causal_offset, mods, kernel=kernel,
                                num_splits=num_splits, store_lse=store_lse)
    interpret = q.device.type != "cuda" or interpreted(attention_fwd_kernel)
    lp = _launch_plan(q, k, causal, causal_offset, kernel, num_splits, scale > 0, interpret)
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), out.stride()
    wide = max(max(sq), max(sk), max(sv), max(so)) >= WIDE_STRIDE
    const, device = lp["const"], q.device
    ints = (*sq, *sk, *sv, *so, lp["heads"], lp["group"], lp["n_q"], lp["n_k"], lp["offset"])
    qk_scale = scale * online.LOG2E
    tma = lp["tma"] and _tma_layout_ok(k) and _tma_layout_ok(v)
    block = [1, 1, const["BLOCK_N"], const["BLOCK_D"]]
    k_desc = (list(k.shape), list(sk), block)
    v_desc = (list(v.shape), list(sv), block)
    two = const.get("BLOCK_D2", 0)
    if two:  # the second head-dim part's descriptors: blocks BLOCK_D2 wide, read at head dim BLOCK_D
        block2 = [1, 1, const["BLOCK_N"], two]
        k_desc2, v_desc2 = (list(k.shape), list(sk), block2), (list(v.shape), list(sv), block2)

    def launches(addr: str) -> dict:
        meta = dict(const, WIDE=wide, ADDR=addr, STORE_LSE=store_lse)
        # The arguments whose 16-byte alignment can change from call to call: q, and k and v unless
        # they are descriptors (made only from aligned bases). out, lse and the workspace come from
        # torch's allocator, which aligns every block to far more than 16 bytes.
        user = (0,) if addr == "tma" else (0, 1, 2)
        if two:  # (q, k, v, k2, v2, out, lse): k2, v2 are k, v without TMA
            return {"fwd": Launch(attention_fwd_d2_kernel, lp["grid"], meta, device,
                                  (0,) if addr == "tma" else (0, 1, 2, 3, 4))}
        if lp["kernel"] == "fwd":
            return {"fwd": Launch(attention_fwd_kernel, lp["grid"], meta, device, user)}
        split = lp["splits"] > 1
        found = {"decode": Launch(attention_decode_kernel, lp["grid"], dict(meta, SPLIT=split), device, user)}
        if split:
            found["merge"] = Launch(attention_merge_kernel, lp["merge_grid"], dict(lp["merge_const"], STORE_LSE=store_lse),
                                    device, ())
        return found

    plain = launches(lp["addr"])
    with_tma = launches("tma") if tma else None
    splits, split_len, rows, m_tiles = lp.get("splits", 1), lp.get("split_len"), lp.get("rows"), lp["m_tiles"]
    if two:
        plain_two = plain["fwd"].bind(*ints, qk_scale, m_tiles)
        tma_two = with_tma["fwd"] if with_tma is not None else None

        def run_two(q, k, v, out, lse):
            if tma_two is not None and (k.data_ptr() | v.data_ptr()) % 16 == 0:
                tma_two(q, _descriptor(k, *k_desc), _descriptor(v, *v_desc), _descriptor(k, *k_desc2),
                        _descriptor(v, *v_desc2), out, lse, *ints, qk_scale, m_tiles)
            else:
                plain_two(q, k, v, k, v, out, lse)
        return run_two
    if with_tma is None and "fwd" in plain:  # one launch: the plan calls it directly
        return plain["fwd"].bind(*ints, qk_scale, m_tiles)
    if with_tma is None and splits == 1:
        decode = plain["decode"].bind(*ints, qk_scale, m_tiles, 1, split_len, rows)
        return lambda q, k, v, out, lse: decode(q, k, v, out, lse, lse)  # Part unused without SPLIT

    def run(q, k, v, out, lse):
        use = plain
        if with_tma is not None and (k.data_ptr() | v.data_ptr()) % 16 == 0:
            use, k, v = with_tma, _descriptor(k, *k_desc), _descriptor(v, *v_desc)
        if "fwd" in use:
            use["fwd"](q, k, v, out, lse, *ints, qk_scale, m_tiles)
            return
        if splits == 1:
            use["decode"](q, k, v, out, lse, lse, *ints, qk_scale, m_tiles, 1, split_len, rows)
            return
        part = torch.empty(lp["workspace"], dtype=torch.float32, device=device)
        use["decode"](q, k, v, out, lse, part, *ints, qk_scale, m_tiles, splits, split_len, rows)
        use["merge"](part, out, lse, *so, rows, lp["heads"], lp["n_q"], splits, qk_scale)
    return run


def _window_flags(mods, causal: bool, offset: int, n_q: int, n_k: int) -> tuple[bool, bool, int, int]:
    """(HAS_LEFT, HAS_RIGHT, left, right) for the kernels: causal is a right edge at 0; an edge
    that no row can reach is dropped (its masked band would cost time for nothing), and a kept one
    is clamped so that i + offset ± edge stays far inside int32. Per-sequence alignments (varlen, a
    KV cache) keep every edge that some sequence could reach."""
    left = mods.left
    right = 0 if causal else mods.right
    per_seq = mods.varlen is not None or mods.seq_k
    span = n_q + n_k + 1  # |i + offset - j| never exceeds it
    has_left = left >= 0 and left < span and (per_seq or n_q - 1 + offset - left > 0)
    has_right = right >= 0 and right < span and (per_seq or offset + right < n_k - 1)
    return has_left, has_right, left if has_left else 0, right if has_right else 0


# A paged K/V tile's address depends on a load (its block-table entry). Triton 3.6's pipeliner
# gives that load a stage of its own ahead of the K/V copies, so at the dense row's num_stages the
# K/V tiles get one shared-memory buffer fewer (sm_90a TTGIR, bf16, D = 128, the sm90 rows at 3
# stages: decode 2 buffers dense, 1 paged at 3 and 4 stages, 2 at 5; forward 3 dense, 2 paged at 3,
# 3 at 5). Measured before this on the H100 (graph-timed, B = 1, Nk = 4096): paged-64 decode 20.0
# µs against 13.8 µs contiguous. Two more stages restore the dense depth at about the dense
# shared-memory size: tests/test_attention_kvcache.py::test_paged_pipeline_depth_for_sm90a.
PAGED_EXTRA_STAGES = 2
# The paged decode reads a split's block-table entries as one vector when they are at most this
# many (attention_decode.py, PAGE_VEC): its K/V addresses then wait on no load inside the walk, so
# it keeps the dense row's stages. Longer splits (long caches at large batch, where the per-tile
# read hides behind many programs) read an entry per tile as the forward does.
# benchmarks/probe_paged_decode.py times both ways.
PAGED_VEC_MAX = 64


def plan_forward_ext(q, k, v, out, lse, scale: float, causal: bool, causal_offset: int, mods, *,
                     kernel: str | None = None, num_splits: int | None = None, store_lse: bool = True):
    """run(q, k, v, out, lse, slopes, key_mask, cu_q, cu_k, seq_k, block_table): the forward with
    `mods` (tiled_attn.attention.Mods) through attention_fwd_ext_kernel / attention_decode_ext_kernel.
    Tensors a call does not use are None. Shapes as the dense plan's, except: varlen q/k/v/out are
    (1, H, total, D) views (the grid runs mods.varlen's n_seqs sequences, the query tiles of the
    longest) and lse is (Hq, total_q); a paged K/V is (pages, page_size, Hkv, D) seen as
    (pages, Hkv, page_size, D)."""
    interpret = q.device.type != "cuda" or interpreted(attention_fwd_ext_kernel)
    d = q.shape[-1]
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    if mods.varlen is not None:
        b, n_q_tiles, n_k_cap = mods.varlen[0], mods.varlen[1], mods.varlen[2]
        n_q, n_k = q.shape[2], k.shape[2]  # the totals: indices are clamped into them
        kernel = "fwd"
    else:
        b, n_q = q.shape[0], q.shape[2]
        n_q_tiles = n_q
        n_k = n_k_cap = mods.paged[0] * mods.paged[3] if mods.paged is not None else k.shape[2]
    offset = causal_offset
    has_left, has_right, left, right = _window_flags(mods, causal, offset, n_q_tiles, n_k_cap)
    fp32 = q.dtype == torch.float32
    upcast = q.dtype == torch.bfloat16 and interpret
    mods_scores = mods.softcap > 0 or mods.alibi_stride >= 0 or mods.key_mask == 2
    if kernel is None:
        dec = config("decode", q.device, q.dtype, d, has_right, n_k_cap)
        kernel = "decode" if n_q * group <= dec["max_rows"] or n_q <= dec["max_q"] else "fwd"
    cfg = config(kernel, q.device, q.dtype, d, has_right, n_k_cap)
    block_d = max(MIN_DOT, _pow2(d))
    raw = scale > 0 and not mods_scores and (bool(cfg["FMA"]) or fp32)
    const = dict(HAS_LEFT=has_left, HAS_RIGHT=has_right, BLOCK_N=cfg["BLOCK_N"], HEAD_DIM=d,
                 BLOCK_D=block_d, EVEN_D=block_d == d, PRECISION="ieee" if fp32 or upcast else "tf32",
                 UPCAST=upcast, RAW=raw, FMA=raw and bool(cfg["FMA"]), LATE_L=bool(cfg["LATE_L"]),
                 SPLIT_D=block_d // SPLIT_D_CHUNK if fp32 else 1, ACCURATE=fp32,
                 ADDR="offs" if cfg["ADDR"] == "tma" or mods.paged is not None else cfg["ADDR"],
                 SOFTCAP=mods.softcap > 0, ALIBI=mods.alibi_stride >= 0, KEY_MASK=mods.key_mask,
                 SEQ_K=mods.seq_k, PAGED=mods.paged is not None, STORE_LSE=store_lse,
                 num_warps=cfg["num_warps"],
                 num_stages=cfg["num_stages"] + (PAGED_EXTRA_STAGES if mods.paged is not None else 0))
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), out.stride()
    if mods.varlen is not None:  # one packed sequence per "batch": no batch stride
        sq, sk, sv, so = ((0,) + tuple(t[1:]) for t in (sq, sk, sv, so))
    wide = max(max(sq), max(sk), max(sv), max(so)) >= WIDE_STRIDE
    cap = mods.softcap
    cap_in, cap_out = (scale / cap, cap * online.LOG2E) if cap > 0 else (1.0, 1.0)
    page_size, n_pages, stride_tb = mods.paged[:3] if mods.paged is not None else (1, 1, 0)
    stride_mb, stride_mn = mods.mask_strides
    const["PAGE"] = page_size
    ext = (*sq, *sk, *sv, *so, max(mods.alibi_stride, 0), stride_mb, stride_mn, stride_tb, n_pages,
           hq, group, n_q, n_k, offset, left, right, scale * online.LOG2E, cap_in, cap_out)
    device = q.device

    bool_mask = mods.key_mask == 1  # read as bytes

    def pick(*tensors):  # unused pointers: any tensor of the call (never read)
        return tuple(out if t is None else t for t in tensors)

    if kernel == "fwd":
        m_tiles = _cdiv(n_q_tiles, cfg["BLOCK_M"])
        const.update(BLOCK_M=cfg["BLOCK_M"], VARLEN=mods.varlen is not None)
        launch = Launch(attention_fwd_ext_kernel, (b * hq * m_tiles,), dict(const, WIDE=wide), device).bind(
            *ext, m_tiles)
        # TMA as the dense plan takes it (16-bit, unpaged, big enough to repay the descriptors):
        # varlen reads its sequences' rows out of the (1, Hkv, total_k, D) descriptors, keys past
        # a sequence's end come from the next one and are masked like any ragged tile.
        tma = (cfg["ADDR"] == "tma" and not fp32 and not upcast and mods.paged is None
               and _flops(b, hq, n_q_tiles, n_k_cap, d, has_right) >= configs.TRITON_TMA_MIN_FLOPS
               and _tma_layout_ok(k) and _tma_layout_ok(v))
        with_tma = None
        if tma:
            # Not bound: a Bound launch reads data_ptr() of every argument, and K/V are descriptors
            # here (Launch checks the alignment of the tensor arguments only).
            with_tma = Launch(attention_fwd_ext_kernel, (b * hq * m_tiles,), dict(const, WIDE=wide, ADDR="tma"),
                              device)
            block = [1, 1, cfg["BLOCK_N"], block_d]
            k_desc = (list(k.shape), list(k.stride()), block)
            v_desc = (list(v.shape), list(v.stride()), block)

        def run(q, k, v, out, lse, slopes=None, key_mask=None, cu_q=None, cu_k=None, seq_k=None, table=None):
            if bool_mask:
                key_mask = key_mask.view(torch.uint8)
            if with_tma is not None and (k.data_ptr() | v.data_ptr()) % 16 == 0:
                with_tma(q, _descriptor(k, *k_desc), _descriptor(v, *v_desc), out, lse,
                         *pick(slopes, key_mask, cu_q, cu_k, seq_k, table), *ext, m_tiles)
                return
            launch(q, k, v, out, lse, *pick(slopes, key_mask, cu_q, cu_k, seq_k, table))
        return run

    # Split-KV decode: the GQA group packed into the rows, keys split over programs.
    rows_per = n_q * group
    block_m = max(MIN_DOT, min(cfg["BLOCK_M"], _pow2(rows_per)))
    m_tiles = _cdiv(rows_per, block_m)
    n_seen = n_k_cap
    if num_splits is None:
        num_splits = decode_splits(b * hkv * m_tiles, n_seen, cfg, _sm_count(device))
    num_splits = max(1, min(num_splits, _cdiv(max(n_seen, 1), cfg["BLOCK_N"])))
    split_len = _cdiv(_cdiv(max(n_seen, 1), num_splits), cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    splits = _cdiv(max(n_seen, 1), split_len)
    rows = b * hq * n_q
    const.update(BLOCK_M=block_m, SPLIT=splits > 1)
    page_vec = 0
    if mods.paged is not None and page_size % cfg["BLOCK_N"] == 0:
        span = _cdiv(split_len, page_size) + 1  # table entries a split can touch
        page_vec = _pow2(span) if span <= PAGED_VEC_MAX else 0
    if page_vec:
        const.update(num_stages=cfg["num_stages"])
    decode = Launch(attention_decode_ext_kernel, (b * hkv * m_tiles * splits,),
                    dict(const, WIDE=wide, PAGE_VEC=page_vec), device).bind(*ext, m_tiles, splits, split_len, rows)
    merge = None
    if splits > 1:
        merge = Launch(attention_merge_kernel, (rows,),
                       dict(BLOCK_S=merge_tile(splits, block_d), HEAD_DIM=d, BLOCK_D=block_d, UPCAST=upcast,
                            RAW=raw, ACCURATE=fp32, STORE_LSE=store_lse, num_warps=cfg["merge_warps"]), device, ())
    workspace = rows * splits * (d + 2)

    def run(q, k, v, out, lse, slopes=None, key_mask=None, cu_q=None, cu_k=None, seq_k=None, table=None):
        if bool_mask:
            key_mask = key_mask.view(torch.uint8)
        extra = pick(slopes, key_mask, seq_k, table)
        if merge is None:
            decode(q, k, v, out, lse, lse, *extra)
            return
        part = torch.empty(workspace, dtype=torch.float32, device=device)
        decode(q, k, v, out, lse, part, *extra)
        merge(part, out, lse, *so, rows, hq, n_q, splits, scale * online.LOG2E)
    return run


def attention_forward(q, k, v, out, lse, scale: float, causal: bool, causal_offset: int, *,
                      kernel: str | None = None, num_splits: int | None = None, mods=None, extras=()) -> None:
    """Fill out (B, Hq, Nq, D) and lse (B, Hq, Nq) with attention of q over k, v (planned for this
    one call: the tests and tuning scripts call it; ta.attention caches the plan)."""
    plan_forward(q, k, v, out, lse, scale, causal, causal_offset, kernel=kernel,
                 num_splits=num_splits, mods=mods)(q, k, v, out, lse, *extras)
