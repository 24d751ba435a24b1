"""Pure-PyTorch algorithms: the reference every kernel is checked against, and the "torch" backend.

Everything here is written for clarity and works in float64. The online-softmax state of DESIGN §1
lives in `OnlineState` with the verbs `update`, `merge` and `finalize`; the tiled softmax and the
blockwise attention below are loops that call them, exactly like the Triton and CUDA kernels do.

Attention scores follow DESIGN §3's model (scale, softcap, ALiBi, key mask, window/causal), written
once in `_scores` and used by the dense reference `attention`, the blockwise forward and the blockwise
backward alike; `attention_varlen` and `attention_kvcache` loop them over packed sequences and cache
rows (`kvcache_keys` gathers a cache row's keys, paged or not, without writing the cache).

State convention: `m` is the running max and `l` the sum of `exp(x - m)`, both in natural units.
A state that has seen only `-inf` has `m = -inf, l = 0`; every verb guards `exp(-inf - (-inf))` by
treating such a max as 0 (the FlashAttention trick), so merging or updating it never makes a NaN.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "OnlineState",
    "identity_state",
    "tile_state",
    "update",
    "merge_states",
    "finalize",
    "safe_softmax",
    "online_softmax",
    "tiled_softmax",
    "softmax_backward",
    "log_softmax",
    "attention",
    "blockwise_attention",
    "merge_attention_partials",
    "merge_attention_outputs",
    "attention_probs",
    "blockwise_attention_backward",
    "attention_varlen",
    "kvcache_keys",
    "attention_kvcache",
]

NEG_INF = float("-inf")


class OnlineState(NamedTuple):
    m: torch.Tensor  # running max, shape (..., 1) so it broadcasts against a tile
    l: torch.Tensor  # running sum of exp(x - m)


def _finite_or_zero(m: torch.Tensor) -> torch.Tensor:
    # A max of -inf means every value seen so far is -inf: shift by 0 instead, so exp(-inf - 0) = 0
    # rather than exp(-inf - (-inf)) = NaN.
    return torch.where(m == NEG_INF, torch.zeros_like(m), m)


def identity_state(shape, dtype=torch.float32, device=None) -> OnlineState:
    """The state of an empty row: merging it with any state S gives S."""
    return OnlineState(torch.full(shape, NEG_INF, dtype=dtype, device=device),
                       torch.zeros(shape, dtype=dtype, device=device))


def _sum_exp(x: torch.Tensor, m: torch.Tensor, e: torch.Tensor, dim: int) -> torch.Tensor:
    """Σ e where e = exp(x − m) and m = max(x): the terms at a finite max, exactly 1 each, are
    counted and added after the rest. The sum's rounding is then relative to what lies below the
    max, so the large outputs of a peaked row, which a rounded sum moves most, see almost none of
    it. (On the H100, float64, a 3000-column row at scale 10: e.sum() left 4 ulps on a 0.91 output
    where torch.softmax happened to be exact.)"""
    at_max = (x == m) & torch.isfinite(m)
    rest = torch.where(at_max, torch.zeros_like(e), e).sum(dim=dim, keepdim=True)
    return rest + at_max.sum(dim=dim, keepdim=True).to(e.dtype)


def tile_state(tile: torch.Tensor, dim: int = -1) -> OnlineState:
    """State of one tile on its own: m = max(t), l = sum(exp(t - m))."""
    m = tile.amax(dim=dim, keepdim=True)
    return OnlineState(m, _sum_exp(tile, m, torch.exp(tile - _finite_or_zero(m)), dim))


def update(state: OnlineState, tile: torch.Tensor, dim: int = -1) -> OnlineState:
    """m' = max(m, max(t)),  l' = l·exp(m − m') + Σ exp(t − m')."""
    m_new = torch.maximum(state.m, tile.amax(dim=dim, keepdim=True))
    shift = _finite_or_zero(m_new)
    l_new = state.l * torch.exp(state.m - shift) + torch.exp(tile - shift).sum(dim=dim, keepdim=True)
    return OnlineState(m_new, l_new)


def merge_states(a: OnlineState, b: OnlineState) -> OnlineState:
    """m = max(m1, m2),  l = l1·exp(m1 − m) + l2·exp(m2 − m)."""
    m = torch.maximum(a.m, b.m)
    shift = _finite_or_zero(m)
    return OnlineState(m, a.l * torch.exp(a.m - shift) + b.l * torch.exp(b.m - shift))


def finalize(x: torch.Tensor, state: OnlineState, log: bool = False) -> torch.Tensor:
    """y = exp(x − m) / l. A row of only -inf gives 0/0 = NaN, as torch.softmax does.

    log: the log-softmax, y = (x − m) − log l (natural log; lse = m + log l, but the difference is
    taken first, as torch.log_softmax does: x − m is exact for nearby values, and a rounded lse
    would put half an ulp of |m| on every output). A row of only -inf gives -inf − (-inf) = NaN,
    as torch.log_softmax does."""
    if log:
        return (x - _finite_or_zero(state.m)) - torch.log(state.l)
    return torch.exp(x - _finite_or_zero(state.m)) / state.l


def attention_probs(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """finalize from a finished state: p = exp(s − m)/l = exp(s − lse) with lse = m + log l (the
    attention backward recomputes P this way from the forward's saved lse). A row that saw no key
    (lse = −inf) gives p = 0, not exp(s + inf)."""
    return torch.exp(s - torch.where(lse == NEG_INF, torch.full_like(lse, math.inf), lse)[..., None])


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------------------------------------
# softmax
# ----------------------------------------------------------------------------------------------
def safe_softmax(x: torch.Tensor, dim: int = -1, log: bool = False) -> torch.Tensor:
    """The classic three passes: max, then sum of exp(x - max), then divide (log: subtract the
    sum's log)."""
    xa = x.to(_acc_dtype(x.dtype))
    m = xa.amax(dim=dim, keepdim=True)
    e = torch.exp(xa - m)
    if log:
        return ((xa - m) - torch.log(_sum_exp(xa, m, e, dim))).to(x.dtype)
    return (e / _sum_exp(xa, m, e, dim)).to(x.dtype)


def online_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The element-wise recurrence of the seeds, one column at a time (slow: for tests only).

    Accumulates in float64 whatever the input: folding N columns one by one into a running sum
    rounds N times (an O(N·eps) error, not the O(log N·eps) of a tree sum), which in float32 already
    exceeds the numerics rule for rows of a few hundred columns.
    """
    xa = x.to(torch.float64).movedim(dim, -1)
    state = identity_state(xa.shape[:-1] + (1,), xa.dtype, xa.device)
    for j in range(xa.shape[-1]):
        state = update(state, xa[..., j:j + 1])
    return finalize(xa, state).movedim(-1, dim).to(x.dtype)


def tiled_softmax(x: torch.Tensor, dim: int = -1, tile: int = 1 << 16, log: bool = False) -> torch.Tensor:
    """The torch backend: one state per tile of `tile` columns, merged, then one normalize pass
    (log: the log-softmax finalize).

    Accumulates in float32 (float64 for float64 input); output in the input dtype.
    """
    if x.numel() == 0:
        return torch.empty_like(x)
    xa = x.movedim(dim, -1)
    n = xa.shape[-1]
    acc = _acc_dtype(x.dtype)
    state = identity_state(xa.shape[:-1] + (1,), acc, x.device)
    for start in range(0, n, tile):
        state = merge_states(state, tile_state(xa[..., start:start + tile].to(acc)))
    y = torch.empty(xa.shape, dtype=x.dtype, device=x.device)
    for start in range(0, n, tile):
        y[..., start:start + tile] = finalize(xa[..., start:start + tile].to(acc), state, log)
    return y.movedim(-1, dim)


def log_softmax(x: torch.Tensor, dim: int = -1, tile: int = 1 << 16) -> torch.Tensor:
    """The torch backend's log-softmax: tiled_softmax with the log finalize."""
    return tiled_softmax(x, dim, tile, log=True)


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int = -1, log: bool = False) -> torch.Tensor:
    """dx = y·(dy − Σ dy·y); log (y the log-softmax output): dx = dy − exp(y)·Σ dy. Accumulated
    in float32 (float64 for float64). The log form of float32 data runs in float64: exp(y)·Σ dy is
    many times dx, and exp(y)'s float32 rounding times Σ dy would be all of its error
    (tiled_attn/triton/softmax_backward.py says more)."""
    acc = _acc_dtype(y.dtype)
    if log and y.dtype == torch.float32:
        acc = torch.float64
    ya, dya = y.to(acc), dy.to(acc)
    if log:
        return (dya - torch.exp(ya) * dya.sum(dim=dim, keepdim=True)).to(y.dtype)
    return (ya * (dya - (dya * ya).sum(dim=dim, keepdim=True))).to(y.dtype)


# ----------------------------------------------------------------------------------------------
# attention: the score model (DESIGN §3), written once for the dense reference, the blockwise
# forward and the blockwise backward
# ----------------------------------------------------------------------------------------------
def _causal_mask(nq: int, nk: int, device, offset: int | None = None) -> torch.Tensor:
    """Query i sees key j iff j <= i + offset. The default offset nk - nq is bottom-right alignment,
    like flash-attn >= 2.1; offset 0 is torch SDPA's top-left `is_causal`."""
    offset = nk - nq if offset is None else offset
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + offset


def _expand_kv(k: torch.Tensor, hq: int) -> torch.Tensor:
    # The reference may repeat K/V for GQA; the kernels map heads by index instead.
    return k.repeat_interleave(hq // k.shape[1], dim=1) if k.shape[1] != hq else k


class _ScoreMods(NamedTuple):
    """One call's score model, validated and shaped once; `_scores` applies it to a key block."""
    scale: float
    offset: int                          # alignment: query i sits at key position i + offset
    left: int                            # window edges, -1 unbounded; causal is folded in as right = 0
    right: int
    softcap: float                       # c > 0, or 0 for none
    slopes: torch.Tensor | None          # ALiBi slopes as (B or 1, Hq, 1, 1), in the compute dtype
    key_mask: torch.Tensor | None        # (B or 1, 1, 1, Nk): bool (True = attend) or additive


def _window_pair(window) -> tuple[int, int]:
    if window is None:
        return -1, -1
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) for w in window)):
        raise TypeError(f"window must be None or a pair of ints (left, right), -1 for unbounded, got {window!r}")
    if window[0] < -1 or window[1] < -1:
        raise ValueError(f"window entries must be >= -1 (-1: unbounded), got {tuple(window)}")
    return int(window[0]), int(window[1])


