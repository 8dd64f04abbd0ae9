"""Run a stage in-process, as a subprocess, or as a Kubernetes Job (launcher.py)."""
