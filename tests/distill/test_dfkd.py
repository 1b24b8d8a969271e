"""Data-free KD stage: BN-statistics loss, teacher grouping, HASA epochs, resume."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd import models
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import dfkd
from fedjax_dd.distill import ensemble
from fedjax_dd.distill import gen_student
from tests.conftest import tiny_task

tree_map = jax.tree_util.tree_map


class InputBN(nn.Module):
  """BatchNorm directly on the 2 input features, then a linear layer."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape((x.shape[0], -1))
    x = nn.BatchNorm(use_running_average=not train)(x)
    return nn.Dense(3)(x)


def test_bn_loss_hand_computed():
  task = Classifier(InputBN(), (1, 2, 1), lambda x: x, 3)
  params, stats = task.init(jax.random.PRNGKey(0))
  # Running stats: mean 0, var 1 (flax defaults).
  # Batch features: column 0 = [-1, 3] (mean 1, var 4); column 1 = [2, 2]
  # (mean 2, var 0).  Loss = ‖(1, 2)‖ + ‖(4 − 1, 0 − 1)‖ = √5 + √10.
  x = jnp.array([[-1.0, 2.0], [3.0, 2.0]]).reshape(2, 1, 2, 1)
  logits, bn = ensemble.apply_with_bn_loss(task, params, stats, x)
  assert logits.shape == (2, 3)
  np.testing.assert_allclose(bn, np.sqrt(5) + np.sqrt(10), rtol=1e-5)
  # A model without BatchNorm contributes 0.
  plain = tiny_task()
  p, s = plain.init(jax.random.PRNGKey(0))
  _, bn0 = ensemble.apply_with_bn_loss(plain, p, s, jnp.ones((2, 4, 4, 1)))
  assert float(bn0) == 0.0
  # Finite gradient even when the statistics match exactly.
  g = jax.grad(lambda x: ensemble.apply_with_bn_loss(
      task, params, stats, x)[1])(jnp.array([[-1., -1.], [1., 1.]]).reshape(2, 1, 2, 1))
  assert np.all(np.isfinite(g))


def _stacked(task, keys):
  inits = [task.init(k) for k in keys]
  return tree_map(lambda *a: jnp.stack(a), *[i[0] for i in inits]), tree_map(
      lambda *a: jnp.stack(a), *[i[1] for i in inits])


def test_teacher_groups_restore_client_order():
  plain, bn = tiny_task(), tiny_task(bn=True)
  ident = lambda x: x
  # Clients 0 and 2 use the plain net, client 1 the BN net.
  groups = (ensemble.TeacherGroup(plain, ident, (2, 0)),
            ensemble.TeacherGroup(bn, ident, (1,)))
  pp, ps = _stacked(plain, [jax.random.PRNGKey(2), jax.random.PRNGKey(0)])
  bp, bs = _stacked(bn, [jax.random.PRNGKey(1)])
  teachers = ensemble.make_teacher_fn(groups)
  x = jax.random.uniform(jax.random.PRNGKey(5), (6, 4, 4, 1))
  logits, bn_loss = teachers(((pp, ps), (bp, bs)), x)
  assert logits.shape == (3, 6, 3) and bn_loss.shape == (3,)
  for k, (task, key) in enumerate([(plain, 0), (bn, 1), (plain, 2)]):
    p, s = task.init(jax.random.PRNGKey(key))
    want, _ = task.apply(p, s, x, train=False)
    np.testing.assert_allclose(logits[k], want, rtol=1e-5, atol=1e-6)
  assert bn_loss[0] == 0 and bn_loss[2] == 0 and bn_loss[1] > 0
  with pytest.raises(ValueError, match="permutation"):
    ensemble.make_teacher_fn((ensemble.TeacherGroup(plain, ident, (0, 2)),))


