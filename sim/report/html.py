"""A small HTML builder for the self-contained report: inline CSS, no scripts, real tables.

Numbers the report shows from a JSON output carry their source in the markup: a `<td
data-source="summary.json" data-key="ttft_s.p99" data-value="0.5993..." data-scale="0.001">599.38</td>` cell
says which file (relative to the report) and dotted key it shows, the exact value, and what one displayed
unit is worth in the key's unit, so a test can check every shown number against the file it came from.
"""

from __future__ import annotations

import base64
import html
import math
import os
from dataclasses import dataclass, field

CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0;
       color: #1b1f24; background: #fff; line-height: 1.45; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5rem 1.5rem 4rem; }
h1 { font-size: 1.6rem; margin: 0 0 .2rem; }
h2 { font-size: 1.25rem; margin: 2.2rem 0 .6rem; padding-bottom: .2rem; border-bottom: 2px solid #d0d7de; }
h3 { font-size: 1.05rem; margin: 1.4rem 0 .4rem; }
p.lead { color: #57606a; margin: 0 0 1rem; }
nav ol { columns: 2; padding-left: 1.2rem; margin: .4rem 0 0; }
div.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: .4rem 0 1rem; font-size: .92rem; }
caption { text-align: left; font-weight: 600; padding: .2rem 0 .4rem; }
th, td { border: 1px solid #d0d7de; padding: .28rem .6rem; vertical-align: top; }
th { background: #f6f8fa; text-align: left; font-weight: 600; }
th[scope="row"] { white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
tr.bad td { background: #fff1f0; }
figure { margin: 1rem 0 1.6rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { color: #57606a; font-size: .9rem; margin-top: .3rem; }
.ok { color: #1a7f37; font-weight: 600; }
.no { color: #cf222e; font-weight: 600; }
ul.warnings li { margin: .25rem 0; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: .4rem 0 1rem; }
dl.kv dt { font-weight: 600; }
dl.kv dd { margin: 0; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .88em; background: #f6f8fa;
       padding: 0 .2em; border-radius: 3px; }
footer { margin-top: 3rem; color: #57606a; font-size: .85rem; }
"""


def shown_path(path) -> str:
    """A path relative to the working directory when it lies below it (reports are shared), else as is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def esc(text) -> str:
    """HTML-escape any value's text."""
    return html.escape(str(text), quote=True)


@dataclass
class Cell:
    """A table cell: shown text, and optionally the summary key and exact value it displays."""

    text: str
    key: str | None = None
    value: object = None
    scale: float = 1.0
    num: bool = False
    header: bool = False
    source: str = "summary.json"

    def render(self) -> str:
        """The cell as <td> (or <th scope="row">)."""
        attrs = []
        if self.num:
            attrs.append('class="num"')
        if self.key is not None:
            attrs.append(f'data-source="{esc(self.source)}" data-key="{esc(self.key)}" '
                         f'data-value="{esc(_json_number(self.value))}" data-scale="{self.scale!r}"')
        tag = "th" if self.header else "td"
        scope = ' scope="row"' if self.header else ""
        return f"<{tag}{scope}{(' ' + ' '.join(attrs)) if attrs else ''}>{esc(self.text)}</{tag}>"


def _json_number(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


def number(value, scale: float = 1.0, digits: int = 3, key: str | None = None, source: str = "summary.json") -> Cell:
    """A numeric cell showing value / scale with `digits` decimals ('-' for None or NaN); `key` and
    `source` name the JSON file (relative to the report) and the dotted key the value comes from."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Cell("-", key, None, scale, num=True, source=source)
    return Cell(f"{value / scale:,.{digits}f}", key, value, scale, num=True, source=source)


def table(headers: list[str], rows: list[list], caption: str = "", row_classes: list[str] | None = None,
          numeric_columns: set[int] | None = None) -> str:
    """A <table> with a header row; row cells are Cells or plain values (the first cell is the row header)."""
    numeric_columns = numeric_columns or set()
    head = "".join(f'<th scope="col"{" class=num" if i in numeric_columns else ""}>{esc(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        cells = []
        for i, c in enumerate(row):
            if not isinstance(c, Cell):
                c = Cell("-" if c is None else str(c), num=i in numeric_columns)
            if i == 0 and not c.num:
                c.header = True
            cells.append(c.render())
        cls = f' class="{row_classes[r]}"' if row_classes and row_classes[r] else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            "</table></div>")


def definition_list(items: list[tuple[str, str]]) -> str:
    """A two-column <dl> of (term, description) pairs; descriptions are escaped text."""
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items) + "</dl>"


def figure(svg: bytes, alt: str, caption: str, fig_id: str) -> str:
    """An <img> holding an SVG as a data URI (no file next to the page, no script), with alt text and caption."""
    data = base64.b64encode(svg).decode("ascii")
    return (f'<figure id="{esc(fig_id)}"><img src="data:image/svg+xml;base64,{data}" alt="{esc(alt)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def bullet_list(lines: list[str], cls: str = "") -> str:
    """A <ul> of escaped lines."""
    c = f' class="{cls}"' if cls else ""
    return f"<ul{c}>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>"


def paragraph(text: str) -> str:
    """An escaped <p>."""
    return f"<p>{esc(text)}</p>"


@dataclass
class Page:
    """The report page: a title, a lead line and sections of ready HTML; render() returns the document."""

    title: str
    lead: str = ""
    sections: list[tuple[str, str, str]] = field(default_factory=list)   # (id, heading, html)
    footer: str = ""

    def add(self, sec_id: str, heading: str, body: str) -> None:
        """Append a section (an <h2> with an id, listed in the contents)."""
        self.sections.append((sec_id, heading, body))

    def render(self) -> str:
        """The whole document: one file, inline CSS, no script, no external reference."""
        toc = "".join(f'<li><a href="#{esc(i)}">{esc(h)}</a></li>' for i, h, _ in self.sections)
        secs = "".join(f'<section id="{esc(i)}" aria-labelledby="{esc(i)}-h"><h2 id="{esc(i)}-h">{esc(h)}</h2>'
                       f"{body}</section>" for i, h, body in self.sections)
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                f"<title>{esc(self.title)}</title><style>{CSS}</style></head><body><main>"
                f"<h1>{esc(self.title)}</h1>" + (f'<p class="lead">{esc(self.lead)}</p>' if self.lead else "")
                + f'<nav aria-label="contents"><strong>Contents</strong><ol>{toc}</ol></nav>{secs}'
                + (f"<footer>{esc(self.footer)}</footer>" if self.footer else "")
                + "</main></body></html>\n")
