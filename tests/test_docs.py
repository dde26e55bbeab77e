"""The README, the user guide and the reference docs as a reader meets them: short enough, the
two set-up commands first, links and anchors that resolve, files they name that exist, no story
of the project's development, no machine paths in stored results."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDE = REPO / "docs" / "guide"
#: What a reader is shown: the README, the guide and the reference docs.
REFERENCE_DOCS = ("design.md", "threat-model.md", "learning-protocol.md")
DECISIONS = REPO / "docs" / "decisions.md"
RESULTS = REPO / "benchmarks" / "results"
README_MAX_LINES = 350
ORDINALS = (
    "First|Second|Third|Fourth|Fifth|Sixth|Seventh|Eighth|Ninth|Tenth|Eleventh|Twelfth|"
    "Thirteenth|Fourteenth|Fifteenth|Sixteenth|Seventeenth|Eighteenth"
)
#: How the story of the project's development shows in prose: work items and sessions by
#: number, rounds of work, the machine paths of the development box.
HISTORY = (
    re.compile(r"\bissue \d+", re.IGNORECASE),
    re.compile(r"\b(session|round) \d+", re.IGNORECASE),
    re.compile(rf"\b({ORDINALS}) (session|run)\b"),
    re.compile(r"/work/"),
    re.compile(r"/root/"),
)
#: A session named by its ordinal in any case ("the fifteenth session's settings"). Not applied
#: to the pre-registered learning protocol, whose text is frozen until its next version.
ORDINAL_SESSION = re.compile(rf"\b({ORDINALS}) session", re.IGNORECASE)
#: A section of another page named in prose (`README, "Options ... are refused"`): nothing notices
#: when that page is rewritten, where a link's file and heading are checked.
PROSE_SECTION = re.compile(r'(?<![\[\w./-])([\w./-]+\.md|README)(?:\'s)?, "[^"]+"')
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: A file of the checkout named in prose or in a command (outputs under runs/ are made by the run).
REPO_FILE = re.compile(
    r"(?<![\w./-])((?:recipes|examples|scripts|benchmarks|data|tests|docs)/[\w./-]*"
    r"\.(?:yaml|py|sh|md|txt|json|gz))\b"
)


def guide_pages() -> list[Path]:
    return sorted(GUIDE.glob("*.md"))


def shown_docs() -> list[Path]:
    return [README, *guide_pages(), *(REPO / "docs" / name for name in REFERENCE_DOCS)]


def history_checked() -> list[Path]:
    """What a reader is shown, and also the record of decisions and the benchmark results: a
    decision or a result is told by what it measured (a results folder, a date, a commit), never
    by the work session that made it."""
    results = [*RESULTS.rglob("*.md"), *RESULTS.rglob("*.py")]
    return [*shown_docs(), DECISIONS, *sorted(results)]


def history_in(text: str, strict: bool = True) -> list[str]:
    patterns = (*HISTORY, ORDINAL_SESSION) if strict else HISTORY
    return [m.group(0) for pattern in patterns for m in pattern.finditer(text)]


def heading_slugs(text: str) -> set[str]:
    """GitHub's anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", text), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file (or, for a Markdown file, heading) does not exist."""
    text = page.read_text()
    broken = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or not anchor_exists(file, anchor):
            broken.append(target)
    return broken


def anchor_exists(file: Path, anchor: str) -> bool:
    return not anchor or file.suffix != ".md" or anchor in heading_slugs(file.read_text())


def missing_repo_files(page: Path) -> list[str]:
    return sorted({p for p in REPO_FILE.findall(page.read_text()) if not (REPO / p).exists()})


def test_readme_fits_a_ten_minute_read() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail to docs/guide/"


def test_readme_leads_with_the_two_commands_and_ci_runs_the_second() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.DOTALL)
    assert first_block and README.read_text().index("```bash") < README.read_text().index("\n## ")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == [
        "bash scripts/setup.sh && .venv/bin/kernelrl train --config recipes/smoke/cpu.yaml",
        "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2 --dist loadfile",
    ]
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert "bash scripts/setup.sh" in ci and commands[1].split("&& .venv/bin/")[1] in ci


