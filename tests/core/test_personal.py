"""Personalized evaluation: each client scored with the model it deploys.

Four clients in two clusters. The image of class ``c`` has pixel ``c`` lit;
cluster A (clients 0, 1) labels it ``c``, cluster B (clients 2, 3)
``(c + 1) mod 3``. Model A predicts the lit pixel, model B the next class,
so every figure below is counted by hand.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import cluster_models
from fedjax_dd.algorithms.disue import disue
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.algorithms.ifca import ifca
from fedjax_dd.algorithms.pacfl import PacflClusters, pacfl
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import deployed
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.core.personal import make_personal_evaluator, personal_evaluation
from fedjax_dd.core.task import Classifier
from fedjax_dd.data.stacked import ClientData
from tests.algorithms import kill_resume
from tests.conftest import synthetic_clients, tiny_task


class Mix(nn.Module):
  """Logits = the first three pixels times a 3x3 matrix."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    w = self.param("w", nn.initializers.zeros, (3, 3))
    return x.reshape((x.shape[0], -1))[:, :3] @ w


TASK = Classifier(module=Mix(), input_shape=(2, 2, 1),
                  preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                  num_classes=3)
MAPPER = ClientMapper(backend="vmap")
A = {"w": 10.0 * jnp.eye(3)}                            # predicts c
B = {"w": 10.0 * jnp.roll(jnp.eye(3), 1, axis=1)}      # predicts c + 1


def _images(classes):
  x = np.zeros((len(classes), 2, 2, 1), np.uint8)
  for i, c in enumerate(classes):
    x[i].reshape(-1)[c] = 200
  return x


def _stack(per_client, n_max):
  """``[(lit pixels, labels)]`` per client -> a padded ClientData."""
  c = len(per_client)
  x = np.zeros((c, n_max, 2, 2, 1), np.uint8)
  y = np.zeros((c, n_max), np.int32)
  n = np.zeros((c,), np.int32)
  for i, (lit, labels) in enumerate(per_client):
    x[i, :len(lit)] = _images(lit)
    y[i, :len(lit)] = labels
    n[i] = len(lit)
  return ClientData(x=x, y=y, num_examples=n)


def _rule(lit, cluster):
  return [(c + (cluster == "B")) % 3 for c in lit]


# Training data: every example follows its cluster's rule.
TRAIN = _stack([([0, 1, 2], _rule([0, 1, 2], "A")),
                ([1, 2], _rule([1, 2], "A")),
                ([0, 1, 2], _rule([0, 1, 2], "B")),
                ([2, 0], _rule([2, 0], "B"))], n_max=3)
# Test data, padded to 5 and evaluated in batches of 2 (whole batches of
# padding for the small clients):
#   client 0 (A): 4 examples, 3 by A's rule, 1 by B's -> A 3/4, B 1/4
#   client 1 (A): 2 by A's rule                       -> A 2/2, B 0/2
#   client 2 (B): 5 examples, 4 by B's rule, 1 by A's -> A 1/5, B 4/5
#   client 3 (B): 1 by B's rule                       -> A 0/1, B 1/1
TEST = _stack([([0, 1, 2, 0], _rule([0, 1, 2], "A") + _rule([0], "B")),
               ([2, 1], _rule([2, 1], "A")),
               ([0, 1, 2, 0, 1], _rule([0, 1, 2, 0], "B") + _rule([1], "A")),
               ([1], _rule([1], "B"))], n_max=5)
GLOBAL_A = [0.75, 1.0, 0.2, 0.0]       # everyone scored with model A
DEPLOYED = [0.75, 1.0, 0.8, 1.0]       # each cluster with its own model


def _models(*ms):
  return cluster_models.stack(list(ms)), {}


def _score(algorithm, server, **options):
  params, stats, picks = deployed(algorithm, server, TRAIN)
  ev = make_personal_evaluator(TASK, TEST, mapper=MAPPER, batch_size=2,
                               **options)
  return ev(params, stats, picks, jax.random.PRNGKey(0)), picks


def _check(scores, expected):
  np.testing.assert_allclose(scores.accuracy, expected)
  fig = scores.figures()
  correct = np.asarray(expected) * np.asarray([4, 2, 5, 1])
  assert fig["personal_accuracy"] == pytest.approx(correct.sum() / 12)
  assert fig["personal_accuracy_min"] == pytest.approx(min(expected))
  assert fig["personal_accuracy_max"] == pytest.approx(max(expected))
  assert fig["personal_accuracy_sd"] == pytest.approx(np.std(expected))
  assert np.isfinite(fig["personal_loss"])


def _opt():
  return optax.sgd(0.1)


def test_global_method_scores_every_client_with_the_global_model():
  alg = fedavg(LocalTraining(TASK, _opt(), batch_size=2, max_steps=1,
                             mapper=MAPPER))
  server, _ = alg.init(A, {}, 4)
  scores, picks = _score(alg, server)
  assert picks.tolist() == [0, 0, 0, 0]
  _check(scores, GLOBAL_A)
  # (3 + 2 + 1 + 0) / 12: the global test split's figure is another one.
  assert scores.figures()["personal_accuracy"] == pytest.approx(0.5)


def test_ifca_deploys_the_model_of_lowest_training_loss():
  alg = ifca(LocalTraining(TASK, _opt(), batch_size=2, max_steps=1,
                           mapper=MAPPER), num_clusters=2,
             init_key=jax.random.PRNGKey(1))
  server, _ = alg.init(A, {}, 4)
  models, stats = _models(B, A)  # model 0 is B's: the picks must find it
  server = server.replace(extra={**server.extra, "models": models,
                                 "batch_stats": stats})
  scores, picks = _score(alg, server)
  assert picks.tolist() == [1, 1, 0, 0]
  _check(scores, DEPLOYED)
  assert scores.figures()["personal_accuracy"] == pytest.approx(10 / 12)


def test_pacfl_deploys_each_client_s_cluster_model():
  clusters = PacflClusters(labels=np.array([1, 1, 0, 0], np.int32),
                           num_clusters=2, proximity=np.zeros((4, 4)),
                           upload_bits=0)
  alg = pacfl(LocalTraining(TASK, _opt(), batch_size=2, max_steps=1,
                            mapper=MAPPER), clusters=clusters)
  server, _ = alg.init(A, {}, 4)
  models, stats = _models(B, A)
  server = server.replace(extra={**server.extra, "models": models,
                                 "batch_stats": stats})
  scores, picks = _score(alg, server)
  assert picks.tolist() == [1, 1, 0, 0]
  _check(scores, DEPLOYED)
  # Clients swapped between the clusters score the other model.
  swapped = server.replace(extra={**server.extra,
                                  "clusters": jnp.array([0, 0, 1, 1])})
  scores, _ = _score(alg, swapped)
  _check(scores, [0.25, 0.0, 0.2, 0.0])


def test_disue_scores_the_universal_expert():
  alg = disue(LocalTraining(TASK, _opt(), batch_size=2, max_steps=1,
                            mapper=MAPPER), iga=None, generator_key=None)
  server, _ = alg.init(B, {}, 4)
  scores, picks = _score(alg, server)
  assert picks.tolist() == [0, 0, 0, 0]
  # Model B for everyone.
  _check(scores, [0.25, 0.0, 0.8, 1.0])


def test_fine_tuning_at_rate_zero_changes_nothing_and_training_helps():
  alg = fedavg(LocalTraining(TASK, _opt(), batch_size=2, max_steps=1,
                             mapper=MAPPER))
  server, _ = alg.init(A, {}, 4)
  kw = dict(train=TRAIN, finetune_steps=3, finetune_batch_size=2)
  still, _ = _score(alg, server, finetune_optimizer=optax.sgd(0.0), **kw)
  _check(still, GLOBAL_A)
  tuned, _ = _score(alg, server, finetune_optimizer=optax.sgd(50.0), **kw)
  # Client 2 learns B's rule on every pixel from its own training data
  # (B's 4 of 5); client 3 never trained on a lit pixel 1, its only test
  # image, so that row of the model stays A's (0 of 1); A's clients keep A.
  _check(tuned, [0.75, 1.0, 0.8, 0.0])


def test_bad_inputs():
  with pytest.raises(ValueError, match="no client has a test example"):
    make_personal_evaluator(
        TASK, ClientData(x=np.zeros((2, 1, 2, 2, 1), np.uint8),
                         y=np.zeros((2, 1), np.int32),
                         num_examples=np.zeros(2, np.int32)))
  with pytest.raises(ValueError, match="needs train="):
    make_personal_evaluator(TASK, TEST, finetune_steps=2)
  with pytest.raises(ValueError, match="finetune_steps"):
    make_personal_evaluator(TASK, TEST, finetune_steps=-1)
  alg = fedavg(LocalTraining(TASK, _opt(), batch_size=2, max_steps=1,
                             mapper=MAPPER))
  with pytest.raises(ValueError, match="train holds 4 clients, test 2"):
    personal_evaluation(alg, TASK, TEST, ClientData(
        x=TEST.x[:2], y=TEST.y[:2], num_examples=TEST.num_examples[:2]))


