"""What the benchmarks' reports share: the verdict word of a target, the machine's load average,
a Markdown table, and the write of a run's section between the markers of a bench/REPORT-*.md
(the text around them, the analysis, is kept). Each script still says what its own report says."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path


def verdict(ok: bool | None) -> str:
    """PASS or MISS for a target; "reported" for a figure with no target (None)."""
    return "reported" if ok is None else "PASS" if ok else "MISS"


def load_average(digits: int = 2) -> str:
    """The machine's load average, 1, 5 and 15 min: "2.03 2.27 3.26"."""
    return " ".join(f"{x:.{digits}f}" for x in os.getloadavg())


def markdown_table(header: Sequence[str], align: str, rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines; `align` one letter per column: l (left) or r (right)."""
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return [f"| {' | '.join(header)} |", rule, *(f"| {' | '.join(row)} |" for row in rows)]


def write_section(path: Path, section: str, begin: str, end: str, preamble: str) -> None:
    """Put `section` between the markers `begin` and `end` of the report at `path`: in place of
    the last run's, the rest of the file kept; appended to a report without markers; a new report
    starts with `preamble`."""
    block = f"{begin}\n{section}\n{end}"
    current = path.read_text() if path.exists() else ""
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        path.write_text(head + block + rest.split(end, 1)[1])
    elif current:
        path.write_text(current.rstrip() + "\n\n" + block + "\n")
    else:
        path.write_text(preamble.rstrip("\n") + "\n\n" + block + "\n")
