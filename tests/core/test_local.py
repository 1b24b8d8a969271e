"""Local update: padding never matters, masked steps are no-ops, SGD is exact."""

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.core.local import (LocalTraining, RoundContext, make_local_update,
                                  round_decay, steps_for)
from fedjax_dd.core.task import Classifier
from tests.conftest import rounds_compile_nothing, synthetic_clients, tiny_task  # noqa: F401


def _run(task, x, y, n, num_steps, max_steps, key, lr=0.1, skip_padding=True):
  local = make_local_update(LocalTraining(task, optax.sgd(lr), batch_size=4,
                                          max_steps=max_steps,
                                          skip_padding=skip_padding))
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
    make_local_update(LocalTraining(tiny_task(), optax.sgd(0.1), batch_size=4,
                                    max_steps=0))


# ----------------------------------------------- augmentation and lr decay


def _leaves_equal(a, b):
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def _run_with(task, x, y, n, key, ctx=(), lr=0.1, steps=3, augment=None,
              schedule=None, **hooks):
  local = make_local_update(LocalTraining(task, optax.sgd(lr), batch_size=4,
                                          max_steps=steps, augment=augment,
                                          schedule=schedule),
                            **hooks)
  params, stats = task.init(jax.random.PRNGKey(0))
  return jax.jit(local.run)(params, stats, local.optimizer.init(params), x, y,
                            n, steps, key, ctx)


def test_identity_augmentation_keeps_batches_and_results():
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=1, sizes=(9,), n_max=12)
  key = jax.random.PRNGKey(4)
  plain = _run_with(task, x[0], y[0], n[0], key)
  seen = []
  ident = _run_with(task, x[0], y[0], n[0], key,
                    augment=lambda k, xb: (seen.append(k), xb)[1])
  assert seen  # the hook was traced
  _leaves_equal(plain.params, ident.params)
  blank = _run_with(task, x[0], y[0], n[0], key,
                    augment=lambda k, xb: jnp.zeros_like(xb))
  assert not np.allclose(np.asarray(blank.loss), np.asarray(plain.loss))


def test_flip_and_crop_hand_example():
  from fedjax_dd.core.local import flip_and_crop
  img = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1) + 1
  xb = jnp.asarray(np.repeat(img, 64, axis=0))
  key = jax.random.PRNGKey(0)
  flipped = flip_and_crop(4, flip_prob=1.0, crop_prob=0.0)(key, xb)
  np.testing.assert_array_equal(flipped, np.repeat(img[:, :, ::-1], 64, 0))
  same = flip_and_crop(4, flip_prob=0.0, crop_prob=0.0)(key, xb)
  np.testing.assert_array_equal(same, xb)
  out = jax.jit(flip_and_crop(1, flip_prob=0.0, crop_prob=1.0))(key, xb)
  assert out.shape == xb.shape and out.dtype == jnp.uint8
  padded = np.pad(img[0, :, :, 0], 1)
  crops = {(i, j): padded[i:i + 4, j:j + 4] for i in range(3) for j in range(3)}
  found = set()
  for o in np.asarray(out)[:, :, :, 0]:
    match = [k for k, c in crops.items() if np.array_equal(c, o)]
    assert match, o  # every output is one of the 9 padded crops
    found.add(match[0])
  assert len(found) > 3  # offsets vary per example
  mixed = flip_and_crop(4)(key, xb)  # FedFTG: each half the time
  assert 0 < np.mean([np.array_equal(m, xb[0]) for m in np.asarray(mixed)]) < 1
  with pytest.raises(ValueError, match="pad"):
    flip_and_crop(-1)


def _context(task, round_index):
  params, stats = task.init(jax.random.PRNGKey(0))
  return RoundContext(round=jnp.asarray(round_index, jnp.int32),
                      start_params=params, start_batch_stats=stats)


