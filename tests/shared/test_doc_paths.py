"""Every repository path README.md and docs/*.md name exists: a file or folder under bench/,
docs/, the source folders, tests/, scripts/ or deploy/ (a glob such as `executor/models/*.py`
must match something), and every relative Markdown link. A file moved or removed without
its documentation fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOLDERS = ("bench", "docs", "executor", "frontend", "shared", "scheduler", "kernels", "folio",
           "tests", "scripts", "deploy")
# A path starts at one of the folders, not inside a longer path (/tmp/folio-x1/...), a URL or
# a dotted name; it ends where path characters end (a sentence's full stop is not part of it).
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*)" % "|".join(FOLDERS))
# A Markdown link or image whose target is a relative path, its #anchor dropped.
LINK = re.compile(r"\]\(([^)\s#:]+)(?:#[^)\s]*)?\)")


def _exists(path: Path) -> bool:
    """A glob (a `*` in it) must match something; any other path must be there."""
    if "*" in str(path):
        return any(Path(path.anchor).glob(str(path.relative_to(path.anchor))))
    return path.exists()


def named_paths(page: Path) -> list[tuple[int, str, Path]]:
    """(line, as written, the path it names) for every repository path and relative link."""
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for match in PATH.finditer(line):
            written = match.group(1).rstrip(".-")
            found.append((number, written, ROOT / written))
        for match in LINK.finditer(line):
            found.append((number, match.group(1), page.parent / match.group(1)))
    return found


def test_the_pages_name_paths():
    """The check sees what it should: the README names docs, and architecture.md the tree."""
    assert any(written.startswith("docs/") for _, written, _ in named_paths(ROOT / "README.md"))
    assert len(named_paths(ROOT / "docs" / "architecture.md")) > 20


def test_a_missing_path_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See `executor/no_such_module.py`, executor/models/*.nothing and "
                    "[x](no_such_page.md#part); /tmp/folio-1/x and folio.frontend are not paths.\n")
    missing = [written for _, written, path in named_paths(page) if not _exists(path)]
    assert missing == ["executor/no_such_module.py", "executor/models/*.nothing",
                       "no_such_page.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_named_path_exists(page):
    missing = [f"{page.relative_to(ROOT)}:{number}: {written}"
               for number, written, path in named_paths(page) if not _exists(path)]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)
