"""Promotion: gates decide who becomes `challenger`; only a person's approval moves `champion`.

config.py (PromotionConfig), client.py (the MLflow client on the store), gates.py
(evaluate_gates), registry.py (MLflow model versions, aliases, lineage tags), approval.py (request / approve / reject / rollback, the Prefect
approval form), audit.py (append-only decision log), __main__.py (`agentrl promote ...`).
Nothing heavy is imported here: mlflow and prefect load inside the functions that use them.
"""
