"""Benchmarks of tiled_attn against torch: `python -m benchmarks` (see __main__.py).

harness.py is the one harness (check, time, rotate inputs, ceilings); suite_*.py only declare
shapes and providers; report.py writes JSON, markdown, PNG plots and the console tables.
"""