def test_the_schedule_of_the_contexts_round_scales_the_step_exactly():
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=1, sizes=(8,), n_max=8)
  key = jax.random.PRNGKey(2)
  # Round index 1 of gamma = 0.5: half of lr 0.2.
  half = _run_with(task, x[0], y[0], n[0], key, ctx=_context(task, 1),
                   lr=0.2, steps=1, schedule=round_decay(0.5))
  ref = _run_with(task, x[0], y[0], n[0], key, lr=0.1, steps=1)
  for a, b in zip(jax.tree_util.tree_leaves(half.params),
                  jax.tree_util.tree_leaves(ref.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _one_client_cohort(steps=1):
  from fedjax_dd.core.algorithm import Cohort
  x, y, n = synthetic_clients(num_clients=1, sizes=(8,), n_max=8)
  return Cohort(x=jnp.asarray(x), y=jnp.asarray(y),
                num_examples=jnp.asarray(n),
                num_steps=jnp.full((1,), steps, jnp.int32),
                client_ids=jnp.arange(1))


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_lr_decay_halves_round_two(name):
  from fedjax_dd.algorithms.fedavg import fedavg
  from fedjax_dd.algorithms.scaffold import scaffold

  def build(lr, decay=1.0):
    training = LocalTraining(task, optax.sgd(lr), batch_size=4, max_steps=1,
                             schedule=round_decay(decay))
    if name == "fedavg":
      return fedavg(training)
    return scaffold(training, learning_rate=lr)

  task = tiny_task()
  # The engine numbers the rounds (cohort.round); the algorithm counts none.
  cohort = _one_client_cohort()
  second = cohort.replace(round=jnp.int32(1))
  params, stats = task.init(jax.random.PRNGKey(0))
  k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  alg = build(0.2, decay=0.5)
  s0, c0 = alg.init(params, stats, 1)
  assert "round" not in s0.extra
  s1, c1, _ = alg.apply(s0, c0, cohort, k1)
  s2, _, m2 = alg.apply(s1, c1, second, k2)
  assert np.isfinite(float(m2["train_loss"]))
  # Round 1 at lr 0.2, round 2 at 0.1: the same as constant-lr runs.
  r1, rc1 = build(0.2).init(params, stats, 1)
  r1, rc1, _ = build(0.2).apply(r1, rc1, cohort, k1)
  for a, b in zip(jax.tree_util.tree_leaves(s1.params),
                  jax.tree_util.tree_leaves(r1.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  if name == "fedavg":  # one step from the same model: delta = -0.1 * grad
    r2, _, _ = build(0.1).apply(r1, rc1, second, k2)
    for a, b in zip(jax.tree_util.tree_leaves(s2.params),
                    jax.tree_util.tree_leaves(r2.params)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # Hand check: with lr 0.2 undecayed, the step would be twice as long.
    full, _, _ = build(0.2).apply(r1, rc1, second, k2)
    for a, b, f in zip(jax.tree_util.tree_leaves(s1.params),
                       jax.tree_util.tree_leaves(s2.params),
                       jax.tree_util.tree_leaves(full.params)):
      np.testing.assert_allclose(2 * (b - a), f - a, rtol=1e-4, atol=1e-6)


def test_lr_decay_off_is_the_old_state_and_bit_identical():
  from fedjax_dd.algorithms.fedavg import fedavg
  task = tiny_task()
  cohort = _one_client_cohort(steps=2).replace(round=jnp.int32(5))
  params, stats = task.init(jax.random.PRNGKey(0))
  old = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=2))
  new = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=2,
                             schedule=round_decay(1.0)))
  assert round_decay(1.0) is None
  so, _ = old.init(params, stats, 1)
  sn, _ = new.init(params, stats, 1)
  assert sn.extra == {}
  so, _, mo = old.apply(so, {}, cohort, jax.random.PRNGKey(3))
  sn, _, mn = new.apply(sn, {}, cohort, jax.random.PRNGKey(3))
  _leaves_equal((so, mo), (sn, mn))
  with pytest.raises(ValueError, match="lr_decay"):
    round_decay(0.0)


def test_lr_decay_does_not_recompile_across_rounds(caplog):
  from fedjax_dd.algorithms.fedavg import fedavg
  from fedjax_dd.core.algorithm import ExperimentState
  from fedjax_dd.data.stacked import ClientData
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  num_steps = steps_for(data.num_examples, 4, epochs=1)
  from fedjax_dd.core.local import flip_and_crop
  alg = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                             max_steps=int(jnp.max(num_steps)),
                             augment=flip_and_crop(1),
                             schedule=round_decay(0.9)))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 4)
  state = ExperimentState(server, clients, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  state, rows = rounds_compile_nothing(caplog, alg, state, data, num_steps,
                                       clients_per_round=2)
  assert int(state.round) == 3 and "round" not in state.server.extra
  assert all(np.isfinite(r["train_loss"]) for r in rows)


def _leaves(tree):
  return jax.tree_util.tree_leaves(tree)


@pytest.mark.parametrize("bn", [False, True])
def test_skipped_padding_is_bit_identical_to_the_masked_scan(bn):
  """The while loop (default) and the masked scan compute the same bits, for
  one client and for a vmap over clients with uneven counts."""
  task = tiny_task(bn=bn)
  x, y, n = synthetic_clients()
  counts = np.asarray([2, 7, 0, 4], np.int32)
  keys = jax.random.split(jax.random.PRNGKey(5), 4)
  params, stats = task.init(jax.random.PRNGKey(0))
  outs = {}
  for skip in (True, False):
    local = make_local_update(LocalTraining(task, optax.sgd(0.1, momentum=0.9),
                                            batch_size=4, max_steps=7,
                                            skip_padding=skip))
    one = lambda x, y, n, s, k: local.run(
        params, stats, local.optimizer.init(params), x, y, n, s, k, ())
    outs[skip] = (jax.jit(jax.vmap(one))(x, y, n, counts, keys),
                  jax.jit(one)(x[1], y[1], n[1], 3, keys[1]))
  for a, b in zip(_leaves(outs[True]), _leaves(outs[False])):
    np.testing.assert_array_equal(a, b)
  batched = outs[True][0]
  np.testing.assert_array_equal(batched.steps, counts.astype(np.float32))
  # The client with no steps keeps the initial model.
  for a, b in zip(_leaves(jax.tree_util.tree_map(lambda l: l[2],
                                                 batched.params)),
                  _leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_skipped_padding_runs_only_the_clients_steps():
  """Unbatched, the loop body runs num_steps times, not max_steps (counted
  with a host callback)."""
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=1, sizes=(9,), n_max=12)
  calls = []

  def counting_loss(params, ctx):
    del ctx
    jax.debug.callback(lambda: calls.append(1))
    return 0.0 * jax.tree_util.tree_leaves(params)[0].sum()

  for skip, expected in ((True, 3), (False, 8)):
    calls.clear()
    local = make_local_update(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                                            max_steps=8, skip_padding=skip),
                              regularizer=counting_loss)
    params, stats = task.init(jax.random.PRNGKey(0))
    out = jax.jit(local.run)(params, stats, local.optimizer.init(params),
                             x[0], y[0], n[0], 3, jax.random.PRNGKey(1), ())
    jax.block_until_ready(out)
    jax.effects_barrier()
    assert len(calls) == expected, (skip, len(calls))


