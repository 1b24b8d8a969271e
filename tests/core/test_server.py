"""The server-side driver: kill anywhere, resume bit-identically.

A run is "killed" by an epoch (or client stage) that raises part-way; the
same call with the intact algorithm then resumes from the checkpoints and must
reproduce an uninterrupted run bit for bit: the model, the server state, the
ledger and every metrics row.
"""

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd import models
from fedjax_dd.algorithms import fedd3
from fedjax_dd.algorithms import one_shot
from fedjax_dd.algorithms.dense import dense
from fedjax_dd.algorithms.feddf import feddf
from fedjax_dd.algorithms.fedhydra import fedhydra
from fedjax_dd.core import keys
from fedjax_dd.core import server as server_lib
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.core.metrics import MetricsWriter
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import dfkd
from fedjax_dd.distill import ensemble
from tests.conftest import synthetic_clients, tiny_task


class Killed(Exception):
  pass


def _identity(x):
  return x


def _problem():
  task = tiny_task(bn=True)
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  num_steps = steps_for(data.num_examples, 4, epochs=1)
  groups = (ensemble.TeacherGroup(task, _identity, (0, 1, 2, 3)),)
  stage = one_shot.client_stage(
      groups, LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=1),
      num_steps=num_steps)
  evaluate = make_evaluator(task, x.reshape(-1, 4, 4, 1), y.reshape(-1),
                            batch_size=16)
  return task, data, groups, stage, evaluate


def _hparams():
  return dfkd.DFKDHyperParams(batch_size=4, generator_steps=2,
                              student_steps=2, pool_size=3)


def _fedhydra(task, groups, stage):
  gen = models.Generator(out_shape=(4, 4, 1), nz=4, ngf=2)
  return fedhydra(stage, groups, gen, task, _identity, _hparams(),
                  stratify_steps=2, stratify_batch_size=4)


def _feddf(task, groups, stage, data):
  public = data.x.reshape(-1, 4, 4, 1)[:20]
  return feddf(stage, groups, task, _identity, public,
               optimizer=optax.adam(0.01), batch_size=4, steps_per_epoch=3)


def _killing(algorithm, *, epoch_calls=None, stage_calls=None):
  """``algorithm`` whose epoch / client stage raises at the given call."""
  counts = {"epoch": 0, "stage": 0}

  def epoch(state, teachers):
    counts["epoch"] += 1
    if counts["epoch"] == epoch_calls:
      raise Killed
    return algorithm.epoch(state, teachers)

  def stage(*args):
    counts["stage"] += 1
    if counts["stage"] == stage_calls:
      raise Killed
    return algorithm.client_stage(*args)

  return algorithm._replace(epoch=epoch, client_stage=stage)


def _run(algorithm, data, task, evaluate, directory, writer=None, **options):
  init_key, run_key = keys.init_and_run(keys.model_root(0))
  model = task.init(init_key)
  writer = writer or MetricsWriter(directory / "metrics.jsonl")
  result = server_lib.run_server_rounds(
      algorithm, data, run_key=run_key, initial_models=[model],
      global_model=model, group_sizes=[4],
      options=server_lib.ServerOptions(progress=False, **options),
      directory=str(directory), evaluate=evaluate, writer=writer)
  return result, writer.rows()


