"""Softmax forward on issue 16's held-out random shapes: row lengths log-uniform in [1, 2^25] (most not
powers of two), M·N log-uniform in [2^20, 2^28] elements, from a fixed seed. The
selection of backend=None (configs.SOFTMAX_SELECT) was fitted on another draw
(benchmarks/sweep_softmax_random.py) and never saw these lengths."""
from . import harness as h

SHAPES = h.random_softmax_sets()[1]
QUICK = SHAPES[::4]

SUITE = h.Suite(
    name="softmax_random", title="Softmax forward on held-out random shapes", op=h.SOFTMAX,
    device="cuda", shapes=SHAPES, quick_shapes=QUICK, dtypes=("fp32", "bf16"),
    providers=[h.default_softmax(), h.ours_softmax("triton", kernels=()),
               h.ours_softmax("cuda", kernels=()), h.torch_softmax()],
    baselines=("torch.softmax",),
    plot=h.Plot("lines", x="N", cols="dtype"),
    notes="Bar (issue 16, eager): default >= 1.0x torch.softmax at every shape; >= 90% of copy "
          "where the row stays on chip (N <= 32768) and the tensor is >= 64 MB. Shapes (M x N, "
          f"harness.random_softmax_sets, seed {h.RANDOM_SOFTMAX['heldout_seed']}): "
          + ", ".join(f"{s['M']}x{s['N']}" for s in SHAPES) + ".",
)
