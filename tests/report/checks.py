"""Checks shared by the report tests: every number a report shows against the JSON file it names, and
every figure's image drawn in a real browser."""

from __future__ import annotations

import io
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np

HEADLINE = [f"{k}.{s}" for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s") for s in ("mean", "median", "p90", "p99")] + [
    "output_throughput_tok_s", "request_throughput_rps", "goodput_rps", "slo_attainment", "memory_fit",
    "gpu_seconds_per_good", "energy_j_per_good"]

# the same cells, read in the browser from the rendered DOM
CELLS_JS = """[...document.querySelectorAll('[data-key]')].map(e => ({source: e.dataset.source, key: e.dataset.key,
  value: e.dataset.value, scale: e.dataset.scale, text: e.textContent}))"""
FIGURES_JS = """[...document.querySelectorAll('figure img')].map(i => { const r = i.getBoundingClientRect();
  return {id: i.closest('figure').id, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, alt: i.alt,
          x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}; })"""


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells, self._open, self.tags = [], None, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if "data-key" in a:
            self._open = {"source": a["data-source"], "key": a["data-key"], "value": a["data-value"],
                          "scale": a["data-scale"], "text": ""}

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._open is not None:
            self.cells.append(self._open)
            self._open = None


def parse_page(text: str) -> tuple[list[dict], list[str]]:
    """The data-key cells of a report's HTML and every tag name used."""
    p = _Cells()
    p.feed(text)
    return p.cells, p.tags


def lookup(folder: Path, source: str, key: str):
    """The value at a dotted key of the JSON file `source` under `folder`: list indices as numbers, and
    keys that hold dots themselves (validation targets such as "e2e_s.median") matched longest first."""
    node = json.loads((folder / source).read_text())
    parts = key.split(".")
    i = 0
    while i < len(parts):
        if isinstance(node, list):
            node, i = node[int(parts[i])], i + 1
            continue
        for j in range(len(parts), i, -1):
            k = ".".join(parts[i:j])
            if k in node:
                node, i = node[k], j
                break
        else:
            raise KeyError(f"{source}: no {key}")
    return node


def check_cells(cells: list[dict], folder: Path) -> int:
    """Every shown number equals its JSON source: the exact value in data-value, and the text that value
    rounded to the digits shown. Returns the number of cells checked."""
    for c in cells:
        want = lookup(folder, c["source"], c["key"])
        where = f"{c['source']}:{c['key']}"
        text = c["text"].strip()
        if want is None or (isinstance(want, float) and math.isnan(want)):
            assert c["value"] == "null" and (text == "-" or text.startswith("more than")), where
            continue
        if isinstance(want, bool):
            assert c["value"] == ("true" if want else "false"), where
            assert text == ("yes" if want else "NO"), where
            continue
        assert float(c["value"]) == float(want), f"{where}: data-value {c['value']} != {want}"
        scale = float(c["scale"])
        shown = float(text.replace(",", ""))
        digits = len(text.split(".")[1]) if "." in text else 0
        assert abs(shown * scale - want) <= 0.5 * 10 ** -digits * scale * (1 + 1e-9) + 1e-12, \
            f"{where}: shows {text} for {want}"
    return len(cells)


def check_headline(cells: list[dict], source: str = "summary.json") -> None:
    """The headline keys are all shown, from `source`."""
    keys = {c["key"] for c in cells if c["source"] == source}
    missing = [k for k in HEADLINE if k not in keys]
    assert not missing, f"headline keys not shown from {source}: {missing}"


def drawn_fraction(png: bytes) -> float:
    """Share of a screenshot's pixels that are not the page background (white)."""
    from PIL import Image
    img = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.uint8)
    return float((img < 235).mean())


def check_in_browser(browser, page: Path) -> dict:
    """Open a report in Chromium: no console error or exception, nothing fetched but the page itself,
    every figure decoded and visibly drawn, every shown number equal to its JSON source."""
    loaded = browser.open(page)
    assert loaded.errors() == [], loaded.errors()
    fetched = [u for u in loaded.requests if not u.startswith("data:")]   # inline figures are data: URIs
    assert fetched == [page.resolve().as_uri()], [u[:120] for u in fetched]
    assert browser.evaluate("document.querySelectorAll('script').length") == 0
    figs = browser.evaluate(FIGURES_JS)
    assert figs, "no figure"
    for f in figs:
        assert f["complete"] and f["w"] > 100 and f["h"] > 100, f
        assert f["alt"], f
        shot = browser.screenshot(f["x"], f["y"], f["width"], f["height"])
        assert drawn_fraction(shot) > 0.02, f"{f['id']}: the figure is blank"
    cells = browser.evaluate(CELLS_JS)
    n = check_cells(cells, page.parent)
    return {"figures": len(figs), "cells": n, "cell_list": cells}
