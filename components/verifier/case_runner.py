"""The hidden-case runner: a stand-alone program the verifier ships into the sandbox.

It gets only the *arguments* of the hidden cases and prints plain-value reprs of the
results on one `AGENTRL-CASES <token> <json>` line. The expected values stay in the
verifier process (components/verifier/hidden_cases.py), so code under test can neither read
them nor forge a pass (patching pytest, returning an object whose __eq__ is always true).

Usage: python runner.py TOKEN ARGS_JSON TIMEOUT_S, in the repository's folder, with the
sandbox's harness plugins (agentrl_limits) on PYTHONPATH. It imports nothing of agentrl.
"""

import ast
import importlib
import importlib.util
import json
import os
import sys

import agentrl_limits  # CPU time and unstarved wall time (harness_plugins/)

PLAIN = (int, float, complex, str, bytes, bool, type(None))


def check(x, depth=0):
    if depth > 64:
        raise TypeError("result nested too deeply")
    t = type(x)  # exact types only: a subclass could fake its repr or equality
    if t in PLAIN:
        return
    if t in (list, tuple, set, frozenset):
        for y in x:
            check(y, depth + 1)
        return
    if t is dict:
        for k, v in x.items():
            check(k, depth + 1)
            check(v, depth + 1)
        return
    raise TypeError(f"result of type {t.__name__} is not a plain value")


def on_limit(kind):
    raise TimeoutError("case timed out")


def load(path, n):
    # A module inside packages is imported by its dotted name (its relative imports work):
    # the folder above its outermost package goes on sys.path, behind the environment.
    parts = path[:-3].split("/")
    k = len(parts) - 1
    while k > 0 and os.path.isfile("/".join(parts[:k]) + "/__init__.py"):
        k -= 1
    if k < len(parts) - 1:
        base = "/".join(parts[:k]) or "."
        if base not in sys.path:
            sys.path.append(base)
        name = ".".join(parts[k:]).removesuffix(".__init__")
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(f"module_under_test_{n}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    token, args_path, timeout = sys.argv[1:4]
    with open(args_path) as f:
        calls = json.load(f)
    sys.path.append(".")  # the repository, behind the environment's packages
    modules, out, import_timeout = {}, [], False
    for module_file, function, text in calls:
        try:
            agentrl_limits.arm(float(timeout), float(timeout), on_limit)
            try:
                if module_file not in modules:
                    try:
                        modules[module_file] = load(module_file, len(modules))
                    except BaseException as e:
                        modules[module_file] = e
                        import_timeout = import_timeout or isinstance(e, TimeoutError)
                module = modules[module_file]
                if isinstance(module, BaseException):
                    raise module
                value = getattr(module, function)(*ast.literal_eval(text))
            finally:
                agentrl_limits.cancel()
            check(value)
            out.append({"repr": repr(value)})
        except BaseException as e:
            out.append({"error": type(e).__name__})
    result = {"results": out, "import_timeout": import_timeout}
    sys.stdout.write(f"\nAGENTRL-CASES {token} {json.dumps(result)}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
