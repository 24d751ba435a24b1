"""Softmax forward ladder (issue 3/4): every kernel of each backend against torch.softmax and
torch.compile, the same ~8-67M elements spread from 32 to 33.5M columns per row."""
from . import harness as h

SHAPES = [dict(M=262144, N=32), dict(M=65536, N=128), dict(M=32768, N=1024),
          dict(M=8192, N=4096), dict(M=4096, N=16384), dict(M=512, N=131072),
          dict(M=64, N=1048576), dict(M=8, N=4194304), dict(M=1, N=33554432)]
QUICK = [dict(M=65536, N=128), dict(M=4096, N=16384), dict(M=1, N=33554432)]
# The ladder's first rungs run one thread per row: past 131072 columns one call takes from 0.1 s
# to seconds of a single thread's loop, which would cost the run minutes and show nothing new.
THREAD_PER_ROW = h.max_cols(131072, "one thread per row")

SUITE = h.Suite(
    name="softmax", title="Softmax forward: the kernel ladder vs torch", op=h.SOFTMAX,
    device="cuda", shapes=SHAPES, quick_shapes=QUICK, dtypes=("fp32", "bf16"),
    providers=[h.default_softmax(), h.ours_softmax("triton"),
               h.ours_softmax("cuda", supports={"naive": THREAD_PER_ROW,
                                                "online_thread": THREAD_PER_ROW}),
               h.torch_softmax(), h.compiled_softmax()],
    baselines=("torch.softmax", "torch.compile"),
    plot=h.Plot("lines", x="N", cols="dtype"),
)
