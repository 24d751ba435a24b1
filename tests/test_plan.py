"""The cost of a call (DESIGN §3, tiled_attn/_plan.py): validate → a cached plan → launch.

A signature's plan is made once and reused; a new shape, dtype, device, stride pattern, dim, flag
or backend makes a new one and never reuses a wrong one; arguments whose wrong type hashes like a
right one (True == 1 == 1.0) still get their error; traced calls go through the registered ops; the
CPU default is torch's own op where it computes the same thing. GPU-only: the compiled-kernel
launch path (triton/launch.py) after the first call, a new alignment, CUDA-graph capture.
"""
import sys

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from helpers import HAS_CUDA, assert_rule, backend_available, device_for, randn, skip_reason
from tiled_attn import _plan, reference

SOFTMAX = sys.modules["tiled_attn.softmax"]
ATTN = sys.modules["tiled_attn.attention"]
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def _triton_device():
    if not backend_available("triton"):
        pytest.skip(skip_reason("triton"))
    return device_for("triton")


@pytest.fixture
def made(monkeypatch):
    """Every plan made (class name, backend), in order."""
    log = []
    for cls in (SOFTMAX.SoftmaxPlan, SOFTMAX.SoftmaxBackwardPlan, ATTN.AttentionPlan):
        init = cls.__init__

        def counting(self, *args, _init=init, _name=cls.__name__, **kw):
            _init(self, *args, **kw)
            log.append((_name, self.backend))
        monkeypatch.setattr(cls, "__init__", counting)
    return log


def _softmax_ref(x, dim):
    return torch.softmax(x.double(), dim)


def test_softmax_same_signature_reuses_the_plan(made, seed):
    dev = _triton_device()
    gen = torch.Generator().manual_seed(seed)
    x = randn((6, 37), torch.float32, dev, gen)
    y1 = ta.softmax(x, -1, backend="triton")
    y2 = ta.softmax(randn((6, 37), torch.float32, dev, gen), -1, backend="triton")
    assert made == [("SoftmaxPlan", "triton")]
    assert y1.data_ptr() != y2.data_ptr()  # a fresh output per call
    assert_rule(y1, _softmax_ref(x, -1), torch.softmax(x, -1), dtype=x.dtype, seed=seed)


# Each variation of the first call's signature: (what changes, a function of the first x).
VARIATIONS = {
    "shape": lambda x: x[:5].clone(),
    "dtype": lambda x: x.to(torch.bfloat16),
    "strides": lambda x: x.t().contiguous().t(),     # same shape, column-major
    "step slice": lambda x: x[::2],
    "dim": None,
    "kernel": None,
}


@pytest.mark.parametrize("what", list(VARIATIONS))
def test_softmax_new_signature_new_plan(what, made, seed):
    dev = _triton_device()
    gen = torch.Generator().manual_seed(seed)
    x = randn((8, 40), torch.float32, dev, gen, 3.0)
    ta.softmax(x, -1, backend="triton")
    dim, kernel = (0 if what == "dim" else -1), ("online" if what == "kernel" else None)
    x2 = VARIATIONS[what](x) if VARIATIONS[what] else x
    for _ in range(2):  # alternate: each signature keeps its own plan
        y = ta.softmax(x2, dim, backend="triton", kernel=kernel)
        assert_rule(y, _softmax_ref(x2, dim), torch.softmax(x2, dim), dtype=x2.dtype, seed=seed, what=what)
        y0 = ta.softmax(x, -1, backend="triton")
        assert_rule(y0, _softmax_ref(x, -1), torch.softmax(x, -1), dtype=x.dtype, seed=seed, what=what)
    assert len(made) == 2


