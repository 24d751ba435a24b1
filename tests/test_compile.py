"""torch.compile, torch.library.opcheck, CUDA graphs and streams for ta.attention / ta.softmax /
ta.log_softmax.

The ops are torch.library custom ops (tiled_attn::attention_fwd, ::softmax, ::softmax_backward,
::log_softmax, ::log_softmax_backward)
with fake implementations, so Dynamo keeps them as single nodes (no graph break) and AOTAutograd
puts the fused softmax backward in the backward graph. Compiled results follow the numerics rule
against the eager model in float64 (the torch backend runs float64), with the eager model in the
dtype as "torch's error". On the CPU the default backend is torch; on CUDA it is triton.

GPU-only tests (CUDA graph capture/replay, side streams, reduce-overhead compile) skip on the CPU.
"""
import copy
import sys

import pytest
import torch
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd

import tiled_attn as ta
from helpers import HAS_CUDA, assert_rule, backend_available, randn
from tiled_attn.cuda.attention import HEAD_DIMS as CUDA_HEAD_DIMS

DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float32
ATTN = sys.modules["tiled_attn.attention"]
SOFTMAX = sys.modules["tiled_attn.softmax"]
OPS = torch.ops.tiled_attn
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _recording_backend():
    """A Dynamo backend that keeps the forward and backward ATen graphs it is given."""
    graphs = {"fw": [], "bw": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)
        return compiler

    return aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")), graphs


# Our ops' backend in the compiled models: backend=None on CUDA (triton); on the CPU None is torch's
# own softmax/SDPA (no op of ours in the graph), so the CPU tests pin the pure-PyTorch backend.
OP_BACKEND = None if HAS_CUDA else "torch"


