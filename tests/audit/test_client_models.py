"""fedjax_dd.audit.workdir.audit_client_models: each client's own model."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.audit import model_mia
from fedjax_dd.audit import workdir as audit_lib
from fedjax_dd.core.algorithm import Teachers
from fedjax_dd.core.checks import SettingError
from fedjax_dd.core.task import Classifier
from fedjax_dd.data.stacked import ClientData

K, SHAPE = 4, (2, 2, 1)


class _Bias(nn.Module):
  """Logits that ignore the image: one learned vector."""

  @nn.compact
  def __call__(self, x, *, train):
    del train
    b = self.param("b", nn.initializers.zeros, (K,))
    return jnp.broadcast_to(b, (x.shape[0], K))


class _Pixel(nn.Module):
  """Logits from the mean pixel: a model whose loss differs by image."""

  @nn.compact
  def __call__(self, x, *, train):
    del train
    return nn.Dense(K)(jnp.mean(x.reshape(x.shape[0], -1), -1,
                                keepdims=True))


def _task(module):
  return Classifier(module, SHAPE, lambda x: x.astype(jnp.float32) / 255.0, K)


def _data(rng, labels):
  n = max(len(l) for l in labels)
  y = np.zeros((len(labels), n), np.int32)
  for i, l in enumerate(labels):
    y[i, :len(l)] = l
  x = rng.integers(0, 256, (len(labels), n, *SHAPE), dtype=np.uint8)
  return ClientData(x=x, y=y, num_examples=np.array([len(l) for l in labels],
                                                    np.int32))


def test_label_leakage_of_bias_models_by_hand_and_in_client_order():
  rng = np.random.default_rng(0)
  # Client 0 holds classes 0, 0, 1, 1; client 1 class 2 only; client 2
  # classes 0-3 once each.
  data = _data(rng, [[0, 0, 1, 1], [2, 2, 2], [0, 1, 2, 3]])
  nonmembers = _data(rng, [[0, 1], [2, 2], [0, 3]])
  task = _task(_Bias())
  # Groups out of client order: group 0 holds clients 2 and 0, group 1
  # client 1. Client 0's model says its own histogram exactly (log-shares
  # as logits), client 2's is uniform, client 1's puts 1/2 on class 2.
  half = np.log(np.array([1 / 6, 1 / 6, 1 / 2, 1 / 6], np.float32))
  own = np.log(np.array([0.5, 0.5, 1e-30, 1e-30], np.float32))
  g0 = types.SimpleNamespace(task=task, client_ids=(2, 0))
  g1 = types.SimpleNamespace(task=task, client_ids=(1,))
  teachers = Teachers(
      vars=(({"b": np.stack([np.zeros(K, np.float32), own])}, {}),
            ({"b": half[None]}, {})),
      num_examples=data.num_examples)
  probe = rng.integers(0, 256, (5, *SHAPE), dtype=np.uint8)
  out = audit_lib.audit_client_models((g0, g1), teachers, data, nonmembers,
                                      probe)
  assert out["kind"] == "client_models" and out["num_clients"] == 3
  assert out["num_members"] == [4, 3, 4]
  assert out["num_nonmembers"] == [2, 2, 2]
  # Client 0: its own histogram, TV 0; client 1: 1/2 on its only class,
  # TV 1/2; client 2: uniform against uniform, TV 0.
  np.testing.assert_allclose(out["label_leakage"]["tv"], [0.0, 0.5, 0.0],
                             atol=1e-6)
  assert abs(out["label_leakage"]["tv_mean"] - 0.5 / 3) < 1e-6


def _two_clients(seed):
  """Two clients' data and non-members, and their own random models
  (per client, and stacked)."""
  rng = np.random.default_rng(seed)
  data = _data(rng, [[0, 1, 2, 3, 0, 1], [3, 3, 2, 2, 1]])
  nonmembers = _data(rng, [[0, 1, 2, 3], [3, 2, 1]])
  task = _task(_Pixel())
  params = [task.init(jax.random.PRNGKey(s))[0] for s in (3, 4)]
  stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *params)
  return rng, data, nonmembers, task, params, stacked


def test_each_clients_attack_is_its_own_models_loss_threshold():
  _, data, nonmembers, task, params, stacked = _two_clients(1)
  g = types.SimpleNamespace(task=task, client_ids=(0, 1))
  teachers = Teachers(vars=((stacked, {}),), num_examples=data.num_examples)
  out = audit_lib.audit_client_models((g,), teachers, data, nonmembers,
                                      data.x[0, :2])
  for k in range(2):
    n, m = int(data.num_examples[k]), int(nonmembers.num_examples[k])
    alone = model_mia.loss_threshold_mia(
        task, params[k], {}, data.x[k, :n], data.y[k, :n],
        nonmembers.x[k, :m], nonmembers.y[k, :m])
    assert abs(out["model_mia_loss"]["auc"][k] - alone.auc) < 1e-9


def _sgd_training(task, lr):
  import optax  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.local import LocalTraining  # pylint: disable=g-import-not-at-top
  return LocalTraining(task, optax.sgd(lr), batch_size=2, max_steps=3)


def test_client_uploads_are_what_fedavg_averages():
  from fedjax_dd.algorithms.fedavg import fedavg  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.algorithm import Cohort  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  data = _data(rng, [[0, 1, 2], [3, 3, 2, 1, 0], [1, 2]])
  task = _task(_Pixel())
  training = _sgd_training(task, 0.5)
  params, stats = task.init(jax.random.PRNGKey(7))
  steps = np.array([3, 2, 1], np.int32)
  key = jax.random.key(5)
  uploads, _ = audit_lib.client_uploads(training, params, stats, data, steps,
                                        key)
  # FedAvg's server step on the same round key: the example-weighted mean
  # of exactly these uploads.
  algorithm = fedavg(training)
  server, _ = algorithm.init(params, stats, 3)
  cohort = Cohort(x=data.x, y=data.y, num_examples=data.num_examples,
                  num_steps=steps, client_ids=np.arange(3, dtype=np.int32))
  server, _, _ = algorithm.apply(server, (), cohort, key)
  w = np.asarray(data.num_examples, np.float64) / 10.0
  for got, each in zip(jax.tree_util.tree_leaves(server.params),
                       jax.tree_util.tree_leaves(uploads)):
    np.testing.assert_allclose(got, np.tensordot(w, np.asarray(each), 1),
                               rtol=1e-5, atol=1e-6)
  # A client's upload moved from the start: local training ran.
  moved = [np.abs(np.asarray(u)[0] - np.asarray(p)).max() for u, p in zip(
      jax.tree_util.tree_leaves(uploads), jax.tree_util.tree_leaves(params))]
  assert max(moved) > 0


def test_shadows_from_a_start_with_a_zero_rate_stay_there():
  task = _task(_Pixel())
  params, stats = task.init(jax.random.PRNGKey(8))
  rng = np.random.default_rng(3)
  pool = _data(rng, [[0, 1, 2, 3, 0, 1]])
  shadows = model_mia.train_shadows(
      _sgd_training(task, 0.0), jax.random.key(1), pool.x[0], pool.y[0],
      num_shadows=3, shadow_size=4, num_steps=2, start=(params, stats),
      round_index=4)
  for got, want in zip(jax.tree_util.tree_leaves(shadows[0]),
                       jax.tree_util.tree_leaves(params)):
    assert got.shape == (3, *np.shape(want))
    np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))


def test_upload_audit_with_lira_is_each_clients_own_and_in_the_headline():
  rng, data, nonmembers, task, params, stacked = _two_clients(4)
  pool = _data(rng, [[0, 1, 2, 3] * 3])
  shadows = model_mia.train_shadows(
      _sgd_training(task, 0.1), jax.random.key(2), pool.x[0], pool.y[0],
      num_shadows=3, shadow_size=6, num_steps=3)
  out = audit_lib.audit_client_uploads(task, stacked, {}, data, nonmembers,
                                       data.x[0, :2], shadows=shadows)
  for k in range(2):
    n, m = int(data.num_examples[k]), int(nonmembers.num_examples[k])
    alone = model_mia.lira_mia(task, params[k], {}, shadows, data.x[k, :n],
                               data.y[k, :n], nonmembers.x[k, :m],
                               nonmembers.y[k, :m])
    assert abs(out["model_mia_lira"]["auc"][k] - alone.auc) < 1e-9
  line = audit_lib.headline({"kind": "global_model", "client_uploads": out})
  assert line["client_uploads_model_mia_lira_auc"] == (
      out["model_mia_lira"]["auc_mean"])
  assert line["client_uploads_label_tv"] == out["label_leakage"]["tv_mean"]
  assert "client_uploads_kind" not in line


def test_soft_label_leakage_by_hand():
  rng = np.random.default_rng(5)
  data = _data(rng, [[0, 0, 1, 1], [2, 2, 2]])
  # Client 0's two public rows average to its own histogram (TV 0);
  # client 1's are uniform against one class: TV = 3/4.
  soft = np.array([[[1.0, 0, 0, 0], [0, 1.0, 0, 0]],
                   [[0.25] * 4, [0.25] * 4]], np.float32)
  out = audit_lib.audit_soft_labels(soft, data, num_classes=K)
  np.testing.assert_allclose(out["label_leakage"]["tv"], [0.0, 0.75],
                             atol=1e-6)
  line = audit_lib.headline({"kind": "hfldd", "soft_labels": out})
  assert abs(line["soft_label_tv"] - 0.375) < 1e-6
  with pytest.raises(SettingError, match="soft_labels must be probability "
                     "rows"):
    audit_lib.audit_soft_labels(soft[:1], data, num_classes=K)


def test_shadow_pool_lies_outside_the_holdout():
  held = np.array([0, 2, 4, 6])
  idx = audit_lib.shadow_pool_indices(10, held, 0, np.random.default_rng(0))
  np.testing.assert_array_equal(idx, [1, 3, 5, 7, 8, 9])
  idx = audit_lib.shadow_pool_indices(10, held, 3, np.random.default_rng(0))
  assert idx.size == 3 and not set(idx) & set(held)
  assert list(idx) == sorted(idx)
  with pytest.raises(SettingError, match="lira_pool must be at most the 6 "
                     "test examples outside the holdout of 4"):
    audit_lib.shadow_pool_indices(10, held, 7, np.random.default_rng(0))