def test_average_ensemble_and_kl():
  logits = jnp.array([[[1.0, 0.0]], [[3.0, 2.0]]])  # [m=2, B=1, K=2]
  np.testing.assert_allclose(ensemble.average_ensemble(logits, None, ()),
                             [[2.0, 1.0]])
  a = jnp.array([[0.0, 0.0]])
  b = jnp.array([[np.log(3.0), 0.0]])  # probabilities (3/4, 1/4)
  # KL((1/2, 1/2) ‖ (3/4, 1/4)) = ½ log(2/3) + ½ log 2.
  want = 0.5 * np.log(2 / 3) + 0.5 * np.log(2)
  np.testing.assert_allclose(ensemble.kl_divergence(a, b, 1.0), want, rtol=1e-5)
  np.testing.assert_allclose(ensemble.kl_divergence(b, b, 2.0), 0.0, atol=1e-6)


_GEN = models.Generator(out_shape=(4, 4, 1), nz=4, ngf=2)


@pytest.fixture(scope="module")
def distiller():
  return _distiller()


def _distiller(pool_size=2, combine=ensemble.average_ensemble):
  task = tiny_task(bn=True)
  ident = lambda x: x
  group = ensemble.TeacherGroup(task, ident, (0, 1))
  params, stats = _stacked(task, [jax.random.PRNGKey(0), jax.random.PRNGKey(1)])
  gen = _GEN
  hp = dfkd.DFKDHyperParams(batch_size=6, generator_steps=2, student_steps=3,
                            pool_size=pool_size)
  d = dfkd.make_dfkd((group,), gen, task, ident, combine, hp,
                     student_optimizer=optax.sgd(0.05, momentum=0.9))
  s_params, s_stats = task.init(jax.random.PRNGKey(9))
  state = d.init(jax.random.PRNGKey(3), s_params, s_stats)
  return d, state, ((params, stats),)


