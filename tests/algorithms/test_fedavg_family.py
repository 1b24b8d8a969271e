"""FedAvg, FedProx, SCAFFOLD, FedNova against hand-derived reference rules."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.algorithms.fednova import fednova, normaliser
from fedjax_dd.algorithms.fedprox import fedprox
from fedjax_dd.algorithms.scaffold import scaffold
from fedjax_dd.core.keys import client_keys
from fedjax_dd.core.algorithm import Cohort
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, make_local_update
from tests.conftest import synthetic_clients, tiny_task

LR = 0.1
B = 4


def _cohort(num_steps=(3, 3, 3, 3)):
  x, y, n = synthetic_clients()
  return Cohort(x=jnp.asarray(x), y=jnp.asarray(y), num_examples=jnp.asarray(n),
                num_steps=jnp.asarray(num_steps, jnp.int32),
                client_ids=jnp.arange(4))


def _reference_client_params(task, params, stats, cohort, key, max_steps,
                             grad_correction=None, ctxs=None):
  """Each client's local result computed one by one, without the engine."""
  local = make_local_update(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                          max_steps=max_steps),
                            grad_correction=grad_correction)
  keys = client_keys(key, cohort.client_ids)
  out = []
  for i in range(4):
    ctx = ctxs[i] if ctxs is not None else ()
    r = local.run(params, stats, local.optimizer.init(params), cohort.x[i],
                  cohort.y[i], cohort.num_examples[i], cohort.num_steps[i],
                  keys[i], ctx)
    out.append(r)
  return out


def _allclose(a, b, **kw):
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(u, v, **kw)


@pytest.mark.parametrize("backend", ["vmap", "chunked", "loop"])
def test_fedavg_is_example_weighted_mean(backend):
  task = tiny_task()
  cohort = _cohort(num_steps=(2, 3, 4, 1))
  key = jax.random.PRNGKey(5)
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = fedavg(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=4,
                             mapper=ClientMapper(backend=backend,
                                                 chunk_size=3)))
  server, _ = alg.init(params, stats, 4)
  new_server, _, metrics = alg.apply(server, {}, cohort, key)
  refs = _reference_client_params(task, params, stats, cohort, key, 4)
  w = np.array([5, 9, 12, 7], np.float64) / 33.0
  expect = jax.tree_util.tree_map(
      lambda *ps: sum(wi * p for wi, p in zip(w, ps)), *[r.params for r in refs])
  _allclose(new_server.params, expect, rtol=1e-5, atol=1e-6)
  assert np.isfinite(float(metrics["train_loss"]))


def test_fedprox_mu_zero_equals_fedavg_and_mu_pulls_towards_server():
  task = tiny_task()
  cohort = _cohort()
  key = jax.random.PRNGKey(2)
  params, stats = task.init(jax.random.PRNGKey(0))
  runs = {}
  for name, alg in {
      "fedavg": fedavg(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                     max_steps=3)),
      "prox0": fedprox(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                     max_steps=3), mu=0.0),
      "prox": fedprox(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                    max_steps=3), mu=5.0),
  }.items():
    server, _ = alg.init(params, stats, 4)
    runs[name] = alg.apply(server, {}, cohort, key)[0].params
  _allclose(runs["prox0"], runs["fedavg"], rtol=1e-6, atol=1e-7)
  dist = lambda p: sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(
      jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(params)))
  assert dist(runs["prox"]) < dist(runs["fedavg"])
  with pytest.raises(ValueError):
    fedprox(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=3),
            mu=-1.0)


