"""Modules for transformer code (placeholder until ta.nn.Attention lands)."""