def test_log_softmax_is_its_own_signature(made, seed):
    """softmax and log_softmax of the same x: two plans (log is part of the signature), each
    reused, each right; their backwards likewise."""
    dev = _triton_device()
    gen = torch.Generator().manual_seed(seed)
    x = randn((6, 37), torch.float32, dev, gen, 3.0)
    for _ in range(2):
        y = ta.softmax(x, -1, backend="triton")
        assert_rule(y, _softmax_ref(x, -1), torch.softmax(x, -1), dtype=x.dtype, seed=seed)
        z = ta.log_softmax(x, -1, backend="triton")
        assert_rule(z, torch.log_softmax(x.double(), -1), torch.log_softmax(x, -1), dtype=x.dtype,
                    seed=seed, what="log_softmax", ulp_floor=True)
    assert made == [("SoftmaxPlan", "triton"), ("SoftmaxPlan", "triton")]
    assert [p.log for p in SOFTMAX._PLANS.values()] == [False]
    assert [p.log for p in SOFTMAX._LOG_PLANS.values()] == [True]
    dy = randn((6, 37), torch.float32, dev, gen)
    for fn in (ta.softmax, ta.log_softmax):
        fn(x.detach().clone().requires_grad_(), -1, backend="triton").backward(dy)
    assert made[2:] == [("SoftmaxBackwardPlan", "triton"), ("SoftmaxBackwardPlan", "triton")]


def test_softmax_backward_plans(made, seed):
    dev = _triton_device()
    gen = torch.Generator().manual_seed(seed)
    x = randn((5, 33), torch.float32, dev, gen).requires_grad_()
    for dy in (randn((5, 33), torch.float32, dev, gen), randn((33, 5), torch.float32, dev, gen).t()):
        x.grad = None
        ta.softmax(x, -1, backend="triton").backward(dy)
        ref = reference.softmax_backward(_softmax_ref(x.detach(), -1), dy.double(), -1)
        xt = x.detach().clone().requires_grad_()
        torch.softmax(xt, -1).backward(dy)
        assert_rule(x.grad, ref, xt.grad, dtype=x.dtype, seed=seed)
    # one forward plan; one backward plan per dy layout
    assert made == [("SoftmaxPlan", "triton"), ("SoftmaxBackwardPlan", "triton"),
                    ("SoftmaxBackwardPlan", "triton")]


@pytest.mark.parametrize("bad,error", [
    (dict(dim=1.0), r"dim must be an int, got float"),
    (dict(dim=True), r"dim must be an int, got bool"),
    (dict(dim=[1]), r"dim must be an int, got list"),
    (dict(backend=["triton"]), r"backend must be None or one of"),
    (dict(kernel=1), r"kernel must be None or a kernel name"),
])
def test_softmax_errors_after_a_cached_plan(bad, error):
    """A hit proves an identical signature was validated: look-alike arguments still fail."""
    x = torch.randn(3, 4)
    ta.softmax(x, 1, backend="torch", kernel=None)
    args = {"dim": 1, "backend": "torch", "kernel": None, **bad}
    with pytest.raises((TypeError, ValueError), match=error):
        ta.softmax(x, args.pop("dim"), **args)


def test_attention_plan_reuse_and_variations(made, seed):
    dev = _triton_device()
    gen = torch.Generator().manual_seed(seed)

    def qkv(nq=9, nk=21, hq=4, hkv=2, dtype=torch.float16):
        return (randn((1, hq, nq, 32), dtype, dev, gen), randn((1, hkv, nk, 32), dtype, dev, gen),
                randn((1, hkv, nk, 32), dtype, dev, gen))

    def check(q, k, v, **kw):
        out = ta.attention(q, k, v, backend="triton", **kw)
        c = kw.get("causal", False)
        ref = reference.blockwise_attention(q.double(), k.double(), v.double(), causal=c, scale=kw.get("scale"))
        theirs = reference.blockwise_attention(q, k, v, causal=c, scale=kw.get("scale"))
        assert_rule(out, ref, theirs, dtype=q.dtype, seed=seed, what=str(kw))

    base = qkv()
    check(*base)
    check(*qkv())
    assert len(made) == 1
    for kw, inputs in ((dict(causal=True), base), (dict(scale=0.3), base), ({}, qkv(nk=22)),
                       ({}, qkv(dtype=torch.bfloat16)), ({}, qkv(hkv=1)),
                       ({}, tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in base))):
        n = len(made)
        check(*inputs, **kw)
        check(*base)
        assert len(made) == n + 1, kw


