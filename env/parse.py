"""From a model completion to the solution source, and the names of the solution's kernels.

A completion is free text: reasoning (often inside ``<think>...</think>``), prose and one or more
fenced code blocks. The solution is the last Python block that defines ``class ModelNew``: the
model's final answer, never an earlier draft. When the answer cannot be found or cannot be used
the model gets a ``FormatError`` whose message says what was wrong and how to fix it, because
that message is the feedback of the next turn.

The AST helpers here (import resolution, Triton decorator recognition, extraction of the CUDA
sources handed to ``load_inline``) find a solution's own kernels for ``backends`` (which the
profiler trace is split by) and for the integrity checks.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator

from kernelrl.env.python_syntax import parse_python


class FormatError(ValueError):
    """The completion holds no usable solution; the message is written for the model."""


_FORMAT_HINT = (
    "Answer with one complete ```python code block that defines class ModelNew(nn.Module) "
    "with a forward method."
)

# A fence opens on its own line with three or more backticks or tildes and an optional
# language tag; it closes with the same fence. An unterminated last fence runs to the end of
# the text, so a truncated answer gets a syntax error rather than "no code block".
_FENCE_OPEN = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<tag>[^\s`]*)[^\n]*$", re.M)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_MODELNEW_TEXT = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.M)


def strip_reasoning(text: str) -> str:
    """The answer of a completion, without its ``<think>`` reasoning: drafts must never be
    graded, nor go back into the conversation (``kernelrl.prompts``).

    A closing tag without an opening one happens when the chat template put ``<think>`` in the
    prompt; everything before the last ``</think>`` is then reasoning. An opening tag that is
    never closed means the model never left its reasoning: there is no answer.
    """
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S | re.I)
    closing = text.lower().rfind("</think>")
    if closing >= 0:
        text = text[closing + len("</think>") :]
    opening = text.lower().find("<think>")
    if opening >= 0:
        if not text[:opening].strip():
            raise FormatError(
                "The completion ends inside <think> reasoning: no final answer was given. "
                + _FORMAT_HINT
            )
        text = text[:opening]
    return text


def _fenced_blocks(text: str) -> Iterator[tuple[str, str]]:
    """Yield ``(language tag, body)`` for each fenced block, in order."""
    position = 0
    while True:
        opening = _FENCE_OPEN.search(text, position)
        if opening is None:
            return
        fence = opening.group("fence")
        body_start = opening.end() + 1
        closing = re.compile(rf"^[ \t]{{0,3}}{re.escape(fence)}[ \t]*$", re.M).search(
            text, body_start
        )
        body_end = closing.start() if closing else len(text)
        yield opening.group("tag").lower(), text[body_start:body_end]
        if closing is None:
            return
        position = closing.end()


def _validated(code: str) -> str:
    """Parse the candidate and check the KernelBench contract; raise a FormatError otherwise."""
    code = textwrap.dedent(code).strip("\n") + "\n"
    if not code.strip():
        raise FormatError("The code block is empty. " + _FORMAT_HINT)
    try:
        tree = parse_python(code)
    except SyntaxError as exc:
        lineno = exc.lineno or 0
        lines = code.splitlines()
        offending = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
        raise FormatError(
            f"The solution has a syntax error on line {lineno} of the code block: {exc.msg}\n"
            f"    {offending.rstrip()}\nFix it and answer with the complete corrected code."
        ) from None
    except ValueError as exc:  # e.g. null bytes
        raise FormatError(f"The solution cannot be parsed as Python: {exc}.") from None
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    model = classes.get("ModelNew")
    if model is None:
        raise FormatError(
            "The code block does not define class ModelNew at module level. " + _FORMAT_HINT
        )
    if not _has_forward(model, classes, set()):
        raise FormatError(
            f"class ModelNew (line {model.lineno}) has no forward method: define "
            "def forward(self, ...) with the same signature as Model.forward."
        )
    return code


def _has_forward(cls: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: set[str]) -> bool:
    """forward defined in the class or inherited from a class of the solution itself."""
    seen.add(cls.name)
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "forward":
            return True
    for base in cls.bases:
        if (
            isinstance(base, ast.Name)
            and base.id in classes
            and base.id not in seen
            and _has_forward(classes[base.id], classes, seen)
        ):
            return True
    return False


def extract_solution(completion: str) -> str:
    """The solution source in a model completion.

    Rules, in order: ``<think>`` reasoning is ignored; among fenced blocks tagged python / py /
    Python or untagged, the last one that defines ``class ModelNew`` is the answer (the last
    Python block if none does, so the error names what is missing); without any fence, the
    whole text is accepted when it parses and defines ``ModelNew``. Raises ``FormatError``.
    """
    if not completion or not completion.strip():
        raise FormatError("The completion is empty. " + _FORMAT_HINT)
    text = strip_reasoning(completion)
    blocks = list(_fenced_blocks(text))
    python_blocks = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    if python_blocks:
        with_model = [body for body in python_blocks if _MODELNEW_TEXT.search(body)]
        return _validated(with_model[-1] if with_model else python_blocks[-1])
    if blocks:
        tags = ", ".join(sorted({tag for tag, _ in blocks}))
        raise FormatError(
            f"The completion has code blocks ({tags}) but no Python block. " + _FORMAT_HINT
        )
    try:
        tree = parse_python(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        tree = None
    # Plain code without a fence (a solution file) is judged as code: one without ModelNew is
    # told so, not that it has no code block. Prose that happens to parse (a single word is a
    # Python expression) defines nothing and still gets the code-block message.
    if tree is not None and (
        _MODELNEW_TEXT.search(text) or any(not isinstance(node, ast.Expr) for node in tree.body)
    ):
        return _validated(text)
    raise FormatError("The completion contains no code block. " + _FORMAT_HINT)


# --------------------------------------------------------------------------- shared AST helpers
def import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> fully qualified name for every import in the module (any depth).

    ``import torch.nn.functional as F`` gives ``F -> torch.nn.functional``; ``import torch.nn``
    binds ``torch``; ``from torch import matmul as mm`` gives ``mm -> torch.matmul``. Relative
    imports are recorded with leading dots so that nothing mistakes them for a known module.
    """
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                if alias.name != "*":
                    full = f"{module}.{alias.name}" if module else alias.name
                    aliases[alias.asname or alias.name] = "." * node.level + full
    return aliases


