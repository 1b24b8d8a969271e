"""pyproject.toml lists every package, so a non-editable install holds them.

An editable install finds any package in the tree; a wheel only the listed
ones. ``fedjax_dd.cluster`` was once missing: ``pip install .`` then failed
on the first DisUE import (seen on a GPU machine).
"""

import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def test_every_package_in_the_tree_is_listed():
  setup = _pyproject()["tool"]["setuptools"]
  dirs = {name: path for name, path in setup["package-dir"].items()}
  listed = set(setup["packages"])
  found = set()
  for name, path in dirs.items():
    base = os.path.join(ROOT, path)
    for here, subdirs, files in os.walk(base):
      subdirs[:] = [d for d in subdirs if not d.startswith((".", "__"))]
      if "__init__.py" not in files:
        continue
      rel = os.path.relpath(here, base)
      pkg = name if rel == "." else name + "." + rel.replace(os.sep, ".")
      # A sub-folder mapped to a package of its own is found under that name.
      if not any(pkg != n and here == os.path.join(ROOT, p)
                 for n, p in dirs.items()):
        found.add(pkg)
  assert found - listed == set(), "missing from [tool.setuptools] packages"
  assert listed - found == set(), "listed but not in the tree"