@pytest.mark.parametrize("nq,nk,splits", [(37, 50, None), (1, 300, 1), (2, 300, 3)])
def test_attention_inference_plans_out_alone(nq, nk, splits, monkeypatch, seed):
    """A call that asks for no lse and records no gradient (ta.attention, the SDPA drop-in) runs
    launches that write `out` alone (STORE_LSE=False: one allocation, no lse stores); a call with
    return_lse runs the other launches of its plan. Each is planned at its first use; both follow
    the rule (forward kernel; decode kernel without and with splits), lse too."""
    from test_attention import _check
    dev = _triton_device()
    if splits is not None:  # force the decode kernel's split count on these small shapes
        from tiled_attn.triton import attention as triton_attention
        real = triton_attention.plan_forward
        monkeypatch.setattr(triton_attention, "plan_forward",
                            lambda *a, **kw: real(*a, **{**kw, "kernel": "decode", "num_splits": splits}))
    gen = torch.Generator().manual_seed(seed)
    q = randn((2, 4, nq, 32), torch.float16, dev, gen)
    k, v = (randn((2, 2, nk, 32), torch.float16, dev, gen) for _ in range(2))
    out = ta.attention(q, k, v, causal=True, backend="triton")
    plan, = ATTN._PLANS.values()
    assert plan.run_out is not None and plan.run is None
    out2, lse = ta.attention(q, k, v, causal=True, backend="triton", return_lse=True)
    plan2 = [p for p in ATTN._PLANS.values() if p is not plan]
    assert len(plan2) == 1 and plan2[0].run is not None and plan2[0].run_out is None
    _check(out2, lse, q, k, v, True, nk - nq, 32 ** -0.5, seed, f"lse launches nq={nq}")
    _check(out, lse, q, k, v, True, nk - nq, 32 ** -0.5, seed, f"out-only launches nq={nq}")


@pytest.mark.parametrize("bad,error", [
    (dict(causal=1), r"causal must be a bool, got int"),
    (dict(scale=True), r"scale must be None or a float, got bool"),
    (dict(scale=float("nan")), r"scale must be finite"),
    (dict(backend="nope"), r"backend must be None or one of"),
])
def test_attention_errors_after_a_cached_plan(bad, error):
    q = torch.randn(1, 2, 3, 16)
    ta.attention(q, q, q, causal=True, scale=1.0, backend="torch")
    kw = {"causal": True, "scale": 1.0, "backend": "torch", **bad}
    with pytest.raises((TypeError, ValueError), match=error):
        ta.attention(q, q, q, **kw)


def test_attention_shape_errors_after_a_cached_plan():
    q = torch.randn(1, 2, 3, 16)
    ta.attention(q, q, q, backend="torch")
    with pytest.raises(TypeError, match=r"k must have q's dtype float32, got float64"):
        ta.attention(q, q.double(), q, backend="torch")
    with pytest.raises(ValueError, match=r"q must have 4 dims"):
        ta.attention(q[0], q, q, backend="torch")


def test_cache_is_bounded():
    cache = _plan.PlanCache("test", limit=3)
    for i in range(5):
        cache.put(i, object())
    assert list(cache) == [2, 3, 4]
    cache.put(None, object())  # an unhashable signature is planned, not stored
    assert len(cache) == 3
    _plan.clear_all()
    assert len(cache) == 0


