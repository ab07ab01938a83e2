"""docs/protocol.md's message tables, rendered from the declarations (shared/protocol/catalogue.py).

Two kinds of table carry a marker (an HTML comment, invisible in the rendered page):

- `<!-- fields: NAME -->`: one row per field of a message or a nested map, `| Field | Type |
  Range | Presence | Meaning |`; every column but Meaning comes from the declaration;
- `<!-- messages: LINK[, LINK] -->`: one row per message on those links, `| Type | Fields |
  When |`; Fields is rendered ("table below" for a message with a table of its own).

The prose columns (Meaning, When) are the doc's own. `python -m folio.shared.protocol.doc`
rewrites the rendered columns in place, keeping the prose by row and adding a row, with an
empty prose cell to fill in, for a new field; tests/shared/protocol/test_doc.py checks that
the doc is what this renders.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from folio.shared.protocol.catalogue import DECLARATIONS
from folio.shared.protocol.links import Link
from folio.shared.protocol.schema import Field, Items, Kind, ListOf, Nil, Shape

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
MARKER = re.compile(r"^<!-- (fields|messages): (.+?) -->$")


def tables() -> dict[str, tuple[Field, ...] | Items]:
    """Every field table the doc may have, by name: each message with fields, and each
    nested map or array reached from one."""
    found: dict[str, tuple[Field, ...] | Items] = {}

    def visit(kind: Kind) -> None:
        while isinstance(kind, (ListOf, Nil)):
            kind = kind.item if isinstance(kind, ListOf) else kind.kind
        if isinstance(kind, (Shape, Items)):
            if kind.table:
                found.setdefault(kind.name, kind if isinstance(kind, Items) else kind.fields)
            for f in kind.fields:
                visit(f.kind)

    for message in DECLARATIONS:
        if message.table:
            found.setdefault(message.name, message.fields)
        for f in message.fields:
            visit(f.kind)
    return found


def field_rows(table: tuple[Field, ...] | Items) -> dict[str, list[str]]:
    """Row key -> the rendered cells (Field, Type, Range, Presence)."""
    if isinstance(table, Items):
        required = len(table.fields) if table.min_len is None else table.min_len
        return {str(i): [f"{i}: {f.key}", f.kind.type_text, f.range_text(),
                         ("required" if i < required else "optional")
                         + (", may be nil" if f.send_nil else "")]
                for i, f in enumerate(table.fields)}
    return {f.key: [f"`{f.key}`", f.kind.type_text, f.range_text(), f.presence_text()]
            for f in table}


def messages_rows(links: list[str], tabled: set[str]) -> dict[str, list[str]]:
    """Row key (type) -> the rendered cells (Type, Fields) for the messages on `links`."""
    rows = {}
    for message in DECLARATIONS:
        if not any(link.value in links for link in message.links):
            continue
        if message.name in tabled:
            fields = f"table `{message.name}`"
        elif not message.fields:
            fields = "none"
        else:
            fields = "; ".join(f.compact() for f in message.fields)
        rows[message.type] = [f"`{message.type}`", fields]
    return rows


# ---- reading and writing the doc --------------------------------------------------------

def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _row_key(kind: str, cells: list[str]) -> str:
    first = cells[0]
    if kind == "fields" and re.fullmatch(r"\d+: .*", first):
        return first.split(":")[0]
    return first.strip("`")


def marked_tables(text: str) -> list[tuple[str, str, int, int]]:
    """(kind, name, first row line, end line) of each marked table: rows after the header."""
    lines = text.split("\n")
    found = []
    for index, line in enumerate(lines):
        match = MARKER.match(line.strip())
        if match:
            start = index + 3   # marker, header, separator
            end = start
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found.append((match.group(1), match.group(2), start, end))
    return found


def expected(kind: str, name: str, tabled: set[str]) -> dict[str, list[str]]:
    if kind == "fields":
        return field_rows(tables()[name])
    return messages_rows([link.strip() for link in name.split(",")], tabled)


def problems(text: str) -> list[str]:
    """Where the doc's marked tables differ from the declarations (empty: none)."""
    marked = marked_tables(text)
    tabled = {name for kind, name, _, _ in marked if kind == "fields"}
    lines = text.split("\n")
    found = []
    for name in sorted(set(tables()) - tabled):
        found.append(f"no `<!-- fields: {name} -->` table")
    covered = {link.strip() for kind, name, _, _ in marked if kind == "messages"
               for link in name.split(",")}
    for link in Link:
        if link.value not in covered and link is not Link.RANK0_TO_RANKS:
            found.append(f"no `<!-- messages: {link.value} -->` table")
    for kind, name, start, end in marked:
        if kind == "fields" and name not in tables():
            found.append(f"fields table {name!r}: nothing declared by that name")
            continue
        want = expected(kind, name, tabled)
        have = {_row_key(kind, _cells(line)): _cells(line) for line in lines[start:end]}
        for key in want.keys() - have.keys():
            found.append(f"{name}: no row for {key!r}")
        for key in have.keys() - want.keys():
            found.append(f"{name}: row {key!r} is not declared")
        for key in want.keys() & have.keys():
            cells = have[key]
            if cells[:-1] != want[key]:
                found.append(f"{name}: row {key!r} is {cells[:-1]}, declared {want[key]}")
            if not cells[-1]:
                found.append(f"{name}: row {key!r} says nothing in its last column")
    return found


def rewrite(text: str) -> str:
    """The doc with every marked table's rendered columns as declared, prose kept."""
    lines = text.split("\n")
    marked = marked_tables(text)
    tabled = {name for kind, name, _, _ in marked if kind == "fields"}
    for kind, name, start, end in reversed(marked):
        if kind == "fields" and name not in tables():
            continue
        prose = {_row_key(kind, _cells(line)): _cells(line)[-1] for line in lines[start:end]}
        rows = [f"| {' | '.join(cells + [prose.get(key, '')])} |"
                for key, cells in expected(kind, name, tabled).items()]
        lines[start:end] = rows
    return "\n".join(lines)


def main() -> int:
    text = DOC.read_text()
    new = rewrite(text)
    if new != text:
        DOC.write_text(new)
        print(f"rewrote {DOC}")
    left = problems(new)
    for problem in left:
        print(problem)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
