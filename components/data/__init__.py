"""Trajectory data: canonical schema, ingestion adapters, validation, versions."""
