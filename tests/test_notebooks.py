"""The notebooks in notebooks/ run top to bottom on digits, as a user runs
them (each cell's own asserts check its result)."""

import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_the_notebooks_exist():
  names = [os.path.basename(p) for p in NOTEBOOKS]
  assert names == ["01_tour.ipynb", "02_own_algorithm.ipynb",
                   "03_kip_clients.ipynb", "04_resume.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  nb = nbformat.read(path, as_version=4)
  # A fresh kernel in a scratch directory (the notebooks write figures there).
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors
