"""Declared dependencies match the imports of the installed package
(issue 82): every top-level name a module of the package imports is the
standard library, the package itself, or a distribution pyproject.toml
declares: in the core list for an import at module level, in the core list
or an extra for one guarded inside a function or a ``try``."""

import ast
import functools
import importlib.metadata
import pathlib
import re
import sys
import tomllib

from tests.conftest import REPO_ROOT

ROOT = pathlib.Path(REPO_ROOT)

# Import names whose distribution is named otherwise, for distributions not
# installed here (the `bench`, `nt` and `tfds` extras).
_ALIASES = {"sklearn": "scikit-learn", "ot": "pot", "torch": "torch",
            "neural_tangents": "neural-tangents", "absl": "absl-py",
            "tensorflow_datasets": "tensorflow-datasets",
            "ml_collections": "ml-collections", "orbax": "orbax-checkpoint",
            "tensorboardX": "tensorboardX", "yaml": "pyyaml"}


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(spec: str) -> str:
  return _norm(re.split(r"[\s<>=!~\[;]", spec.strip(), maxsplit=1)[0])


def _declared():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  core = {_requirement_name(s) for s in project["dependencies"]}
  extras = {_requirement_name(s)
            for specs in project["optional-dependencies"].values()
            for s in specs}
  return core, extras


def _package_files():
  dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())[
      "tool"]["setuptools"]["package-dir"]
  for d in sorted(set(dirs.values())):
    yield from sorted((ROOT / d).glob("*.py"))
    for sub in sorted((ROOT / d).iterdir()):
      if sub.is_dir() and (sub / "__init__.py").exists() and (
          sub.name not in dirs):
        yield from sorted(sub.rglob("*.py"))


def imports(source: str):
  """``(top-level name, guarded)`` of each absolute import of ``source``;
  guarded: inside a function, a class body's method or a ``try``."""
  out = []

  def visit(node, guarded):
    for child in ast.iter_child_nodes(node):
      inner = guarded or isinstance(child, (ast.FunctionDef,
                                            ast.AsyncFunctionDef, ast.Try))
      if isinstance(child, ast.Import):
        out.extend((a.name.split(".")[0], guarded) for a in child.names)
      elif isinstance(child, ast.ImportFrom) and child.level == 0:
        out.append((child.module.split(".")[0], guarded))
      visit(child, inner)

  visit(ast.parse(source), False)
  return out


@functools.cache
def _installed():
  return importlib.metadata.packages_distributions()


def distribution(module: str) -> str:
  found = _installed().get(module)
  return _norm(found[0] if found else _ALIASES.get(module, module))


def undeclared():
  core, extras = _declared()
  own = {"fedjax_dd", "tests"}
  problems = []
  for path in _package_files():
    for module, guarded in imports(path.read_text()):
      if module in sys.stdlib_module_names or module in own:
        continue
      dist = distribution(module)
      if dist in core or (guarded and dist in extras):
        continue
      where = "an extra" if guarded else "the core dependencies"
      problems.append(f"{path.relative_to(ROOT)} imports {module} "
                      f"({dist}), not in {where}")
  return sorted(set(problems))


def test_the_rule_reads_guarded_and_module_level_imports():
  got = imports("import numpy as np\nfrom scipy import optimize\n"
                "def f():\n  import torch\ntry:\n  import ot\n"
                "except ImportError:\n  pass\nfrom . import x\n")
  assert got == [("numpy", False), ("scipy", False), ("torch", True),
                 ("ot", True)]
  assert distribution("sklearn") == "scikit-learn"


def test_every_import_of_the_package_is_declared():
  assert undeclared() == []


def test_core_declares_nothing_only_tests_use():
  core, _ = _declared()
  used = set()
  for path in _package_files():
    used |= {distribution(m) for m, _ in imports(path.read_text())}
  # jaxlib is jax's backend, imported through jax.
  assert sorted(core - used - {"jaxlib"}) == [], "declared but unused"
