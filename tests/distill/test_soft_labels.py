"""Label-knowledge collection: batched pretraining, soft labels, Eq. 4 KL."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.core.keys import client_keys
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, make_local_update
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import soft_labels
from tests.conftest import synthetic_clients, tiny_task, tracing_task


def _kl_reference(s, eps):
  s = np.clip(np.asarray(s, np.float64), eps, 1.0)
  n, m, _ = s.shape
  out = np.zeros((n, n))
  for i in range(n):
    for j in range(n):
      out[i, j] = np.mean(np.sum(s[i] * np.log(s[i] / s[j]), axis=-1))
  return out


def test_pairwise_kl_hand_checked():
  s = np.array([[[0.5, 0.5]], [[0.9, 0.1]]], np.float32)
  m = np.asarray(soft_labels.pairwise_kl(s))
  want = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
  np.testing.assert_allclose(m[0, 1], want, rtol=1e-5)
  want_rev = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
  np.testing.assert_allclose(m[1, 0], want_rev, rtol=1e-5)
  np.testing.assert_array_equal(np.diag(m), [0.0, 0.0])


def test_pairwise_kl_matches_numpy_double_loop_with_zeros():
  rng = np.random.default_rng(0)
  s = rng.dirichlet(np.ones(4), size=(5, 7)).astype(np.float32)
  s[0, :, 1] = 0.0                                  # a class never predicted
  s[0] /= s[0].sum(-1, keepdims=True)
  s[3, 2] = [1.0, 0.0, 0.0, 0.0]
  m = np.asarray(soft_labels.pairwise_kl(s, eps=1e-8))
  assert np.isfinite(m).all() and (m >= 0).all()
  np.testing.assert_allclose(m, _kl_reference(s, 1e-8), rtol=2e-4, atol=2e-5)
  with pytest.raises(ValueError):
    soft_labels.pairwise_kl(s[0])


def test_pretrain_clients_is_one_batched_program_matching_per_client_runs():
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = ClientData(x=x, y=y, num_examples=n)
  params, stats = task.init(jax.random.PRNGKey(0))
  steps = jnp.array([2, 3, 0, 1], jnp.int32)
  key = jax.random.PRNGKey(4)
  # max_steps=1 is replaced by the largest count, 3: no client is clipped.
  training = LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=1)
  res = soft_labels.pretrain_clients(training, params, stats, data, steps,
                                     key)
  assert jax.tree_util.tree_leaves(res.params)[0].shape[0] == 4
  np.testing.assert_array_equal(res.steps, [2, 3, 0, 1])
  local = make_local_update(dataclasses.replace(training, max_steps=3))
  keys = client_keys(key, jnp.arange(4))
  run = jax.jit(local.run)
  for i in range(4):
    ref = run(params, stats, local.optimizer.init(params),
                    jnp.asarray(x[i]), jnp.asarray(y[i]), n[i], steps[i],
                    keys[i], ((), 0.0))
    for a, b in zip(jax.tree_util.tree_leaves(res.params),
                    jax.tree_util.tree_leaves(ref.params)):
      np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)
  # The client with zero steps keeps the common initialisation.
  for a, b in zip(jax.tree_util.tree_leaves(res.params),
                  jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a[2], b)


def test_soft_labeler_shapes_values_and_no_recompilation():
  traces = []
  task = tracing_task(traces)
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  params = jax.vmap(lambda k: task.init(k)[0])(keys)
  aux = np.random.default_rng(0).integers(0, 255, (7, 4, 4, 1)).astype(np.uint8)
  label = soft_labels.make_soft_labeler(
      task, mapper=ClientMapper(backend="vmap"), aux_batch_size=3)
  s = np.asarray(label(params, {}, aux))
  assert s.shape == (3, 7, 3) and np.isfinite(s).all()
  np.testing.assert_allclose(s.sum(-1), 1.0, rtol=1e-5)
  for i in range(3):
    p_i = jax.tree_util.tree_map(lambda a: a[i], params)
    logits, _ = task.apply(p_i, {}, jnp.asarray(aux, jnp.float32) / 255.0,
                           train=False)
    np.testing.assert_allclose(s[i], jax.nn.softmax(logits), rtol=1e-5,
                               atol=1e-6)
  count = len(traces)
  params2 = jax.tree_util.tree_map(lambda a: a + 0.01, params)
  label(params2, {}, aux)
  assert len(traces) == count                     # same shapes: no retrace


def test_collect_label_knowledge_separates_label_distributions():
  # Clients 0,1 only see class 0; clients 2,3 only class 2: after training,
  # KL within a pair is smaller than across pairs.
  rng = np.random.default_rng(0)
  x = np.zeros((4, 12, 4, 4, 1), np.uint8)
  y = np.zeros((4, 12), np.int32)
  for c, label in enumerate([0, 0, 2, 2]):
    imgs = rng.integers(0, 60, (12, 4, 4, 1))
    imgs[:, label, 0, 0] += 180
    x[c], y[c] = imgs, label
  data = ClientData(x=x, y=y, num_examples=np.full(4, 12, np.int32))
  task = tiny_task()
  params, stats = task.init(jax.random.PRNGKey(1))
  aux = rng.integers(0, 255, (10, 4, 4, 1)).astype(np.uint8)
  s, m, _ = soft_labels.collect_label_knowledge(
      LocalTraining(task, optax.sgd(0.5), batch_size=4, max_steps=1), params,
      stats, data, aux, jnp.full((4,), 20, jnp.int32), jax.random.PRNGKey(2))
  m = np.asarray(m)
  assert s.shape == (4, 10, 3) and m.shape == (4, 4)
  assert np.isfinite(m).all()
  within = max(m[0, 1], m[1, 0], m[2, 3], m[3, 2])
  across = min(m[0, 2], m[0, 3], m[1, 2], m[1, 3], m[2, 0], m[3, 1])
  assert within < across


def _pretrain_tiny(*, labels: int = 12, steps=np.ones(4, np.int32),
                   schedule=None):
  """pretrain_clients on the synthetic clients, their labels cut to
  ``labels`` per client."""
  task = tiny_task()
  x, y, n = synthetic_clients()
  params, stats = task.init(jax.random.PRNGKey(0))
  return soft_labels.pretrain_clients(
      LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=1,
                    schedule=schedule),
      params, stats, ClientData(x=x, y=y[:, :labels], num_examples=n), steps,
      jax.random.PRNGKey(1))


def test_pretrain_clients_refuses_labels_shorter_than_images():
  with pytest.raises(ValueError, match=r"^y must be \[C, N_max\] = \[4, 12\] "
                     r"\(the first two axes of x\), got shape \(4, 10\)\.$"):
    _pretrain_tiny(labels=10)


def test_pretrain_clients_refuses_fractional_step_counts():
  with pytest.raises(ValueError, match=r"^num_steps must be \[C\] = \[4\] "
                     r"integer step counts, got shape \(4,\) dtype float32"):
    _pretrain_tiny(steps=np.ones(4, np.float32))


def test_pretraining_is_round_zero_of_a_schedule():
  # Pretraining is one round, index 0: a decaying schedule gives factor 1,
  # the constant rate's result up to rounding (the traced factor's multiply
  # can fuse into the update differently); round 1's factor 0.5 would move
  # the weights by far more than the tolerance.
  from fedjax_dd.core.local import round_decay
  plain = _pretrain_tiny(steps=np.full(4, 2, np.int32))
  decayed = _pretrain_tiny(steps=np.full(4, 2, np.int32),
                           schedule=round_decay(0.5))
  for a, b in zip(jax.tree_util.tree_leaves(plain),
                  jax.tree_util.tree_leaves(decayed)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6,
                               atol=1e-8)


def test_soft_labeler_refuses_float_and_empty_auxiliary_images():
  label = soft_labels.make_soft_labeler(tiny_task())
  with pytest.raises(ValueError, match=r"^x_aux must be \[M, H, W, Ch\] uint8 "
                     r"pixels in 0\.\.255, got dtype float32 with values in "
                     r"\[0, 1\]; images in \[0, 1\] must be scaled first"):
    label(None, None, np.linspace(0, 1, 48, dtype=np.float32).reshape(3, 4, 4, 1))
  with pytest.raises(ValueError, match=r"^x_aux must hold at least one image"):
    label(None, None, np.zeros((0, 4, 4, 1), np.uint8))