def test_rounds_rows_carry_personal_figures_and_resume_bit_identically(
    tmp_path):
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=4)
  data = ClientData(x=jnp.asarray(x), y=jnp.asarray(y),
                    num_examples=jnp.asarray(n))
  tx, ty, tn = synthetic_clients(num_clients=4, sizes=(3, 0, 4, 2), n_max=4,
                                 seed=1)
  test = ClientData(x=tx, y=ty, num_examples=tn)

  def build(tick):
    del tick
    return ifca(LocalTraining(task, optax.sgd(0.3), batch_size=3, max_steps=3,
                              mapper=MAPPER), num_clusters=2,
                init_key=jax.random.PRNGKey(5))

  def initial(alg):
    params, stats = task.init(jax.random.PRNGKey(0))
    server, clients = alg.init(params, stats, 4)
    return rounds_lib.ExperimentState(server=server, clients=clients,
                                      key=jax.random.PRNGKey(7),
                                      round=jnp.asarray(0, jnp.int32))

  evaluate = make_evaluator(task, x.reshape(-1, 4, 4, 1), y.reshape(-1),
                            batch_size=16)
  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=2,
                                  progress=False, eval_every=2,
                                  checkpoint_every=1)
  full = kill_resume.check(
      tmp_path, build, initial, data, jnp.full((4,), 3, jnp.int32), opts,
      [("apply", 2), ("row", 1), ("apply", 1)], evaluate=evaluate,
      personal=lambda alg: personal_evaluation(
          alg, task, data, test, mapper=MAPPER, batch_size=2,
          finetune_optimizer=optax.sgd(0.3), finetune_steps=2,
          finetune_batch_size=3))
  evaluated = [r for r in full.rows if "test_accuracy" in r]
  assert [r["round"] for r in evaluated] == [2, 3]
  assert all("personal_accuracy" not in r for r in full.rows
             if "test_accuracy" not in r)
  for r in evaluated:
    assert 0.0 <= r["personal_accuracy_min"] <= r["personal_accuracy"] <= (
        r["personal_accuracy_max"]) <= 1.0
    # Nine test examples: every accuracy is a multiple of 1/9 of the sum.
    assert r["personal_accuracy"] * 9 == pytest.approx(
        round(r["personal_accuracy"] * 9))


def test_scoring_other_models_compiles_nothing(caplog):
  import logging  # pylint: disable=g-import-not-at-top
  ev = make_personal_evaluator(TASK, TEST, mapper=MAPPER, batch_size=2)
  models, stats = _models(A, B)
  ev(models, stats, jnp.array([0, 0, 1, 1]))
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    scores = ev(_models(B, A)[0], stats, jnp.array([1, 1, 0, 0]))
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  _check(scores, DEPLOYED)


def test_global_model_on_the_dealt_out_test_split_equals_the_global_score():
  # Every test example goes to one client (each class has a holder), so
  # the example-weighted mean over clients is the global split's accuracy.
  from fedjax_dd.data import partition  # pylint: disable=g-import-not-at-top
  from fedjax_dd.data.stacked import stack_clients  # pylint: disable=g-import-not-at-top
  lit = np.array([0, 1, 2, 0, 1, 2, 2, 0])
  labels = np.array([0, 1, 2, 1, 1, 0, 2, 0], np.int32)
  x = _images(lit)
  train_counts = np.array([[2, 1, 0], [0, 1, 1], [1, 0, 3]])
  parts = partition.personal_test_split(labels, train_counts,
                                        np.random.default_rng(0))
  test = stack_clients(x, labels, parts, allow_empty=True)
  ev = make_personal_evaluator(TASK, test, mapper=MAPPER, batch_size=2)
  scores = ev(*_models(A), jnp.zeros(3, jnp.int32))
  # Model A is right where label == lit: 6 of 8 (not images 3 and 5).
  assert scores.figures()["personal_accuracy"] == pytest.approx(6 / 8)
  assert make_evaluator(TASK, x, labels)(A, {})["accuracy"] == (
      pytest.approx(6 / 8))
