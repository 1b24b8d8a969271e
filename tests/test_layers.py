"""Nothing imports upward: each package imports only from its own floor or
the floors below it (lazy imports inside functions included)."""

import ast
import pathlib

from tests.conftest import REPO_ROOT

# Lowest first. ``fedjax_dd/__init__.py`` (the lazy public API) stands above
# them all and is not checked.
FLOORS = (
    ("_xla_setup", "versions"),
    ("policy",),
    ("data", "kernels", "models"),
    ("core", "privacy"),
    ("cluster", "distill"),
    ("algorithms",),
    # The audits read what a run's algorithms stored (FedD3's stage cache).
    ("audit",),
    ("utils",),
    ("experiments",),
)
# Source folder -> its package under fedjax_dd (package-dir in pyproject).
SOURCES = {"fedjax_dd": None, "kernels": "kernels", "models": "models",
           "experiments": "experiments"}
_FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _top(module: str) -> str | None:
  """The ``fedjax_dd.<top>`` of an absolute import, else None."""
  parts = module.split(".")
  return parts[1] if parts[0] == "fedjax_dd" and len(parts) > 1 else None


def _imports(path: pathlib.Path):
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == "fedjax_dd":
        yield from (a.name for a in node.names)
      elif _top(node.module):
        yield _top(node.module)
    elif isinstance(node, ast.Import):
      yield from filter(None, (_top(a.name) for a in node.names))


def _upward():
  root = pathlib.Path(REPO_ROOT)
  for folder, package in SOURCES.items():
    for path in sorted((root / folder).rglob("*.py")):
      rel = path.relative_to(root / folder)
      own = package or (rel.parts[0].removesuffix(".py"))
      if own == "__init__" or own not in _FLOOR:
        continue
      for target in _imports(path):
        if target in _FLOOR and _FLOOR[target] > _FLOOR[own]:
          yield f"{folder}/{rel} ({own}) imports {target}"


def test_nothing_imports_upward():
  assert list(_upward()) == []


def test_the_check_sees_an_upward_import(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  from fedjax_dd.utils import figures\n")
  assert list(_imports(bad)) == ["utils"]
  assert _FLOOR["utils"] > _FLOOR["algorithms"]