@pytest.mark.parametrize("skip", [True, False])
def test_spans_of_steps_are_one_call(skip):
  """Steps [0, 3), [3, 5), [5, 9) from each span's state give the bits of
  one call of all 7 (momentum and BatchNorm carried in the state), under a
  vmap with uneven counts; each span's ``steps`` counts its own."""
  task = tiny_task(bn=True)
  x, y, n = synthetic_clients()
  counts = np.asarray([2, 7, 0, 4], np.int32)
  keys = jax.random.split(jax.random.PRNGKey(5), 4)
  params, stats = task.init(jax.random.PRNGKey(0))
  local = make_local_update(LocalTraining(task, optax.sgd(0.1, momentum=0.9),
                                          batch_size=4, max_steps=7,
                                          skip_padding=skip))
  opt = local.optimizer.init(params)
  span = jax.jit(jax.vmap(
      lambda p, s, o, x, y, n, c, k, first, stop: local.run(
          p, s, o, x, y, n, c, k, (), first_step=first, stop_step=stop),
      in_axes=(0, 0, 0, 0, 0, 0, 0, 0, None, None)))
  stack = lambda t: jax.tree_util.tree_map(
      lambda a: jnp.broadcast_to(a, (4, *a.shape)), t)
  state = (stack(params), stack(stats), stack(opt))
  whole = span(*state, x, y, n, counts, keys, 0, 9)
  spans = []
  for first, stop in ((0, 3), (3, 5), (5, 9)):
    out = span(*state, x, y, n, counts, keys, first, stop)
    state = (out.params, out.batch_stats, out.opt_state)
    spans.append(np.asarray(out.steps))
  for a, b in zip(_leaves(state), _leaves((whole.params, whole.batch_stats,
                                           whole.opt_state))):
    np.testing.assert_array_equal(a, b)
  # Client counts 2, 7, 0, 4 split at 3 and 5.
  np.testing.assert_array_equal(np.stack(spans), [[2, 3, 0, 3], [0, 2, 0, 1],
                                                  [0, 2, 0, 0]])
  np.testing.assert_array_equal(whole.steps, counts)