def _score_mods(q, nk: int, causal: bool, scale, causal_offset, window, softcap, alibi_slopes, key_mask,
                dtype) -> _ScoreMods:
    """Validate the modifications of one call and bring the tensors to `dtype`, broadcastable against
    scores (B, Hq, Nq, block)."""
    b, hq, nq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    offset = nk - nq if causal_offset is None else int(causal_offset)
    left, right = _window_pair(window)
    if causal:  # flash-attn: causal + window (left, x) is window (left, 0)
        right = 0
    if softcap is None:
        softcap = 0.0
    elif isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (
            0 < softcap < math.inf):
        raise ValueError(f"softcap must be None or a positive finite float, got {softcap!r}")
    slopes = None
    if alibi_slopes is not None:
        shape = tuple(alibi_slopes.shape)
        if shape not in ((hq,), (b, hq)) or not alibi_slopes.is_floating_point():
            raise ValueError(f"alibi_slopes must be a float tensor of shape (Hq,) = ({hq},) or (B, Hq) = "
                             f"({b}, {hq}), got {alibi_slopes.dtype} {shape}")
        slopes = alibi_slopes.to(device=q.device, dtype=dtype).reshape(-1, hq, 1, 1)
    mask = None
    if key_mask is not None:
        if key_mask.dim() != 2 or key_mask.shape[0] not in (1, b) or key_mask.shape[1] != nk:
            raise ValueError(f"key_mask must have shape (B, Nk) = ({b}, {nk}), got {tuple(key_mask.shape)}")
        mask = key_mask if key_mask.dtype == torch.bool else key_mask.to(dtype)
        mask = mask.to(q.device)[:, None, None, :]
    return _ScoreMods(scale, offset, left, right, float(softcap), slopes, mask)