def test_clear_all_reaches_every_plan_cache():
    """clear_all forgets every plan cache but the ones made with clear_all=False (the context-parallel
    signature check, which one rank alone must not clear): caches are registered by identity (an
    earlier list.remove() compared them as empty dicts and dropped the softmax plans' cache)."""
    from tiled_attn import distributed, kvcache, varlen
    caches = [SOFTMAX._PLANS, SOFTMAX._BACKWARD_PLANS, SOFTMAX._LOG_PLANS, SOFTMAX._LOG_BACKWARD_PLANS,
              ATTN._PLANS, ATTN._BACKWARD_PLANS, ATTN._SDPA_PLANS, kvcache._PLANS, varlen._SIGNATURES]
    for cache in caches:
        cache.put(("probe",), object())
    _plan.clear_all()
    assert [len(c) for c in caches] == [0] * len(caches)
    assert not any(c is distributed._SIGNATURES for c in _plan._CACHES)


def test_config_table_change_clears_plans(monkeypatch):
    from tiled_attn import configs
    ta.softmax(torch.randn(2, 3), backend="torch")
    assert len(SOFTMAX._PLANS) == 1
    key = next(iter(configs.TRITON_ATTENTION))
    monkeypatch.setitem(configs.TRITON_ATTENTION, key, dict(configs.TRITON_ATTENTION[key]))
    assert len(SOFTMAX._PLANS) == 0


# ------------------------------------------------------------------------------------------------
# traced calls take the registered ops
# ------------------------------------------------------------------------------------------------
def test_make_fx_records_the_ops():
    from torch.fx.experimental.proxy_tensor import make_fx
    x = torch.randn(4, 6)
    q = torch.randn(1, 2, 5, 16)

    def f(x, q):
        return ta.softmax(x, backend="torch"), ta.attention(q, q, q, backend="torch")

    for mode in ("real", "fake"):
        gm = make_fx(f, tracing_mode=mode)(x, q)
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert torch.ops.tiled_attn.softmax.default in targets, mode
        assert torch.ops.tiled_attn.attention_fwd.default in targets, mode


def test_eager_predicate():
    assert _plan.eager()
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert not _plan.eager()


# ------------------------------------------------------------------------------------------------
# backend=None on the CPU: torch's own op where it computes the same thing
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nq,nk,causal,lse,expected", [
    (7, 7, True, False, "native"),     # top-left == bottom-right
    (3, 11, True, False, "native"),    # bottom-right through causal_lower_right
    (11, 3, True, False, "torch"),     # rows that see no key: torch's SDPA is undefined there
    (5, 9, False, False, "native"),
    (5, 9, False, True, "torch"),      # lse: torch's SDPA does not return it
    (4, 0, False, False, "native"),    # no keys: output 0 without a launch
])
def test_cpu_default_attention(nq, nk, causal, lse, expected, kernel_calls, seed):
    gen = torch.Generator().manual_seed(seed)
    q = randn((2, 4, nq, 32), torch.float32, "cpu", gen)
    k, v = (randn((2, 2, nk, 32), torch.float32, "cpu", gen) for _ in range(2))
    got = ta.attention(q, k, v, causal=causal, return_lse=lse)
    out = got[0] if lse else got
    ref = reference.blockwise_attention(q.double(), k.double(), v.double(), causal=causal)
    theirs = reference.blockwise_attention(q, k, v, causal=causal)
    assert_rule(out, ref, theirs, dtype=q.dtype, seed=seed, what=f"{nq}x{nk} causal={causal}")
    assert kernel_calls == [expected]


def test_cpu_default_softmax_is_torch_softmax(seed):
    x = randn((3, 5, 7), torch.bfloat16, "cpu", torch.Generator().manual_seed(seed))
    assert torch.equal(ta.softmax(x, 1), torch.softmax(x, 1))
    xg = x.float().requires_grad_()
    ta.softmax(xg, 1).sum().backward()  # torch's own autograd
    assert xg.grad is not None


def test_cpu_default_compiles_fullgraph(seed):
    gen = torch.Generator().manual_seed(seed)
    q = randn((1, 4, 6, 16), torch.float32, "cpu", gen)
    k = randn((1, 2, 10, 16), torch.float32, "cpu", gen)

    def f(q, k):
        return ta.softmax(ta.attention(q, k, k, causal=True), -1)

    torch._dynamo.reset()
    try:
        out = torch.compile(f, fullgraph=True, backend="eager")(q, k)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, f(q, k))


# ------------------------------------------------------------------------------------------------
# GPU: launches through the compiled kernel
# ------------------------------------------------------------------------------------------------
@gpu
def test_launch_uses_the_compiled_kernel_after_the_first_call(monkeypatch, seed):
    from tiled_attn.triton import launch as launch_mod
    jit_calls = []
    real = launch_mod.Launch.__call__

    def spy(self, *args):
        if not self._compiled:
            jit_calls.append(self.fn)
        return real(self, *args)
    monkeypatch.setattr(launch_mod.Launch, "__call__", spy)
    gen = torch.Generator().manual_seed(seed)
    x = randn((64, 1000), torch.bfloat16, "cuda", gen)
    outs = [ta.softmax(x, -1, backend="triton") for _ in range(3)]
    assert len(jit_calls) == 1
    for y in outs:
        assert_rule(y, _softmax_ref(x, -1), torch.softmax(x, -1), dtype=x.dtype, seed=seed)
    # A 16-byte-misaligned view of the same layout is a new specialization (Triton's alignment
    # hint would be wrong for it): it compiles its own, and is right.
    big = randn((64 * 1000 + 8,), torch.bfloat16, "cuda", gen)
    a, b = big[:64000].view(64, 1000), big[1:64001].view(64, 1000)
    for t in (a, b, a, b):
        assert_rule(ta.softmax(t, -1, backend="triton"), _softmax_ref(t, -1), torch.softmax(t, -1),
                    dtype=t.dtype, seed=seed, what="alignment")


@gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_attention_fast_path_matches_first_call(backend, seed):
    if not backend_available(backend):
        pytest.skip(skip_reason(backend))
    gen = torch.Generator().manual_seed(seed)
    for nq in (1, 128):  # decode (split-KV) and prefill plans
        q = randn((2, 8, nq, 64), torch.bfloat16, "cuda", gen)
        k, v = (randn((2, 2, 700, 64), torch.bfloat16, "cuda", gen) for _ in range(2))
        first = ta.attention(q, k, v, causal=True, backend=backend)
        for _ in range(2):
            torch.testing.assert_close(ta.attention(q, k, v, causal=True, backend=backend), first,
                                       rtol=0, atol=0)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True,
                                             attn_mask=torch.ones(nq, 700, dtype=torch.bool, device="cuda").tril(700 - nq))
        theirs = F.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                                attn_mask=torch.ones(nq, 700, dtype=torch.bool, device="cuda").tril(700 - nq))
        assert_rule(first, ref, theirs, dtype=q.dtype, seed=seed, what=f"{backend} nq={nq}")