def test_a_batch_larger_than_the_largest_client_draws_its_count(caplog):
  # Two clients padded to N_max = 5: batch 40 draws 5 examples a step, the
  # same program and bits as batch 5, with one log line.
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=1, sizes=(5,), n_max=5)
  key = jax.random.PRNGKey(3)
  params, stats = task.init(jax.random.PRNGKey(0))

  def run(batch_size):
    local = make_local_update(LocalTraining(task, optax.sgd(0.1),
                                            batch_size=batch_size, max_steps=3))
    return jax.jit(local.run)(params, stats, local.optimizer.init(params),
                              x[0], y[0], n[0], 3, key, ())

  with caplog.at_level("WARNING"):
    big = run(40)
  assert ("batch_size 40 is larger than the largest client's 5 examples; "
          "local steps draw batches of 5.") in caplog.text
  exact = run(5)
  for a, b in zip(jax.tree_util.tree_leaves(big.params),
                  jax.tree_util.tree_leaves(exact.params)):
    np.testing.assert_array_equal(a, b)
  assert float(big.loss) == float(exact.loss)
  # Below N_max nothing changes: batch 4 is not 5.
  four = run(4)
  assert float(four.loss) != float(exact.loss)


# ------------------------------------------------------ LocalTraining value


class _Linear(nn.Module):
  """Logits ``W x`` of the flattened input, ``W`` starting at zero."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    return nn.Dense(2, use_bias=False, kernel_init=nn.initializers.zeros)(
        x.reshape((x.shape[0], -1)))


def _linear_task():
  return Classifier(module=_Linear(), input_shape=(1, 1, 1),
                    preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                    num_classes=2)


def test_local_training_is_a_frozen_hashable_value():
  task, opt = _linear_task(), optax.sgd(0.1)
  training = LocalTraining(task, opt, batch_size=1, max_steps=2)
  with pytest.raises(dataclasses.FrozenInstanceError):
    training.batch_size = 2  # type: ignore[misc]
  # Equal settings are equal values with one hash (a cache key); another
  # setting is another value.
  same = LocalTraining(task, opt, batch_size=1, max_steps=2)
  assert same == training and hash(same) == hash(training)
  longer = dataclasses.replace(training, max_steps=3)
  assert longer != training and longer.max_steps == 3
  assert training.max_steps == 2  # replace made a copy
  assert not training.decays and dataclasses.replace(
      training, schedule=round_decay(0.5)).decays
  # A decay of one setting is one value: two builds of a config are equal.
  assert (dataclasses.replace(training, schedule=round_decay(0.5))
          == dataclasses.replace(training, schedule=round_decay(0.5)))


@pytest.mark.parametrize("field, value, message", [
    ("max_steps", 0, "max_steps must be an int >= 1, got 0."),
    ("batch_size", 0, "batch_size must be an int >= 1, got 0."),
    ("schedule", 0.5, "LocalTraining.schedule must be None or an optax "
     "schedule (a function of the round), got 0.5."),
])
def test_local_training_refuses_bad_settings(field, value, message):
  kw = {"batch_size": 1, "max_steps": 1, field: value}
  with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
    LocalTraining(_linear_task(), optax.sgd(0.1), **kw)


def test_make_local_update_of_a_local_training_by_hand():
  # One example x = 1 (pixel 255) of class 0; logits W x with W = 0.
  # Step 1: softmax (1/2, 1/2), dL/dW = (1/2 - 1, 1/2) = (-1/2, 1/2),
  # W = -0.1 * (-1/2, 1/2) = (0.05, -0.05), loss ln 2.
  # Step 2: p0 = sigmoid(0.1), dL/dW = (p0 - 1, 1 - p0),
  # W = (0.05 + 0.1 (1 - p0), -(0.05 + 0.1 (1 - p0))).
  task = _linear_task()
  x = jnp.full((1, 1, 1, 1), 255, jnp.uint8)
  y = jnp.zeros((1,), jnp.int32)
  params, stats = task.init(jax.random.PRNGKey(0))
  p0 = 1.0 / (1.0 + np.exp(-0.1))
  w2 = 0.05 + 0.1 * (1.0 - p0)
  for steps, w, loss in ((1, 0.05, np.log(2.0)),
                         (2, w2, (np.log(2.0) - np.log(p0)) / 2)):
    local = make_local_update(LocalTraining(task, optax.sgd(0.1),
                                            batch_size=1, max_steps=2))
    out = local.run(params, stats, local.optimizer.init(params), x, y, 1,
                    steps, jax.random.PRNGKey(1), ())
    np.testing.assert_allclose(np.asarray(out.params["Dense_0"]["kernel"]),
                               [[w, -w]], rtol=1e-6)
    np.testing.assert_allclose(float(out.loss), loss, rtol=1e-6)
    assert float(out.steps) == steps
  # Round index 1 of gamma = 0.5 halves the step: W = (0.025, -0.025);
  # round index 0 is the undecayed step.
  decayed = make_local_update(
      LocalTraining(task, optax.sgd(0.1), batch_size=1, max_steps=1,
                    schedule=round_decay(0.5)))
  for round_index, w in ((1, 0.025), (0, 0.05)):
    ctx = RoundContext(round=jnp.int32(round_index), start_params=params,
                       start_batch_stats=stats)
    out = decayed.run(params, stats, decayed.optimizer.init(params), x, y, 1,
                      1, jax.random.PRNGKey(1), ctx)
    np.testing.assert_allclose(np.asarray(out.params["Dense_0"]["kernel"]),
                               [[w, -w]], rtol=1e-6)


def test_round_decay_is_optax_exponential_decay_bit_for_bit():
  # The engine's schedule must give the factors the former per-algorithm
  # counter gave, jnp.power(float32 gamma, float32 i), to the bit.
  schedule = round_decay(0.998)
  former = jax.jit(lambda i: jnp.power(jnp.float32(0.998),
                                       i.astype(jnp.float32)))
  for i in (0, 1, 2, 7, 299):
    got = np.asarray(jax.jit(schedule)(jnp.int32(i)))
    assert got.dtype == np.float32
    assert got == np.asarray(former(jnp.int32(i)))
  assert float(schedule(jnp.int32(1))) == pytest.approx(0.998)