def _scores(qa: torch.Tensor, kb: torch.Tensor, m: _ScoreMods, start: int, stop: int):
    """Scores of every query against keys [start, stop), `kb` being those keys (expanded to the
    query heads): DESIGN §3's steps in order — scale, softcap, ALiBi, key mask, positional mask.

    Returns (s, t) with t = tanh(scale·q·k / c), kept for the backward's softcap chain factor
    1 − t² (None without softcap). Invisible keys are exactly −inf, which the online verbs and
    attention_probs turn into exact zeros.
    """
    s = torch.matmul(qa, kb.transpose(-1, -2)) * m.scale
    t = None
    if m.softcap:
        t = torch.tanh(s / m.softcap)
        s = m.softcap * t
    rel = None
    if m.slopes is not None or m.left >= 0 or m.right >= 0:
        # rel[i, j] = (i + offset) − j: how far key j lies behind query i's aligned position.
        rel = (torch.arange(qa.shape[-2], device=qa.device)[:, None] + m.offset
               - torch.arange(start, stop, device=qa.device)[None, :])
    if m.slopes is not None:
        # |rel| is an exact integer in the compute dtype (below 2^24 keys for float32): the bias
        # rounds once, in the product.
        s = s - m.slopes * rel.abs().to(s.dtype)
    if m.key_mask is not None:
        km = m.key_mask[..., start:stop]
        s = s.masked_fill(~km, NEG_INF) if km.dtype == torch.bool else s + km
    if m.left >= 0:
        s = s.masked_fill(rel > m.left, NEG_INF)      # j < i + offset − left
    if m.right >= 0:
        s = s.masked_fill(rel < -m.right, NEG_INF)    # j > i + offset + right
    return s, t


