"""One declaration per method: a toy method of each shape (a rounds method,
a server method after the one-shot client stage, a host pipeline) reaches
the command line and Python through its module and its config file alone,
is validated before compute, and is refused on resume with other
settings."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fedjax_dd.experiments import axis_sweep
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedftg
from tests.conftest import REPO_ROOT

def _hparams(name, fields, checked, condition, want):
  """A toy's hyperparameter dataclass, as source: ``fields`` with their
  defaults, ``checked`` refused unless ``condition``."""
  return (f"@dataclasses.dataclass(frozen=True)\nclass {name}:\n  {fields}\n\n"
          f"  def __post_init__(self):\n    if not {condition}:\n"
          f"      raise ValueError(f\"{checked} must be {want}, got "
          f"{{self.{checked}}}.\")\n")


# FedAvg with server momentum: its module (the algorithm and its
# declaration) and its config file are all it takes.
FEDAVGM = '''
import dataclasses

import optax

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.experiments import registry


{hparams}

registry.declare(registry.Method(
    "fedavgm", hparams=FedAvgM,
    rounds=lambda config, training, hparams: fedavg(
        training, server_optimizer=optax.sgd(hparams.server_lr,
                                             momentum=hparams.momentum))))
'''

FEDAVGM = FEDAVGM.replace("{hparams}", _hparams(
    "FedAvgM", "server_lr: float = 1.0\n  momentum: float = 0.9", "momentum",
    "0.0 <= self.momentum < 1.0", "in [0, 1)"))

FEDAVGM_CONFIG = '''
"""FedAvg with server momentum (a toy): fedjax-dd --config=fedavgm.py:smoke"""
import fedavgm_algo  # declares the method
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedavg


def get_config(arg="smoke"):
  return registry.add_group(fedavg.get_config(arg), "fedavgm")
'''

# A server method after the shared one-shot client stage: a mix of the
# clients' average and the start, weight ``mix`` (1: one-shot FedAvg).
MIX = '''
import dataclasses

import jax

from fedjax_dd.algorithms import one_shot
from fedjax_dd.core.algorithm import ServerDistillation, no_setup
from fedjax_dd.experiments import registry


{hparams}

def build(config, stage, groups, task, input_fn, hparams):
  del config, groups, task, input_fn

  def init(key, setup, teachers, params, batch_stats):
    del key, setup, batch_stats
    avg, stats = one_shot.average(teachers)
    mixed = jax.tree.map(lambda a, b: hparams.mix * a + (1 - hparams.mix) * b,
                         avg, params)
    return {"params": mixed, "batch_stats": stats}

  return ServerDistillation(
      client_stage=stage, setup=no_setup, init=init,
      epoch=lambda state, teachers: (state, {}),
      model=lambda state: (state["params"], state["batch_stats"]))


registry.declare(registry.Method("toy_mix", server=build, hparams=Mix))
'''

MIX = MIX.replace("{hparams}", _hparams(
    "Mix", "mix: float = 1.0", "mix", "0.0 <= self.mix <= 1.0", "in [0, 1]"))

MIX_CONFIG = '''
import toy_mix_algo
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedhydra


def get_config(arg="smoke"):
  return registry.add_group(fedhydra.get_config(arg), "toy_mix")
'''

# A host pipeline with its own driver: the majority class of the clients'
# pooled labels (plus ``smoothing`` per class), scored on the test split.
PRIOR = '''
import dataclasses

import numpy as np

from fedjax_dd.core.workdir import Workdir
from fedjax_dd.data import partition
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry


{hparams}

def run(config, workdir):
  hparams = registry.hparams(config)
  prepared = common.load_and_prepare(config)
  ds = prepared.dataset
  parts = common.partition(config, ds.y_train)
  counts = partition.class_counts(ds.y_train, parts, prepared.task.num_classes)
  guess = int(np.argmax(np.sum(counts, axis=0) + hparams.smoothing))
  summary = {"method": config.method, "dataset": config.data.dataset,
             "final_test_accuracy": float(np.mean(ds.y_test == guess)),
             "guess": guess, "config": config.to_dict()}
  Workdir(workdir).write_summary(summary)
  return summary


registry.declare(registry.Method("toy_prior", pipeline=run, hparams=Prior))
'''

PRIOR = PRIOR.replace("{hparams}", _hparams(
    "Prior", "smoothing: float = 0.0", "smoothing", "self.smoothing >= 0.0",
    ">= 0"))

PRIOR_CONFIG = '''
import toy_prior_algo
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedavg


def get_config(arg="smoke"):
  config = fedavg.get_config(arg)
  config.runner = "toy_prior"
  return registry.add_group(config, "toy_prior")
'''

TOYS = {"fedavgm": (FEDAVGM, FEDAVGM_CONFIG),
        "toy_mix": (MIX, MIX_CONFIG),
        "toy_prior": (PRIOR, PRIOR_CONFIG)}


@pytest.fixture
def toys(tmp_path, monkeypatch):
  """The toy modules and configs in ``tmp_path``, importable here, with the
  declarations they make undone after the test."""
  for name, (module, config) in TOYS.items():
    (tmp_path / f"{name}_algo.py").write_text(textwrap.dedent(module))
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(config))
    for mod in (name, f"{name}_algo"):
      monkeypatch.delitem(sys.modules, mod, raising=False)
  monkeypatch.syspath_prepend(str(tmp_path))
  registry.methods()  # the built-in declarations, before the copy
  # pylint: disable=protected-access
  monkeypatch.setattr(registry, "_DECLARED", dict(registry._DECLARED))
  monkeypatch.setattr(registry, "_OWNERS", dict(registry._OWNERS))
  yield tmp_path
  for name in TOYS:
    for mod in (name, f"{name}_algo"):
      sys.modules.pop(mod, None)


def _cli(toys, name, workdir, *flags):
  env = {**os.environ, "PYTHONPATH": str(toys)}
  return subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       f"--config={toys / (name + '.py')}:smoke", f"--workdir={workdir}",
       "--config.run.progress=False", *flags],
      cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)


def _cli_run(toys, name, workdir):
  """The toy's ``:smoke`` run from the command line: its summary."""
  proc = _cli(toys, name, workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return _summary(workdir)


def _refused_on_resume(toys, name, workdir, key, value):
  """The toy resumed on ``workdir`` with ``--config.KEY=VALUE``: refused
  before anything runs, naming the key."""
  again = _cli(toys, name, workdir, f"--config.{key}={value}")
  assert again.returncode != 0 and key in again.stderr


def _config(name):
  return __import__(name).get_config("smoke")


def _summary(workdir):
  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    return json.load(f)


def test_a_method_declares_its_group_and_runner(toys):
  del toys
  c = _config("fedavgm")
  assert c.method == "fedavgm" and c.runner == "federated"
  assert c.fedavgm.to_dict() == {"server_lr": 1.0, "momentum": 0.9}
  assert "fedavgm" in registry.methods("federated")
  assert _config("toy_mix").toy_mix.mix == 1.0
  assert _config("toy_prior").runner == "toy_prior"
  assert registry.get("toy_mix").runners == ("fedhydra",)
  assert registry.get("toy_prior").runners == ("toy_prior",)
  assert registry.get("os_fedavg").runners == ("federated", "fedhydra")
  registry.check_method(c)


def test_the_rounds_toy_runs_from_the_command_line_and_python(toys):
  workdir = toys / "cli"
  cli = _cli_run(toys, "fedavgm", workdir)
  rows = [json.loads(line) for line in
          (workdir / "metrics.jsonl").read_text().splitlines()]
  assert cli["method"] == "fedavgm" and [r["round"] for r in rows] == [1, 2]
  py = registry.run_recorded(_config("fedavgm"), str(toys / "py"))
  assert py["final_test_accuracy"] == cli["final_test_accuracy"]
  # Server momentum changes the run: with momentum 0 and server lr 1 the
  # toy is FedAvg.
  c = _config("fedavgm")
  c.fedavgm.momentum = 0.0
  plain = registry.run(c, str(toys / "plain"))
  c.method = "fedavg"
  del c["fedavgm"]
  fedavg = registry.run(c, str(toys / "fedavg"))
  assert plain["final_test_accuracy"] == fedavg["final_test_accuracy"]
  # Resumed with another momentum: refused before a round runs.
  _refused_on_resume(toys, "fedavgm", workdir, "fedavgm.momentum", 0.5)


@pytest.mark.parametrize("name, flag, message", [
    ("fedavgm", "--config.fedavgm.momentum=1.5", "config.fedavgm.momentum "
     "must be in [0, 1), got 1.5; set --config.fedavgm.momentum."),
    ("toy_mix", "--config.toy_mix.mix=-1", "config.toy_mix.mix must be in "
     "[0, 1], got -1"),
    ("toy_prior", "--config.toy_prior.smoothing=-1", "config.toy_prior."
     "smoothing must be >= 0"),
])
def test_each_toy_is_validated_before_compute(toys, name, flag, message):
  proc = _cli(toys, name, toys / f"bad_{name}", flag)
  assert proc.returncode != 0
  assert message in proc.stderr
  assert not (toys / f"bad_{name}" / "config.json").exists()


def test_a_group_key_that_is_not_a_field_is_refused(toys):
  del toys
  c = _config("fedavgm")
  with c.fedavgm.unlocked():
    c.fedavgm.nesterov = True
  with pytest.raises(ValueError, match=r"config.fedavgm holds \['nesterov'\]"):
    registry.check_method(c)


def test_the_server_toy_runs_from_the_command_line_and_python(toys):
  workdir = toys / "mix"
  cli = _cli_run(toys, "toy_mix", workdir)
  # mix = 1 is one-shot FedAvg of the same clients, which the runner reports.
  assert cli["final_test_accuracy"] == cli["os_fedavg_test_accuracy"]
  c = _config("toy_mix")
  c.toy_mix.mix = 0.0  # the start itself
  py = registry.run_recorded(c, str(toys / "mix_py"))
  assert py["final_test_accuracy"] != cli["final_test_accuracy"]
  _refused_on_resume(toys, "toy_mix", workdir, "toy_mix.mix", 0.5)


def test_the_pipeline_toy_runs_from_the_command_line_and_python(toys):
  workdir = toys / "prior"
  cli = _cli_run(toys, "toy_prior", workdir)
  c = _config("toy_prior")
  py = registry.run(c, str(toys / "prior_py"))
  assert py["final_test_accuracy"] == cli["final_test_accuracy"]
  # By hand: the majority class of the clients' labels, on the test split.
  from fedjax_dd.experiments import common  # pylint: disable=g-import-not-at-top
  ds = common.load_and_prepare(c).dataset
  used = np.concatenate(common.partition(c, ds.y_train))
  guess = int(np.argmax(np.bincount(ds.y_train[used], minlength=10)))
  assert py["guess"] == guess
  assert py["final_test_accuracy"] == pytest.approx(
      float(np.mean(ds.y_test == guess)))
  _refused_on_resume(toys, "toy_prior", workdir, "toy_prior.smoothing", 2.0)


def test_a_built_in_method_cannot_be_replaced(toys):
  del toys
  with pytest.raises(ValueError, match="'fedavg' is declared by "
                     "fedjax_dd.experiments.runners"):
    registry.declare(registry.Method(
        "fedavg", rounds=lambda config, training: None))


@pytest.mark.parametrize("kwargs, message", [
    ({}, "needs a rounds, server or pipeline builder"),
    ({"pipeline": print, "rounds": print}, "a pipeline has no rounds"),
    ({"rounds": print, "needs": ("public",)}, r"needs \['public'\]"),
    ({"rounds": print, "hparams": dict}, "hparams must be a dataclass"),
    ({"rounds": print, "group": "g"}, "group 'g' without an hparams"),
])
def test_a_malformed_declaration_is_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    registry.Method("x", **kwargs)


def test_every_built_in_method_is_declared_once_for_its_runner():
  assert set(registry.methods("federated")) >= {
      "fedavg", "fedprox", "scaffold", "feddyn", "moon", "fednova", "ifca",
      "cfl", "cfl_gp", "pacfl", "disue", "fedftg", "dynafed", "dp_fedavg",
      "centralized", "os_fedavg", "feddf_datafree"}
  assert registry.methods("fedhydra") == (
      "coboosting", "dense", "feddf", "fedhydra", "os_fedavg", "ot_fusion")
  assert registry.methods("fedd3") == ("fedd3", "fedd3_hybrid")
  assert registry.methods("hfldd") == ("hfldd", "hfldd_random", "hfldd_wodd")
  assert registry.get("pacfl").needs == ("client_data",)
  assert registry.get("dp_fedavg").summary_fields is not None
  assert registry.get("fedhydra").server_epochs
  assert not registry.get("ot_fusion").server_epochs


def _experiments_imports() -> dict[str, set[str]]:
  """Each ``experiments/*.py`` module -> the experiments modules it imports
  when it is imported (module-level statements; an import inside a
  function runs on the call, after every module has loaded)."""
  import ast  # pylint: disable=g-import-not-at-top
  directory = os.path.join(REPO_ROOT, "experiments")
  names = {f[:-3] for f in os.listdir(directory) if f.endswith(".py")}
  graph = {}
  for name in names:
    with open(os.path.join(directory, f"{name}.py"), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    edges = set()
    nodes = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in nodes:
      if isinstance(node, ast.ImportFrom) and node.module:
        if node.module == "fedjax_dd.experiments":
          edges |= {a.name for a in node.names}
        elif node.module.startswith("fedjax_dd.experiments."):
          edges.add(node.module.split(".")[2])
      elif isinstance(node, ast.Import):
        edges |= {a.name.split(".")[2] for a in node.names
                  if a.name.startswith("fedjax_dd.experiments.")}
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
  # The declaration module sits below every module that declares methods.
  assert "registry" in graph["runners"] and not graph["registry"]


def test_a_method_check_runs_before_the_data_loads():
  c = fedftg.get_config("smoke")
  registry.check_method(c)
  c.iga.enabled = False
  with pytest.raises(ValueError, match="fedftg is FedAvg plus IGA: "
                     "iga.enabled must stay True"):
    registry.check_method(c)
  with pytest.raises(ValueError, match="iga.enabled must stay True"):
    registry.run(c, "/nonexistent/never/written")
  # Every path to the builder refuses it: a sweep from Python, a rebuild.
  with pytest.raises(ValueError, match="iga.enabled must stay True"):
    axis_sweep.check(c)
  with pytest.raises(ValueError, match="iga.enabled must stay True"):
    registry.build_rounds(c, training=None)


def test_a_group_leaves_out_derived_fields_and_takes_its_own_defaults():
  import dataclasses  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(frozen=True)
  class Opt:
    batch_size: int = 128
    steps: int = 0
    lr: float = 0.1

  group = registry.hparams_group(Opt, exclude=("batch_size",), steps=40)
  assert group.to_dict() == {"steps": 40, "lr": 0.1}
  with pytest.raises(ValueError, match=r"no fields \['size'\]"):
    registry.hparams_group(Opt, exclude=("size",))
  with pytest.raises(ValueError, match=r"no fields \['step'\]"):
    registry.hparams_group(Opt, step=3)


def test_an_optional_field_is_a_typed_placeholder_the_cli_can_set(tmp_path):
  import dataclasses  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(frozen=True)
  class Opt:
    scale: float | None = None
    steps: int = 3

  group = registry.hparams_group(Opt)
  assert group.scale is None and group.steps == 3
  group.scale = 0.5  # typed float: a number is taken ...
  with pytest.raises(TypeError):
    group.scale = "big"  # ... a string is not
  with pytest.raises(ValueError, match="needs a type"):
    registry.hparams_group(dataclasses.make_dataclass(
        "Bad", [("x", "list | None", dataclasses.field(default=None))]))
  # DisUE's preference, None by default, set from the command line.
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       "--config=experiments/configs/disue.py:smoke",
       f"--workdir={tmp_path / 'w'}", "--config.disue.preference=-5",
       "--config.disue.damping=1.0"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode != 0  # the damping, refused after the parse
  assert "config.disue.damping must be a finite number >= 0.5" in proc.stderr
