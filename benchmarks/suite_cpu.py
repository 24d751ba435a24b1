"""The CPU suite (no GPU needed, < 2 minutes): our torch backend, and the Triton kernels in the
interpreter at tiny sizes (TRITON_INTERPRET=1), against torch.softmax and SDPA on the CPU. Its
figures show the pipeline works; performance claims come from the GPU suites."""
from . import harness as h

INTERP = h.tiny(64 * 256)  # the interpreter runs a few thousand elements per second of Python

SOFTMAX = h.Suite(
    name="cpu_softmax", title="CPU: softmax forward", op=h.SOFTMAX, device="cpu",
    shapes=[dict(M=64, N=256), dict(M=4096, N=128), dict(M=512, N=1024), dict(M=16, N=65536)],
    quick_shapes=[dict(M=16, N=128), dict(M=512, N=1024)], dtypes=("fp32",),
    providers=[h.ours_softmax("torch", supports={"online": h.tiny(1 << 17, "per-column loop")}),
               h.ours_softmax("triton", supports={"*": INTERP}), h.torch_softmax()],
    baselines=("torch.softmax",),
    plot=h.Plot("lines", x="N", cols="dtype"),
)

SOFTMAX_BACKWARD = h.Suite(
    name="cpu_softmax_backward", title="CPU: softmax backward", op=h.SOFTMAX_BACKWARD,
    device="cpu", shapes=[dict(M=64, N=256), dict(M=512, N=1024), dict(M=16, N=65536)],
    quick_shapes=[dict(M=16, N=128)], dtypes=("fp32",),
    providers=[h.ours_softmax_backward("torch"), h.torch_softmax_backward()],
    baselines=("torch.autograd",),
    plot=h.Plot("lines", x="N", cols="dtype"),
)

ATTENTION = h.Suite(
    name="cpu_attention", title="CPU: attention forward", op=h.ATTENTION, device="cpu",
    shapes=[dict(B=1, H=2, N=n, D=d, causal=c) for c in (False, True)
            for n, d in ((64, 32), (256, 64), (1024, 64))],
    quick_shapes=[dict(B=1, H=2, N=64, D=32, causal=c) for c in (False, True)],
    dtypes=("fp32",),
    providers=[h.ours_attention("torch"), h.ours_attention("triton", supports=h.tiny(2 * 64 * 32)),
               h.sdpa()],
    baselines=("sdpa",),
    plot=h.Plot("lines", x="N", rows="causal", cols="D"),
)

DECODE = h.Suite(
    name="cpu_decode", title="CPU: decode (Nq=1, GQA)", op=h.DECODE, device="cpu",
    shapes=[dict(B=1, Hq=8, Hkv=2, Nk=nk, D=64) for nk in (256, 4096, 32768)],
    quick_shapes=[dict(B=1, Hq=8, Hkv=2, Nk=256, D=64)], dtypes=("fp32",),
    providers=[h.ours_attention("torch"),
               h.ours_attention("triton", supports=h.tiny(8 * 256 * 64)), h.sdpa()],
    baselines=("sdpa",),
    plot=h.Plot("bars"),
)

SUITES = [SOFTMAX, SOFTMAX_BACKWARD, ATTENTION, DECODE]
