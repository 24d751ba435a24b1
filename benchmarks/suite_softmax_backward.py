"""Softmax backward (issue 5): the fused dx = y·(dy − Σ dy·y) per backend against what autograd of
torch.softmax runs, on the forward ladder's shapes."""
from . import harness as h
from .suite_softmax import QUICK, SHAPES

SUITE = h.Suite(
    name="softmax_backward", title="Softmax backward vs torch autograd", op=h.SOFTMAX_BACKWARD,
    device="cuda", shapes=SHAPES, quick_shapes=QUICK, dtypes=("fp32", "bf16"),
    providers=[h.default_softmax_backward(), h.ours_softmax_backward("triton"), h.ours_softmax_backward("cuda"),
               h.torch_softmax_backward()],
    baselines=("torch.autograd",),
    plot=h.Plot("lines", x="N", cols="dtype"),
    notes="Both sides run the op autograd calls, on the same fixed (y, dy): ours "
          "torch.ops.tiled_attn.softmax_backward, torch's aten._softmax_backward_data (what "
          "autograd of torch.softmax runs). The autograd engine's own overhead is not timed.",
)