def dotted_name(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``T.nn.functional.relu`` -> ``torch.nn.functional.relu`` when ``T`` is an import alias."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


TRITON_JIT = {"triton.jit", "triton.runtime.jit", "triton.runtime.jit.jit", "triton.JITFunction"}
TRITON_WRAPPERS = {
    "triton.autotune",
    "triton.heuristics",
    "triton.runtime.autotune",
    "triton.runtime.heuristics",
    "triton.runtime.autotuner.autotune",
    "triton.runtime.autotuner.heuristics",
}


def is_triton_jit(expr: ast.expr, aliases: dict[str, str]) -> bool:
    """``triton.jit``, ``triton.jit(...)`` or a bare ``jit`` imported from triton."""
    target = expr.func if isinstance(expr, ast.Call) else expr
    name = dotted_name(target, aliases)
    if name is None and isinstance(target, ast.Name) and target.id == "jit":
        return "jit" not in aliases  # unresolved bare @jit: a Triton kernel or a NameError
    return name in TRITON_JIT


def _wrapped_jit_function(expr: ast.expr, aliases: dict[str, str]) -> str | None:
    """``triton.jit(fn)`` or ``triton.autotune(...)(triton.jit(fn))`` -> ``fn``."""
    while isinstance(expr, ast.Call):
        func = expr.func
        if is_triton_jit(func, aliases) and expr.args and isinstance(expr.args[0], ast.Name):
            return expr.args[0].id
        if isinstance(func, ast.Call) and dotted_name(func.func, aliases) in TRITON_WRAPPERS:
            expr = expr.args[0] if expr.args else None  # type: ignore[assignment]
            continue
        return None
    return None


def triton_kernels(tree: ast.Module, aliases: dict[str, str] | None = None) -> dict[str, str]:
    """Names bound to the solution's Triton kernels -> the kernel's function name.

    A kernel is a function with ``triton.jit`` among its decorators (``autotune``/``heuristics``
    stacked on top are fine), or a name assigned ``triton.jit(fn)`` at module level. The
    function name is what the profiler shows; the bound name is what forward launches.
    """
    aliases = import_aliases(tree) if aliases is None else aliases
    kernels: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            is_triton_jit(d, aliases) for d in node.decorator_list
        ):
            kernels[node.name] = node.name
    for node in tree.body:
        if isinstance(node, ast.Assign):
            wrapped = _wrapped_jit_function(node.value, aliases)
            if wrapped is not None:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        kernels[target.id] = wrapped
    return kernels