def test_fednova_equal_steps_equals_fedavg_and_normaliser():
  task = tiny_task()
  cohort = _cohort(num_steps=(3, 3, 3, 3))
  key = jax.random.PRNGKey(4)
  params, stats = task.init(jax.random.PRNGKey(0))
  out = {}
  for name, alg in {"avg": fedavg(LocalTraining(task, optax.sgd(LR),
                                                batch_size=B, max_steps=3)),
                    "nova": fednova(LocalTraining(task, optax.sgd(LR),
                                                  batch_size=B, max_steps=3))}.items():
    server, _ = alg.init(params, stats, 4)
    out[name] = alg.apply(server, {}, cohort, key)[0].params
  _allclose(out["nova"], out["avg"], rtol=1e-5, atol=1e-6)
  # a_i for momentum 0.5 and tau = 2: (2 - 0.5 * (1 - 0.25) / 0.5) / 0.5 = 2.5
  np.testing.assert_allclose(normaliser(jnp.array([2.0]), 0.5), [2.5], rtol=1e-6)
  np.testing.assert_allclose(normaliser(jnp.array([3.0]), 0.0), [3.0])


def test_fednova_unequal_steps_rule():
  task = tiny_task()
  cohort = _cohort(num_steps=(1, 2, 4, 2))
  key = jax.random.PRNGKey(6)
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = fednova(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=4))
  server, _ = alg.init(params, stats, 4)
  new = alg.apply(server, {}, cohort, key)[0].params
  refs = _reference_client_params(task, params, stats, cohort, key, 4)
  p = np.array([5, 9, 12, 7], np.float64) / 33.0
  a = np.array([1, 2, 4, 2], np.float64)
  tau_eff = float((p * a).sum())
  expect = jax.tree_util.tree_map(
      lambda x, *ys: x + tau_eff * sum(pi * (y - x) / ai
                                       for pi, ai, y in zip(p, a, ys)),
      params, *[r.params for r in refs])
  _allclose(new, expect, rtol=1e-5, atol=1e-6)


def test_scaffold_variates_follow_option_two():
  task = tiny_task()
  cohort = _cohort(num_steps=(2, 3, 1, 2))
  key = jax.random.PRNGKey(9)
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = scaffold(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=3),
                 learning_rate=LR)
  server, clients = alg.init(params, stats, 8)  # 8 clients, 4 sampled
  sampled = jax.tree_util.tree_map(lambda a: a[:4], clients)
  new_server, new_clients, _ = alg.apply(server, sampled, cohort, key)
  # Round 1: all variates are zero, so local training is plain SGD.
  refs = _reference_client_params(task, params, stats, cohort, key, 3)
  k = np.array([2, 3, 1, 2], np.float64)
  expect_ci = [jax.tree_util.tree_map(lambda x, y: (x - y) / (ki * LR), params,
                                      r.params) for ki, r in zip(k, refs)]
  for i in range(4):
    _allclose(jax.tree_util.tree_map(lambda a: a[i], new_clients["c"]),
              expect_ci[i], rtol=1e-4, atol=1e-5)
  mean_delta = jax.tree_util.tree_map(
      lambda x, *ys: sum(y - x for y in ys) / 4, params, *[r.params for r in refs])
  _allclose(new_server.params,
            jax.tree_util.tree_map(lambda x, d: x + d, params, mean_delta),
            rtol=1e-5, atol=1e-6)
  c_expect = jax.tree_util.tree_map(lambda *cs: (4 / 8) * sum(cs) / 4, *expect_ci)
  _allclose(new_server.extra["c"], c_expect, rtol=1e-4, atol=1e-5)
  assert alg.comm.upload == 2 and alg.comm.download == 2


