"""Local update: padding never matters, masked steps are no-ops, SGD is exact."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.core.local import make_local_update, steps_for
from tests.conftest import synthetic_clients, tiny_task  # noqa: F401


def _run(task, x, y, n, num_steps, max_steps, key, lr=0.1):
  local = make_local_update(task, optax.sgd(lr), batch_size=4,
                            max_steps=max_steps)
  params, stats = task.init(jax.random.PRNGKey(0))
  return jax.jit(local.run)(params, stats, local.optimizer.init(params), x, y,
                            n, num_steps, key, ())


def test_padding_does_not_change_results():
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=1, sizes=(5,), n_max=5)
  key = jax.random.PRNGKey(3)
  tight = _run(task, x[0], y[0], n[0], 6, 6, key)
  # Same client padded to 40 rows with adversarial garbage in the padding.
  xp = np.concatenate([x[0], np.full((35, 4, 4, 1), 255, np.uint8)])
  yp = np.concatenate([y[0], np.full((35,), 2, np.int32)])
  padded = _run(task, xp, yp, n[0], 6, 6, key)
  for a, b in zip(jax.tree_util.tree_leaves(tight.params),
                  jax.tree_util.tree_leaves(padded.params)):
    np.testing.assert_array_equal(a, b)
  assert float(tight.loss) == float(padded.loss)


def test_masked_steps_are_noops():
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=1, sizes=(9,), n_max=12)
  key = jax.random.PRNGKey(1)
  exact = _run(task, x[0], y[0], n[0], 3, 3, key)
  masked = _run(task, x[0], y[0], n[0], 3, 8, key)
  for a, b in zip(jax.tree_util.tree_leaves(exact.params),
                  jax.tree_util.tree_leaves(masked.params)):
    np.testing.assert_array_equal(a, b)
  assert float(masked.steps) == 3.0
  zero = _run(task, x[0], y[0], n[0], 0, 4, key)
  params0, _ = task.init(jax.random.PRNGKey(0))
  for a, b in zip(jax.tree_util.tree_leaves(zero.params),
                  jax.tree_util.tree_leaves(params0)):
    np.testing.assert_array_equal(a, b)
  assert float(zero.steps) == 0.0 and np.isfinite(float(zero.loss))


def test_one_sgd_step_matches_manual_gradient():
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=1, sizes=(4,), n_max=4)
  key = jax.random.PRNGKey(7)
  out = _run(task, x[0], y[0], n[0], 1, 1, key, lr=0.5)
  # Reproduce the batch the step drew and take one manual SGD step.
  from fedjax_dd.data.stacked import sample_batch
  xb, yb = sample_batch(jax.random.fold_in(key, 0), x[0], y[0], n[0], 4)
  params, stats = task.init(jax.random.PRNGKey(0))
  grads = jax.grad(lambda p: task.loss(p, stats, xb, yb)[0])(params)
  manual = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads)
  for a, b in zip(jax.tree_util.tree_leaves(out.params),
                  jax.tree_util.tree_leaves(manual)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_batchnorm_stats_are_updated():
  task = tiny_task(bn=True)
  x, y, n = synthetic_clients(num_clients=1, sizes=(8,), n_max=8)
  out = _run(task, x[0], y[0], n[0], 3, 3, jax.random.PRNGKey(0))
  _, stats0 = task.init(jax.random.PRNGKey(0))
  moved = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()),
                                 out.batch_stats, stats0)
  assert max(jax.tree_util.tree_leaves(moved)) > 0


def test_steps_for():
  n = np.array([0, 1, 64, 65, 600])
  np.testing.assert_array_equal(steps_for(n, 64, epochs=1), [0, 1, 1, 2, 10])
  np.testing.assert_array_equal(steps_for(n, 64, epochs=2), [0, 2, 2, 4, 20])
  np.testing.assert_array_equal(steps_for(n, 64, steps=5), [0, 5, 5, 5, 5])
  with pytest.raises(ValueError):
    steps_for(n, 64)
  with pytest.raises(ValueError):
    make_local_update(tiny_task(), optax.sgd(0.1), batch_size=4, max_steps=0)
