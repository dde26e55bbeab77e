"""Normalised token streams of Python sources, shared by deduplication and decontamination.

Two copies of a task differ in ways that do not matter: variable and class names, comments,
docstrings, formatting, quotes. Both steps therefore compare token streams in which:

- comments, docstrings and layout (newlines, indentation) are dropped;
- every identifier the source binds or reads by itself (variables, parameters, functions,
  classes, module aliases like ``F`` or ``torch``) becomes ``ID``; a single placeholder, not
  ``v1, v2, ...``, so that an inserted line does not renumber everything after it;
- attribute names (``.relu``, ``.matmul``, ``.Conv2d``) and keyword-argument names (``dim=``)
  are kept: they say which operators run, which is what makes two tasks different;
- attributes of ``self`` are the author's names too (``self.fc`` vs ``self.linear``): ``ID``;
- the ``KERNELRL`` metadata literal is not part of the task's code and is dropped;
- keywords, builtins, dunder names and the KernelBench contract names (``Model``,
  ``forward``, ``get_inputs``, ``get_init_inputs``) are kept;
- string literals become ``STR``; numbers inside functions and classes are kept (``dim=1`` vs
  ``dim=0`` are different tasks), numbers in module-level statements (the size globals that
  ``get_inputs`` reads) become ``NUM``: the same computation at other sizes is the same task.
  ``normalize_numbers`` turns every number into ``NUM``.
"""

from __future__ import annotations

import builtins
import io
import keyword
import tokenize

from kernelrl.env.task import strip_metadata

KEPT_NAMES = (
    frozenset(keyword.kwlist)
    | frozenset(keyword.softkwlist)
    | frozenset(dir(builtins))
    | {"self", "cls", "Model", "ModelNew", "forward", "get_inputs", "get_init_inputs"}
)
_SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}
# Python 3.12 splits f-strings into parts: the start token stands for the whole literal.
_FSTRING_PARTS = {
    getattr(tokenize, name) for name in ("FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, name)
}


def _is_docstring(tokens: list[tokenize.TokenInfo], index: int) -> bool:
    """A string that is a whole statement (first token of a logical line)."""
    previous = next(
        (t for t in reversed(tokens[:index]) if t.type not in (tokenize.NL, tokenize.COMMENT)), None
    )
    if previous is not None and previous.type not in (
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
    ):
        return False
    following = next(
        (t for t in tokens[index + 1 :] if t.type not in (tokenize.NL, tokenize.COMMENT)), None
    )
    return following is None or following.type in (tokenize.NEWLINE, tokenize.ENDMARKER)


BOILERPLATE_STARTS = ("import", "from", "def", "class", "super", "@")


def normalized_lines(source: str, normalize_numbers: bool = False) -> list[list[str]]:
    """The normalised tokens of ``source``, one list per logical line.

    Sources that do not tokenize fall back to whitespace-separated words: a broken record is
    still compared, never silently skipped.
    """
    source = strip_metadata(source)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [line.split() for line in source.splitlines() if line.strip()]
    lines: list[list[str]] = []
    out: list[str] = []
    depth = 0
    indent = 0
    for index, tok in enumerate(tokens):
        if tok.type == tokenize.INDENT:
            indent += 1
        elif tok.type == tokenize.DEDENT:
            indent -= 1
        if tok.type == tokenize.NEWLINE:
            if out:
                lines.append(out)
            out = []
            continue
        if tok.type in _SKIPPED or tok.type in _FSTRING_PARTS:
            continue
        text = tok.string
        if tok.type == tokenize.OP:
            if text in "([{":
                depth += 1
            elif text in ")]}":
                depth = max(depth - 1, 0)
            out.append(text)
        elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
            if not _is_docstring(tokens, index):
                out.append("STR")
        elif tok.type == tokenize.NUMBER:
            module_level = indent == 0 and not (out and out[0] in ("def", "class", "@"))
            out.append("NUM" if normalize_numbers or module_level else text.lower())
        elif tok.type == tokenize.NAME:
            after_dot = bool(out) and out[-1] == "."
            self_attribute = after_dot and len(out) >= 2 and out[-2] == "self"
            following = tokens[index + 1].string if index + 1 < len(tokens) else ""
            keyword_arg = depth > 0 and following == "=" and bool(out) and out[-1] in ("(", ",")
            if self_attribute and not text.startswith("__"):
                out.append("ID")
            elif text in KEPT_NAMES or text.startswith("__") or after_dot or keyword_arg:
                out.append(text)
            else:
                out.append("ID")
        else:
            out.append(text)
    if out:
        lines.append(out)
    return lines


def normalized_tokens(
    source: str, normalize_numbers: bool = False, drop_boilerplate: bool = True
) -> list[str]:
    """The normalised token stream of ``source`` (see the module docstring).

    ``drop_boilerplate`` leaves out the lines every KernelBench file has in some form (imports,
    ``def``/``class`` headers, decorators, ``super().__init__()``): in files this small they
    would otherwise make any two tasks look alike.
    """
    return [
        token
        for line in normalized_lines(source, normalize_numbers)
        if not (drop_boilerplate and line[0] in BOILERPLATE_STARTS)
        for token in line
    ]


def shingles(tokens: list[str], n: int) -> set[str]:
    """Contiguous n-grams of tokens, joined; a stream shorter than n is one shingle."""
    if len(tokens) < n:
        return {" ".join(tokens)} if tokens else set()
    return {" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}
