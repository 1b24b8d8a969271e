"""Every algorithm factory hands its LocalTraining on whole.

The clients' local-training settings (task, optimizer, batch size, step
bound, mapper, augmentation, rate decay, ...) are one value,
:class:`fedjax_dd.core.local.LocalTraining`. These checks read the sources
of ``fedjax_dd/algorithms/*.py``: no call of ``make_local_update`` spells a
setting out again, and no public function takes the settings one by one.
"""

import ast
import dataclasses
import os

import fedjax_dd.algorithms
from fedjax_dd.core.local import LocalTraining

ALGORITHMS = os.path.dirname(fedjax_dd.algorithms.__file__)
SETTINGS = frozenset(f.name for f in dataclasses.fields(LocalTraining))
# Parameters that only a factory forwarding the clients' settings one by
# one has (the step bound and the augmentation live in LocalTraining; a
# server's own optimizer or batch, e.g. FedDF's distillation, is no client
# setting).
FORWARDED = frozenset({"max_steps", "client_optimizer", "augment"})


def forwarding(source: str) -> list[str]:
  """Each place in ``source`` that forwards local-training settings."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Call):
      f = node.func
      name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
      if name != "make_local_update":
        continue
      spelled = sorted(k.arg for k in node.keywords if k.arg in SETTINGS)
      if len(node.args) != 1 or spelled or any(k.arg is None
                                                for k in node.keywords):
        found.append(f"line {node.lineno}: make_local_update("
                     f"{len(node.args)} positional, {spelled})")
    elif (isinstance(node, ast.FunctionDef)
          and not node.name.startswith("_")):
      params = {a.arg for a in node.args.args + node.args.kwonlyargs}
      if params & FORWARDED:
        found.append(f"line {node.lineno}: {node.name} takes "
                     f"{sorted(params & FORWARDED)}")
  return found


def test_the_check_finds_forwarded_settings():
  old = '''
def fedavg(task, client_optimizer, *, batch_size, max_steps, augment=None):
  local = make_local_update(task, client_optimizer, batch_size=batch_size,
                            max_steps=max_steps, augment=augment)
'''
  found = forwarding(old)
  assert len(found) == 2, found
  assert "augment" in found[0] and "max_steps" in found[0]
  assert "batch_size" in found[1] and "max_steps" in found[1]
  assert forwarding("local = make_local_update(training, **kw)")
  new = '''
def fedavg(training, *, regularizer=None):
  local = make_local_update(training, regularizer=regularizer)
'''
  assert forwarding(new) == []


def test_no_algorithm_forwards_local_training_settings():
  names = sorted(n for n in os.listdir(ALGORITHMS) if n.endswith(".py"))
  assert "fedavg.py" in names and "clustered.py" in names
  calls = 0
  problems = {}
  for name in names:
    with open(os.path.join(ALGORITHMS, name), encoding="utf-8") as f:
      source = f.read()
    calls += source.count("make_local_update(")
    found = forwarding(source)
    if found:
      problems[name] = found
  assert calls >= 10  # the factories do build their local updates here
  assert not problems, problems