def test_docs_do_not_narrate_development_history() -> None:
    found = {}
    for page in history_checked():
        hits = history_in(page.read_text(), strict=page.name != "learning-protocol.md")
        if hits:
            found[str(page.relative_to(REPO))] = hits
    assert not found, f"development history in what a user reads: {found}"


def test_history_patterns_catch_what_they_are_for() -> None:
    narrated = (
        "measured in issue 27; round 2 of the red team; the Seventh run (2026-11-27); "
        "the fifteenth session's synthesis; a venv at /work/main/.venv; /root/.cache"
    )
    assert len(history_in(narrated)) == 6
    assert history_in("the eighteenth session's settings", strict=False) == []
    plain = "a first run with no checkpoint; a WebSocket session; `setsid`; issue a request"
    assert history_in(plain) == []


def test_readme_and_guide_links_resolve(tmp_path: Path) -> None:
    pages = [README, *guide_pages()]
    assert {p.name for p in guide_pages()} >= {
        "environment.md",
        "training.md",
        "evaluation.md",
        "curation.md",
        "service.md",
        "recipes.md",
    }
    broken = {str(p.relative_to(REPO)): broken_links(p) for p in pages if broken_links(p)}
    assert not broken, f"relative links to nothing: {broken}"
    readme = README.read_text()
    for page in guide_pages():  # every guide page is reachable from the README
        assert f"(docs/guide/{page.name})" in readme, page.name
    # the checker itself: a missing file and a missing heading are both caught
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A `kernelrl` heading, here\n")
    page.write_text(
        "[ok](other.md#a-kernelrl-heading-here) [web](https://x.org/y) [self](#top)\n"
        "[gone](missing.md) [no heading](other.md#nowhere)\n```\n[in code](nothing.md)\n```\n# Top\n"
    )
    assert broken_links(page) == ["missing.md", "other.md#nowhere"]


def test_decisions_links_and_anchors_resolve() -> None:
    """The record of decisions cites sections of the README, the guide and benchmarks/README.md,
    pages that get rewritten: each citation is a link whose file and heading are checked."""
    text = FENCE.sub("", DECISIONS.read_text())
    assert len(LINK.findall(text)) >= 5, "docs/decisions.md cites sections by link"
    assert broken_links(DECISIONS) == [], "docs/decisions.md links to nothing"
    assert PROSE_SECTION.findall(text) == [], "a section named in prose: make it a link"
    cited = '(README, "Options ... are refused") and ([design.md, "Layers"](design.md#layers))'
    assert PROSE_SECTION.findall(cited) == ["README"]


def test_files_the_readme_and_guide_name_exist() -> None:
    missing = {}
    for page in [README, *guide_pages()]:
        if names := missing_repo_files(page):
            missing[str(page.relative_to(REPO))] = names
    assert not missing, f"files named in the docs that the checkout does not have: {missing}"
    assert REPO_FILE.findall("run `recipes/smoke/cpu.yaml` and tests/x.py::t") == [
        "recipes/smoke/cpu.yaml",
        "tests/x.py",
    ]


#: Where a development machine's folders would show in a stored result: its checkout, its home,
#: the cgroup of a container it runs in (named by the container's id).
MACHINE_PATH = re.compile(r"/work/|/root/|/sys/fs/cgroup/\S*[0-9a-f]{32}")


def test_no_stored_result_names_a_machine_path() -> None:
    """Results are read on other machines: a run's records name their files by the run folder
    or the checkout, never by the folders of the machine that made them (compressed records
    included)."""
    found = []
    for path in sorted(p for p in RESULTS.rglob("*") if p.is_file()):
        if path.suffix == ".gz":
            text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        elif path.suffix in {".png", ".parquet", ".sqlite"}:
            continue
        else:
            text = path.read_text(errors="replace")
        found += [f"{path.relative_to(REPO)}: {m}" for m in MACHINE_PATH.findall(text)[:1]]
    assert found == []
