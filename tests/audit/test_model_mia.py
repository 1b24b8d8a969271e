"""Loss-threshold and offline-LiRA membership inference on models."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.audit import model_mia
from fedjax_dd.core.checks import SettingError
from fedjax_dd.core.clients import RoundContext
from fedjax_dd.core.local import LocalTraining, make_local_update
from fedjax_dd.core.task import Classifier

SHAPE, K, STEPS = (4, 4, 1), 10, 150


class _MLP(nn.Module):
  width: int = 128

  @nn.compact
  def __call__(self, x, *, train):
    del train
    x = nn.relu(nn.Dense(self.width)(x.reshape(x.shape[0], -1)))
    return nn.Dense(K)(x)


def _training(width=128):
  task = Classifier(_MLP(width), SHAPE,
                    lambda x: x.astype(jnp.float32) / 255.0, K)
  return LocalTraining(task, optax.adam(0.01), batch_size=20,
                       max_steps=STEPS)


def _random_set(rng, n):
  """Images and labels without structure: only memorising fits them."""
  return (rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8),
          rng.integers(0, K, n).astype(np.int32))


def _train(training, key, x, y):
  """One client's model, memorising ``(x, y)`` with the engine's update."""
  task, local = training.task, make_local_update(training)
  params, stats = task.init(jax.random.fold_in(key, 0))
  ctx = RoundContext(round=jnp.zeros((), jnp.int32), start_params=params,
                     start_batch_stats=stats)
  run = jax.jit(local.run)
  out = run(params, stats, local.optimizer.init(params), x, y,
            jnp.int32(len(y)), jnp.int32(STEPS), jax.random.fold_in(key, 1),
            ctx)
  return out.params, out.batch_stats


def test_losses_and_confidences_of_a_zero_model_by_hand():
  task = _training().task
  params, stats = task.init(jax.random.key(0))
  zero = jax.tree_util.tree_map(jnp.zeros_like, params)
  x, y = _random_set(np.random.default_rng(0), 5)
  # Uniform softmax: loss log K; phi = log(1/K) - log((K-1)/K) = -log(K-1).
  np.testing.assert_allclose(
      model_mia.example_losses(task, zero, stats, x, y, batch=2), np.log(K),
      rtol=1e-6)
  np.testing.assert_allclose(
      model_mia.confidence_logit(task, zero, stats, x, y), -np.log(K - 1),
      rtol=1e-6)


def test_lira_scores_by_hand():
  shadow = jnp.array([[0.0, 1.0], [2.0, 3.0]])  # mu [1, 2], var [2, 2]
  s = model_mia.lira_offline_scores(jnp.array([3.0, 2.0]), shadow)
  np.testing.assert_allclose(s, [2 / np.sqrt(2), 0.0], rtol=1e-6)
  shadow = jnp.array([[0.0, 1.0], [2.0, 5.0]])  # var [2, 8], pooled 5
  s = model_mia.lira_offline_scores(jnp.array([3.0, 3.0]), shadow,
                                    global_variance=False)
  np.testing.assert_allclose(s, [2 / np.sqrt(2), 0.0], rtol=1e-6)
  s = model_mia.lira_offline_scores(jnp.array([3.0, 3.0]), shadow)
  np.testing.assert_allclose(s, [2 / np.sqrt(5), 0.0], rtol=1e-6)


@pytest.fixture(scope="module")
def federation():
  """Two clients that memorised 40 random examples each, their held-out
  non-members, and the attacker's disjoint pool."""
  rng = np.random.default_rng(0)
  training = _training()
  members = [_random_set(rng, 40) for _ in range(2)]
  nonmembers = [_random_set(rng, 40) for _ in range(2)]
  pool = _random_set(rng, 200)
  models = [_train(training, jax.random.key(10 + i), *members[i])
            for i in range(2)]
  return training, members, nonmembers, pool, models


def test_loss_threshold_separates_memorised_members(federation):
  training, members, nonmembers, _, models = federation
  r = model_mia.loss_threshold_mia(training.task, *models[0], *members[0],
                                   *nonmembers[0])
  assert r.auc >= 0.9 and r.num_members == 40