def test_epoch_shapes_finite_and_no_recompilation(caplog, distiller):
  d, state, tv = distiller
  assert state.pool_x.shape == (2, 6, 4, 4, 1)
  s1, metrics = d.epoch(state, tv, ())
  assert int(s1.epoch) == 1
  for k in ("gen_ce", "gen_bn", "gen_adv", "student_kl", "student_ce"):
    assert np.isfinite(float(metrics[k])), k
  assert float(metrics["gen_bn"]) > 0
  # The generator and the student both moved; slot 0 of the pool was filled.
  moved = lambda a, b: any(not np.allclose(x, y) for x, y in zip(
      jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
  assert moved(state.gen_params, s1.gen_params)
  assert moved(state.params, s1.params)
  assert np.all((s1.pool_x[0] > 0) & (s1.pool_x[0] < 1))
  assert np.all(s1.pool_x[1] == 0)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    s2, _ = d.epoch(s1, tv, ())
    s3, _ = d.epoch(s2, tv, ())
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert int(s3.epoch) == 3
  # The state's generator is a valid variable set of the generator.
  imgs, _ = ensemble.apply_generator(_GEN, s3.gen_params, s3.gen_stats,
                                     jnp.zeros((5, 4)),
                                     jnp.zeros((5,), jnp.int32), True)
  assert imgs.shape == (5, 4, 4, 1)


def test_resume_is_bit_identical(tmp_path, distiller):
  d, state, tv = distiller
  straight = state
  for _ in range(3):
    straight, _ = d.epoch(straight, tv, ())
  s = state
  s, _ = d.epoch(s, tv, ())
  with CheckpointStore(tmp_path / "ck", max_to_keep=1) as store:
    store.save(1, s, {"round": 1}, force=True)
  template = d.init(jax.random.PRNGKey(123), state.params, state.batch_stats)
  with CheckpointStore(tmp_path / "ck", max_to_keep=1) as store:
    step, restored, meta = store.restore(template)
  assert step == 1 and meta == {"round": 1}
  for _ in range(2):
    restored, _ = d.epoch(restored, tv, ())
  for a, b in zip(jax.tree_util.tree_leaves(straight),
                  jax.tree_util.tree_leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_hparams_validation():
  with pytest.raises(ValueError, match="generator_steps"):
    dfkd.DFKDHyperParams(generator_steps=0)
  with pytest.raises(ValueError, match="temperature"):
    dfkd.DFKDHyperParams(temperature=0.0)
  with pytest.raises(ValueError, match="student_steps"):
    dfkd.DFKDHyperParams(student_steps=-1)


def test_adversarial_kl_masks_hand_computed():
  ln3 = np.log(3.0)
  p = jnp.array([[ln3, 0.0], [0.0, ln3]])  # (3/4, 1/4) and (1/4, 3/4)
  s = jnp.array([[0.0, 0.0], [ln3, 0.0]])  # (1/2, 1/2) and (3/4, 1/4)
  # Row 0 agrees (both argmax 0, the tie resolving to 0); row 1 disagrees.
  kl0 = 0.75 * np.log(1.5) + 0.25 * np.log(0.5)
  kl1 = 0.25 * np.log(1 / 3) + 0.75 * np.log(3.0)
  np.testing.assert_allclose(ensemble.adversarial_kl(p, s, 1.0, "none"),
                             -(kl0 + kl1) / 2, rtol=1e-5)
  np.testing.assert_allclose(ensemble.adversarial_kl(p, s, 1.0, "agree"),
                             -kl0 / 2, rtol=1e-5)
  np.testing.assert_allclose(ensemble.adversarial_kl(p, s, 1.0, "disagree"),
                             -kl1 / 2, rtol=1e-5)
  with pytest.raises(ValueError, match="adv_mask"):
    dfkd.DFKDHyperParams(adv_mask="some")


def test_generator_objective_combines_its_terms():
  ln3 = np.log(3.0)
  p = jnp.array([[ln3, 0.0], [0.0, ln3]])
  s = jnp.array([[0.0, 0.0], [ln3, 0.0]])
  y = jnp.array([0, 0])
  bn = jnp.array([1.0, 3.0])  # L_BN is the mean over teachers: 2.
  loss, m = ensemble.generator_objective(p, y, bn, s, lambda_bn=0.5,
                                         lambda_adv=2.0, temperature=1.0,
                                         adv_mask="disagree")
  ce = -(np.log(0.75) + np.log(0.25)) / 2
  adv = ensemble.adversarial_kl(p, s, 1.0, "disagree")
  np.testing.assert_allclose(m["gen_ce"], ce, rtol=1e-5)
  np.testing.assert_allclose(m["gen_bn"], 2.0)
  np.testing.assert_allclose(m["gen_adv"], adv)
  np.testing.assert_allclose(loss, ce + 0.5 * 2.0 + 2.0 * adv, rtol=1e-5)
  np.testing.assert_allclose(m["gen_loss"], loss)
  np.testing.assert_allclose(m["ensemble_accuracy"], 0.5)


def _small(hp_kwargs):
  task = tiny_task(bn=True)
  ident = lambda x: x
  group = ensemble.TeacherGroup(task, ident, (0, 1))
  tv = ((_stacked(task, [jax.random.PRNGKey(0), jax.random.PRNGKey(1)])),)
  gen = _GEN
  hp = dfkd.DFKDHyperParams(batch_size=6, **hp_kwargs)
  d = dfkd.make_dfkd((group,), gen, task, ident, ensemble.average_ensemble, hp,
                     student_optimizer=optax.sgd(0.05, momentum=0.9))
  s_params, s_stats = task.init(jax.random.PRNGKey(9))
  return d, d.init(jax.random.PRNGKey(3), s_params, s_stats), tv


def test_student_pass_over_filled_pool_and_stored_logits():
  d, state, tv = _small(dict(generator_steps=2, student_steps=0, pool_size=3))
  steps = []
  for _ in range(4):
    state, m = d.epoch(state, tv, ())
    steps.append(int(m["student_steps"]))
  # One step per filled batch: the pass grows until the pool (3) is full.
  assert steps == [1, 2, 3, 3]
  # The stored P of every slot is the ensemble of its stored images.
  teachers = ensemble.make_teacher_fn(
      (ensemble.TeacherGroup(tiny_task(bn=True), lambda x: x, (0, 1)),))
  logits, _ = teachers(tv, state.pool_x.reshape(-1, 4, 4, 1))
  np.testing.assert_allclose(
      state.pool_p.reshape(-1, 3),
      ensemble.average_ensemble(logits, None, ()), rtol=1e-5, atol=1e-5)
  # A fixed step count wraps around the shuffled pool.
  d2, s2, _ = _small(dict(generator_steps=1, student_steps=5, pool_size=3))
  _, m2 = d2.epoch(s2, tv, ())
  assert int(m2["student_steps"]) == 5


@pytest.mark.slow
def test_adv_temperature_sets_the_temperature_of_l_ad_alone():
  # One generator step from the same generator and student: L_AD depends on
  # the temperature it is computed at and on nothing else that differs.
  adv = {}
  for name, kw in {"t1": dict(temperature=1.0),
                   "t4_adv1": dict(temperature=4.0, adv_temperature=1.0),
                   "t4": dict(temperature=4.0)}.items():
    d, state, tv = _small(dict(generator_steps=1, pool_size=1,
                               adv_mask="none", **kw))
    _, m = d.epoch(state, tv, ())
    adv[name] = float(m["gen_adv"])
  assert adv["t1"] < 0
  np.testing.assert_allclose(adv["t4_adv1"], adv["t1"], rtol=1e-6)
  assert abs(adv["t4"] - adv["t1"]) > 1e-4
  with pytest.raises(ValueError, match="adv_temperature"):
    dfkd.DFKDHyperParams(adv_temperature=-1.0)


def test_protocol_switches_change_the_pool():
  """Reset + learnable noise + best batch (the reference code) vs. off."""
  pools = {}
  for name, kw in {"ref": {}, "plain": dict(reset_generator=False,
                                            learn_noise=False,
                                            keep_best=False, adv_mask="none")
                   }.items():
    d, state, tv = _small(dict(generator_steps=3, pool_size=2, **kw))
    for _ in range(2):
      state, m = d.epoch(state, tv, ())
    assert all(np.isfinite(float(v)) for v in m.values())
    pools[name] = np.asarray(state.pool_x)
    assert np.all((pools[name] > 0) & (pools[name] < 1))
  assert not np.allclose(pools["ref"], pools["plain"])


def _alg1(protocol, lr=0.05):
  task = tiny_task(bn=True)
  ident = lambda x: x
  group = ensemble.TeacherGroup(task, ident, (0, 1))
  tv = ((_stacked(task, [jax.random.PRNGKey(0), jax.random.PRNGKey(1)])),)
  # The DENSE fields passed here are what "paper" overrides.
  hp = dfkd.DFKDHyperParams(batch_size=6, generator_steps=3, pool_size=4,
                            student_steps=5, protocol=protocol)
  d = dfkd.make_dfkd((group,), _GEN, task, ident, ensemble.average_ensemble,
                     hp, student_optimizer=optax.sgd(lr))
  s_params, s_stats = task.init(jax.random.PRNGKey(9))
  return hp, task, d, d.init(jax.random.PRNGKey(3), s_params, s_stats), tv


def test_paper_protocol_is_fedhydra_alg1_as_printed():
  """FedHydra Alg. 1: the generator initialised once (line 11) and carried;
  per epoch one (z, y) draw (lines 13-14), z fixed over the T_G generator
  steps (lines 16-21, L_AD on every sample); then ONE student step of
  L_Glo (Eq. 19) on G(z) after those steps (lines 23-24), no pool."""
  lr = 0.05
  hp, task, d, s0, tv = _alg1("paper", lr)
  for name, value in dfkd.PAPER_LOOP.items():
    assert getattr(hp, name) == value, name
  assert (hp.pool_size, hp.student_steps, hp.adv_mask) == (1, 1, "none")
  s1, m = d.epoch(s0, tv, ())
  assert int(m["student_steps"]) == 1 and s1.pool_x.shape[0] == 1
  # Lines 13-14: epoch 0's draw (fold_in(key, 0)); z is not optimised, so
  # the batch is G(z) of the generator after its T_G = 3 steps.
  kz, ky = jax.random.split(gen_student.split_keys(s0.key, 0, 3)[0])
  z = jax.random.normal(kz, (6, 4), jnp.float32)
  y = jax.random.randint(ky, (6,), 0, 3)
  np.testing.assert_array_equal(s1.pool_y[0], y)
  x, _ = ensemble.apply_generator(_GEN, s1.gen_params, s1.gen_stats, z, y,
                                  True)
  np.testing.assert_allclose(s1.pool_x[0], x, rtol=1e-5, atol=1e-6)
  # Lines 23-24: one plain SGD step of L_Glo on that batch.
  objective = ensemble.make_student_objective(
      task, lambda v: v, beta=hp.beta, temperature=hp.temperature)
  (_, (stats, _)), g = jax.value_and_grad(objective, has_aux=True)(
      s0.params, s0.batch_stats, s1.pool_x[0], s1.pool_p[0])
  want = tree_map(lambda p, gp: p - lr * gp, s0.params, g)
  for a, b in zip(jax.tree_util.tree_leaves(s1.params),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # Line 11: one generator, carried with its Adam state: epoch 1 starts
  # from epoch 0's generator (a fresh one there changes the batch), and
  # the optimiser has counted both epochs' steps.
  s2, _ = d.epoch(s1, tv, ())
  fresh, _ = d.epoch(s1.replace(gen_params=s0.gen_params), tv, ())
  assert not np.allclose(s2.pool_x, fresh.pool_x)
  assert int(s2.gen_opt_state[0].count) == 2 * hp.generator_steps
  # DENSE's loop starts every epoch from a fresh generator: the carried one
  # is never read.
  _, _, dd, d0, _ = _alg1("dense")
  d1, _ = dd.epoch(d0, tv, ())
  a, _ = dd.epoch(d1, tv, ())
  b, _ = dd.epoch(d1.replace(gen_params=d0.gen_params), tv, ())
  np.testing.assert_array_equal(a.pool_x, b.pool_x)
  assert int(a.gen_opt_state[0].count) == hp.generator_steps
  with pytest.raises(ValueError, match="protocol"):
    dfkd.DFKDHyperParams(protocol="alg1")


def test_augment_shifts_with_zero_fill_and_mirrors():
  x = jnp.arange(9.0).reshape(1, 3, 3, 1) + 1.0  # rows 1 2 3 / 4 5 6 / 7 8 9
  same = dfkd.augment(x, jnp.array([[1, 1]]), jnp.array([False]), 1)
  np.testing.assert_array_equal(same, x)  # offset s: no shift
  # Offset (0, 2): the view starts one row above and one column right of x.
  moved = dfkd.augment(x, jnp.array([[0, 2]]), jnp.array([False]), 1)
  np.testing.assert_array_equal(moved[0, :, :, 0],
                                [[0, 0, 0], [2, 3, 0], [5, 6, 0]])
  mirrored = dfkd.augment(x, jnp.array([[1, 1]]), jnp.array([True]), 0)
  np.testing.assert_array_equal(mirrored[0, :, :, 0],
                                [[3, 2, 1], [6, 5, 4], [9, 8, 7]])
  with pytest.raises(ValueError, match="augment_shift"):
    dfkd.DFKDHyperParams(augment_shift=-1)


def test_augmented_synthesis_keeps_the_draws_and_does_not_recompile(caplog):
  d, state, tv = _small(dict(generator_steps=2, pool_size=2))
  da, sa, _ = _small(dict(generator_steps=2, pool_size=2, augment_shift=1,
                          augment_flip=True))
  s1, _ = d.epoch(state, tv, ())
  a1, m = da.epoch(sa, tv, ())
  assert all(np.isfinite(float(v)) for v in m.values())
  # Same labels; the generator saw other views, so the kept batch differs.
  np.testing.assert_array_equal(s1.pool_y, a1.pool_y)
  assert not np.allclose(s1.pool_x, a1.pool_x)
  assert np.all((a1.pool_x[0] > 0) & (a1.pool_x[0] < 1))
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    a2, _ = da.epoch(a1, tv, ())
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert int(a2.epoch) == 2
