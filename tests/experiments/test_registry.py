"""A new method on the command line: its algorithm module and its config
file, which registers the method (runners.register); nothing else changes."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fedjax_dd.experiments import runners
from tests.conftest import REPO_ROOT

# FedAvg whose server takes half of the averaged update.
ALGORITHM = '''
import optax
from fedjax_dd.algorithms.fedavg import fedavg


def half_step(training):
  return fedavg(training, server_optimizer=optax.sgd(0.5))
'''

CONFIG = '''
import half_step_algo
from fedjax_dd.experiments import runners
from fedjax_dd.experiments.configs import fedavg

runners.register("half_step", lambda config, training: (
    half_step_algo.half_step(training)))


def get_config(arg="smoke"):
  config = fedavg.get_config(arg)
  config.method = "half_step"
  return config
'''


def test_a_toy_method_runs_from_the_command_line(tmp_path):
  (tmp_path / "half_step_algo.py").write_text(textwrap.dedent(ALGORITHM))
  (tmp_path / "half_step.py").write_text(textwrap.dedent(CONFIG))
  workdir = tmp_path / "run"
  env = {**os.environ, "PYTHONPATH": str(tmp_path)}
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       f"--config={tmp_path / 'half_step.py'}:smoke", f"--workdir={workdir}",
       "--config.run.progress=False"],
      cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  rows = [json.loads(line) for line in
          (workdir / "metrics.jsonl").read_text().splitlines()]
  assert summary["method"] == "half_step"
  assert [r["round"] for r in rows] == [1, 2]
  assert 0.0 <= summary["final_test_accuracy"] <= 1.0


def test_a_built_in_method_cannot_be_replaced():
  with pytest.raises(ValueError, match="'fedavg' is built in"):
    runners.register("fedavg", lambda config, training: None)


def _experiments_imports() -> dict[str, set[str]]:
  """Each ``experiments/*.py`` module -> the experiments modules it imports,
  at any depth, the runner table's imports on first use included."""
  import ast  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  directory = os.path.join(REPO_ROOT, "experiments")
  names = {f[:-3] for f in os.listdir(directory) if f.endswith(".py")}
  graph = {}
  for name in names:
    with open(os.path.join(directory, f"{name}.py"), encoding="utf-8") as f:
      source = f.read()
    edges = set()
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.ImportFrom) and node.module:
        if node.module == "fedjax_dd.experiments":
          edges |= {a.name for a in node.names}
        elif node.module.startswith("fedjax_dd.experiments."):
          edges.add(node.module.split(".")[2])
      elif isinstance(node, ast.Import):
        edges |= {a.name.split(".")[2] for a in node.names
                  if a.name.startswith("fedjax_dd.experiments.")}
    # importlib.import_module("fedjax_dd.experiments.X") and _lazy("X").
    edges |= set(re.findall(
        r'import_module\(\s*"fedjax_dd\.experiments\.(\w+)"', source))
    edges |= set(re.findall(r'_lazy\("(\w+)"\)', source))
    graph[name] = (edges & names) - {name}
  return graph


def test_the_experiments_modules_import_without_a_cycle():
  graph = _experiments_imports()
  done, path = set(), []

  def visit(name):
    if name in path:
      raise AssertionError(f"import cycle: {' -> '.join(path + [name])}")
    if name in done:
      return
    path.append(name)
    for other in sorted(graph[name]):
      visit(other)
    path.pop()
    done.add(name)

  for name in sorted(graph):
    visit(name)
  assert "run_fedd3" in graph["registry"]  # The table's lazy imports count.