def test_lira_separates_memorised_members(federation):
  training, members, nonmembers, pool, models = federation
  shadows = model_mia.train_shadows(training, jax.random.key(1), *pool,
                                    num_shadows=4, shadow_size=40,
                                    num_steps=STEPS)
  assert jax.tree_util.tree_leaves(shadows[0])[0].shape[0] == 4
  r = model_mia.lira_mia(training.task, *models[0], shadows, *members[0],
                         *nonmembers[0])
  assert r.auc >= 0.9


def _stack(sets):
  return (np.stack([s[0] for s in sets]), np.stack([s[1] for s in sets]))


def test_batched_equals_each_client(federation):
  training, members, nonmembers, pool, models = federation
  task = training.task
  params = jax.tree_util.tree_map(lambda *p: jnp.stack(p), *models)
  (mx, my), (nx, ny) = _stack(members), _stack(nonmembers)
  nm, nn_ = np.array([40, 25]), np.array([30, 40])
  shadows = model_mia.train_shadows(training, jax.random.key(1), *pool,
                                    num_shadows=4, shadow_size=40,
                                    num_steps=STEPS)
  per_client = model_mia.loss_threshold_mia_batched(task, *params, mx, my, nm,
                                                    nx, ny, nn_)
  shared = model_mia.loss_threshold_mia_batched(
      task, *models[1], mx, my, nm, nx, ny, nn_, shared_model=True)
  lira = model_mia.lira_mia_batched(task, *params, shadows, mx, my, nm, nx,
                                    ny, nn_)
  for i in range(2):
    m, n = (mx[i, :nm[i]], my[i, :nm[i]]), (nx[i, :nn_[i]], ny[i, :nn_[i]])
    one = model_mia.loss_threshold_mia(task, *models[i], *m, *n)
    assert per_client[i].auc == pytest.approx(one.auc)
    assert per_client[i].tpr_at_fpr == pytest.approx(one.tpr_at_fpr)
    glob = model_mia.loss_threshold_mia(task, *models[1], *m, *n)
    assert shared[i].auc == pytest.approx(glob.auc)
    one = model_mia.lira_mia(task, *models[i], shadows, *m, *n)
    assert lira[i].auc == pytest.approx(one.auc)
    assert lira[i].tpr_at_fpr == pytest.approx(one.tpr_at_fpr)
  # The global model (client 1's) has not seen client 0's members.
  assert shared[1].auc >= 0.9 and shared[0].auc < 0.8


def test_model_audit_refusals(federation):
  training, members, nonmembers, pool, models = federation
  task = training.task
  with pytest.raises(SettingError, match="nonmembers_x must be a non-empty"):
    model_mia.loss_threshold_mia(task, *models[0], *members[0],
                                 nonmembers[0][0][:0], nonmembers[0][1][:0])
  with pytest.raises(SettingError, match=r"members_y must be class indices "
                     r"in \[0, 10\)"):
    model_mia.loss_threshold_mia(task, *models[0], members[0][0],
                                 members[0][1] + K, *nonmembers[0])
  with pytest.raises(SettingError, match="members_x must be images of the "
                     "task's input shape"):
    model_mia.loss_threshold_mia(task, *models[0], members[0][0][:, :2],
                                 members[0][1], *nonmembers[0])
  with pytest.raises(SettingError, match=r"^fpr must be"):
    model_mia.loss_threshold_mia(task, *models[0], *members[0],
                                 *nonmembers[0], fprs=(1.0,))
  with pytest.raises(SettingError, match=r"num_steps must be an int >= 1 and "
                     r"<= 150"):
    model_mia.train_shadows(training, jax.random.key(0), *pool,
                            num_shadows=2, shadow_size=10, num_steps=151)
  with pytest.raises(SettingError, match=r"shadow_size must be an int >= 1 "
                     r"and <= 200"):
    model_mia.train_shadows(training, jax.random.key(0), *pool,
                            num_shadows=2, shadow_size=201, num_steps=1)
  one = jax.tree_util.tree_map(lambda p: p[None], models[0])
  with pytest.raises(SettingError, match="shadows must be train_shadows"):
    model_mia.lira_mia(task, *models[0], one, *members[0], *nonmembers[0])