def test_scaffold_local_optimizer_clips_the_corrected_gradient():
  # A clip of 1e-3 and weight decay change every step; in round 1 the
  # variates are zero, so each client is the same chain without SCAFFOLD.
  task = tiny_task()
  cohort = _cohort(num_steps=(2, 3, 1, 2))
  key = jax.random.PRNGKey(9)
  params, stats = task.init(jax.random.PRNGKey(0))
  chain = optax.chain(optax.clip_by_global_norm(1e-3),
                      optax.add_decayed_weights(1e-3), optax.sgd(LR))
  alg = scaffold(LocalTraining(task, chain, batch_size=B, max_steps=3),
                 learning_rate=LR)
  plain = scaffold(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                 max_steps=3), learning_rate=LR)
  server, clients = alg.init(params, stats, 4)
  got, got_clients, _ = alg.apply(server, clients, cohort, key)
  bare, _, _ = plain.apply(server, clients, cohort, key)
  local = make_local_update(LocalTraining(task, chain, batch_size=B,
                                          max_steps=3))
  keys = client_keys(key, cohort.client_ids)
  refs = [local.run(params, stats, chain.init(params), cohort.x[i],
                    cohort.y[i], cohort.num_examples[i], cohort.num_steps[i],
                    keys[i], ()) for i in range(4)]
  mean_delta = jax.tree_util.tree_map(
      lambda x, *ys: sum(y - x for y in ys) / 4, params, *[r.params for r in refs])
  _allclose(got.params, jax.tree_util.tree_map(lambda x, d: x + d, params,
                                               mean_delta),
            rtol=1e-5, atol=1e-6)
  # Every step moved by at most lr * (1e-3 + decay): far less than plain SGD.
  step = lambda s: max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree_util.tree_leaves(s.params), jax.tree_util.tree_leaves(params)))
  assert step(got) < step(bare) / 10
  # The variates still divide by K_i * lr (option II).
  k0 = 2.0
  _allclose(jax.tree_util.tree_map(lambda a: a[0], got_clients["c"]),
            jax.tree_util.tree_map(lambda x, y: (x - y) / (k0 * LR), params,
                                   refs[0].params), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bn", [False, True])
def test_centralized_equals_one_local_run_with_persistent_optimizer(bn):
  from fedjax_dd.algorithms.centralized import centralized
  task = tiny_task(bn=bn)
  x, y, n = synthetic_clients()
  pooled = Cohort(x=jnp.asarray(x[2:3]), y=jnp.asarray(y[2:3]),
                  num_examples=jnp.asarray(n[2:3]),
                  num_steps=jnp.asarray([3], jnp.int32),
                  client_ids=jnp.arange(1))
  opt = optax.sgd(LR, momentum=0.9)
  alg = centralized(LocalTraining(task, opt, batch_size=B, max_steps=3))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 1)
  local = make_local_update(LocalTraining(task, opt, batch_size=B, max_steps=3))
  p, s, o = params, stats, opt.init(params)
  for r in range(2):  # the momentum buffer carries over to the second epoch
    key = jax.random.PRNGKey(10 + r)
    server, clients, metrics = alg.apply(server, clients, pooled, key)
    ref = local.run(p, s, o, pooled.x[0], pooled.y[0], pooled.num_examples[0],
                    pooled.num_steps[0], key, ())
    p, s, o = ref.params, ref.batch_stats, ref.opt_state
    for a, b in zip(jax.tree_util.tree_leaves((server.params, server.opt_state,
                                               server.batch_stats)),
                    jax.tree_util.tree_leaves((p, o, s))):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                 atol=1e-6)
  assert float(metrics["local_steps_mean"]) == 3.0


@pytest.mark.parametrize("kwargs,name", [
    ({"learning_rate": 0.0}, "SCAFFOLD learning_rate"),
    ({"learning_rate": -0.1}, "SCAFFOLD learning_rate"),
    ({"learning_rate": 0.1, "server_learning_rate": float("nan")},
     "SCAFFOLD server_learning_rate"),
])
def test_scaffold_refuses_rates_its_variate_update_cannot_divide_by(
    kwargs, name):
  # Before: accepted, and the variates became inf/nan after round 1.
  training = LocalTraining(tiny_task(), optax.sgd(0.1), batch_size=2,
                           max_steps=3)
  with pytest.raises(ValueError, match=rf"^{name} must be a finite number > "
                     r"0, got "):
    scaffold(training, **kwargs)


def test_fedavg_refuses_a_server_optimizer_that_is_a_name():
  # Before: accepted, then an AttributeError inside the jitted round.
  training = LocalTraining(tiny_task(), optax.sgd(0.1), batch_size=2,
                           max_steps=3)
  with pytest.raises(ValueError, match=r"^fedavg server_optimizer must be an "
                     r"optax.GradientTransformation .*optax.sgd"):
    fedavg(training, server_optimizer="sgd")
