"""Host cost of one eager call (issue 12): µs per call at tiny shapes, ours against torch's op for
the same job on the same tensors (benchmarks/overhead.py runs it: interleaved batches, checked first)."""
from . import overhead

SUITE = overhead.OverheadSuite()
