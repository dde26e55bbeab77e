"""``ast.parse`` behind one lock, for every parse the trusted side makes.

CPython 3.11 (up to at least 3.11.7, the interpreter of our CI) keeps the AST converter's
recursion depth per interpreter, not per thread: two threads parsing at the same time can fail
with ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). A
worker checks several solutions on several threads, so a legitimate solution could otherwise
lose its evaluation to another one's parse. Parsing is milliseconds; one lock costs nothing. ``inspect.getsource`` of a class parses too.
"""

from __future__ import annotations

import ast
import inspect
import threading

_lock = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.Module:
    with _lock:
        return ast.parse(source, filename, mode)


def parse_source_of(obj: object) -> ast.Module:
    """The syntax tree of a class's or function's own source. ``inspect.getsource`` parses the
    whole module to find a class, so it goes under the same lock."""
    with _lock:
        return ast.parse(inspect.getsource(obj).lstrip())
