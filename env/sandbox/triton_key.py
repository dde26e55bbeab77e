"""The parts of Triton's cache key for one compile, computed alike by a child and its compile
companion (``sandbox.compiler``), so that a child that does not find the companion's kernel
under its own key can say which part differed rather than only that it did.

Triton keys a compiled kernel by its own build (``triton_key``), the kernel's source with its
signature, constants and attributes, the backend (its target and its assembler's version), the
compile options as parsed for that target, and the environment variables it lets change a
compile. Each is named here on its own, an option or variable by its name.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

# Parts named in one child's record at most (each with its two values, cut short).
SHOWN = 3
VALUE_CHARS = 60
CONTEXT_CHARS = 10  # shown of what the two values share before their first difference


def key_parts(source: Any, target: Any, options: dict[str, Any] | None) -> dict[str, str]:
    """Triton's cache key for compiling ``source`` (an ``ASTSource``) for ``target`` with
    ``options``, part by part, as ``triton.compiler.compile`` computes it in this process."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import make_backend
    from triton.runtime.cache import get_cache_key, triton_key

    backend = make_backend(target)
    parsed = backend.parse_options(dict(options or {}, **source.parse_options()))
    env_vars = get_cache_invalidating_env_vars()
    key = get_cache_key(source, backend, parsed, env_vars=env_vars)
    return {
        "hash": hashlib.sha256(key.encode("utf-8")).hexdigest(),
        "triton": triton_key(),
        "kernel source": source.fn.cache_key,
        "signature": str(sorted(source.signature.items())),
        "constants": str(sorted((str(k), str(v)) for k, v in source.constants.items())),
        "attrs": str(source.attrs),
        "backend": backend.hash(),
        "options": parsed.hash(),
        **{f"option {name}": str(value) for name, value in sorted(parsed.__dict__.items())},
        **{f"env {name}": str(value) for name, value in sorted(env_vars.items())},
    }


def differences(here: dict[str, str], there: Any) -> str:
    """Which parts of two keys differ, with their values here and there ("" when none do)."""
    if not isinstance(there, dict):
        return "the companion sent no key parts"
    names = [n for n in sorted(set(here) | set(there)) if here.get(n) != there.get(n)]
    names = [n for n in names if n != "hash"] or names  # the whole key only if nothing else
    shown = [f"{name} ({_apart(here.get(name), there.get(name))})" for name in names[:SHOWN]]
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return "; ".join(shown) + more


def _apart(here: Any, there: Any) -> str:
    """The two values from a little before where they first differ: a tool's version text or a
    path agrees for its first dozens of characters, and it is the rest that says which."""
    text_here, text_there = (
        "none" if v is None else " ".join(str(v).split()) for v in (here, there)
    )
    start = max(len(os.path.commonprefix([text_here, text_there])) - CONTEXT_CHARS, 0)
    return f"{_cut(text_here, start)} here, {_cut(text_there, start)} there"


def _cut(text: str, start: int) -> str:
    shown = text[start : start + VALUE_CHARS]
    return ("..." if start else "") + shown + ("..." if start + VALUE_CHARS < len(text) else "")
