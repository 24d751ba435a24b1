"""Triton kernels. online.py holds the online-softmax state; the kernels import it."""
