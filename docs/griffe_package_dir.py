"""Griffe extension: load pyproject's ``package-dir`` subpackages.

``pyproject.toml`` maps ``kernels/``, ``models/`` and ``experiments/`` into
the ``fedjax_dd`` namespace (``[tool.setuptools] package-dir``). Griffe
reads source folders, so it finds ``fedjax_dd/`` but not those three; this
extension loads each mapped folder as a member of the ``fedjax_dd`` package
once griffe has loaded it, so ``::: fedjax_dd.kernels`` resolves.
"""

import pathlib
import tomllib

import griffe

_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _package_dirs() -> dict[str, pathlib.Path]:
  """Top-level mapped subpackages of fedjax_dd: name -> folder."""
  with open(_ROOT / "pyproject.toml", "rb") as f:
    mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
  dirs = {}
  for package, folder in mapping.items():
    parts = package.split(".")
    if len(parts) == 2 and parts[0] == "fedjax_dd":
      dirs[parts[1]] = _ROOT / folder
  return dirs


class PackageDir(griffe.Extension):
  """Adds the mapped folders as submodules of ``fedjax_dd``."""

  def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                 **kwargs) -> None:
    del kwargs
    if pkg.name != "fedjax_dd":
      return
    for name, folder in _package_dirs().items():
      if name in pkg.members or not (folder / "__init__.py").exists():
        continue
      # A private loader method: griffe has no public call that loads a
      # folder under another package's name.
      module = loader._load_module(  # pylint: disable=protected-access
          name, folder / "__init__.py", parent=pkg)
      pkg.set_member(name, module)
