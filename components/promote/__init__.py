"""Promotion: gates decide who becomes `challenger`; only a person's approval moves `champion`.

config.py (PromotionConfig), client.py (the MLflow client on the store; reserved aliases),
gates.py (evaluate_gates), registry.py (MLflow model versions, aliases, lineage tags),
approval.py (request / approve / reject / rollback, the Prefect approval form), audit.py
(the decision log: write-ahead, hash-chained, its head mirrored in the registry), chain.py
(the log's file format and verification), lock.py (one writer at a time), errors.py (what
a refused command raises), __main__.py (`agentrl promote ...`).
Nothing heavy is imported here: mlflow and prefect load inside the functions that use them.
"""