def _assert_same(a, b):
  (ra, rows_a), (rb, rows_b) = a, b
  for x, y in zip(jax.tree_util.tree_leaves((ra.params, ra.batch_stats,
                                             ra.state)),
                  jax.tree_util.tree_leaves((rb.params, rb.batch_stats,
                                             rb.state))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert ra.ledger.to_dict() == rb.ledger.to_dict()
  assert rows_a == rows_b
  assert ra.per_round == rb.per_round


class _KillPlan:
  """One process's kill point: the ``n``-th call of a stage raises
  :class:`Killed` (``epoch``: at the start of an epoch; ``epoch_done``:
  after the epoch computed, before its row; ``row``: right after its row was
  written, before its checkpoint)."""

  def __init__(self, point: str, n: int = 1):
    self.point, self.n, self.counts = point, n, {}

  def tick(self, point: str) -> None:
    self.counts[point] = self.counts.get(point, 0) + 1
    if point == self.point and self.counts[point] == self.n:
      raise Killed(f"{point} #{self.n}")

  def wrap(self, algorithm):
    def stage(*args):
      self.tick("client_stage")
      return algorithm.client_stage(*args)

    def setup(*args):
      self.tick("setup")
      return algorithm.setup(*args)

    def init(*args):
      self.tick("init")
      return algorithm.init(*args)

    def epoch(state, teachers):
      self.tick("epoch")
      out = algorithm.epoch(state, teachers)
      jax.block_until_ready(out)
      self.tick("epoch_done")
      return out

    return algorithm._replace(client_stage=stage, setup=setup, init=init,
                              epoch=epoch)


class _KillingWriter(MetricsWriter):

  def __init__(self, path, plan):
    super().__init__(path)
    self._plan = plan

  def write(self, row):
    super().write(row)
    self._plan.tick("row")


# Every stage boundary and points inside epochs, in the order one workdir
# meets them; each process is killed once and the next resumes. With 3
# epochs saved every 2: rows 1-2 are written before their first checkpoint
# (so killed runs leave rows the resume must drop), and epoch 3 follows one.
_GAUNTLET = (
    ("client_stage", 1),  # nothing saved yet
    ("setup", 1),         # the clients saved
    ("init", 1),          # the setup cached
    ("epoch", 1),         # epoch 1 started
    ("epoch_done", 1),    # epoch 1 computed, its row not written
    ("row", 1),           # row 1 written, no checkpoint
    ("row", 2),           # row 2 written, its checkpoint not
    ("epoch", 2),         # restored at 2; epoch 3 started
    ("epoch_done", 1),    # epoch 3 computed, its row not written
    ("row", 1),           # row 3 written, its checkpoint not
)


def _assert_fresh_avals(tree):
  """No leaf carries another device mesh in its aval (as a restore gives)."""
  for leaf in jax.tree_util.tree_leaves(tree):
    if isinstance(leaf, jax.Array):
      mesh = leaf.aval.sharding.mesh
      assert not mesh.axis_names, (leaf.shape, leaf.aval.sharding)


# FedHydra's stages are also resumed in test_two_round_fedhydra_resumes_bit_identically.
@pytest.mark.parametrize("method", [pytest.param("fedhydra", marks=pytest.mark.slow),
                                    "dense", "feddf"])
def test_killed_at_every_stage_boundary_resumes_bit_identically(tmp_path,
                                                                method):
  task, data, groups, stage, evaluate = _problem()
  algo = {
      "fedhydra": lambda: _fedhydra(task, groups, stage),
      "dense": lambda: dense(stage, groups, models.Generator(
          out_shape=(4, 4, 1), nz=4, ngf=2), task, _identity, _hparams()),
      "feddf": lambda: _feddf(task, groups, stage, data),
  }[method]()
  opts = dict(num_epochs=3, eval_every=2, checkpoint_every=2)
  full = _run(algo, data, task, evaluate, tmp_path / "full", **opts)
  assert [r["epoch"] for r in full[1]] == [1, 2, 3]
  # A fresh run hands the server what a restore would: the client mapper's
  # mesh is not left in the teachers' or the state's avals (it changed the
  # compiled server programs, so fresh and resumed runs rounded apart).
  _assert_fresh_avals((full[0].teachers, full[0].state, full[0].setup))
  part = tmp_path / "part"
  for point, n in _GAUNTLET:
    plan = _KillPlan(point, n)
    with pytest.raises(Killed):
      _run(plan.wrap(algo), data, task, evaluate, part,
           writer=_KillingWriter(part / "metrics.jsonl", plan), **opts)
  resumed = _run(algo, data, task, evaluate, part, **opts)
  _assert_same(full, resumed)
  assert [r["epoch"] for r in resumed[1]] == [1, 2, 3]
  assert np.all(np.isfinite([r["test_loss"] for r in resumed[1]
                             if "test_loss" in r]))


def test_fedhydra_killed_in_a_hasa_epoch_resumes_bit_identically(tmp_path,
                                                                 caplog):
  task, data, groups, stage, evaluate = _problem()
  algo = _fedhydra(task, groups, stage)
  opts = dict(num_epochs=4, eval_every=2, checkpoint_every=1)
  full = _run(algo, data, task, evaluate, tmp_path / "full", **opts)
  with pytest.raises(Killed):
    _run(_killing(algo, epoch_calls=3), data, task, evaluate,
         tmp_path / "part", **opts)
  # The setup (stratification) was cached: resuming does not redo it.
  calls = []
  cached = algo._replace(setup=lambda *a: calls.append(1) or algo.setup(*a))
  resumed = _run(cached, data, task, evaluate, tmp_path / "part", **opts)
  assert not calls
  _assert_same(full, resumed)
  assert resumed[0].setup["curves"].shape == (4, 3, 2)  # [m, c, T_G]
  report = algo.report(resumed[0].state, resumed[0].setup)
  assert report["U_r"].shape == (3, 4)
  assert report["samples"][0].shape == (4, 4, 4, 1)
  # A further epoch of the resumed run compiles nothing new.
  caplog.set_level(logging.WARNING)
  teachers = resumed[0].teachers
  with jax.log_compiles(True):
    algo.epoch(resumed[0].state, teachers)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]


