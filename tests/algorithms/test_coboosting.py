"""Co-Boosting: its losses by hand, the ensemble re-weighting, the server loop
(no recompilation, kill anywhere and resume bit-identically)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models
from fedjax_dd.algorithms import coboosting as cb
from fedjax_dd.core.checkpoint import as_restored
from tests.core import test_server as ts


def test_weighted_ensemble_and_hard_sample_loss_by_hand():
  logits = jnp.array([[[2.0, 0.0]], [[0.0, 4.0]]])  # [m=2, B=1, K=2]
  # w = (0.2, 0.6): (0.2·(2, 0) + 0.6·(0, 4)) / 0.8 = (0.5, 3).
  np.testing.assert_allclose(
      cb.weighted_ensemble(logits, None, jnp.array([0.2, 0.6])), [[0.5, 3.0]],
      rtol=1e-6)
  # p = (0, ln 3): σ = (1/4, 3/4). Label 0: weight (1 − 1/4)^γ, CE = ln 4.
  p = jnp.array([[0.0, np.log(3.0)], [0.0, np.log(3.0)]])
  y = jnp.array([0, 1])
  want = np.mean([0.75 ** 2 * np.log(4.0), 0.25 ** 2 * np.log(4.0 / 3.0)])
  np.testing.assert_allclose(cb.hard_sample_loss(p, y, 2.0), want, rtol=1e-6)
  # γ = 0 is the plain cross-entropy.
  np.testing.assert_allclose(
      cb.hard_sample_loss(p, y, 0.0),
      np.mean([np.log(4.0), np.log(4.0 / 3.0)]), rtol=1e-6)
  # The hardness weight is a constant: the gradient is the weighted CE's.
  g = jax.grad(lambda q: cb.hard_sample_loss(q, y[:1], 2.0))(p[:1])
  np.testing.assert_allclose(g, 0.75 ** 2 * np.array([[0.25 - 1.0, 0.75]]),
                             rtol=1e-6)


def test_enhance_is_one_signed_step():
  # A(x) = (Σx, 0) for x [1, 2, 1, 1]; r = (1, 0): ∂σ_0(A/T)/∂x > 0 everywhere,
  # so every pixel moves by +ε.
  x = jnp.zeros((1, 2, 1, 1))
  logits_fn = lambda v: jnp.stack([jnp.sum(v, (1, 2, 3)),
                                   jnp.zeros(v.shape[0])], -1)
  out = cb.enhance(x, logits_fn, jnp.array([[1.0, 0.0]]), 0.5, 4.0)
  np.testing.assert_array_equal(out, np.full((1, 2, 1, 1), 0.5))
  out = cb.enhance(x, logits_fn, jnp.array([[-1.0, 0.0]]), 0.5, 4.0)
  np.testing.assert_array_equal(out, np.full((1, 2, 1, 1), -0.5))


def _setup(**hp):
  task, data, groups, stage, evaluate = ts._problem()
  gen = models.Generator(out_shape=(4, 4, 1), nz=4, ngf=2)
  hparams = cb.CoBoostingHyperParams(
      batch_size=4, generator_steps=2, pool_size=3, num_epochs=4,
      **{"student_steps": 2, **hp})
  algo = cb.coboosting(stage, groups, gen, task, ts._identity, hparams)
  return task, data, groups, stage, evaluate, algo


def test_reweighting_moves_weights_towards_the_right_teacher(caplog):
  # Teacher 0 predicts the generator's labels, teacher 1 their opposite: one
  # pass of sign steps raises w_0 by μ and lowers w_1 by μ per pool batch.
  task, data, groups, stage, evaluate, algo = _setup(weight_lr=0.1,
                                                     weight_decay=0.5)
  teachers = stage([task.init(jax.random.PRNGKey(0))], data,
                   jax.random.PRNGKey(1))
  state = algo.init(jax.random.PRNGKey(2), {}, teachers,
                    *task.init(jax.random.PRNGKey(3)))
  np.testing.assert_array_equal(state.weights, [0.25] * 4)
  y = jnp.array([[0, 1, 2, 0]] * 3)
  right = jax.nn.one_hot(y, 3) * 5.0                     # [S, B, K]
  wrong = jax.nn.one_hot((y + 1) % 3, 3) * 5.0
  pool_t = jnp.stack([right, wrong, right * 0, right * 0], 2)  # [S, B, m, K]
  # On one device with a restore's avals, as the driver hands them over.
  dev = jax.devices()[0]
  state = as_restored(jax.device_put(state.replace(
      pool_y=y, pool_t=pool_t, epoch=jnp.asarray(2, jnp.int32)), dev))
  teachers = as_restored(jax.device_put(teachers, dev))
  state, metrics = algo.epoch(state, teachers)
  # Epoch 2: two filled batches before the insert, μ·δ² = 0.025 each.
  np.testing.assert_allclose(state.weights[:2], [0.3, 0.2], rtol=1e-6)
  assert int(state.epoch) == 3
  for k in ("gen_loss", "gen_hard", "gen_adv", "student_kl"):
    assert np.isfinite(float(metrics[k])), k
  # Another epoch compiles nothing new.
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    state, _ = algo.epoch(state, teachers)
  assert not [r.getMessage() for r in caplog.records
              if "Compiling" in r.getMessage()]
  report = algo.report(state, {})
  assert report["samples"][0].shape == (4, 4, 4, 1)
  assert len(report["ensemble_weights"]) == 4


def test_hyperparameter_checks():
  with pytest.raises(ValueError, match="pool_size"):
    cb.CoBoostingHyperParams(pool_size=0)
  with pytest.raises(ValueError, match="temperature"):
    cb.CoBoostingHyperParams(temperature=0.0)


def test_killed_anywhere_resumes_bit_identically(tmp_path):
  # One student pass over the pool per epoch (the code's; the fixed step
  # count runs in the re-weighting test).
  task, data, groups, stage, evaluate, algo = _setup(student_steps=0)
  opts = dict(num_epochs=3, eval_every=2, checkpoint_every=2)
  full = ts._run(algo, data, task, evaluate, tmp_path / "full", **opts)
  assert [r["epoch"] for r in full[1]] == [1, 2, 3]
  assert full[0].ledger.cumulative()["bytes_downloaded"] == 0
  part = tmp_path / "part"
  for point, n in ts._GAUNTLET:
    plan = ts._KillPlan(point, n)
    with pytest.raises(ts.Killed):
      ts._run(plan.wrap(algo), data, task, evaluate, part,
              writer=ts._KillingWriter(part / "metrics.jsonl", plan), **opts)
  resumed = ts._run(algo, data, task, evaluate, part, **opts)
  ts._assert_same(full, resumed)
  # The weights moved off 1/m from epoch 2 on.
  assert not np.allclose(resumed[0].state.weights, 0.25)
