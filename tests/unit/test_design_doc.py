"""docs/design.md is the one design document, and nothing in the repository cites a file outside it.

1. ``test_the_module_map_names_every_module``: the map (docs/design.md#parts) names every module of
   src/taiji by its path under it, in backticks (``runtime/engine.py``); a package's ``__init__.py``
   may be named by its folder (``launch/sched/``), the package root's as ``taiji/__init__.py``.
2. ``test_nothing_cites_a_file_outside_the_repository``: no source, test, benchmark, example or
   documentation file cites a design note kept outside the repository (a path above it, or such a
   note by name or by its section numbers).
3. ``test_cited_anchors_exist``: every ``docs/<page>.md#<anchor>`` written in src/, tests/,
   benchmarks/ or examples/ names a page that exists and an anchor that page defines (an explicit
   ``{#id}``, or the id mkdocs' ``toc`` gives a heading).

Every violation is listed as ``file:line`` in the failure message.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from taiji_harness.testing import REPO

PACKAGE = REPO / "src" / "taiji"
DOCS = REPO / "docs"
DESIGN = DOCS / "design.md"
THIS = Path(__file__).resolve()

# where citations may be written: every text file under these folders, and these files
SCANNED_DIRS = ("src", "tests", "benchmarks", "examples", "docs")
SCANNED_FILES = ("README.md", "Makefile", "mkdocs.yml")
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".rst", ".j2"}
SKIPPED_PARTS = {"__pycache__", ".pytest_cache", "results"}

# a file above the repository, or the design notes that used to be kept there
OUTSIDE = {
    "a path above the repository": re.compile(r"\.\./shared\b|/work/shared\b"),
    "a design note outside the repository": re.compile(r"\b(?:SCHEDULER|MULTIHOST|ANCHORS)\.md\b"),
    "a section of a design note outside the repository": re.compile(r"\bDESIGN(?:\.md)?\s*§"),
}
CITATION = re.compile(r"\bdocs/((?:[\w-]+/)*[\w-]+\.md)#([\w-]+)")
CODE_DIRS = ("src", "tests", "benchmarks", "examples")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def scanned_files(dirs=SCANNED_DIRS, files=SCANNED_FILES) -> list[Path]:
    found = [REPO / name for name in files if (REPO / name).is_file()]
    for top in dirs:
        for path in sorted((REPO / top).rglob("*")):
            if (
                path.is_file()
                and path.suffix in TEXT_SUFFIXES
                and not SKIPPED_PARTS & set(path.relative_to(REPO).parts)
                and ".egg-info" not in str(path)
                and path.resolve() != THIS
            ):
                found.append(path)
    return found


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def section(markdown: str, anchor: str) -> str:
    """The text of the ``##`` section whose heading carries ``{#anchor}``, up to the next ``##``."""
    match = re.search(rf"^## .*\{{#{re.escape(anchor)}\}}\s*$", markdown, re.MULTILINE)
    assert match, f"docs/design.md has no '## ... {{#{anchor}}}' heading"
    rest = markdown[match.end() :]
    end = re.search(r"^## ", rest, re.MULTILINE)
    return rest if end is None else rest[: end.start()]


def slug(title: str) -> str:
    """The id mkdocs' ``toc`` extension gives a heading without an explicit one."""
    title = unicodedata.normalize("NFKD", re.sub(r"[`*]", "", title)).encode("ascii", "ignore").decode()
    title = re.sub(r"[^\w\s-]", "", title).strip().lower()
    return re.sub(r"[\s-]+", "-", title)


def anchors_of(page: Path) -> set[str]:
    text = page.read_text()
    ids = set(re.findall(r"\{:?\s*#([\w-]+)[^}]*\}", text))
    ids |= set(re.findall(r"""\bid=["']([\w-]+)["']""", text))
    for title in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, re.MULTILINE):
        if "{#" not in title and "{: #" not in title:
            ids.add(slug(title))
    return ids


def module_names(path: Path) -> set[str]:
    """How the map may name the module at ``path``."""
    relative = path.relative_to(PACKAGE).as_posix()
    if path.name != "__init__.py":
        return {relative}
    folder = path.parent.relative_to(PACKAGE).as_posix()
    if folder == ".":
        return {"__init__.py", "taiji/__init__.py", "taiji/"}
    return {relative, f"{folder}/"}


def test_the_module_map_names_every_module():
    parts = section(DESIGN.read_text(), "parts")
    named = set(re.findall(r"`([^`\s]+)`", parts))
    missing = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts and not module_names(path) & named
    )
    assert not missing, (
        f"docs/design.md#parts does not name {len(missing)} module(s) of src/taiji (name each by its "
        "path under src/taiji, in backticks; a package's __init__.py may be named by its folder, "
        "`pkg/`):\n  " + "\n  ".join(missing)
    )


def test_nothing_cites_a_file_outside_the_repository():
    problems = []
    for path in scanned_files():
        text = path.read_text(errors="replace")
        for what, pattern in OUTSIDE.items():
            for match in pattern.finditer(text):
                problems.append(f"  {rel(path)}:{line_of(text, match.start())}: {what}: {match.group(0)!r}")
    assert not problems, (
        "cite docs/design.md#<anchor> or a page under docs/ instead of files outside the repository:\n"
        + "\n".join(sorted(problems))
    )


def test_cited_anchors_exist():
    anchors: dict[str, set[str] | None] = {}
    problems = []
    cited = 0
    for path in scanned_files(CODE_DIRS, ()):
        text = path.read_text(errors="replace")
        for match in CITATION.finditer(text):
            page, anchor = match.groups()
            cited += 1
            if page not in anchors:
                anchors[page] = anchors_of(DOCS / page) if (DOCS / page).is_file() else None
            where = f"  {rel(path)}:{line_of(text, match.start())}: docs/{page}#{anchor}"
            if anchors[page] is None:
                problems.append(f"{where}: no page docs/{page}")
            elif anchor not in anchors[page]:
                problems.append(f"{where}: no such anchor (it has: {', '.join(sorted(anchors[page]))})")
    assert cited, "no docs/<page>.md#<anchor> citation found at all: is the pattern right?"
    assert not problems, "citations of anchors that do not exist:\n" + "\n".join(sorted(problems))


def test_the_checks_themselves():
    assert slug("1. Parts") == "1-parts"
    assert slug("Taking a host out: notices and `taiji drain`") == "taking-a-host-out-notices-and-taiji-drain"
    assert module_names(PACKAGE / "launch" / "sched" / "__init__.py") == {
        "launch/sched/__init__.py",
        "launch/sched/",
    }
    assert module_names(PACKAGE / "runtime" / "engine.py") == {"runtime/engine.py"}
    assert OUTSIDE["a section of a design note outside the repository"].search("see DESIGN\n§6")
    assert CITATION.search("(docs/reference/scheduler-model.md#pcrr)").groups() == (
        "reference/scheduler-model.md",
        "pcrr",
    )