@pytest.mark.parametrize("kill", [dict(epoch_calls=3), dict(stage_calls=2)])
def test_two_round_fedhydra_resumes_bit_identically(tmp_path, kill):
  task, data, groups, stage, evaluate = _problem()
  algo = _fedhydra(task, groups, stage)
  opts = dict(num_rounds=2, num_epochs=2, eval_every=1, checkpoint_every=1)
  full = _run(algo, data, task, evaluate, tmp_path / "full", **opts)
  assert full[0].rounds == 2 and len(full[0].per_round) == 2
  assert [r["step"] for r in full[1]] == [1, 2, 3, 4]
  # Round 2 downloads the distilled model to every client.
  by_kind = full[0].ledger.to_dict()
  assert full[0].ledger.cumulative()["bytes_downloaded"] > 0, by_kind
  with pytest.raises(Killed):
    _run(_killing(algo, **kill), data, task, evaluate, tmp_path / "part",
         **opts)
  resumed = _run(algo, data, task, evaluate, tmp_path / "part", **opts)
  _assert_same(full, resumed)
  # Re-running the finished run keeps every round's rows (restoring round 1
  # once dropped round 2's rows as if written after round 1's checkpoint).
  again = _run(algo, data, task, evaluate, tmp_path / "full", **opts)
  assert again[1] == full[1]


