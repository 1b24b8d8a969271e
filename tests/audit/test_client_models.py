"""fedjax_dd.audit.workdir.audit_client_models: each client's own model."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.audit import model_mia
from fedjax_dd.audit import workdir as audit_lib
from fedjax_dd.core.algorithm import Teachers
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


def test_each_clients_attack_is_its_own_models_loss_threshold():
  rng = np.random.default_rng(1)
  data = _data(rng, [[0, 1, 2, 3, 0, 1], [3, 3, 2, 2, 1]])
  nonmembers = _data(rng, [[0, 1, 2, 3], [3, 2, 1]])
  task = _task(_Pixel())
  params = [task.init(jax.random.PRNGKey(s))[0] for s in (3, 4)]
  stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *params)
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
