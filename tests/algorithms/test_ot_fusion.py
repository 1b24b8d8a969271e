"""OT fusion: permuted copies of one network fuse back to it.

The transports are checked exactly (they are 0/1 matrices); the fused
parameters to float rounding, since ``ω_1·x + ω_2·x`` need not be ``x``.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.algorithms import one_shot
from fedjax_dd.core.algorithm import Teachers
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import ensemble
from fedjax_dd.models.fedhydra_cnn import ConvBNNet
from fedjax_dd.models.layers import LayerSet
from tests.conftest import tiny_task
from tests.core import test_server as ts

ot_fusion = pytest.importorskip("ot") and pytest.importorskip(
    "fedjax_dd.algorithms.ot_fusion")

_PERM_A = np.array([3, 0, 7, 5, 1, 6, 2, 4])


def _leaves(tree):
  return [np.asarray(v) for v in jax.tree_util.tree_leaves(tree)]


def _randomised_stats(stats, seed):
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda v: jnp.asarray(rng.uniform(0.5, 2.0, v.shape), v.dtype), stats)


def _mlp_models():
  """TinyBNNet A and B = A with its 8 hidden units permuted (same function)."""
  task = tiny_task(bn=True)
  p, s = task.init(jax.random.PRNGKey(0))
  s = _randomised_stats(s, 0)
  # Non-zero biases and BatchNorm offsets, so that they must move too.
  pa = _randomised_stats(p, 1)
  pb = {
      "Dense_0": {"kernel": pa["Dense_0"]["kernel"][:, _PERM_A],
                  "bias": pa["Dense_0"]["bias"][_PERM_A]},
      "BatchNorm_0": {k: v[_PERM_A] for k, v in pa["BatchNorm_0"].items()},
      "Dense_1": {"kernel": pa["Dense_1"]["kernel"][_PERM_A],
                  "bias": pa["Dense_1"]["bias"]},
  }
  sb = {"BatchNorm_0": {k: v[_PERM_A] for k, v in s["BatchNorm_0"].items()}}
  return task, (pa, s), (pb, sb)


def _stack(*models):
  return jax.tree_util.tree_map(lambda *v: jnp.stack(v), *models)


def _fuse(task, models, weights, **kw):
  group = ensemble.TeacherGroup(task, lambda v: v, tuple(range(len(models))))
  algo = ot_fusion.ot_fusion(None, (group,), **kw)
  teachers = Teachers(vars=(_stack(*models),),
                      num_examples=jnp.asarray(weights, jnp.int32))
  setup = algo.setup(teachers, jax.random.PRNGKey(0))
  state = algo.init(jax.random.PRNGKey(1), setup, teachers, None, None)
  return algo, setup, state, teachers


def test_transport_of_a_hand_checked_cost_is_the_permutation():
  # Neuron 0 of the model is closest to anchor neuron 1 and vice versa.
  m = ot_fusion.transport(np.array([[5.0, 1.0], [1.0, 5.0]]))
  np.testing.assert_array_equal(m, [[0.0, 1.0], [1.0, 0.0]])
  # Three neurons: the cheapest assignment (0->2, 1->0, 2->1; cost 3) beats
  # the greedy diagonal (cost 3.3).
  cost = np.array([[1.1, 9.0, 1.0], [1.0, 1.1, 9.0], [9.0, 1.0, 1.1]])
  np.testing.assert_array_equal(ot_fusion.transport(cost),
                                [[0, 1, 0], [0, 0, 1], [1, 0, 0]])


@pytest.mark.parametrize("mode", ["weights", "activations"])
def test_permuted_mlp_fuses_back_to_the_anchor(mode):
  task, a, b = _mlp_models()
  x = np.random.default_rng(1).integers(0, 256, (20, 4, 4, 1), np.uint8)
  kw = dict(mode=mode, samples=x if mode == "activations" else None)
  # 1 example on A, 3 on B: plain averaging would weigh B's units 3:1 into
  # the wrong slots; aligned, both are A.
  algo, setup, state, teachers = _fuse(task, [a, b], [1, 3], **kw)
  t = np.asarray(setup["transport_0"])
  assert t.shape == (2, 8, 8)
  np.testing.assert_array_equal(t[0], np.eye(8))
  # Anchor unit j = B's unit i with PERM[i] = j: M[PERM[i], i] = 1.
  np.testing.assert_array_equal(t[1], np.eye(8)[:, _PERM_A])
  for got, want in zip(_leaves((state["params"], state["batch_stats"])),
                       _leaves(a)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  # Every hidden unit of B moves (PERM_A has no fixed point), and each
  # moves whole.
  assert algo.report(state, setup) == {"transport_off_permutation": [0.0],
                                       "transport_off_identity": [1.0]}
  avg = one_shot.average(teachers)
  assert not np.allclose(avg[0]["Dense_0"]["kernel"], a[0]["Dense_0"]["kernel"])
  # With B as the anchor the fusion is B.
  _, _, state_b, _ = _fuse(task, [a, b], [1, 3], anchor=1, **kw)
  for got, want in zip(_leaves((state_b["params"], state_b["batch_stats"])),
                       _leaves(b)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_permuted_cnn_fuses_back_through_the_flatten():
  # Two conv blocks and a dense layer on the flattened [2, 2, 4] features:
  # conv2's inputs, fc's rows (channel fastest) move with the transports.
  task = Classifier(module=ConvBNNet(num_classes=3, features=(3, 4),
                                     kernel_size=3,
                                     layers=LayerSet(conv_impl="lax")),
                    input_shape=(8, 8, 1),
                    preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                    num_classes=3)
  p, s = task.init(jax.random.PRNGKey(0))
  p, s = _randomised_stats(p, 2), _randomised_stats(s, 3)
  layers = ot_fusion.layer_chain(task, p, s)
  assert [(l.path, l.in_features, l.out_features, l.norms) for l in layers] == [
      (("conv1",), 1, 3, (("bn1",),)), (("conv2",), 3, 4, (("bn2",),)),
      (("fc",), 16, 3, ())]
  p1, p2 = np.array([2, 0, 1]), np.array([1, 3, 0, 2])
  fc = np.asarray(p["fc"]["kernel"]).reshape(4, 4, 3)[:, p2].reshape(16, 3)
  q = {"conv1": {"kernel": p["conv1"]["kernel"][..., p1]},
       "bn1": {k: v[p1] for k, v in p["bn1"].items()},
       "conv2": {"kernel": p["conv2"]["kernel"][:, :, p1][..., p2]},
       "bn2": {k: v[p2] for k, v in p["bn2"].items()},
       "fc": {"kernel": jnp.asarray(fc), "bias": p["fc"]["bias"]}}
  r = {"bn1": {k: v[p1] for k, v in s["bn1"].items()},
       "bn2": {k: v[p2] for k, v in s["bn2"].items()}}
  x = jax.random.uniform(jax.random.PRNGKey(4), (5, 8, 8, 1))
  # The permuted network computes the same function.
  np.testing.assert_allclose(task.apply(q, r, x, train=False)[0],
                             task.apply(p, s, x, train=False)[0], rtol=1e-5)
  algo, setup, state, _ = _fuse(task, [(p, s), (q, r)], [2, 5])
  np.testing.assert_array_equal(setup["transport_1"][1], np.eye(4)[:, p2])
  # Two models with one start: every transport is the identity.
  same, same_setup, _, _ = _fuse(task, [(p, s), (p, s)], [2, 5])
  assert same.report(None, same_setup)["transport_off_identity"] == [0.0, 0.0]
  # A third model equal to the anchor halves the moved share: 3 of 3 conv1
  # units move in one of the two non-anchor models.
  three, three_setup, _, _ = _fuse(task, [(p, s), (q, r), (p, s)], [2, 5, 1])
  assert three.report(None, three_setup)["transport_off_identity"] == [0.5,
                                                                       0.5]
  for got, want in zip(_leaves((state["params"], state["batch_stats"])),
                       _leaves((p, s))):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_refusals():
  task = tiny_task(bn=True)
  g = ensemble.TeacherGroup(task, lambda v: v, (0, 1))
  with pytest.raises(ValueError, match="one client architecture"):
    ot_fusion.ot_fusion(None, (g, g))
  with pytest.raises(ValueError, match="mode"):
    ot_fusion.ot_fusion(None, (g,), mode="acts")
  with pytest.raises(ValueError, match="needs samples"):
    ot_fusion.ot_fusion(None, (g,), mode="activations")
  with pytest.raises(ValueError, match="anchor"):
    ot_fusion.ot_fusion(None, (g,), anchor=2)


# Every stage boundary of a one-shot method without epochs.
_GAUNTLET = (("client_stage", 1), ("setup", 1), ("init", 1), ("row", 1))


def test_killed_at_every_stage_resumes_bit_identically(tmp_path, caplog):
  task, data, groups, stage, evaluate = ts._problem()
  algo = ot_fusion.ot_fusion(stage, groups)
  full = ts._run(algo, data, task, evaluate, tmp_path / "full", num_epochs=0)
  assert [r["epoch"] for r in full[1]] == [0]
  # The ledger holds the four clients' model uploads (float32 parameters)
  # and nothing else.
  ledger = full[0].ledger.cumulative()
  size = sum(np.asarray(v).size for v in jax.tree_util.tree_leaves(
      task.init(jax.random.PRNGKey(0))[0]))
  assert ledger["bytes_uploaded"] == 4 * size * 4
  assert ledger["bytes_downloaded"] == 0
  part = tmp_path / "part"
  for point, n in _GAUNTLET:
    plan = ts._KillPlan(point, n)
    with pytest.raises(ts.Killed):
      ts._run(plan.wrap(algo), data, task, evaluate, part,
              writer=ts._KillingWriter(part / "metrics.jsonl", plan),
              num_epochs=0)
  resumed = ts._run(algo, data, task, evaluate, part, num_epochs=0)
  ts._assert_same(full, resumed)
  # Fusing the same shapes again compiles nothing new.
  teachers = resumed[0].teachers
  setup = algo.setup(teachers, jax.random.PRNGKey(0))
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    algo.init(jax.random.PRNGKey(0), setup, teachers, None, None)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
