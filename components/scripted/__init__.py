"""Scripted policies (no model): the reference-fix oracle and its variants, the baselines
a learned policy must beat, and the registry that names them all (registry.py)."""
