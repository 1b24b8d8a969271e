"""FedHydra: Eq. 2 guards, SA against a NumPy transcription, stratification, local stage."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd import models
from fedjax_dd.algorithms import stratify as st
from fedjax_dd.algorithms.one_shot import local_stage
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.algorithms import stages
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import ensemble
from tests.conftest import synthetic_clients, tiny_task


def test_uncertainty_hand_computed_and_guards():
  # m = 2 clients, c = 2 classes, T = 3.
  curves = jnp.array([
      [[4.0, 2.0, 1.0],    # u = (4 − 1)/1 = 3
       [2.0, 2.0, 2.0]],   # flat: u = 0
      [[1.0, 0.5, 0.5],    # u = 0.5/0.5 = 1
       [3.0, 1.0, 0.0]],   # min L = 0: floored, finite and huge
  ])
  s = st.stratification_from_curves(curves)
  u = np.asarray(s.u)
  assert u.shape == (2, 2)  # [c, m]
  np.testing.assert_allclose(u[0], [3.0, 1.0])
  assert u[1, 0] == 0.0 and u[1, 1] == pytest.approx(3.0 / st.MIN_LOSS_FLOOR)
  assert np.all(np.isfinite(s.u_r)) and np.all(np.isfinite(s.u_c))
  np.testing.assert_allclose(s.u_r[0], [0.75, 0.25])
  np.testing.assert_allclose(s.u_r[1], [0.0, 1.0])
  np.testing.assert_allclose(s.u_c[:, 0], [1.0, 0.0])
  np.testing.assert_allclose(np.asarray(s.u_r).sum(1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(s.u_c).sum(0), 1.0, rtol=1e-6)
  # All-zero rows / columns fall back to uniform weights; NaN curves to u = 0.
  zero = np.asarray(st.normalise_rows(jnp.zeros((3, 4))))
  np.testing.assert_allclose(zero, 0.25)
  np.testing.assert_allclose(st.normalise_cols(jnp.zeros((3, 4))), 1 / 3)
  nan = st.uncertainty(jnp.array([[[np.nan, 1.0]]]))
  assert float(nan[0, 0]) == 0.0


def _sa_numpy(logits, y, u_r, u_c):
  """Eqs. 8–11 written with loops."""
  m, b, c = logits.shape
  out = np.zeros((b, c))
  for i in range(b):
    for k in range(m):
      p_hat = logits[k, i] * u_c[:, k]        # Eq. 8: P̂_k = P_k ⊙ U_c[:, k]
      out[i] += u_r[y[i], k] * p_hat          # Eqs. 9–11
  return out


def test_stratified_ensemble_matches_numpy():
  rng = np.random.default_rng(0)
  m, b, c = 3, 5, 4
  logits = rng.normal(size=(m, b, c))
  y = rng.integers(0, c, b)
  u = rng.uniform(size=(c, m))
  u_r = u / u.sum(1, keepdims=True)
  u_c = u / u.sum(0, keepdims=True)
  got = st.stratified_ensemble(jnp.asarray(logits, jnp.float32), jnp.asarray(y),
                               (jnp.asarray(u_r), jnp.asarray(u_c)))
  np.testing.assert_allclose(got, _sa_numpy(logits, y, u_r, u_c), rtol=1e-5,
                             atol=1e-6)
  # Uniform U reduces SA to the average scaled by 1/c.
  flat = st.stratified_ensemble(jnp.asarray(logits), jnp.asarray(y),
                                (jnp.full((c, m), 1 / m), jnp.full((c, m), 1 / c)))
  np.testing.assert_allclose(flat, logits.mean(0) / c, rtol=1e-5, atol=1e-6)
  # sa_context rescales U_c by c: uniform U then gives exactly the average,
  # and an informative U gives c times Eqs. 8-11.
  curves = np.ones((m, c, 3), np.float32)
  curves[..., 0] = 2.0  # u = (2 - 1) / 1 = 1 for every pair
  uniform = st.stratification_from_curves(jnp.asarray(curves))
  np.testing.assert_allclose(uniform.u, np.ones((c, m)))
  ae = st.stratified_ensemble(jnp.asarray(logits, jnp.float32), jnp.asarray(y),
                              st.sa_context(uniform))
  np.testing.assert_allclose(ae, logits.mean(0), rtol=1e-5, atol=1e-6)
  literal = st.sa_context(uniform, average_scale=False)
  np.testing.assert_allclose(literal[1], np.full((c, m), 1 / c), rtol=1e-6)
  s = st.Stratification(curves=None, u=jnp.asarray(u), u_r=jnp.asarray(u_r),
                        u_c=jnp.asarray(u_c))
  scaled = st.stratified_ensemble(jnp.asarray(logits, jnp.float32),
                                  jnp.asarray(y), st.sa_context(s))
  np.testing.assert_allclose(scaled, c * _sa_numpy(logits, y, u_r, u_c),
                             rtol=1e-5, atol=1e-5)


def test_sa_predicted_rows_ignore_the_target_hand_checked():
  # m = 2 clients, c = 2 classes, one sample: teacher 0 says [4, 0], teacher
  # 1 says [0, 2]; U_c = 1 so Eq. 8 leaves the logits as they are.
  logits = jnp.array([[[4.0, 0.0]], [[0.0, 2.0]]])
  u_r = jnp.array([[0.9, 0.1], [0.2, 0.8]])
  ctx = (u_r, jnp.ones((2, 2)))
  # Eq. 10 picks the target's row: target 1 gives 0.2 * [4, 0] + 0.8 * [0, 2].
  np.testing.assert_allclose(st.stratified_ensemble(logits, jnp.array([1]), ctx),
                             [[0.8, 1.6]], rtol=1e-6)
  np.testing.assert_allclose(st.stratified_ensemble(logits, jnp.array([0]), ctx),
                             [[3.6, 0.2]], rtol=1e-6)
  # The predicted rows: σ(mean) = σ([2, 1]) = [0.7311, 0.2689] mixes the rows
  # into V = [0.7118, 0.2882]; output V0 * [4, 0] + V1 * [0, 2].
  p0 = np.exp(2) / (np.exp(2) + np.exp(1))
  v = p0 * np.array([0.9, 0.1]) + (1 - p0) * np.array([0.2, 0.8])
  want = [[4 * v[0], 2 * v[1]]]
  for y in (0, 1):
    got = st.stratified_ensemble_predicted(logits, jnp.array([y]), ctx)
    np.testing.assert_allclose(got, want, rtol=1e-5)
  # Uniform U: the predicted rows reduce to the plain average too.
  rng = np.random.default_rng(1)
  many = jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.float32)
  flat = (jnp.full((5, 3), 1 / 3), jnp.ones((5, 3)))
  np.testing.assert_allclose(
      st.stratified_ensemble_predicted(many, jnp.zeros(4, jnp.int32), flat),
      many.mean(0), rtol=1e-5, atol=1e-6)


def test_target_naming_rate_hand_checked():
  # Two samples, c = 2. Sample 0 is class 0 (teachers [4, 0] and [0, 2]);
  # sample 1 is class 1 (teachers [1, 0] and [0, 3]). Each has one wrong
  # target. SA with the wrong target's row names it on both: 0.2*[4,0] +
  # 0.8*[0,2] = [0.8, 1.6] -> 1, and 0.9*[1,0] + 0.1*[0,3] = [0.9, 0.3] -> 0.
  logits = jnp.array([[[4.0, 0.0], [1.0, 0.0]], [[0.0, 2.0], [0.0, 3.0]]])
  labels = jnp.array([0, 1])
  ctx = (jnp.array([[0.9, 0.1], [0.2, 0.8]]), jnp.ones((2, 2)))
  assert float(st.target_naming_rate(st.stratified_ensemble, logits, labels,
                                     ctx, 2)) == 1.0
  # The plain average ([2, 1] -> 0, [0.5, 1.5] -> 1) is right on both, so it
  # names neither wrong target; so are the predicted rows here.
  assert float(st.target_naming_rate(ensemble.average_ensemble, logits,
                                     labels, ctx, 2)) == 0.0
  assert float(st.target_naming_rate(st.stratified_ensemble_predicted, logits,
                                     labels, ctx, 2)) == 0.0
  # Swap the labels: now the average is wrong on both samples and names each
  # (new) wrong target, i.e. the class it predicts.
  assert float(st.target_naming_rate(ensemble.average_ensemble, logits,
                                     labels[::-1], ctx, 2)) == 1.0


def test_agreement_with_class_shares_hand_checked():
  # 3 classes x 2 clients; client 0 holds 4 x class 0 and 1 x class 1, client
  # 1 holds 3 x class 1; nobody holds class 2 (its row is ignored).
  counts = np.array([[4, 1, 0], [0, 3, 0]])  # [m, c]
  # Truth S = [[1, 0], [0.25, 0.75]] on the held rows.
  oracle = np.array([[1.0, 0.0], [0.25, 0.75], [0.5, 0.5]])
  got = st.agreement_with_class_shares(oracle, counts)
  assert got == pytest.approx({"correlation": 1.0, "argmax_agreement": 1.0})
  swapped = oracle[:, ::-1]
  got = st.agreement_with_class_shares(swapped, counts)
  assert got == pytest.approx({"correlation": -1.0, "argmax_agreement": 0.0})
  # Class 1 right, class 0 wrong: half the held classes agree.
  half = np.array([[0.4, 0.6], [0.1, 0.9], [0.5, 0.5]])
  assert st.agreement_with_class_shares(half, counts)["argmax_agreement"] == 0.5
  with pytest.raises(ValueError, match="does not match"):
    st.agreement_with_class_shares(oracle, counts.T)


def _groups_and_vars():
  task = tiny_task(bn=True)
  keys = [jax.random.PRNGKey(i) for i in range(2)]
  inits = [task.init(k) for k in keys]
  stack = lambda i: jax.tree_util.tree_map(lambda *a: jnp.stack(a),
                                           *[x[i] for x in inits])
  group = ensemble.TeacherGroup(task, lambda x: x, (0, 1))
  return (group,), ((stack(0), stack(1)),)


def test_stratifier_vmap_equals_loop_and_does_not_recompile(caplog):
  groups, tv = _groups_and_vars()
  gen = models.Generator(out_shape=(4, 4, 1), nz=4, ngf=2)
  kw = dict(num_classes=3, steps=3, batch_size=4)
  vm = st.make_stratifier(groups, gen, mapper=ClientMapper("vmap"), **kw)
  lp = st.make_stratifier(groups, gen, mapper=ClientMapper("loop"), **kw)
  sh = st.make_stratifier(groups, gen, mapper=ClientMapper("sharded"), **kw)
  a = vm(tv, jax.random.PRNGKey(0))
  b = lp(tv, jax.random.PRNGKey(0))
  np.testing.assert_allclose(sh(tv, jax.random.PRNGKey(0)).curves, b.curves,
                             rtol=2e-4, atol=1e-5)
  assert a.curves.shape == (2, 3, 3)
  assert a.u.shape == a.u_r.shape == a.u_c.shape == (3, 2)
  assert np.all(np.isfinite(a.curves)) and np.all(a.curves > 0)
  np.testing.assert_allclose(a.curves, b.curves, rtol=2e-4, atol=1e-5)
  # The generator trainings lower the CE towards the target class.
  assert np.all(a.curves[..., -1] <= a.curves[..., 0] + 1e-6)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    vm(tv, jax.random.PRNGKey(1))
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  with pytest.raises(ValueError, match="steps >= 2"):
    st.make_stratifier(groups, gen, num_classes=3, steps=1)
  with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
    st.make_stratifier(groups, gen, num_classes=3, batch_size=0)


def test_stratification_backend_of_the_policy_equals_the_plain_form():
  # The policy's "stratify" workload: one vmap over Alg. 2's (client, class)
  # pairs on one CPU device, where the training default (chunked) runs them
  # one at a time; several devices keep the training default.
  from fedjax_dd.core import clients
  assert clients.default_backend("cpu", "stratify", num_devices=1) == "vmap"
  assert clients.default_backend("cpu", "train", num_devices=1) == "chunked"
  assert clients.default_backend("cpu", "stratify", num_devices=2) == (
      clients.default_backend("cpu", "train", num_devices=2)) == "sharded"
  assert clients.default_backend("gpu", "stratify", num_devices=1) == (
      clients.default_backend("gpu", "train", num_devices=1))
  assert st.make_stratifier.__kwdefaults__["mapper"].workload == "stratify"
  groups, tv = _groups_and_vars()
  gen = models.Generator(out_shape=(4, 4, 1), nz=4, ngf=2)
  kw = dict(num_classes=3, steps=3, batch_size=4)
  key = jax.random.PRNGKey(3)
  vm = st.make_stratifier(groups, gen, mapper=ClientMapper("vmap"), **kw)
  for chunk in (1, 2):
    ch = st.make_stratifier(
        groups, gen, mapper=ClientMapper("chunked", chunk_size=chunk), **kw)
    np.testing.assert_allclose(vm(tv, key).curves, ch(tv, key).curves,
                               rtol=2e-4, atol=1e-5)


def test_local_stage_equals_one_shot_fedavg():
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  num_steps = steps_for(data.num_examples, 4, epochs=2)
  max_steps = int(jnp.max(num_steps))
  params, stats = task.init(jax.random.PRNGKey(0))
  run_key = jax.random.PRNGKey(1)
  # One-shot FedAvg: one FedAvg round of every client through the rounds loop.
  alg = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                             max_steps=max_steps))
  server, clients = alg.init(params, stats, 4)
  state = ExperimentState(server, clients, run_key, jnp.asarray(0, jnp.int32))
  opts = rounds_lib.RoundsOptions(num_rounds=1, clients_per_round=4,
                                  progress=False)
  state, _, _ = rounds_lib.run_rounds(alg, state, data, num_steps, opts)
  # The same clients through FedHydra's local stage, averaged.
  train = local_stage(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                                    max_steps=max_steps))
  _, train_key = jax.random.split(jax.random.fold_in(run_key, 1))
  cohort = Cohort(data.x, data.y, data.num_examples, num_steps, jnp.arange(4))
  result = train(params, stats, cohort, train_key)
  assert jax.tree_util.tree_leaves(result.params)[0].shape[0] == 4
  avg = stages.weighted_mean(result.params, data.num_examples)
  for a, b in zip(jax.tree_util.tree_leaves(avg),
                  jax.tree_util.tree_leaves(state.server.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
