"""DisUE's inter-group aggregation: GLS, GWF, the losses, padding, rounds, resume."""

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import ensemble
from fedjax_dd.distill import iga
from fedjax_dd.models.cgenerator import CGeneratorA
from tests.conftest import tiny_task
from tests.conftest import x64

tree_map = jax.tree_util.tree_map
leaves = jax.tree_util.tree_leaves


# ----------------------------------------------------------------------------
# GLS and GWF.


def test_gls_allocation_hand_checked():
  p = iga.label_prior(jnp.array([[3, 1], [1, 3]]))
  np.testing.assert_allclose(p, [0.5, 0.5])
  np.testing.assert_array_equal(iga.allocate_labels(p, 6), [3, 3])
  # 2.5 / 2.5: the one label left over goes to the lower class on a tie.
  np.testing.assert_array_equal(iga.allocate_labels(p, 5), [3, 2])
  # p = (.5, .3, .2), B = 4: quotas 2, 1.2, .8 -> floors 2, 1, 0; the one
  # left goes to the largest remainder (class 2).
  p3 = iga.label_prior(jnp.array([[5, 0, 0], [0, 3, 2], [0, 0, 0]]))
  np.testing.assert_allclose(p3, [0.5, 0.3, 0.2], rtol=1e-6)
  np.testing.assert_array_equal(iga.allocate_labels(p3, 4), [2, 1, 1])
  np.testing.assert_array_equal(iga.allocate_labels(p3, 10), [5, 3, 2])
  # No counts at all: uniform.
  np.testing.assert_allclose(iga.label_prior(jnp.zeros((2, 4))), [0.25] * 4)
  # Sampled labels hold exactly the allocation, shuffled by the key.
  a = iga.sample_labels(jax.random.PRNGKey(0), p, 6)
  b = iga.sample_labels(jax.random.PRNGKey(1), p, 6)
  assert a.dtype == jnp.int32 and a.shape == (6,)
  np.testing.assert_array_equal(np.sort(a), [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(np.sort(b), [0, 0, 0, 1, 1, 1])
  c = iga.sample_labels(jax.random.PRNGKey(2), p3, 10)
  np.testing.assert_array_equal(np.bincount(c, minlength=3), [5, 3, 2])


def test_gwf_columns():
  counts = jnp.array([[3, 1, 0], [1, 3, 0], [0, 0, 0]])
  alpha = iga.class_weights(counts)
  np.testing.assert_allclose(alpha, [[0.75, 0.25, 0], [0.25, 0.75, 0],
                                     [0, 0, 0]])
  # Held classes sum to 1 over the teachers; class 2 (nobody) is 0.
  np.testing.assert_allclose(alpha.sum(0), [1, 1, 0])
  np.testing.assert_array_equal(iga.teacher_mask(counts), [True, True, False])
  np.testing.assert_allclose(iga.equal_weights(counts),
                             [[0.5] * 3, [0.5] * 3, [0] * 3])
  y = jnp.array([1, 0, 2])
  np.testing.assert_allclose(iga.sample_weights(alpha, y),
                             [[0.25, 0.75, 0], [0.75, 0.25, 0], [0, 0, 0]])


# ----------------------------------------------------------------------------
# Losses against numpy.


def _softmax(a):
  e = np.exp(a - a.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


T_LOGITS = np.array([[[1.0, 0.0, -1.0], [0.0, 2.0, 0.0]],
                     [[0.5, 0.5, 0.0], [3.0, 0.0, 1.0]]], np.float32)  # [2,2,3]
S_LOGITS = np.array([[0.0, 0.0, 0.0], [1.0, -1.0, 0.5]], np.float32)  # [2,3]
W = np.array([[0.25, 1.0], [0.75, 0.0]], np.float32)  # [K=2, B=2]


def test_cluster_distillation_loss_hand_computed():
  pt, ps = _softmax(T_LOGITS), _softmax(S_LOGITS)
  kl = np.sum(pt * (np.log(pt) - np.log(ps)[None]), -1)  # [K, B]
  l1 = np.sum(np.abs(pt - ps[None]), -1)
  l1_logits = np.mean(np.abs(T_LOGITS - S_LOGITS[None]), -1)
  for name, d in (("kl", kl), ("l1", l1), ("l1_logits", l1_logits)):
    want = np.mean(np.sum(W * d, 0))
    got = iga.cluster_distillation_loss(jnp.asarray(T_LOGITS),
                                        jnp.asarray(S_LOGITS), jnp.asarray(W),
                                        discrepancy=name)
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
  # Temperature 2 on KL: softmax of logits / 2, times T².
  pt2, ps2 = _softmax(T_LOGITS / 2), _softmax(S_LOGITS / 2)
  kl2 = np.sum(pt2 * (np.log(pt2) - np.log(ps2)[None]), -1) * 4
  np.testing.assert_allclose(
      iga.cluster_distillation_loss(T_LOGITS, S_LOGITS, W, temperature=2.0),
      np.mean(np.sum(W * kl2, 0)), rtol=1e-5)
  # A zero-weight teacher with non-finite logits changes nothing.
  bad = T_LOGITS.copy()
  bad[1, 1] = np.nan
  np.testing.assert_allclose(
      iga.cluster_distillation_loss(bad, S_LOGITS, W),
      np.mean(np.sum(W * kl, 0)), rtol=1e-5)
  with pytest.raises(ValueError, match="discrepancy"):
    iga.cluster_distillation_loss(T_LOGITS, S_LOGITS, W, discrepancy="js")


def test_cluster_fidelity_loss_weights_each_sample_once():
  y = np.array([0, 2])
  ce = -np.log(_softmax(T_LOGITS))[:, np.arange(2), y]  # [K, B]
  # Sample 0: .25·CE_00 + .75·CE_10; sample 1: 1·CE_01 + 0·CE_11.
  want = ((0.25 * ce[0, 0] + 0.75 * ce[1, 0]) + ce[0, 1]) / 2
  np.testing.assert_allclose(
      iga.cluster_fidelity_loss(T_LOGITS, jnp.asarray(y), W), want, rtol=1e-5)


def test_diversity_loss_forms():
  z = np.array([[0.0, 0.0], [1.0, 2.0], [3.0, -1.0]], np.float32)
  x = np.random.default_rng(0).normal(size=(3, 2, 2, 1)).astype(np.float32)
  xf = x.reshape(3, -1)
  fedgen = euclid = 0.0
  for i in range(3):
    for j in range(3):
      fedgen += (np.mean(np.abs(xf[i] - xf[j])) *
                 np.mean((z[i] - z[j]) ** 2))
      euclid += np.linalg.norm(xf[i] - xf[j]) * np.linalg.norm(z[i] - z[j])
  np.testing.assert_allclose(iga.diversity_loss(z, x), np.exp(-fedgen / 9),
                             rtol=1e-5)
  np.testing.assert_allclose(iga.diversity_loss(z, x, "euclidean"),
                             np.exp(-euclid / 9), rtol=1e-5)
  # Identical samples: no diversity, loss 1; finite gradient at i = j.
  g = jax.grad(lambda x: iga.diversity_loss(z, x, "euclidean"))(
      jnp.zeros((3, 4)))
  assert np.all(np.isfinite(g))
  np.testing.assert_allclose(iga.diversity_loss(z, jnp.zeros((3, 4))), 1.0)


def test_hparams_validation_and_factory_checks():
  for bad in (dict(iterations=0), dict(student_steps=0), dict(lr_decay=0.0),
              dict(beta_cf=-1.0), dict(discrepancy="js"),
              dict(student_discrepancy="x"), dict(diversity="l3")):
    with pytest.raises(ValueError):
      iga.IGAHyperParams(**bad)
  assert iga.IGAHyperParams(discrepancy="l1").student_d == "l1"
  assert iga.IGAHyperParams(discrepancy="l1_logits",
                            student_discrepancy="kl").student_d == "kl"
  task = tiny_task()
  with pytest.raises(ValueError, match="conditional"):
    iga.make_iga(task, models.Generator(out_shape=(4, 4, 1), nz=4),
                 num_teachers_max=2, input_fn=lambda x: x)
  with pytest.raises(ValueError, match="classes"):
    iga.make_iga(task, CGeneratorA(out_shape=(4, 4, 1), nz=4, num_classes=5),
                 num_teachers_max=2)


# ----------------------------------------------------------------------------
# Rounds on a tiny problem: K_max = 3 TinyBNNet teachers, 4x4x1 samples.

K_MAX = 3
GEN = CGeneratorA(out_shape=(4, 4, 1), nz=4, ngf=4, num_classes=3)
# student_lr 0.6 on the class-averaged loss (C = 3) is the step of 0.2 on
# the summed one.
HP = iga.IGAHyperParams(iterations=2, generator_steps=1, student_steps=2,
                        batch_size=8, student_lr=0.6)


def _stack(task, seeds):
  inits = [task.init(jax.random.PRNGKey(s)) for s in seeds]
  return (tree_map(lambda *a: jnp.stack(a), *[i[0] for i in inits]),
          tree_map(lambda *a: jnp.stack(a), *[i[1] for i in inits]))


@pytest.fixture(scope="module")
def problem():
  task = tiny_task(bn=True)
  loop = iga.make_iga(task, GEN, hparams=HP, num_teachers_max=K_MAX)
  tp, ts = _stack(task, [11, 12, 13])
  sp, ss = task.init(jax.random.PRNGKey(9))
  state = loop.init(jax.random.PRNGKey(3), sp, ss)
  counts = jnp.array([[6, 1, 0], [0, 2, 5], [1, 1, 1]], jnp.int32)
  return task, loop, state, (sp, ss), (tp, ts), counts


def _same(a, b):
  for x, y in zip(leaves(a), leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_shapes_finite_and_no_recompile_when_k_changes(caplog, problem):
  _, loop, state, (sp, ss), (tp, ts), counts = problem
  s1, sp1, ss1, m = loop.round(state, sp, ss, tp, ts, counts, 0)
  assert int(s1.rounds) == 1 and int(m["num_teachers"]) == 3
  for k in ("gen_loss", "gen_cd", "gen_cf", "gen_div", "ensemble_accuracy",
            "student_cd"):
    assert np.isfinite(float(m[k])), k
  assert 0 < float(m["gen_div"]) <= 1
  moved = lambda a, b: any(not np.array_equal(x, y)
                           for x, y in zip(leaves(a), leaves(b)))
  assert moved(state.gen_params, s1.gen_params)
  assert moved(state.gen_stats, s1.gen_stats)
  assert moved(sp, sp1) and moved(ss, ss1)
  k2 = counts.at[2].set(0)
  k1 = k2.at[1].set(0)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    # K = 2, then K = 1 real teachers, other rounds t: nothing compiles.
    s2, sp2, ss2, m2 = loop.round(s1, sp1, ss1, tp, ts, k2, 1)
    s3, _, _, m3 = loop.round(s2, sp2, ss2, tp, ts, k1, 7)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert int(m2["num_teachers"]) == 2 and int(m3["num_teachers"]) == 1
  assert int(s3.rounds) == 3


def test_padded_teachers_change_nothing(problem):
  _, loop, state, (sp, ss), (tp, ts), counts = problem
  k2 = counts.at[2].set(0)  # teacher 2 is padding.
  runs = []
  for fill in (np.nan, 1e30):
    gp = tree_map(lambda a: a.at[2].set(fill), tp)
    gs = tree_map(lambda a: a.at[2].set(-fill), ts)
    s, p, b, m = loop.round(state, sp, ss, gp, gs, k2, 0)
    assert np.isfinite(float(m["gen_loss"]))
    runs.append((s, p, b))
  _same(runs[0], runs[1])


def test_a_shorter_stack_is_padded_to_k_max(problem):
  # A Bernoulli cohort hands IGA K < K_max teachers: the round pads them
  # with zero count rows, and is the round of a stack padded by the caller
  # (whatever the padded slot held: test_padded_teachers_change_nothing).
  task, loop, state, (sp, ss), (tp, ts), counts = problem
  padded = loop.round(state, sp, ss, tp, ts, counts.at[2].set(0), 0)
  short = loop.round(state, sp, ss, tree_map(lambda a: a[:2], tp),
                     tree_map(lambda a: a[:2], ts), counts[:2], 0)
  _same(padded[:3], short[:3])
  assert int(short[3]["num_teachers"]) == 2
  with pytest.raises(ValueError, match=r"1 <= K <= K_max=3"):
    loop.round(state, sp, ss, *_stack(task, [1, 2, 3, 4]),
               jnp.ones((4, 3), jnp.int32), 0)
  with pytest.raises(ValueError, match=r"stacked \[K=2"):
    loop.round(state, sp, ss, tp, ts, counts[:2], 0)


def test_padded_slot_matches_fewer_slots():
  # Two teachers stacked in K_max = 3 slots (one padded) and in K_max = 2
  # give the same round. The batched teacher programs differ with K_max, so
  # the two agree to rounding, not bitwise; Adam then scales each generator
  # gradient by its own size, so a parameter whose exact gradient is zero
  # would turn that rounding into steps of the learning rate. Such are the
  # biases before a BatchNorm: the conv biases (hence conv_bias=False) and,
  # at 4x4 where the first map is 1x1, the dense ones (hence 8x8 here).
  task = tiny_task(bn=True, input_shape=(8, 8, 1))
  gen = CGeneratorA(out_shape=(8, 8, 1), nz=4, ngf=4, num_classes=3,
                    conv_bias=False)
  tp, ts = _stack(task, [11, 12, 13])
  sp, ss = task.init(jax.random.PRNGKey(9))
  counts = jnp.array([[6, 1, 0], [0, 2, 5], [0, 0, 0]], jnp.int32)
  runs = []
  for k_max in (3, 2):
    loop = iga.make_iga(task, gen, hparams=HP, num_teachers_max=k_max)
    state = loop.init(jax.random.PRNGKey(3), sp, ss)
    s, p, b, _ = loop.round(state, sp, ss,
                            tree_map(lambda a: a[:k_max], tp),
                            tree_map(lambda a: a[:k_max], ts),
                            counts[:k_max], 0)
    runs.append((s, p, b))
  for x, y in zip(leaves(runs[0]), leaves(runs[1])):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                               atol=1e-6)


def _eval_cd(task, sp, ss, tp, ts, counts, state):
  """L_cd of the student on 64 fixed samples of the state's generator."""
  z = jax.random.normal(jax.random.PRNGKey(100), (64, 4))
  y = iga.sample_labels(jax.random.PRNGKey(101), iga.label_prior(counts), 64)
  x, _ = ensemble.apply_generator(GEN, state.gen_params, state.gen_stats, z, y,
                                  False)
  t = jax.vmap(lambda p, s: task.apply(p, s, x, train=False)[0])(tp, ts)
  s, _ = task.apply(sp, ss, x, train=False)
  w = iga.sample_weights(iga.class_weights(counts), y)
  return float(iga.cluster_distillation_loss(t, s, w))


def test_rounds_move_the_student_towards_the_teachers(problem):
  task, loop, state, (sp, ss), (tp, ts), counts = problem
  # Confident teachers (scaled weights), so L_cd starts well above 0.
  tp = tree_map(lambda a: 3.0 * a, tp)
  s, p, b = state, sp, ss
  for t in range(4):
    s, p, b, _ = loop.round(s, p, b, tp, ts, counts, t)
  # On the final generator's samples the distilled student is closer to the
  # weighted teachers than the initial student.
  before = _eval_cd(task, sp, ss, tp, ts, counts, s)
  after = _eval_cd(task, p, b, tp, ts, counts, s)
  assert after < 0.8 * before, (before, after)


def test_state_checkpoint_round_trip_and_resume(tmp_path, problem):
  _, loop, state, (sp, ss), (tp, ts), counts = problem
  s1, sp1, ss1, _ = loop.round(state, sp, ss, tp, ts, counts, 0)
  with CheckpointStore(tmp_path / "ck", max_to_keep=1) as store:
    store.save(1, s1, {"round": 1}, force=True)
  template = loop.init(jax.random.PRNGKey(123), sp, ss)
  with CheckpointStore(tmp_path / "ck", max_to_keep=1) as store:
    step, restored, meta = store.restore(template)
  assert step == 1 and meta == {"round": 1}
  assert isinstance(restored, iga.IGAState)
  _same(s1, restored)
  a = loop.round(s1, sp1, ss1, tp, ts, counts, 1)
  b = loop.round(restored, sp1, ss1, tp, ts, counts, 1)
  _same(a[:3], b[:3])


def test_ablations_and_fedftg_variant_run():
  task = tiny_task()  # no BatchNorm: empty teacher batch_stats.
  hp = iga.IGAHyperParams(iterations=1, generator_steps=2, student_steps=1,
                          batch_size=6, use_gls=False, use_gwf=False,
                          beta_cf=0.0, beta_div=0.0,
                          discrepancy="l1_logits", student_discrepancy="kl",
                          diversity="euclidean", fresh_samples=False)
  loop = iga.make_iga(task, GEN, hparams=hp, num_teachers_max=2)
  tp, ts = _stack(task, [1, 2])
  sp, ss = task.init(jax.random.PRNGKey(0))
  state = loop.init(jax.random.PRNGKey(0), sp, ss)
  counts = jnp.array([[4, 0, 0], [0, 0, 0]])  # one real teacher, one class.
  s, p, _, m = loop.round(state, sp, ss, tp, ts, counts, 0)
  assert all(np.isfinite(float(v)) for v in m.values())
  assert int(m["num_teachers"]) == 1
  assert any(not np.array_equal(x, y) for x, y in zip(leaves(sp), leaves(p)))


def test_student_step_is_fedftgs_sgd_step():
  """One student step is FedFTG's: SGD (lr, weight decay) on
  ``mean_{i,c} −log σ(S_i)_c · Σ_k w_ki σ(P_ki)_c``, whose lr was set for a
  loss averaged over the B·C entries (not a KL summed over the classes)."""
  task = tiny_task(bn=True)
  hp = iga.IGAHyperParams(iterations=1, generator_steps=1, student_steps=1,
                          batch_size=8, student_lr=0.3,
                          student_weight_decay=0.01)
  loop = iga.make_iga(task, GEN, hparams=hp, num_teachers_max=K_MAX)
  _, programs = loop.round.args[:2]
  tp, ts = _stack(task, [11, 12, 13])
  tp = tree_map(lambda a: 3.0 * a, tp)  # confident teachers
  sp, ss = task.init(jax.random.PRNGKey(9))
  state = loop.init(jax.random.PRNGKey(3), sp, ss)
  counts = jnp.array([[6, 1, 0], [0, 2, 5], [1, 1, 1]], jnp.float32)
  t = 4.0
  draw = programs.draw(state.key, state.rounds, counts)
  setup, _ = programs.setup(state.gen_params, tp, ts, counts, t)
  j = 1  # the student's slot (after the one generator slot)
  new_p, _, _ = programs.student_step(sp, ss, state.gen_params,
                                      state.gen_stats, setup, draw, 0, j)
  # The reference, written out from FedFTG's student update.
  z, y = draw.z[0, j], draw.y[0, j]
  x, _ = ensemble.apply_generator(GEN, state.gen_params, state.gen_stats, z,
                                  y, False)
  t_logits = jax.vmap(lambda p, s: task.apply(p, s, x, train=False)[0])(tp, ts)
  w = iga.class_weights(counts)[:, y]  # [K, B]
  merged = jnp.einsum("kb,kbc->bc", w, jax.nn.softmax(t_logits, -1))

  def fedftg_loss(p):
    s_logits, _ = task.apply(p, ss, x, train=True)
    return jnp.mean(-jax.nn.log_softmax(s_logits, -1) * merged)

  g = jax.grad(fedftg_loss)(sp)
  lr = 0.3 * 0.998**t
  ref = tree_map(lambda p, g: p - lr * (g + 0.01 * p), sp, g)
  moved = sum(float(jnp.sum(jnp.abs(a - b)))
              for a, b in zip(leaves(ref), leaves(sp)))
  assert moved > 1e-3
  for a, b in zip(leaves(new_p), leaves(ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                               atol=1e-6)


# ----------------------------------------------------------------------------
# FedFTG's generator schedule: one step per real teacher.


def test_per_teacher_objectives_are_each_teachers_share_of_eq13(problem):
  """Teacher k's objective is β_cf·L_cf^k + β_div·L_div/K − L_cd^k, written
  out from the teachers' logits; the K objectives sum to the summed one."""
  task, loop, state, (sp, ss), (tp, ts), counts = problem
  counts = counts.at[1].set(0)  # real teachers 0 and 2, slot 1 padded.
  lp, programs = loop.round.args[:2]
  draw = programs.draw(state.key, state.rounds, counts)
  setup, _ = programs.setup(state.gen_params, tp, ts, counts, 0.0)
  z, y = draw.z[0, 0], draw.y[0, 0]
  loss = lambda k: iga._generator_loss(lp, state.gen_params, state.gen_stats,
                                       sp, ss, setup, z, y, k)
  summed, (_, m_sum) = loss(None)
  x, _ = ensemble.apply_generator(GEN, state.gen_params, state.gen_stats, z,
                                  y, True)
  s_logits, _ = task.apply(sp, ss, x, train=False)
  alpha = iga.class_weights(counts)
  div = float(iga.diversity_loss(z, x))
  total = 0.0
  for k in (0, 2):
    got, (_, m) = loss(jnp.int32(k))
    t_k = task.apply(tree_map(lambda a: a[k], tp),
                     tree_map(lambda a: a[k], ts), x, train=False)[0]
    w = alpha[k, y]  # [B]
    kl = jnp.sum(jax.nn.softmax(t_k) * (jax.nn.log_softmax(t_k) -
                                        jax.nn.log_softmax(s_logits)), -1)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(t_k), y[:, None], 1)[:, 0]
    want = float(jnp.mean(w * ce) + div / 2 - jnp.mean(w * kl))
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)
    assert "ensemble_accuracy" not in m
    total += float(got)
  np.testing.assert_allclose(total, float(summed), rtol=1e-5, atol=1e-6)
  assert "ensemble_accuracy" in m_sum


def test_per_teacher_round_one_teacher_equals_summed_and_no_recompile(
    caplog, problem):
  counts = problem[-1]
  one = counts.at[1:].set(0)
  # The two schedules batch the teachers differently, so they agree to
  # rounding only; 8x8 samples and no pre-BatchNorm conv biases keep Adam
  # from turning that rounding into steps (see the padded-slot test above).
  task = tiny_task(bn=True, input_shape=(8, 8, 1))
  gen = CGeneratorA(out_shape=(8, 8, 1), nz=4, ngf=4, num_classes=3,
                    conv_bias=False)
  tp, ts = _stack(task, [11, 12, 13])
  sp, ss = task.init(jax.random.PRNGKey(9))
  # 2 iterations of 3 student steps: the 2·K generator steps of K = 2 and 1
  # are counts no earlier round had, so a per-step stack would compile.
  base = dataclasses.replace(HP, student_steps=3)
  hp = dataclasses.replace(base, generator_per_teacher=True)
  per = iga.make_iga(task, gen, hparams=hp, num_teachers_max=K_MAX)
  summed = iga.make_iga(task, gen, hparams=base, num_teachers_max=K_MAX)
  state = per.init(jax.random.PRNGKey(3), sp, ss)
  # With one real teacher the two schedules make the same steps.
  a = per.round(state, sp, ss, tp, ts, one, 0)
  b = summed.round(state, sp, ss, tp, ts, one, 0)
  for x, y in zip(leaves(a[:3]), leaves(b[:3])):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                               atol=1e-6)
  # With three, the generator makes three steps per iteration, not one, and
  # ends elsewhere; K = 3, 2, 1 compile nothing new.
  c = per.round(state, sp, ss, tp, ts, counts, 0)
  d = summed.round(state, sp, ss, tp, ts, counts, 0)
  assert any(not np.allclose(x, y) for x, y in
             zip(leaves(c[0].gen_params), leaves(d[0].gen_params)))
  # The count edits are eager scatters that compile on their own; only the
  # rounds are watched.
  two = counts.at[2].set(0)
  one_left = two.at[1].set(0)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    s2 = per.round(c[0], *c[1:3], tp, ts, two, 1)
    per.round(s2[0], *s2[1:3], tp, ts, one_left, 2)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  with pytest.raises(ValueError, match="every row of class_counts is 0"):
    per.round(state, sp, ss, tp, ts, jnp.zeros_like(counts), 0)


# ----------------------------------------------------------------------------
# The jitted steps' gradients.


@pytest.mark.slow
def test_jitted_gradients_equal_the_eager_ones_in_float64():
  """The generator's gradient and the student's step, jitted as the round
  runs them, equal the eager ones. XLA:CPU once computed max-pool's gradient
  wrongly in jitted programs after a BatchNorm (models' float64 tests); here
  the teachers and the student are CNN3 (BatchNorm before each max-pool) and
  the generator has BatchNorm too. In float64 only such a mismatch, not
  rounding, exceeds the tolerance."""
  shape = (8, 8, 3)
  task = Classifier(module=models.CNN3(3), input_shape=shape,
                    preprocess=lambda x: x, num_classes=3)
  gen = CGeneratorA(out_shape=shape, nz=4, ngf=4, num_classes=3)
  loop_fn = iga.make_iga(task, gen, num_teachers_max=K_MAX,
                         hparams=dataclasses.replace(HP, batch_size=6))
  loop, programs = loop_fn.round.args[:2]
  tp, ts = _stack(task, [11, 12, 13])
  sp, ss = task.init(jax.random.PRNGKey(9))
  state = loop_fn.init(jax.random.PRNGKey(3), sp, ss)
  counts = jnp.array([[6, 1, 0], [0, 2, 5], [0, 0, 0]], jnp.float32)
  draw = programs.draw(state.key, state.rounds, counts)
  with x64():
    f64 = lambda t: tree_map(
        lambda a: a.astype(jnp.float64)
        if jnp.issubdtype(a.dtype, jnp.floating) else a, t)
    tp, ts, sp, ss = f64((tp, ts, sp, ss))
    gp, gs, z = f64((state.gen_params, state.gen_stats, draw.z))
    setup, _ = iga._setup(loop, gp, tp, ts, counts, jnp.float64(2.0))
    setup = f64(setup)
    y = draw.y[0, 0]

    def generator_grads(params):
      return jax.grad(functools.partial(iga._generator_loss, loop),
                      has_aux=True)(params, gs, sp, ss, setup, z[0, 0], y,
                                    None)[0]

    def student_update(params):
      # The student step itself (slot 1 of iteration 0): its update is
      # −lr·(gradient + weight decay·params).
      new, _, _ = iga._student_step(loop, params, ss, gp, gs, setup,
                                    draw._replace(z=z), 0, 1)
      return tree_map(jnp.subtract, new, params)

    for fn, arg in ((generator_grads, gp), (student_update, sp)):
      eager, jitted = fn(arg), jax.jit(fn)(arg)
      scale = max(float(jnp.max(jnp.abs(g))) for g in leaves(eager))
      assert scale > 0
      for a, b in zip(leaves(jitted), leaves(eager)):
        assert a.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12,
                                   atol=1e-12 * scale)


