"""Every algorithm factory hands its LocalTraining on whole.

The clients' local-training settings (task, optimizer, batch size, step
bound, mapper, augmentation, rate decay, ...) are one value,
:class:`fedjax_dd.core.local.LocalTraining`. These checks read the sources
of ``fedjax_dd/algorithms/*.py``: no call of ``make_local_update`` spells a
setting out again, and no public function takes the settings one by one.
HFLDD's label-knowledge chain (``distill/soft_labels.py``'s
``collect_label_knowledge`` and ``pretrain_clients``, called by
``algorithms/hfldd_stages.py``) takes its pretraining whole too: there no
public function takes an optimizer or a batch size and none builds a
LocalTraining (a variant is ``dataclasses.replace`` of the one given).
"""

import ast
import dataclasses
import os

import fedjax_dd.algorithms
import fedjax_dd.distill
from fedjax_dd.core.local import LocalTraining

ALGORITHMS = os.path.dirname(fedjax_dd.algorithms.__file__)
# The label-knowledge chain: its only training is the clients' pretraining.
CHAIN = (os.path.join(os.path.dirname(fedjax_dd.distill.__file__),
                      "soft_labels.py"),
         os.path.join(ALGORITHMS, "hfldd_stages.py"))
SETTINGS = frozenset(f.name for f in dataclasses.fields(LocalTraining))
# Parameters that only a factory forwarding the clients' settings one by
# one has (the step bound and the augmentation live in LocalTraining; a
# server's own optimizer or batch, e.g. FedDF's distillation, is no client
# setting).
FORWARDED = frozenset({"max_steps", "client_optimizer", "augment"})
# In the label-knowledge chain an optimizer or a batch size can only be the
# pretraining's.
CHAIN_FORWARDED = FORWARDED | {"optimizer", "batch_size"}


def forwarding(source: str, *, chain: bool = False) -> list[str]:
  """Each place in ``source`` that forwards local-training settings
  (``chain``: the label-knowledge chain's stricter rules)."""
  forwarded = CHAIN_FORWARDED if chain else FORWARDED
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Call):
      f = node.func
      name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
      if chain and name == "LocalTraining":
        found.append(f"line {node.lineno}: builds a LocalTraining")
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
      if params & forwarded:
        found.append(f"line {node.lineno}: {node.name} takes "
                     f"{sorted(params & forwarded)}")
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


def test_the_check_finds_the_chain_forwarding_pretraining():
  old = '''
def pretrain_clients(task, params, data, num_steps, key, *, optimizer,
                     batch_size, mapper=ClientMapper()):
  local = make_local_update(LocalTraining(
      task, optimizer, batch_size=batch_size, max_steps=max_steps))

def label_knowledge_clusters(task, params, data, key, *, optimizer,
                             batch_size, num_homogeneous, mapper):
  return pretrain_clients(task, params, data, steps, key,
                          optimizer=optimizer, batch_size=batch_size)
'''
  found = forwarding(old, chain=True)
  assert len(found) == 3, found
  assert any("pretrain_clients takes ['batch_size', 'optimizer']" in f
             for f in found), found
  assert any("label_knowledge_clusters takes" in f for f in found), found
  assert any("builds a LocalTraining" in f for f in found), found
  # The algorithms' rule alone lets a server's optimizer and batch pass.
  assert forwarding(old) == []
  new = '''
def pretrain_clients(training, params, data, num_steps, key):
  training = dataclasses.replace(training, max_steps=max_steps)
  local = make_local_update(training)

def make_soft_labeler(task, *, mapper=ClientMapper(), aux_batch_size=100):
  pass
'''
  assert forwarding(new, chain=True) == []


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


def test_the_label_knowledge_chain_takes_its_pretraining_whole():
  problems = {}
  for path in CHAIN:
    with open(path, encoding="utf-8") as f:
      source = f.read()
    # The chain's functions are still where the check looks.
    assert ("def collect_label_knowledge(" in source
            or "def label_knowledge_clusters(" in source), path
    found = forwarding(source, chain=True)
    if found:
      problems[os.path.basename(path)] = found
  assert not problems, problems
