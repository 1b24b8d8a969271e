"""pyproject.toml lists every package, so a non-editable install holds them,
and no lab folder, so a wheel holds no benchmark or reference adapter.

An editable install finds any package in the tree; a wheel only the listed
ones. ``fedjax_dd.cluster`` was once missing: ``pip install .`` then failed
on the first DisUE import (seen on a GPU machine). The lab's folders below
stay in the checkout: the benchmarks (``experiments/bench/``, imported from
an editable install as ``fedjax_dd.experiments.bench.bench_engine`` and so
on), the reference adapters and the measured reports.
"""

import fnmatch
import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Folders of the lab, kept out of the wheel: no package may be one of them.
LAB_DIRS = ("experiments/bench", "experiments/reference", "experiments/results")
# Module names of the lab: a benchmark, a reference adapter or comparison.
LAB_MODULES = ("bench_*.py", "*_adapter.py", "compare_*.py")


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
      subdirs[:] = [d for d in subdirs if not d.startswith((".", "__"))
                    and not _is_lab_dir(os.path.join(here, d))]
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


def _is_lab_dir(path):
  return any(os.path.samefile(path, os.path.join(ROOT, d))
             for d in LAB_DIRS if os.path.isdir(os.path.join(ROOT, d)))


def package_dirs(setup):
  """Each listed package -> its folder (relative to the root), resolved as
  setuptools does: the longest ``package-dir`` prefix, then the rest of the
  dotted name as sub-folders."""
  mapping = setup.get("package-dir", {})
  out = {}
  for name in setup["packages"]:
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
      prefix = ".".join(parts[:i])
      if prefix in mapping:
        out[name] = os.path.normpath(
            os.path.join(mapping[prefix], *parts[i:]))
        break
    else:
      out[name] = os.path.join(*parts)
  return out


def lab_modules_installed(setup, listdir=os.listdir):
  """``package: module`` of each lab module a wheel would hold: setuptools
  installs a listed package's direct ``*.py`` files only."""
  found = []
  for name, path in sorted(package_dirs(setup).items()):
    for f in sorted(listdir(os.path.join(ROOT, path))):
      if any(fnmatch.fnmatch(f, p) for p in LAB_MODULES):
        found.append(f"{name}: {path}/{f}")
  return found


def test_no_package_is_a_lab_folder():
  dirs = set(package_dirs(_pyproject()["tool"]["setuptools"]).values())
  assert dirs & {os.path.normpath(d) for d in LAB_DIRS} == set()


def test_the_wheel_holds_no_benchmark_or_reference_adapter():
  assert lab_modules_installed(_pyproject()["tool"]["setuptools"]) == []


def test_the_check_sees_a_benchmark_in_a_listed_package():
  # The layout before the benchmarks moved: fedjax_dd.experiments, i.e.
  # experiments/, held bench_engine.py and its siblings.
  setup = {"package-dir": {"fedjax_dd": "fedjax_dd",
                           "fedjax_dd.experiments": "experiments"},
           "packages": ["fedjax_dd", "fedjax_dd.core", "fedjax_dd.experiments",
                        "fedjax_dd.experiments.bench"]}
  assert package_dirs(setup) == {
      "fedjax_dd": "fedjax_dd", "fedjax_dd.core": os.path.join("fedjax_dd",
                                                               "core"),
      "fedjax_dd.experiments": "experiments",
      "fedjax_dd.experiments.bench": os.path.join("experiments", "bench")}
  old = {"experiments": ["main.py", "bench_engine.py", "common.py"]}
  found = lab_modules_installed(
      setup, listdir=lambda p: old.get(os.path.relpath(p, ROOT), []))
  assert found == ["fedjax_dd.experiments: experiments/bench_engine.py"]
