"""Output a person can read: aligned tables and one-line summaries."""

from __future__ import annotations

import re

SUMMARY = "summary: "


def format_table(rows: list[dict]) -> str:
    """Rows of equal keys as an aligned plain-text table with a header line."""
    if not rows:
        return "(empty)"
    headers = list(rows[0])
    cells = [[str(row[h]) for h in headers] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]
    return "\n".join([line.rstrip(), rule, *body])


def summary_line(**fields) -> str:
    """`summary: key=value key=value ...`, the last line of every run."""
    parts = []
    for key, value in fields.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        parts.append(f"{key}={value}")
    return SUMMARY + " ".join(parts)


def parse_table(text: str) -> list[dict[str, str]]:
    """The first table format_table printed in `text` (its header, the rule of dashes, the
    rows up to the first line that is not one), as dicts of the printed cells."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if re.fullmatch(r"-+(  -+)*", line))
    headers = re.split(r"\s{2,}", lines[rule - 1].strip())
    rows = []
    for line in lines[rule + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(headers):
            break
        rows.append(dict(zip(headers, cells, strict=True)))
    return rows


def parse_summary(text: str, *, once: bool = False) -> dict[str, str]:
    """The fields of the last `summary: key=value ...` line in a run's output, as printed
    (strings: summary_line wrote floats to 4 significant digits).

    Raises ValueError, with the end of the output, when there is no such line, or with
    once=True when there are several (only rank 0 should print one).
    """
    lines = [line for line in text.splitlines() if line.startswith(SUMMARY)]
    if not lines or once and len(lines) > 1:
        raise ValueError(f"{len(lines)} `summary: ...` lines where one was expected; the "
                         f"output ends:\n{text[-2000:]}")
    return dict(re.findall(r"(\w+)=(\S*)", lines[-1][len(SUMMARY):]))
