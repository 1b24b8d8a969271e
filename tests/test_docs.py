"""The docs site builds with warnings as errors (`mkdocs build --strict`).

Skipped unless the `docs` extra is installed. The build renders the API
reference from the library's docstrings, so a docstring griffe cannot parse
(e.g. an `Args` entry naming a parameter the function does not have) fails
here.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_build_strict(tmp_path):
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  result = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict",
       "--config-file", os.path.join(REPO_ROOT, "mkdocs.yml"),
       "--site-dir", str(tmp_path / "site")],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  for page in ("index.html", "getting_started/index.html",
               "systems/disue/index.html", "api/core/index.html",
               "performance/index.html"):
    assert (tmp_path / "site" / page).is_file(), page
  api = (tmp_path / "site" / "api" / "core" / "index.html").read_text()
  assert 'id="fedjax_dd.core.fit.fit"' in api
  kernels = (tmp_path / "site" / "api" / "kernels" / "index.html").read_text()
  assert 'id="fedjax_dd.kernels.krr"' in kernels  # a package-dir module