LOAD_INLINE = {
    "torch.utils.cpp_extension.load_inline",
    "torch.utils.cpp_extension.load",
}


def is_cpp_extension_call(node: ast.AST, aliases: dict[str, str]) -> bool:
    """A call of ``torch.utils.cpp_extension.load_inline`` (or ``load``), however imported."""
    return isinstance(node, ast.Call) and dotted_name(node.func, aliases) in LOAD_INLINE


def module_string_constants(tree: ast.Module) -> dict[str, list[ast.expr]]:
    """Module-level ``NAME = <expr>`` assignments, so that source strings can be followed."""
    values: dict[str, list[ast.expr]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, []).append(node.value)
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value
            or isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
        ):
            values.setdefault(node.target.id, []).append(node.value)
    return values


def string_fragments(
    expr: ast.expr, constants: dict[str, list[ast.expr]], seen: set[str] | None = None
) -> list[tuple[str, int]]:
    """Every string literal an argument expression is built from: ``(text, first line)``.

    Follows module-level names, concatenation, lists, f-strings and ``str.join``/``dedent``
    calls by collecting every literal inside the expression, so a source assembled from pieces
    is still seen whole (pieces are joined with newlines; only their content matters).
    """
    seen = set() if seen is None else seen
    fragments: list[tuple[str, int]] = []
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            fragments.append((node.value, node.lineno))
        elif isinstance(node, ast.Name) and node.id in constants and node.id not in seen:
            seen.add(node.id)
            for value in constants[node.id]:
                fragments.extend(string_fragments(value, constants, seen))
    return fragments


def cpp_extension_sources(
    tree: ast.Module, aliases: dict[str, str] | None = None
) -> list[tuple[ast.Call, dict[str, list[tuple[str, int]]]]]:
    """Each ``load_inline``/``load`` call with the strings passed per source keyword.

    Keys are ``cuda_sources``, ``cpp_sources`` and ``sources`` (``load`` takes file paths).
    Positional arguments follow ``load_inline(name, cpp_sources, cuda_sources, ...)``.
    """
    aliases = import_aliases(tree) if aliases is None else aliases
    constants = module_string_constants(tree)
    found = []
    for node in ast.walk(tree):
        if not is_cpp_extension_call(node, aliases):
            continue
        assert isinstance(node, ast.Call)
        arguments: dict[str, ast.expr] = {}
        for position, key in enumerate(("name", "cpp_sources", "cuda_sources")):
            if position < len(node.args):
                arguments[key] = node.args[position]
        for keyword in node.keywords:
            if keyword.arg:
                arguments[keyword.arg] = keyword.value
        sources = {
            key: string_fragments(arguments[key], constants)
            for key in ("cuda_sources", "cpp_sources", "sources")
            if key in arguments
        }
        found.append((node, sources))
    return found


def strip_c_comments(source: str) -> str:
    """Remove C/C++ comments and ``#if 0`` blocks, keeping line breaks so lines still count.

    Without this a ``// __global__ void k()`` comment would pass for a kernel.
    """

    def blank(match: re.Match[str]) -> str:
        return "\n" * match.group(0).count("\n")

    source = re.sub(r"/\*.*?\*/", blank, source, flags=re.S)
    source = re.sub(r"//[^\n]*", "", source)
    return re.sub(
        r"^[ \t]*#[ \t]*if[ \t]+0\b.*?^[ \t]*#[ \t]*endif\b", blank, source, flags=re.S | re.M
    )


_GLOBAL_FUNCTION = re.compile(r"__global__\s+(?:[^(;{}]*?\s)?[*&\s]*(\w+)\s*(?:<[^>(]*>\s*)?\(")


def cuda_global_functions(source: str) -> list[str]:
    """Names of the ``__global__`` functions defined in CUDA C++ source (comments ignored)."""
    source = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", strip_c_comments(source))
    return list(dict.fromkeys(_GLOBAL_FUNCTION.findall(source)))