def _key_range(m: _ScoreMods, nq: int, nk: int) -> tuple[int, int]:
    """Keys [lo, hi) that at least one query may see through the window: the tiled algorithms walk
    only these (as the kernels do). Skipping the rest changes nothing, bit for bit: a tile of only
    −inf leaves the state (m, l·exp(0) + 0) and the accumulator (acc·1 + 0) as they were."""
    if nq == 0:
        return 0, 0
    lo = 0 if m.left < 0 else min(nk, max(0, m.offset - m.left))
    hi = nk if m.right < 0 else min(nk, max(0, nq + m.offset + m.right))
    return lo, max(lo, hi)


def attention(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False,
              causal_offset: int | None = None, *, window=None, softcap=None, alibi_slopes=None,
              key_mask=None):
    """softmax(scores) v, materializing the scores: the reference (use float64 inputs).

    The scores are DESIGN §3's: scale·q·kᵀ, then softcap c·tanh(s/c), ALiBi −slope[b, h]·|i + off − j|
    (slopes (Hq,) or (B, Hq)), `key_mask` (B, Nk) (bool: False hides the key; float: added), and the
    positional mask: `window` (left, right), −1 unbounded, with causal forcing right = 0. `off` is
    `causal_offset`, bottom-right Nk − Nq by default (0 is torch SDPA's top-left `is_causal`); it
    aligns the causal mask, the window and ALiBi alike. Computes in the inputs' dtype. Rows that see
    no key give output 0 and lse −inf, and gradient 0 under autograd.
    """
    m = _score_mods(q, k.shape[2], causal, scale, causal_offset, window, softcap, alibi_slopes, key_mask,
                    q.dtype)
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    s, _ = _scores(q, k, m, 0, k.shape[2])
    # logsumexp's backward on a row of only −inf is exp(−inf − (−inf)) = NaN, and an additive mask
    # would carry it to q: such rows take the logsumexp of zeros instead, then −inf by hand.
    dead = (s == NEG_INF).all(dim=-1, keepdim=True)
    lse = torch.logsumexp(s.masked_fill(dead, 0.0), dim=-1) if s.shape[-1] > 0 else torch.zeros(
        s.shape[:-1], dtype=s.dtype, device=s.device)
    lse = torch.where(dead.squeeze(-1), torch.full_like(lse, NEG_INF), lse)
    p = torch.exp(s - _finite_or_zero(lse)[..., None])
    out = torch.matmul(p, v)
    return (out, lse) if return_lse else out


