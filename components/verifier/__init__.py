"""The verifier: a verdict on an agent's final tree by hidden tests, out of reach of the code
under test, and the facts the reward terms need.

Modules, each one concern (import names from the module that defines them):

- verdict.py: `verify`, the entry point; the order of the checks and what is (not)
  protected; who caused a missing verdict (the control).
- verification.py: `Verification`, the verdict and its facts.
- snapshot.py: the one copy of the final tree every check starts from, the fresh trees the
  checks run in, `changed_files`.
- tampering.py: which changes never enter verification (`tamper_reason`).
- hidden_tests.py: the hidden tests under the harness, and their judgement.
- hidden_cases.py: the hidden cases (differential where the task has a reference fix, else shipped or derived) under the case runner, and theirs.
- checks.py: what every sandboxed check shares (settings read, sandbox, verdict lines).
- lint.py: lint and security findings the changes introduce (ruff).
- cache.py: the process-global verdict cache (`verdict_cache_info`, `clear_verdict_cache`).
- gate_runner.py: the task gate's test runner (`sandboxed_test_runner`).
- harness.py, case_runner.py: stand-alone programs shipped into the sandbox as they are.
- version.py: the verifier version, a hash of the sources a verdict depends on.
"""