def test_teachers_from_and_refusals(tmp_path):
  task, data, groups, stage, evaluate = _problem()
  algo = dense(stage, groups, models.Generator(out_shape=(4, 4, 1), nz=4,
                                               ngf=2),
               task, _identity, _hparams())
  first, _ = _run(algo, data, task, evaluate, tmp_path / "a", num_epochs=1,
                  protocol="p1")
  # Reused clients are the same models; the stage does not run.
  reuse = algo._replace(client_stage=lambda *a: pytest.fail("retrained"))
  second, _ = _run(reuse, data, task, evaluate, tmp_path / "b", num_epochs=1,
                   protocol="p1", teachers_from=str(tmp_path / "a"))
  for x, y in zip(jax.tree_util.tree_leaves(first.teachers),
                  jax.tree_util.tree_leaves(second.teachers)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with pytest.raises(ValueError, match="another client protocol"):
    _run(reuse, data, task, evaluate, tmp_path / "c", num_epochs=1,
         protocol="p2", teachers_from=str(tmp_path / "a"))
  # A cached setup computed under other settings is refused.
  hydra = _fedhydra(task, groups, stage)
  _run(hydra, data, task, evaluate, tmp_path / "d", num_epochs=1,
       setup_fingerprint={"stratify_steps": 2})
  with pytest.raises(ValueError, match="stratify_steps"):
    _run(hydra, data, task, evaluate, tmp_path / "d", num_epochs=1,
         setup_fingerprint={"stratify_steps": 3})
  with pytest.raises(ValueError, match="homogeneous"):
    server_lib.run_server_rounds(
             hydra, data, run_key=jax.random.PRNGKey(0),
             initial_models=[task.init(jax.random.PRNGKey(0))] * 2,
             global_model=task.init(jax.random.PRNGKey(0)),
             group_sizes=[2, 2],
             options=server_lib.ServerOptions(num_rounds=2, progress=False),
             directory=str(tmp_path / "e"), evaluate=evaluate)


def test_os_fedavg_is_the_average_and_writes_one_row(tmp_path):
  task, data, groups, stage, evaluate = _problem()
  result, rows = _run(one_shot.os_fedavg(stage), data, task, evaluate,
                      tmp_path / "os", num_epochs=0)
  avg = one_shot.average(result.teachers)
  for a, b in zip(jax.tree_util.tree_leaves(avg),
                  jax.tree_util.tree_leaves((result.params,
                                             result.batch_stats))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert len(rows) == 1 and rows[0]["epoch"] == 0
  assert rows[0]["test_accuracy"] == result.per_round[0]["test_accuracy"]


def _spanned_stage(own: bool):
  """The tiny problem's clients with 3 local epochs: 6, 9, 9 and 6 steps."""
  task, data, groups, _, evaluate = _problem()
  num_steps = steps_for(data.num_examples, 4, epochs=3)
  stage = one_shot.client_stage(
      groups, LocalTraining(task, optax.sgd(0.1, momentum=0.9), batch_size=4,
                            max_steps=1),
      num_steps=num_steps,
      independent_init=jax.random.PRNGKey(3) if own else None)
  return task, data, stage, evaluate


def _same_models(a, b):
  for x, y in zip(jax.tree_util.tree_leaves((a.teachers, a.params,
                                             a.batch_stats)),
                  jax.tree_util.tree_leaves((b.teachers, b.params,
                                             b.batch_stats))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("own", [False, True])
def test_client_stage_in_spans_is_one_call_and_resumes_after_a_kill(
    tmp_path, own):
  """Spans of 2 steps (0-2, 2-4, 4-6, 6-8, 8-9) give the clients of one
  call; a run killed in its third span resumes from step 4 and runs only
  the three spans left; the spans' checkpoints are gone once the clients
  are saved."""
  task, data, stage, evaluate = _spanned_stage(own)
  assert stage.total_steps == 9
  full = _run(one_shot.os_fedavg(stage), data, task, evaluate,
              tmp_path / "full", num_epochs=0)
  spanned = _run(one_shot.os_fedavg(stage), data, task, evaluate,
                 tmp_path / "spans", num_epochs=0, client_span_steps=2)
  _same_models(full[0], spanned[0])
  assert spanned[1] == full[1]
  assert not (tmp_path / "spans" / "r1" / "client_spans").exists()

  calls, kill_at = [], [3]

  def advance(progress, data, key, first, stop):
    calls.append((first, stop))
    if len(calls) == kill_at[0]:
      raise Killed
    return stage.advance(progress, data, key, first, stop)

  killing = one_shot.os_fedavg(stage._replace(advance=advance))
  with pytest.raises(Killed):
    _run(killing, data, task, evaluate, tmp_path / "part", num_epochs=0,
         client_span_steps=2)
  assert (tmp_path / "part" / "r1" / "client_spans").is_dir()
  calls.clear()
  kill_at[0] = 0
  resumed = _run(killing, data, task, evaluate, tmp_path / "part",
                 num_epochs=0, client_span_steps=2)
  assert calls == [(4, 6), (6, 8), (8, 9)]
  _same_models(full[0], resumed[0])
  assert resumed[1] == full[1]


def test_client_stage_in_spans_stops_on_the_budget_and_resumes(tmp_path):
  """A budget that has run out stops the stage after its first span: no
  round is done, the summary can say how far the clients got, and the next
  call finishes them as one call would have."""
  task, data, stage, evaluate = _spanned_stage(own=False)
  full = _run(one_shot.os_fedavg(stage), data, task, evaluate,
              tmp_path / "full", num_epochs=0)
  algo = dense(stage, _problem()[2], models.Generator(
      out_shape=(4, 4, 1), nz=4, ngf=2), task, _identity, _hparams())
  opts = dict(num_epochs=1, client_span_steps=4)
  stopped = _run(algo, data, task, evaluate, tmp_path / "part",
                 max_seconds=1e-9, **opts)
  assert stopped[0].out_of_time and stopped[0].rounds == 0
  assert stopped[0].client_steps == (4, 9)
  assert stopped[0].teachers is None and stopped[1] == []
  resumed = _run(algo, data, task, evaluate, tmp_path / "part", **opts)
  assert resumed[0].client_steps is None and resumed[0].rounds == 1
  for x, y in zip(jax.tree_util.tree_leaves(full[0].teachers),
                  jax.tree_util.tree_leaves(resumed[0].teachers)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with pytest.raises(ValueError, match="client_span_steps"):
    server_lib.ServerOptions(client_span_steps=-1)


def _fedd3(task, images_per_class=2):
  return fedd3.fedd3(
      fedd3.random_distiller(num_classes=3, images_per_class=images_per_class),
      task, optax.sgd(0.1, momentum=0.9), num_classes=3,
      images_per_class=images_per_class, batch_size=4)


def test_fedd3_killed_mid_training_resumes_bit_identically(tmp_path, caplog):
  task, data, _, _, evaluate = _problem()
  algo = _fedd3(task)
  opts = dict(num_epochs=4, eval_every=1, checkpoint_every=1)
  full = _run(algo, data, task, evaluate, tmp_path / "full", **opts)
  with pytest.raises(Killed):
    _run(_killing(algo, epoch_calls=3), data, task, evaluate,
         tmp_path / "part", **opts)
  resumed = _run(algo, data, task, evaluate, tmp_path / "part", **opts)
  _assert_same(full, resumed)
  uploads = resumed[0].teachers
  # Every client holds all 3 classes at least twice except by chance; each
  # sends min(2, n_class) images per class: the padded block is [4, 6].
  assert uploads.x.shape == (4, 6, 4, 4, 1)
  counts = np.asarray(uploads.count)
  _, y, n = synthetic_clients()
  expected = [sum(min(2, int(np.sum(y[c, :n[c]] == k))) for k in range(3))
              for c in range(4)]
  np.testing.assert_array_equal(counts, expected)
  # The server trained on exactly the images received: M rows.
  assert resumed[0].state.index.shape == (sum(expected),)
  assert int(resumed[0].state.epoch) == 4
  # One upload message per client: 16 pixels x 8 bits + an 8-bit label each.
  ledger = resumed[0].ledger
  assert ledger.cumulative()["bytes_uploaded"] * 8 == sum(expected) * (16 * 8 + 8)
  assert ledger.cumulative()["bytes_downloaded"] == 0
  assert np.all(np.isfinite([r["train_loss"] for r in resumed[1]]))
  # A further epoch compiles nothing new.
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    algo.epoch(resumed[0].state, uploads)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]


def test_fedd3_padding_never_reaches_the_loss(tmp_path):
  # Garbage in the padded rows must not change training.
  task, data, _, _, evaluate = _problem()
  algo = _fedd3(task)
  clean, _ = _run(algo, data, task, evaluate, tmp_path / "a", num_epochs=2)

  def dirty_stage(*args):
    u = algo.client_stage(*args)
    pad = np.arange(u.x.shape[1])[None, :] >= np.asarray(u.count)[:, None]
    x = np.where(pad[..., None, None, None], 255, np.asarray(u.x))
    y = np.where(pad[..., None], 7.0, np.asarray(u.y_soft))
    return u.replace(x=jnp.asarray(x, jnp.uint8), y_soft=jnp.asarray(y))

  dirty, _ = _run(algo._replace(client_stage=dirty_stage), data, task,
                  evaluate, tmp_path / "b", num_epochs=2)
  for a, b in zip(jax.tree_util.tree_leaves(clean.params),
                  jax.tree_util.tree_leaves(dirty.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_protocol_differences_compares_json_fields_and_tolerates_new_off_ones():
  ours = json.dumps({"client.lr": 0.01, "client.grad_clip": 0.0})
  # A field their run predates, off here: no difference.
  assert server_lib.protocol_differences(json.dumps({"client.lr": 0.01}),
                                         ours) == []
  # ... but on here: named, with both values.
  clip = json.dumps({"client.lr": 0.01, "client.grad_clip": 10.0})
  assert server_lib.protocol_differences(json.dumps({"client.lr": 0.01}),
                                         clip) == [
      "client.grad_clip (theirs: absent, ours: 10.0)"]
  assert server_lib.protocol_differences(ours, clip) == [
      "client.grad_clip (theirs: 0.0, ours: 10.0)"]
  # Not JSON objects: whole strings, and a missing protocol never matches.
  assert server_lib.protocol_differences("p1", "p1") == []
  assert server_lib.protocol_differences("p1", "p2") == [
      "theirs: 'p1', ours: 'p2'"]
  assert server_lib.protocol_differences(None, ours) != []