def test_cd_through_teachers_false_stops_only_l_cd_at_the_teachers(problem):
  """With ``cd_through_teachers=False`` the generator's gradient is that of
  ``β_cf·L_cf + β_div·L_div − L_cd`` with the teachers' logits held constant
  inside ``L_cd`` only (FedFTG's ``t_logit.detach()``); the objective's
  value is unchanged, and with the default the gradient differs."""
  task, _, state, (sp, ss), (tp, ts), counts = problem
  gs = state.gen_stats

  def grads(hp):
    loop_fn = iga.make_iga(task, GEN, hparams=hp, num_teachers_max=K_MAX)
    loop, programs = loop_fn.round.args[:2]
    draw = programs.draw(state.key, state.rounds, counts)
    setup, _ = programs.setup(state.gen_params, tp, ts, counts, 0.0)
    z, y = draw.z[0, 0], draw.y[0, 0]
    value, g = jax.value_and_grad(
        lambda p: iga._generator_loss(loop, p, gs, sp, ss, setup, z, y,
                                      None)[0])(state.gen_params)
    return loop, setup, z, y, float(value), g

  hp = dataclasses.replace(HP, discrepancy="l1_logits",
                           cd_through_teachers=False)
  loop, setup, z, y, value, got = grads(hp)

  def written_out(p):
    x, _ = ensemble.apply_generator(GEN, p, gs, z, y, True)
    t, _ = loop.teachers(setup.teacher_vars, x)  # [K, B, C]
    s, _ = task.apply(sp, ss, x, train=False)
    w = iga.sample_weights(setup.alpha, y)  # [K, B]
    cd = jnp.mean(jnp.sum(w * jnp.mean(jnp.abs(jax.lax.stop_gradient(t) -
                                               s[None]), -1), 0))
    ce = -jnp.take_along_axis(jax.nn.log_softmax(t), y[None, :, None],
                              -1)[..., 0]
    cf = jnp.mean(jnp.sum(w * ce, 0))
    return cf + iga.diversity_loss(z, x) - cd

  want_value, want = jax.value_and_grad(written_out)(state.gen_params)
  np.testing.assert_allclose(value, float(want_value), rtol=1e-5)
  for a, b in zip(leaves(got), leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4,
                               atol=1e-6)
  _, _, _, _, value_default, default = grads(
      dataclasses.replace(hp, cd_through_teachers=True))
  np.testing.assert_allclose(value_default, value, rtol=1e-6)
  assert any(not np.allclose(a, b, rtol=1e-3, atol=1e-6)
             for a, b in zip(leaves(default), leaves(got)))