def _attention_block_loop(qa, k, v, m: _ScoreMods, kv_start, kv_stop, block_n):
    """Online attention over keys [kv_start, kv_stop): returns the unnormalized (acc, state)."""
    b, h, nq, _ = qa.shape
    acc_t = qa.dtype
    state = identity_state((b, h, nq, 1), acc_t, qa.device)
    acc = torch.zeros(b, h, nq, v.shape[-1], dtype=acc_t, device=qa.device)
    for start in range(kv_start, kv_stop, block_n):
        stop = min(start + block_n, kv_stop)
        s, _ = _scores(qa, k[:, :, start:stop].to(acc_t), m, start, stop)
        new = update(state, s)
        shift = _finite_or_zero(new.m)
        # The accumulator is rescaled by the same exp(m - m') factor as l.
        acc = acc * torch.exp(state.m - shift) + torch.matmul(torch.exp(s - shift), v[:, :, start:stop].to(acc_t))
        state = new
    return acc, state


def _finalize_attention(acc, state: OnlineState, dtype):
    empty = state.l == 0  # fully masked row (or no keys): output 0, lse -inf
    l_safe = torch.where(empty, torch.ones_like(state.l), state.l)
    out = torch.where(empty, torch.zeros_like(acc), acc / l_safe)
    # log of the guarded l: log(0)'s backward (1/0) would turn the discarded branch's zero gradient
    # into NaN when torch's autograd differentiates this loop (the varlen torch backend does).
    lse = torch.where(empty, torch.full_like(state.m, NEG_INF), state.m + torch.log(l_safe))
    return out.to(dtype), lse.squeeze(-1).to(_acc_dtype(dtype))


def merge_attention_partials(parts):
    """Merge (acc, state) partials of disjoint key ranges (split-KV / flash-decoding)."""
    acc, state = parts[0]
    for acc2, state2 in parts[1:]:
        merged = merge_states(state, state2)
        shift = _finite_or_zero(merged.m)
        acc = acc * torch.exp(state.m - shift) + acc2 * torch.exp(state2.m - shift)
        state = merged
    return acc, state


def merge_attention_outputs(out_a, lse_a, out_b, lse_b):
    """Merge two finished attention results over disjoint key sets, (out, lse) each with lse in
    natural-log units (context parallelism's ring steps, tiled_attn/distributed.py).

    A finished result is the state (m = lse, l = 1) with the accumulator out (l = 0 where lse = −inf:
    a row that saw no key is the identity state), so this is merge_attention_partials of the two,
    then the attention finalize: out = (out_a·e^(lse_a−m) + out_b·e^(lse_b−m)) / l and lse = m + log l.
    Rows that saw no key on either side give out 0 and lse −inf, never NaN. Computes in out_a's
    dtype (pass float32 or float64: the caller's accumulator); lse comes back in its float dtype.
    """
    def state(lse):
        m = lse[..., None]
        return OnlineState(m, (m != NEG_INF).to(m.dtype))
    acc, merged = merge_attention_partials([(out_a, state(lse_a)), (out_b, state(lse_b))])
    return _finalize_attention(acc, merged, out_a.dtype)


