"""The notebooks in notebooks/ run top to bottom on digits, as a user runs
them (each cell's own asserts check its result), and show their figures."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


# A cell that draws: it calls a plotting function (fedjax_dd.plot_history,
# figures.plot_class_samples, ...).
PLOTTING = re.compile(r"\bplot_\w+\(")


def cells_without_figure(nb) -> list[int]:
  """The plotting cells of an executed notebook with no ``image/png``
  output (a figure shown only as ``<Figure size ... with 1 Axes>``)."""
  return [i for i, c in enumerate(nb.cells)
          if c.cell_type == "code" and PLOTTING.search(c.source)
          and not any("image/png" in o.get("data", {})
                      for o in c.get("outputs", []))]


def test_a_plotting_cell_without_an_image_is_found():
  nbformat = pytest.importorskip("nbformat")
  v4 = nbformat.v4
  text = v4.new_output("execute_result", execution_count=1,
                       data={"text/plain": "<Figure size 550x380 with 1 Axes>"})
  png = v4.new_output("display_data", {"image/png": "iVBORw0KGgo=",
                                       "text/plain": "<Figure>"})
  nb = v4.new_notebook(cells=[
      v4.new_code_cell("x = 1"),
      v4.new_code_cell("fedjax_dd.plot_history(rows)", outputs=[text]),
      v4.new_code_cell("fedjax_dd.plot_history(rows)", outputs=[png])])
  assert cells_without_figure(nb) == [1]


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
  assert any(PLOTTING.search(c.source) for c in nb.cells)
  assert cells_without_figure(nb) == []