@gpu
def test_graph_capture_after_plans(seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((32, 500), torch.float16, "cuda", gen)
    q = randn((1, 4, 1, 64), torch.float16, "cuda", gen)
    k = randn((1, 4, 3000, 64), torch.float16, "cuda", gen)
    eager = (ta.softmax(x), ta.attention(q, k, k))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ta.softmax(x), ta.attention(q, k, k)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = (ta.softmax(x), ta.attention(q, k, k))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@gpu
def test_decode_loop_shares_compiled_kernels(seed):
    """A decode loop makes a plan per step (the key length grows); the new plans find the kernels
    earlier plans compiled (triton/launch.py _SHARED, Triton's own specialization), and every step
    is still right."""
    from tiled_attn.triton import launch as launch_mod
    gen = torch.Generator().manual_seed(seed)
    q = randn((2, 8, 1, 64), torch.bfloat16, "cuda", gen)
    cache = randn((2, 2, 420, 64), torch.bfloat16, "cuda", gen)
    before = len(launch_mod._SHARED)
    steps = range(300, 420, 3)
    for n in steps:
        k = cache[:, :, :n].contiguous()  # a new tensor per step, as torch.cat makes
        out = ta.attention(q, k, k, backend="triton")
        ref = F.scaled_dot_product_attention(q.double(), k.double(), k.double(), enable_gqa=True)
        theirs = F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        assert_rule(out, ref, theirs, dtype=q.dtype, seed=seed, what=f"decode Nk={n}")
    # one compiled kernel per (kernel, specialization): Nk % 16 and the split count vary, little else
    assert len(launch_mod._SHARED) - before < len(steps) // 2


def test_launch_refuses_a_cpu_device_without_the_interpreter():
    """A compiled Triton kernel planned for CPU tensors (only a plan made past validation can ask)
    raises at plan time instead of retrying its device switch on every launch."""
    from tiled_attn.triton.launch import Launch

    class Compiled:  # what a @triton.jit kernel looks like outside the interpreter
        device_caches: dict = {}

        @staticmethod
        def fn():
            pass

    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        Launch(Compiled(), (1,), {}, torch.device("cpu"))


# ------------------------------------------------------------------------------------------------
# the C++ launch of a planned Triton kernel (csrc/bindings.cpp fast_register / fast_run)
# ------------------------------------------------------------------------------------------------
def _row_launch():
    from tiled_attn.triton.launch import Launch
    from tiled_attn.triton.softmax_row import softmax_row_kernel
    device = torch.device("cuda" if HAS_CUDA else "cpu")
    return Launch(softmax_row_kernel, (5,), dict(BLOCK_M=2, BLOCK_N=128, COL_CONTIG=True, MASK_N=False),
                  device)


def test_fast_spec_packs_parameters_as_triton_does():
    """The parameters fast_register gets are Triton's launcher's: the specialized-away integers
    (== 1: "constexpr") dropped, i32 in 4 bytes, i64 in 8, fp32 in 4 (its bits), pointers in 8 with
    their address left to the call, Triton's two scratch pointers last; nothing before the aligned
    build exists."""
    launch = _row_launch()
    bound = launch.bind(7, 1, 2 ** 40, 3, 128)  # M, N, stride_xm, stride_xn, stride_ym
    assert bound.fast_spec() is None  # not compiled yet
    types = ("*bf16", "*bf16", "i32", "constexpr", "i64", "i32", "i32")
    launch.ready = (None, 0xABC0, (4, 1, 2048), False, False, types)
    spec = bound.fast_spec()
    assert spec == dict(function=0xABC0, grid=[5, 1, 1], threads=128, shared=2048, device=launch.device.index,
                        sizes=[8, 8, 4, 8, 4, 4, 8, 8], values=[0, 0, 7, 2 ** 40, 3, 128, 0, 0], slots=[0, 1])
    # a float32 parameter: its bits in 4 bytes, as Triton's launcher packs it (pack_fp32)
    launch.ready = (None, 0xABC0, (4, 1, 2048), False, False, types[:-1] + ("fp32",))
    spec = launch.bind(7, 1, 2 ** 40, 3, 0.125).fast_spec()
    assert spec["sizes"][5] == 4 and spec["values"][5] == 0x3E000000
    # what the C++ launch does not take: an int where the signature has a float, a cluster,
    # cooperative or PDL launch
    for ready in ((None, 1, (4, 1, 0), False, False, types[:-1] + ("fp32",)),
                  (None, 1, (4, 2, 0), False, False, types),
                  (None, 1, (4, 1, 0), True, False, types),
                  (None, 1, (4, 1, 0), False, True, types),
                  (None, 1, (4, 1, 0), False, False, None)):
        launch.ready = ready
        assert bound.fast_spec() is None, ready


FAST_CASES = {  # (shape, dtype, view, dim, backend, kernel, log)
    "row-fp32": ((4, 128), torch.float32, None, -1, None, None, False),
    "row-bf16": ((4, 128), torch.bfloat16, None, -1, None, None, False),
    "row-fp16-odd": ((37, 1003), torch.float16, None, -1, "triton", "row", False),
    "row-log": ((9, 300), torch.float32, None, -1, None, None, True),
    "online": ((5, 20000), torch.bfloat16, None, -1, "triton", "online", False),
    "columns": ((300, 6), torch.float32, None, 0, "triton", "row", False),  # out laid out unlike x
    "transposed": ((300, 6), torch.float32, "t", 0, "triton", "row", False),
    "3d-last": ((2, 3, 257), torch.bfloat16, None, 2, None, None, False),
    # the CUDA ladder (fast_register_softmax): each kernel without workspace, packed and scalar rows
    "cuda-warp_row-bf16": ((64, 128), torch.bfloat16, None, -1, "cuda", "warp_row", False),
    "cuda-default": ((33, 100), torch.float32, None, -1, "cuda", None, False),
    "cuda-naive": ((9, 70), torch.float32, None, -1, "cuda", "naive", False),
    "cuda-online_thread": ((9, 70), torch.float16, None, -1, "cuda", "online_thread", False),
    "cuda-block_smem_tree": ((5, 1000), torch.float32, None, -1, "cuda", "block_smem_tree", False),
    "cuda-block_shuffle": ((5, 1000), torch.bfloat16, None, -1, "cuda", "block_shuffle", False),
    "cuda-block_row_reg": ((7, 3001), torch.float16, None, -1, "cuda", "block_row_reg", False),
    "cuda-block_row_smem": ((3, 50000), torch.float32, None, -1, "cuda", "block_row_smem", False),
    "cuda-flat_rows-t": ((300, 6), torch.float32, "t", 0, "cuda", "flat_rows", False),
    "cuda-tile2d-columns": ((300, 6), torch.float32, None, 0, "cuda", "tile2d", False),
}


@gpu
@pytest.mark.parametrize("case", list(FAST_CASES))
def test_softmax_fast_launch(case, monkeypatch, seed):
    """After a plan's first call (through Triton or the CUDA ladder's binding) the next calls
    allocate and launch from C++ and compute the same function; a 16-byte-misaligned x of the same
    signature is declined (the Python path runs its own specialization or scalar path), and so is a
    call that records a gradient."""
    if not backend_available("cuda"):  # the C++ launch lives in the CUDA extension
        pytest.skip(skip_reason("cuda"))
    shape, dtype, view, dim, backend, kernel, log = FAST_CASES[case]
    fn, ref_fn = (ta.log_softmax, torch.log_softmax) if log else (ta.softmax, torch.softmax)
    gen = torch.Generator().manual_seed(seed)

    def make(offset=0):
        numel = 1
        for s in shape:
            numel *= s
        base = randn((numel + 8,), dtype, "cuda", gen)[offset:offset + numel].view(shape)
        return base.t() if view == "t" else base

    def check(y, x, what):
        assert y.shape == x.shape and y.dtype == x.dtype
        assert_rule(y, ref_fn(x.double(), dim), ref_fn(x, dim), dtype=dtype, seed=seed, what=what)

    first = make()
    y0 = fn(first, dim, backend=backend, kernel=kernel)
    check(y0, first, "first call")
    plans = list((SOFTMAX._LOG_PLANS if log else SOFTMAX._PLANS).values())
    assert len(plans) == 1 and plans[0].fast is not None, SOFTMAX.fast_launch_off_because
    returned = []
    real = SOFTMAX._fast_run

    def counting(*args):
        out = real(*args)
        returned.append(out is not None)
        return out
    monkeypatch.setattr(SOFTMAX, "_fast_run", counting)
    x = make()
    y = fn(x, dim, backend=backend, kernel=kernel)
    assert returned == [True]
    assert y.stride() == y0.stride() and plans[0].like == (not case.endswith("columns"))
    check(y, x, "C++ launch")
    misaligned = make(offset=1)
    check(fn(misaligned, dim, backend=backend, kernel=kernel), misaligned, "misaligned x")
    assert returned == [True, False]
    g = make().requires_grad_()
    fn(g, dim, backend=backend, kernel=kernel).sum().backward()
    assert returned == [True, False]  # autograd's call takes the Python path
    assert torch.isfinite(g.grad).all()


@gpu
def test_softmax_fast_launch_not_for_copied_rows():
    """Rows that are not a view of x (dim 1 of a contiguous 3-D tensor) are copied into order first:
    that plan keeps the Python path."""
    x = torch.randn(3, 7, 33, device="cuda")
    for _ in range(2):
        torch.testing.assert_close(ta.softmax(x, 1), torch.softmax(x, 1))
    (plan,) = SOFTMAX._PLANS.values()
    assert plan.copy and plan.fast is None


@gpu
def test_softmax_fast_launch_not_for_split_row():
    """The CUDA ladder's split_row takes a workspace: its plan keeps the Python path."""
    if not backend_available("cuda"):
        pytest.skip(skip_reason("cuda"))
    x = torch.randn(2, 70000, device="cuda")
    for _ in range(2):
        torch.testing.assert_close(ta.softmax(x, backend="cuda", kernel="split_row"), torch.softmax(x, -1))
    (plan,) = SOFTMAX._PLANS.values()
    assert plan.fast is None and plan.fast_tries == 0 and SOFTMAX.fast_launch_off_because is None


@gpu
def test_fast_register_refuses_bad_arguments():
    if not backend_available("cuda"):
        pytest.skip(skip_reason("cuda"))
    from tiled_attn import cuda
    from tiled_attn.cuda import _build
    ext = cuda.load()
    good = dict(function=1, grid=[1, 1, 1], threads=32, shared=0, device=0, sizes=[8, 8], values=[0, 0],
                x_slot=0, out_slot=1, out_sizes=[4], out_strides=[1], out_like_x=True)
    for change, message in ((dict(function=0), "function must be"), (dict(threads=48), "threads must be"),
                            (dict(sizes=[8, 3], values=[0, 0]), "must be 1, 2, 4 or 8 bytes"),
                            (dict(out_slot=0), "x_slot and out_slot"),
                            (dict(sizes=[8, 4]), "8-byte pointers")):
        with pytest.raises(ValueError, match=message):
            _build.call(ext.fast_register, *{**good, **change}.values())
    x, out = torch.randn(4, 64, device="cuda"), torch.empty(4, 64, device="cuda")
    good = dict(kernel="warp_row", x2d=x, out2d=out, threads=128, cluster=1, cta_bytes=0, chunk=0,
                out_sizes=[4, 64], out_strides=[64, 1], out_like_x=True)
    _build.call(ext.fast_register_softmax, *good.values())
    for change, message in ((dict(kernel="split_row"), "needs a workspace"), (dict(kernel="nope"), "kernel must be"),
                            (dict(x2d=torch.randn(260, device="cuda")[1:257].view(4, 64)), "16-byte aligned"),
                            (dict(x2d=x[:0], out2d=out[:0]), "must not be empty"),
                            (dict(kernel="flat_rows", x2d=torch.randn(2, 4096, device="cuda"),
                                  out2d=torch.empty(2, 4096, device="cuda")), "at most"),
                            (dict(threads=48), "threads must be")):
        with pytest.raises(ValueError, match=message):
            _build.call(ext.fast_register_softmax, *{**good, **change}.values())
    with pytest.raises(TypeError, match="4 arguments"):
        ext.fast_run(None)
