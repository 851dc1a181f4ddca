"""The what-if notebooks run headless, top to bottom, on this checkout's code.

Each notebook is stored without outputs, opens with the question it answers (a markdown cell),
imports only the public API (sim.api, sim.figures) and draws at least one figure. They are run with
nbclient in a fresh python3 kernel; this checkout goes first on the kernel's PYTHONPATH, so an
installed capsim elsewhere is never the one exercised. Notebook 03's trace part prints a reason and
skips itself when the public data folder is absent (tests/conftest.py's SHARED_DATA).
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import REPO, SHARED_DATA

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat (pip install -e '.[test]')")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbclient (pip install -e '.[test]')")
pytest.importorskip("ipykernel", reason="notebook tests need ipykernel (pip install -e '.[test]')")

NOTEBOOKS = REPO / "notebooks"
NAMES = ["01-memory-fit", "02-schedulers", "03-prefix-caching", "04-speculative", "05-capacity-plan"]
IMPORT = re.compile(r"^\s*(?:from\s+(\S+)\s+import|import\s+(\S+))", re.M)
TIMEOUT_S = 300  # per cell; a notebook takes seconds (03 with the Mooncake trace about 15 s)


def read(name: str):
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def test_the_five_notebooks_are_there():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_stored_clean(name):
    nb = read(name)
    nbformat.validate(nb)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "?" in first.source.split("\n\n")[1], \
        "the first cell states the question the notebook answers"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a notebook computes something"
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, f"{name}: outputs stored in {cell.source[:40]!r}"
        for a, b in IMPORT.findall(cell.source):
            assert (a or b) in ("sim.api", "sim.figures"), f"{name} imports {a or b}: only sim.api / sim.figures"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("CAPSIM_SHARED_DATA", str(SHARED_DATA))
    nb = read(name)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError with the failing cell and traceback
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no figure"
    if name == "03-prefix-caching" and not (SHARED_DATA / "traces" / "mooncake_fast25").exists():
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert "skipped: no Mooncake trace" in text
    assert list(tmp_path.iterdir()) == [], "notebooks write no files"