def blockwise_attention(q, k, v, causal: bool = False, scale: float | None = None,
                        return_lse: bool = False, block_n: int = 512, num_splits: int = 1,
                        causal_offset: int | None = None, *, window=None, softcap=None,
                        alibi_slopes=None, key_mask=None):
    """The torch backend of ta.attention: online softmax over key blocks, never the full scores.

    Same score model and arguments as `attention`. Only the keys some query can see through the
    window are walked (`_key_range`); with num_splits > 1 that range is split into parts whose
    partial (acc, m, l) are merged, the split-KV scheme the decode kernels use. Accumulates in
    float32 (float64 for float64); plain torch ops, so torch's autograd can differentiate it too.
    """
    acc_t = _acc_dtype(q.dtype)
    nq, nk = q.shape[2], k.shape[2]
    m = _score_mods(q, nk, causal, scale, causal_offset, window, softcap, alibi_slopes, key_mask, acc_t)
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    lo, hi = _key_range(m, nq, nk)
    num_splits = max(1, min(num_splits, hi - lo))
    bounds = [lo + (hi - lo) * i // num_splits for i in range(num_splits + 1)]
    qa = q.to(acc_t)
    parts = [_attention_block_loop(qa, k, v, m, bounds[i], bounds[i + 1], block_n) for i in range(num_splits)]
    out, lse = _finalize_attention(*merge_attention_partials(parts), q.dtype)
    return (out, lse) if return_lse else out


def _sum_group(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, Hq, ...) -> (B, Hkv, ...): the sum over each key/value head's group of query heads."""
    b, hq = x.shape[:2]
    return x.reshape(b, hkv, hq // hkv, *x.shape[2:]).sum(2) if hq != hkv else x


def blockwise_attention_backward(q, k, v, out, lse, grad_out, grad_lse=None, causal: bool = False,
                                 scale: float | None = None, causal_offset: int | None = None,
                                 block_n: int = 512, *, window=None, softcap=None, alibi_slopes=None,
                                 key_mask=None):
    """The torch backend's attention backward, the tiled algorithm of the kernels: (dq, dk, dv).

    delta = rowsum(dO·O) − dlse first; then per key block P = exp(s − lse) is recomputed from q, k
    and the forward's lse (never the full scores), dV += Pᵀ·dO, dS = P·(dO·Vᵀ − delta), through a
    softcap dS_pre = dS·(1 − tanh²) (the derivative of c·tanh(x/c)), dQ += dS_pre·K·scale,
    dK += dS_preᵀ·Q·scale, with dK/dV summed over each GQA group. (A gradient of lse adds P·dlse to
    dS: d lse_i / d s_ij = P_ij, hence the − dlse in delta.) ALiBi and the masks are constants of
    the scores: no gradient, and invisible keys have P = 0 so dS = 0 there; rows that saw no key
    (lse = −inf) get P = 0 and gradient 0. Same score arguments as `attention`. Accumulates in
    float32 (float64 for float64); the gradients come back in the inputs' dtypes.
    """
    acc_t = _acc_dtype(q.dtype)
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    m = _score_mods(q, nk, causal, scale, causal_offset, window, softcap, alibi_slopes, key_mask, acc_t)
    qa, doa = q.to(acc_t), grad_out.to(acc_t)
    delta = (doa * out.to(acc_t)).sum(-1)
    if grad_lse is not None:
        # A −inf lse's (empty row's) gradient is meaningless; its P is 0 anyway.
        delta = delta - grad_lse.to(acc_t)
    lse_a = lse.to(acc_t)
    dq = torch.zeros(b, hq, nq, d, dtype=acc_t, device=q.device)
    dk = torch.zeros(b, hkv, nk, d, dtype=acc_t, device=q.device)
    dv = torch.zeros(b, hkv, nk, v.shape[-1], dtype=acc_t, device=q.device)
    lo, hi = _key_range(m, nq, nk)
    for start in range(lo, hi, block_n):
        stop = min(start + block_n, hi)
        kb = _expand_kv(k[:, :, start:stop].to(acc_t), hq)
        vb = _expand_kv(v[:, :, start:stop].to(acc_t), hq)
        s, t = _scores(qa, kb, m, start, stop)
        p = attention_probs(s, lse_a)
        ds = p * (torch.matmul(doa, vb.transpose(-1, -2)) - delta[..., None])
        if t is not None:
            ds = ds * (1 - t * t)
        dv[:, :, start:stop] = _sum_group(torch.matmul(p.transpose(-1, -2), doa), hkv)
        dk[:, :, start:stop] = _sum_group(torch.matmul(ds.transpose(-1, -2), qa), hkv) * m.scale
        dq += torch.matmul(ds, kb) * m.scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ----------------------------------------------------------------------------------------------
# packed sequences and KV caches: loops of the above, one sequence (row) at a time
# ----------------------------------------------------------------------------------------------
def _host_ints(x) -> list[int]:
    return [int(x)] if isinstance(x, int) else [int(i) for i in (x.tolist() if isinstance(x, torch.Tensor) else x)]


def _row_slopes(alibi_slopes, b: int):
    # (B, Hq) slopes hold one row per sequence/batch row; (Hq,) slopes are shared.
    return alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal: bool = False, scale: float | None = None,
                     window=None, softcap=None, alibi_slopes=None, return_lse: bool = False,
                     blockwise: bool = False, block_n: int = 512):
    """flash_attn_varlen_func's meaning, one sequence at a time: the reference of ta.attention_varlen
    (`blockwise=False`, the dense `attention`) and its torch backend (`blockwise=True`).

    q (total_q, Hq, D), k/v (total_k, Hkv, D); sequence b is q rows cu_seqlens_q[b]:[b + 1] against
    keys cu_seqlens_k[b]:[b + 1], aligned bottom-right (off = len_k − len_q); (B, Hq) ALiBi slopes
    give sequence b row b. Returns out (total_q, Hq, D) and, with return_lse, lse (Hq, total_q)
    (flash-attn's layout). Rows past the last sequence (cu_seqlens_q[-1] < total_q) and sequences
    with no keys give 0 and −inf. Differentiable by torch's autograd (slices, transposes and cat).
    """
    cq, ck = _host_ints(cu_seqlens_q), _host_ints(cu_seqlens_k)
    if len(cq) != len(ck) or len(cq) < 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both have B + 1 >= 1 entries, got {len(cq)} "
                         f"and {len(ck)}")
    hq, dv = q.shape[1], v.shape[-1]
    lse_t = _acc_dtype(q.dtype) if blockwise else q.dtype
    fn = blockwise_attention if blockwise else attention
    kw = dict(block_n=block_n) if blockwise else {}
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qb, kb, vb = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t, lo, hi in
                      ((q, cq[b], cq[b + 1]), (k, ck[b], ck[b + 1]), (v, ck[b], ck[b + 1])))
        o, l = fn(qb, kb, vb, causal=causal, scale=scale, return_lse=True, window=window, softcap=softcap,
                  alibi_slopes=_row_slopes(alibi_slopes, b), **kw)
        outs.append(o[0].transpose(0, 1))
        lses.append(l[0].to(lse_t))
    tail = q.shape[0] - cq[-1]
    outs.append(torch.zeros(tail, hq, dv, dtype=q.dtype, device=q.device))
    lses.append(torch.full((hq, tail), NEG_INF, dtype=lse_t, device=q.device))
    out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
    return (out, lse) if return_lse else out