class TinyBlock(nn.Module):
    """A model using all three entry points: ta.nn.Attention, ta.attention and ta.softmax."""

    def __init__(self, dim=64, heads=4, kv_heads=2, backend=OP_BACKEND):
        super().__init__()
        self.backend = backend
        self.attn = ta.nn.Attention(dim, heads, kv_heads, rope_theta=10000.0, backend=backend)
        self.gate = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x):
        h = x + self.attn(x)
        b, n, e = h.shape
        qkv = h.view(b, n, self.heads, e // self.heads).transpose(1, 2)
        h = h + ta.attention(qkv, qkv, qkv, causal=False, backend=self.backend).transpose(1, 2).reshape(b, n, e)
        # softmax over the sequence dim, not the last
        return h * ta.softmax(self.gate(h), dim=1, backend=self.backend)


def _block(seed):
    torch.manual_seed(seed)
    return TinyBlock().to(DEVICE).eval()


def _compiled_vs_eager(model, x, seed, what, **compile_kw):
    """Compile `model` (fullgraph: a graph break raises), run it in DTYPE, apply the rule."""
    model = model.to(DTYPE)
    with torch.no_grad():
        ours = torch.compile(model, fullgraph=True, **compile_kw)(x)
        ref = copy.deepcopy(model).double()(x.double())
        theirs = model(x)
    assert_rule(ours, ref, theirs, dtype=DTYPE, seed=seed, what=what)
    return ours


def test_dynamo_keeps_ops_whole_no_graph_break(seed):
    m = _block(seed)
    backend, graphs = _recording_backend()
    x = randn((2, 11, 64), torch.float32, DEVICE, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.compile(m, fullgraph=True, backend=backend)(x)
    (fw,) = graphs["fw"]  # fullgraph: one graph, or compile would have raised
    targets = _targets(fw)
    assert targets.count(OPS.attention_fwd.default) == 2
    assert targets.count(OPS.softmax.default) == 1


def test_eager_only_calls_break_the_graph_and_run_eagerly(seed):
    """Calls with a window, varlen or a KV cache are _plan.eager_only: torch.compile breaks the
    graph around them (fullgraph raises) and runs them eagerly (not traced: their host value
    checks and plan lookups), with the eager results; an eager call takes the function directly."""
    gen = torch.Generator().manual_seed(seed)
    q = randn((1, 2, 9, 16), torch.float32, DEVICE, gen)
    k, v = (randn((1, 2, 9, 16), torch.float32, DEVICE, gen) for _ in range(2))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    cache = randn((1, 12, 2, 16), torch.float32, DEVICE, gen)
    lens = torch.tensor([9], dtype=torch.int32, device=DEVICE)

    def f(q, k, v):
        w = ta.attention(q, k, v, causal=True, window=(3, 0), backend=OP_BACKEND)
        p = ta.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 5, 5,
                                causal=True, backend=OP_BACKEND)
        c = ta.attention_kvcache(q[:, :, -1:], cache, cache, lens, causal=True, backend=OP_BACKEND)
        return w * 2, p + 1, c

    eager = f(q, k, v)
    for got, want in zip(torch.compile(f, backend="eager")(q, k, v), eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)graph break|disable|skip"):
        torch.compile(f, backend="eager", fullgraph=True)(q, k, v)


def test_inductor_matches_eager(seed):
    x = randn((2, 13, 64), DTYPE, DEVICE, torch.Generator().manual_seed(seed))
    _compiled_vs_eager(_block(seed), x, seed, "inductor, TinyBlock")


def test_softmax_backward_through_compile(seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((5, 37, 3), DTYPE, DEVICE, gen, scale=4.0)
    w = randn((5, 37, 3), DTYPE, DEVICE, gen)

    def loss(x, w):
        return (ta.softmax(x, dim=1, backend=OP_BACKEND) * w).sum()

    backend, graphs = _recording_backend()
    xr = x.clone().requires_grad_()
    torch.compile(loss, fullgraph=True, backend=backend)(xr, w).backward()
    assert OPS.softmax.default in _targets(graphs["fw"][0])
    assert OPS.softmax_backward.default in _targets(graphs["bw"][0])  # the fused backward op

    grads = {}
    for name, fn, dtype in (("ours", torch.compile(loss, fullgraph=True), DTYPE),
                            ("ref", lambda x, w: (torch.softmax(x, 1) * w).sum(), torch.float64),
                            ("torch", lambda x, w: (torch.softmax(x, 1) * w).sum(), DTYPE)):
        xi = x.detach().to(dtype, copy=True).requires_grad_()
        fn(xi, w.to(dtype)).backward()
        grads[name] = xi.grad
    assert_rule(grads["ours"], grads["ref"], grads["torch"], dtype=DTYPE, seed=seed,
                what="compiled softmax backward")


def test_log_softmax_backward_through_compile(seed):
    """ta.log_softmax under torch.compile(fullgraph=True): its op in the forward graph, its fused
    backward op in the backward graph, gradients under the numerics rule."""
    gen = torch.Generator().manual_seed(seed)
    x = randn((5, 37, 3), DTYPE, DEVICE, gen, scale=4.0)
    w = randn((5, 37, 3), DTYPE, DEVICE, gen)

    def loss(x, w):
        return (ta.log_softmax(x, dim=1, backend=OP_BACKEND) * w).sum()

    backend, graphs = _recording_backend()
    xr = x.clone().requires_grad_()
    torch.compile(loss, fullgraph=True, backend=backend)(xr, w).backward()
    assert OPS.log_softmax.default in _targets(graphs["fw"][0])
    assert OPS.log_softmax_backward.default in _targets(graphs["bw"][0])

    grads = {}
    for name, fn, dtype in (("ours", torch.compile(loss, fullgraph=True), DTYPE),
                            ("ref", lambda x, w: (torch.log_softmax(x, 1) * w).sum(), torch.float64),
                            ("torch", lambda x, w: (torch.log_softmax(x, 1) * w).sum(), DTYPE)):
        xi = x.detach().to(dtype, copy=True).requires_grad_()
        fn(xi, w.to(dtype)).backward()
        grads[name] = xi.grad
    assert_rule(grads["ours"], grads["ref"], grads["torch"], dtype=DTYPE, seed=seed,
                what="compiled log_softmax backward", ulp_floor=True)


def test_nn_attention_compiles_in_training_mode(seed):
    # With grad enabled: one graph, our forward op in it and our backward op in the backward graph.
    m = _block(seed).attn.train()
    x = randn((2, 9, 64), torch.float32, DEVICE, torch.Generator().manual_seed(seed))
    backend, graphs = _recording_backend()
    torch.compile(m, fullgraph=True, backend=backend)(x).sum().backward()
    assert OPS.attention_fwd.default in _targets(graphs["fw"][0])
    assert OPS.attention_bwd.default in _targets(graphs["bw"][0])
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_through_compile(causal, seed):
    """torch.compile(fullgraph=True) over ta.attention's forward + backward (GQA, Nq != Nk, the
    loss using lse too): tiled_attn::attention_bwd in the AOT backward graph, gradients under the
    rule against float64 autograd."""
    gen = torch.Generator().manual_seed(seed)
    q = randn((2, 4, 9, 32), DTYPE, DEVICE, gen)
    k, v = (randn((2, 2, 13, 32), DTYPE, DEVICE, gen) for _ in range(2))
    w = randn((2, 4, 9, 32), DTYPE, DEVICE, gen)
    wl = randn((2, 4, 9), torch.float32, DEVICE, gen)

    def loss(q, k, v):
        out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend=OP_BACKEND)
        return (out.float() * w.float()).sum() + (lse * wl).sum()

    backend, graphs = _recording_backend()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.compile(loss, fullgraph=True, backend=backend)(*leaves).backward()
    assert OPS.attention_bwd.default in _targets(graphs["bw"][0])
    ours = [t.grad for t in leaves]
    from tiled_attn import reference
    q6, k6, v6 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o6, l6 = reference.attention(q6, k6, v6, causal=causal, return_lse=True)
    g6 = torch.autograd.grad((o6 * w.double()).sum() + (l6 * wl.double()).sum(), (q6, k6, v6))
    qt, kt, vt = (t.detach().clone().requires_grad_() for t in (q, k, v))
    kr, vr = (t.repeat_interleave(2, dim=1) for t in (kt, vt))
    mask = reference._causal_mask(9, 13, q.device) if causal else None
    s = (qt.float() @ kr.float().transpose(-1, -2)) * 32 ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.nn.functional.scaled_dot_product_attention(qt, kr, vr, attn_mask=mask)
    gt = torch.autograd.grad((o.float() * w.float()).sum() + (torch.logsumexp(s, -1) * wl).sum(), (qt, kt, vt))
    for name, a, r, t in zip("qkv", ours, g6, gt):
        assert_rule(a, r, t, dtype=DTYPE, seed=seed, what=f"compiled attention d{name}")


# ------------------------------------------------------------------------------------------------
# opcheck: schema, fake (meta) implementation, autograd registration, AOT dispatch
# ------------------------------------------------------------------------------------------------
def _opcheck_backends():
    return ["torch"] + [b for b in ("triton", "cuda") if HAS_CUDA and backend_available(b)]


@pytest.mark.parametrize("backend", _opcheck_backends())
@pytest.mark.parametrize("case", [
    # (B, Hq, Hkv, Nq, Nk, D, causal, causal_offset)
    (2, 4, 2, 8, 6, 16, True, -2),
    (1, 2, 2, 5, 9, 32, False, 0),
    (1, 3, 1, 1, 40, 64, True, 39),
    (1, 2, 2, 4, 0, 16, False, 0),
], ids=str)
def test_opcheck_attention(case, backend, seed):
    b, hq, hkv, nq, nk, d, causal, offset = case
    if backend == "cuda" and d not in CUDA_HEAD_DIMS:  # refused at planning, even with no keys
        pytest.skip(f"the cuda backend instantiates head dims {CUDA_HEAD_DIMS}, not {d}")
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float32 if backend == "torch" else torch.bfloat16
    q = randn((b, hq, nq, d), dtype, DEVICE if backend != "torch" else "cpu", gen)
    k, v = (randn((b, hkv, nk, d), dtype, q.device, gen) for _ in range(2))
    torch.library.opcheck(ATTN._attention_op, (q, k, v, d ** -0.5, causal, offset, backend))


@pytest.mark.parametrize("backend", _opcheck_backends())
@pytest.mark.parametrize("case", [
    # (B, Hq, Hkv, Nq, Nk, D, causal, causal_offset, with dlse)
    (2, 4, 2, 8, 6, 16, True, -2, True),
    (1, 2, 2, 5, 9, 32, False, 0, False),
    (1, 2, 2, 4, 0, 16, False, 0, False),
], ids=str)
def test_opcheck_attention_backward(case, backend, seed):
    b, hq, hkv, nq, nk, d, causal, offset, with_dlse = case
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float32 if backend == "torch" else torch.bfloat16
    device = DEVICE if backend != "torch" else "cpu"
    q = randn((b, hq, nq, d), dtype, device, gen)
    k, v = (randn((b, hkv, nk, d), dtype, device, gen) for _ in range(2))
    fwd_backend = "triton" if backend == "cuda" else backend  # the cuda forward has no D = 16
    out, lse = ATTN._attention_op(q, k, v, d ** -0.5, causal, offset, fwd_backend)
    dout = randn(out.shape, dtype, device, gen)
    dlse = randn(lse.shape, torch.float32, device, gen) if with_dlse else None
    torch.library.opcheck(ATTN._attention_bwd_op,
                          (dout, q, k, v, out, lse, dlse, d ** -0.5, causal, offset, backend, False))


@pytest.mark.parametrize("backend", _opcheck_backends())
@pytest.mark.parametrize("shape,dim,transpose", [((4, 33), 1, False), ((3, 5, 7), 1, False),
                                                  ((3, 5, 7), 0, True), ((0, 5), 1, False)], ids=str)
def test_opcheck_softmax(shape, dim, transpose, backend, seed):
    device = DEVICE if backend != "torch" else "cpu"
    x = randn(shape, torch.float32, device, torch.Generator().manual_seed(seed))
    if transpose:
        x = x.transpose(0, -1)
    # The ops carry no autograd (DESIGN §6: it lives in an autograd.Function outside them, which
    # the gradient tests check), so they are checked on inputs that need none.
    torch.library.opcheck(SOFTMAX._softmax_op, (x, dim, backend, ""))
    y = torch.softmax(x, dim)
    dy = torch.randn_like(y)
    torch.library.opcheck(SOFTMAX._softmax_backward_op, (y, dy, dim, backend))
    if backend != "cuda":  # no log kernels on the CUDA backend
        torch.library.opcheck(SOFTMAX._log_softmax_op, (x, dim, backend, ""))
        torch.library.opcheck(SOFTMAX._log_softmax_backward_op, (torch.log_softmax(x, dim), dy, dim, backend))


# ------------------------------------------------------------------------------------------------
# GPU only: CUDA graphs, streams, reduce-overhead compile
# ------------------------------------------------------------------------------------------------
def _gpu_backends():
    return [pytest.param(b, marks=pytest.mark.skipif(not (HAS_CUDA and backend_available(b)),
                                                     reason=f"needs CUDA and the {b} backend"))
            for b in ("triton", "cuda")]


def _attn_ref(q, k, v, causal):
    """(float64 reference, torch SDPA in the dtype) for Nq == Nk or non-causal (alignment-free)."""
    f = torch.nn.functional.scaled_dot_product_attention
    kw = {"is_causal": causal, "enable_gqa": k.shape[1] != q.shape[1]}
    return f(q.double(), k.double(), v.double(), **kw), f(q, k, v, **kw)


def _capture(fn):
    """Warm up on a side stream (compiles/loads kernels outside capture), then capture fn()."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


# (B, Hq, Hkv, Nq, Nk, D, causal): prefill (causal, Nq == Nk) and decode (split-KV path).
GRAPH_CASES = [(2, 8, 2, 256, 256, 64, True), (4, 8, 1, 1, 4096, 128, False)]


@gpu
@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("case", GRAPH_CASES, ids=str)
def test_cuda_graph_attention(case, backend, seed):
    b, hq, hkv, nq, nk, d, causal = case
    gen = torch.Generator().manual_seed(seed)
    q = randn((b, hq, nq, d), torch.bfloat16, "cuda", gen)
    k, v = (randn((b, hkv, nk, d), torch.bfloat16, "cuda", gen) for _ in range(2))
    graph, out = _capture(lambda: ta.attention(q, k, v, causal=causal, backend=backend))
    for trial in range(2):  # new data in the captured buffers, replay, compare with eager
        for t in (q, k, v):
            t.copy_(randn(t.shape, t.dtype, "cuda", gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = ta.attention(q, k, v, causal=causal, backend=backend)
        ref, theirs = _attn_ref(q, k, v, causal)
        assert_rule(out, ref, theirs, dtype=q.dtype, seed=seed, what=f"graph replay {trial}")
        torch.testing.assert_close(out, eager, rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("backend", _gpu_backends())
def test_cuda_graph_training_step(backend, seed):
    """A training step (ta.nn.Attention forward + backward of a loss) captured in one CUDA graph and
    replayed on new inputs: the parameter gradients equal an eager step's bitwise where the backward
    is repeatable (Triton's default: its dQ pass, no atomics); backend "cuda" on an H100 runs its
    wgmma backward, whose dQ float32 atomics add in a varying order, so there they agree to a few
    bf16 roundings (a replay of stale inputs would be off by O(1))."""
    torch.manual_seed(seed)
    # D = 64: a head dim the cuda backend's forward instantiates.
    m = ta.nn.Attention(512, 8, 2, rope_theta=10000.0, backend=backend).to("cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    x = randn((2, 256, 512), torch.bfloat16, "cuda", gen)
    from tiled_attn.cuda import attention_backward as cb
    q = torch.empty(2, 8, 256, 64, dtype=torch.bfloat16, device="cuda")
    atomic = backend == "cuda" and cb.covers(q, q, q, q, q, q, q, q, False, None)

    def step():
        for p in m.parameters():
            p.grad = None
        m(x).float().square().mean().backward()
        return [p.grad for p in m.parameters()]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for p in m.parameters():
        p.grad = None
    with torch.cuda.graph(graph):
        m(x).float().square().mean().backward()
    grads = [p.grad for p in m.parameters()]
    for trial in range(2):
        x.copy_(randn(x.shape, x.dtype, "cuda", gen))
        for g in grads:
            g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        captured = [g.clone() for g in grads]
        eager = step()
        for i, (a, e) in enumerate(zip(captured, eager)):
            assert torch.isfinite(a).all(), f"replay {trial}: gradient {i} not finite"
            tol = (0.0, 0.0) if not atomic else (2 ** -6, 2 ** -6 * e.abs().max().item())
            torch.testing.assert_close(a, e, rtol=tol[0], atol=tol[1],
                                       msg=lambda msg: f"replay {trial} grad {i}: {msg}")


@gpu
@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("shape", [(4096, 1000), (8, 300000)], ids=str)
def test_cuda_graph_softmax(shape, backend, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn(shape, torch.float16, "cuda", gen, scale=3.0)
    graph, out = _capture(lambda: ta.softmax(x, backend=backend))
    for trial in range(2):
        x.copy_(randn(shape, x.dtype, "cuda", gen, scale=3.0))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_rule(out, torch.softmax(x.double(), -1), torch.softmax(x, -1), dtype=x.dtype,
                    seed=seed, what=f"graph replay {trial}")
        torch.testing.assert_close(out, ta.softmax(x, backend=backend), rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("shape", [(4096, 1000), (8, 300000)], ids=str)
def test_cuda_graph_log_softmax(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn(shape, torch.float16, "cuda", gen, scale=3.0)
    graph, out = _capture(lambda: ta.log_softmax(x))
    for trial in range(2):
        x.copy_(randn(shape, x.dtype, "cuda", gen, scale=3.0))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_rule(out, torch.log_softmax(x.double(), -1), torch.log_softmax(x, -1), dtype=x.dtype,
                    seed=seed, what=f"log_softmax graph replay {trial}", ulp_floor=True)
        torch.testing.assert_close(out, ta.log_softmax(x), rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("op", ["attention", "softmax"])
def test_runs_on_the_current_stream(op, backend, seed):
    # On a side stream: poison the input, spin the GPU for ~50 ms, then write the real input and
    # call the op. If the op launched on any stream but the current one, it would run during the
    # spin and read the poison (NaN); on the current stream it runs after the copy.
    gen = torch.Generator().manual_seed(seed)
    if op == "attention":
        src = randn((2, 8, 512, 64), torch.bfloat16, "cuda", gen)
        k, v = (randn((2, 2, 512, 64), torch.bfloat16, "cuda", gen) for _ in range(2))
        fn = lambda q: ta.attention(q, k, v, causal=True, backend=backend)  # noqa: E731
    else:
        src = randn((512, 3000), torch.bfloat16, "cuda", gen)
        fn = lambda x: ta.softmax(x, backend=backend)  # noqa: E731
    expected = fn(src)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        inp = torch.full_like(src, float("nan"))
        torch.cuda._sleep(100_000_000)  # cycles: ~50 ms at H100 clocks
        inp.copy_(src)
        out = fn(inp)
    torch.cuda.current_stream().wait_stream(side)
    out.record_stream(torch.cuda.current_stream())
    assert not out.isnan().any(), "the op ran before its input was written: wrong stream"
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@gpu
def test_compile_reduce_overhead_cuda_graphs(seed):
    # Inductor's CUDA-graph mode (cudagraph trees) around our custom ops.
    m = _block(seed)
    gen = torch.Generator().manual_seed(seed)
    compiled = torch.compile(m.to(DTYPE), fullgraph=True, mode="reduce-overhead")
    for step in range(3):  # warmup, record, replay
        x = randn((2, 64, 64), DTYPE, DEVICE, gen)
        with torch.no_grad():
            ours = compiled(x).clone()
            ref = copy.deepcopy(m).double()(x.double())
            theirs = m(x)
        assert_rule(ours, ref, theirs, dtype=DTYPE, seed=seed, what=f"reduce-overhead step {step}")
