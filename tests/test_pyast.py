"""Python is parsed through `components.pyast.parse` wherever worker threads may parse at
once (CPython 3.11's AST constructor is not thread-safe: python/cpython#106905)."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from components import pyast

ROOT = Path(__file__).resolve().parents[1]


def test_no_component_calls_ast_parse_directly():
    """Code embedded in strings (harnesses run in the sandbox) is not a call here."""
    direct = []
    for path in sorted((ROOT / "components").rglob("*.py")):
        if path.name == "pyast.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "parse" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "ast"):  # fmt: skip
                direct.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert direct == [], f"use components.pyast.parse: {direct}"


def test_parses_are_serialised():
    """While one parse holds the lock, another thread's parse waits for it."""
    done = threading.Event()
    with pyast._LOCK:
        worker = threading.Thread(target=lambda: (pyast.parse("x = 1"), done.set()))
        worker.start()
        assert not done.wait(0.3)
    worker.join(5)
    assert done.is_set()


def test_parse_keeps_ast_parse_semantics():
    assert ast.dump(pyast.parse("f(1)", mode="eval")) == ast.dump(ast.parse("f(1)", mode="eval"))