def kvcache_keys(k_cache, v_cache, cache_seqlens, block_table=None, k_new=None, v_new=None):
    """Each batch row's keys and values as flash_attn_with_kvcache sees them, without touching the
    cache: a list of (k_b, v_b), each (1, Hkv, Nk_b, D).

    k_cache/v_cache (B, Nmax, Hkv, D), or paged (num_pages, page_size, Hkv, D) with block_table
    (B, pages) (key position p of row b lives in page block_table[b, p // page_size], slot
    p % page_size). cache_seqlens: (B,) ints or one int, each row's length before the call. k_new/
    v_new (B, Hkv, Nq_new, D) follow the first cache_seqlens[b] keys (Nk_b = cache_seqlens[b] +
    Nq_new), as if written in place (cast to the cache's dtype, as the write would). The contiguous
    cache's rows may come back as views of it.
    """
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together")
    if isinstance(cache_seqlens, int):
        rows = (block_table.shape[0] if block_table is not None else
                k_new.shape[0] if k_new is not None else k_cache.shape[0])
        lens = [cache_seqlens] * rows
    else:
        lens = _host_ints(cache_seqlens)
    keys = []
    for b, n in enumerate(lens):
        if block_table is None:
            kb, vb = k_cache[b, :n], v_cache[b, :n]
        else:
            page = k_cache.shape[1]
            pos = torch.arange(n, device=k_cache.device)
            pages = block_table[b].to(device=k_cache.device, dtype=torch.long)[pos // page]
            kb, vb = k_cache[pages, pos % page], v_cache[pages, pos % page]
        kb, vb = kb.transpose(0, 1).unsqueeze(0), vb.transpose(0, 1).unsqueeze(0)
        if k_new is not None:
            kb = torch.cat([kb, k_new[b:b + 1].to(device=kb.device, dtype=kb.dtype)], dim=2)
            vb = torch.cat([vb, v_new[b:b + 1].to(device=vb.device, dtype=vb.dtype)], dim=2)
        keys.append((kb, vb))
    return keys


def attention_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None, block_table=None,
                      causal: bool = False, scale: float | None = None, window=None, softcap=None,
                      alibi_slopes=None, return_lse: bool = False, blockwise: bool = False,
                      block_n: int = 512):
    """flash_attn_with_kvcache's meaning, one batch row at a time (the cache is not written: see
    kvcache_keys): the reference of ta.attention_kvcache (`blockwise=False`) and its torch backend
    (`blockwise=True`, called after the in-place append with the lengths after it and no k_new).

    q (B, Hq, Nq, D); row b attends to its Nk_b keys aligned bottom-right, off_b = Nk_b − Nq, so
    causal lines the Nq queries up with the last Nq keys; (B, Hq) ALiBi slopes give row b row b.
    Returns out (B, Hq, Nq, D) and, with return_lse, lse (B, Hq, Nq); a row with no keys gives 0
    and −inf.
    """
    if isinstance(cache_seqlens, int):
        cache_seqlens = [cache_seqlens] * q.shape[0]
    keys = kvcache_keys(k_cache, v_cache, cache_seqlens, block_table, k_new, v_new)
    if len(keys) != q.shape[0]:
        raise ValueError(f"cache_seqlens must have B = {q.shape[0]} entries, got {len(keys)}")
    fn = blockwise_attention if blockwise else attention
    kw = dict(block_n=block_n) if blockwise else {}
    outs, lses = [], []
    for b, (kb, vb) in enumerate(keys):
        o, l = fn(q[b:b + 1], kb, vb, causal=causal, scale=scale, return_lse=True, window=window,
                  softcap=softcap, alibi_slopes=_row_slopes(alibi_slopes, b), **kw)
        outs.append(o)
        lses.append(l)
    if not outs:
        lse_t = _acc_dtype(q.dtype) if blockwise else q.dtype
        out = q.new_zeros(0, q.shape[1], q.shape[2], v_cache.shape[-1])
        lse = torch.zeros(0, q.shape[1], q.shape[2], dtype=lse_t, device=q.device)
    else:
        out, lse = torch.cat(outs, 0), torch.cat(lses, 0)
    return (out, lse) if return_lse else out
