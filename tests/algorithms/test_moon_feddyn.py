"""MOON and FedDyn against hand-derived rules; per-client state, ledger,
no recompilation and bit-identical resume."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd import models
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.algorithms.feddyn import dynamic_regularizer, feddyn
from fedjax_dd.algorithms.fedprox import proximal_term
from fedjax_dd.algorithms.moon import (client_state_bytes, contrastive_loss,
                                       cosine, moon)
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import prepare as prepare_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.keys import client_keys
from fedjax_dd.core.local import (LocalTraining, RoundContext, make_local_update,
                                  round_decay, steps_for)
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import sources
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.models.projection import ProjectionNet
from tests.algorithms import kill_resume
from tests.conftest import (TinyBNNet, TinyNet, rounds_compile_nothing,
                            synthetic_clients, tiny_task)

LR = 0.1
B = 4
tree_map = jax.tree_util.tree_map


def _proj_task(bn=False):
  base = TinyBNNet() if bn else TinyNet()
  # TinyNet's output layer is its second Dense (flax's name Dense_1).
  module = ProjectionNet(base=base, head="Dense_1", num_classes=3, proj_dim=4)
  return Classifier(module=module, input_shape=(4, 4, 1),
                    preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                    num_classes=3)


def _cohort(num_steps=(3, 3, 3, 3)):
  x, y, n = synthetic_clients()
  return Cohort(x=jnp.asarray(x), y=jnp.asarray(y), num_examples=jnp.asarray(n),
                num_steps=jnp.asarray(num_steps, jnp.int32),
                client_ids=jnp.arange(4))


def _allclose(a, b, **kw):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb)
  for u, v in zip(la, lb):
    np.testing.assert_allclose(u, v, **kw)


def _row(tree, i):
  return tree_map(lambda a: a[i], tree)


# ----------------------------------------------------------------------------
# MOON
# ----------------------------------------------------------------------------


def test_contrastive_loss_by_hand():
  z = jnp.array([[2.0, 0.0], [0.0, 3.0]])
  z_glob = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # sim 1 for both rows
  z_prev = jnp.array([[0.0, 5.0], [0.0, 2.0]])  # sim 0, then sim 1
  np.testing.assert_allclose(cosine(z, z_prev), [0.0, 1.0], atol=1e-7)
  loss = contrastive_loss(z, z_glob, z_prev, temperature=0.5)
  # Row 0: -log(e^2 / (e^2 + e^0)) = log(1 + e^-2); row 1: log 2.
  np.testing.assert_allclose(loss, [math.log1p(math.exp(-2.0)), math.log(2.0)],
                             rtol=1e-6)


def test_projection_net_drops_the_output_layer_and_adds_the_head():
  task = _proj_task()
  params, _ = task.init(jax.random.PRNGKey(0))
  assert set(params) == {"base", "proj1", "proj2", "out"}
  assert set(params["base"]) == {"Dense_0"}  # the output layer Dense_1 is gone
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4, 4, 1)),
                  jnp.float32)
  h = jax.nn.relu(x.reshape(3, -1) @ params["base"]["Dense_0"]["kernel"]
                  + params["base"]["Dense_0"]["bias"])
  dense = lambda p, v: v @ p["kernel"] + p["bias"]
  z = dense(params["proj2"], jax.nn.relu(dense(params["proj1"], h)))
  (z_got, logits), _ = task.apply(params, {}, x, train=False,
                                  method=ProjectionNet.project)
  np.testing.assert_allclose(z_got, z, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(logits, dense(params["out"], z), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(task.apply(params, {}, x, train=False)[0], logits)
  assert params["proj1"]["kernel"].shape == (8, 8)
  assert params["proj2"]["kernel"].shape == (8, 4)
  # The registry's variants: the registered model less its output layer.
  spec = models.get_model("lenet5_proj")
  shapes = jax.eval_shape(
      lambda k: models.init_model(spec.build(10), k, spec.input_shape),
      jax.random.PRNGKey(0))["params"]
  base_shapes = jax.eval_shape(
      lambda k: models.init_model(models.get_model("lenet5").build(10), k,
                                  (28, 28, 1)), jax.random.PRNGKey(0))["params"]
  assert set(shapes["base"]) == set(base_shapes) - {"fc3"}
  assert shapes["proj1"]["kernel"].shape == (84, 84)
  assert shapes["proj2"]["kernel"].shape == (84, 256)
  assert "lenet5_proj" not in models.MODELS  # the model tests' list unchanged


def test_projection_width_is_a_build_option_and_a_prepare_option():
  spec = models.get_model("lenet5_proj")
  shapes = jax.eval_shape(
      lambda k: models.init_model(spec.build(10, proj_dim=32), k,
                                  spec.input_shape),
      jax.random.PRNGKey(0))["params"]
  assert shapes["proj2"]["kernel"].shape == (84, 32)
  assert shapes["out"]["kernel"].shape == (32, 10)
  with pytest.raises(ValueError, match="proj_dim must be at least 1, got 0"):
    spec.build(10, proj_dim=0)
  ds = sources.load_dataset("digits")
  prepared = prepare_lib.prepare(ds, "digits_cnn_proj", proj_dim=16)
  params, _ = prepared.task.init(jax.random.PRNGKey(0))
  assert params["proj2"]["kernel"].shape[1] == 16
  default, _ = prepare_lib.prepare(ds, "digits_cnn_proj").task.init(
      jax.random.PRNGKey(0))
  assert default["proj2"]["kernel"].shape[1] == 256  # 0: MOON's out_dim
  # A model without the head, or a negative width, is refused before the
  # data is read: the dataset name here would fail to load.
  with pytest.raises(ValueError, match="'digits_cnn' has none"):
    prepare_lib.prepare("npz:/nonexistent/x.npz", "digits_cnn", proj_dim=16)
  with pytest.raises(ValueError, match="got -1"):
    prepare_lib.prepare("npz:/nonexistent/x.npz", "digits_cnn_proj",
                        proj_dim=-1)


def test_moon_needs_a_projection_model():
  with pytest.raises(ValueError, match="projection"):
    moon(LocalTraining(tiny_task(), optax.sgd(LR), batch_size=B, max_steps=1))


def test_moon_round_one_equals_fedavg_and_stores_local_models():
  # w_i^{t-1} = w^t in round 1, so sim(z, z_glob) = sim(z, z_prev) and the
  # gradient of ℓ_con, (∇sim_prev − ∇sim_glob)/(2τ), is zero.
  task = _proj_task()
  cohort = _cohort(num_steps=(2, 3, 1, 2))
  key = jax.random.PRNGKey(3)
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = moon(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=3),
             mu=1.0)
  server, clients = alg.init(params, stats, 6)
  assert jax.tree_util.tree_leaves(clients["prev"][0])[0].shape[0] == 6
  sampled = _row(clients, jnp.arange(4))
  new_server, new_clients, _ = alg.apply(server, sampled, cohort, key)
  ref = fedavg(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=3))
  ref_server, _ = ref.init(params, stats, 6)
  ref_server, _, _ = ref.apply(ref_server, {}, cohort, key)
  _allclose(new_server.params, ref_server.params, rtol=1e-5, atol=1e-6)
  # The stored previous models are this round's local models.
  local = make_local_update(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                          max_steps=3))
  run = jax.jit(local.run)
  keys = client_keys(key, cohort.client_ids)
  for i in range(4):
    r = run(params, stats, local.optimizer.init(params), cohort.x[i],
                  cohort.y[i], cohort.num_examples[i], cohort.num_steps[i],
                  keys[i], ())
    _allclose(_row(new_clients["prev"][0], i), r.params, rtol=1e-5, atol=1e-6)
  assert alg.comm.upload == 1 and alg.comm.download == 1


def test_moon_step_is_sgd_on_cross_entropy_plus_mu_contrastive():
  # One client with one example: every batch row is that example, and one
  # step moves w by −η ∇(CE + μ ℓ_con) with the global and previous models
  # fixed (written here from Eq. 3 without the library's loss).
  task = _proj_task()
  mu, tau = 2.0, 0.5
  x, y, _ = synthetic_clients()
  xc = jnp.asarray(x[:1, :1])
  yc = jnp.asarray(y[:1, :1])
  cohort = Cohort(x=xc, y=yc, num_examples=jnp.array([1]),
                  num_steps=jnp.array([1]), client_ids=jnp.array([0]))
  w_glob, _ = task.init(jax.random.PRNGKey(0))
  w_prev, _ = task.init(jax.random.PRNGKey(1))
  alg = moon(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=1),
             mu=mu, temperature=tau)
  server, _ = alg.init(w_glob, {}, 1)
  clients = {"prev": (tree_map(lambda a: a[None], w_prev), {})}
  _, new_clients, _ = alg.apply(server, clients, cohort, jax.random.PRNGKey(2))

  module = task.module
  xi = task.preprocess(xc[0, :1])
  project = lambda w: module.apply({"params": w}, xi, train=False,
                                   method=ProjectionNet.project)

  def loss(w):
    z, logits = project(w)
    z_glob, z_prev = project(w_glob)[0], project(w_prev)[0]
    cos = lambda a, b: jnp.sum(a * b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b))
    s_glob, s_prev = cos(z[0], z_glob[0]) / tau, cos(z[0], z_prev[0]) / tau
    con = -s_glob + jnp.log(jnp.exp(s_glob) + jnp.exp(s_prev))
    ce = -jax.nn.log_softmax(logits[0])[yc[0, 0]]
    return ce + mu * con

  expect = tree_map(lambda w, g: w - LR * g, w_glob, jax.grad(loss)(w_glob))
  _allclose(_row(new_clients["prev"][0], 0), expect, rtol=1e-5, atol=1e-6)
  # ℓ_con contributes: the same step with μ = 0 lands elsewhere.
  plain = tree_map(lambda w, g: w - LR * g, w_glob,
                   jax.grad(lambda w: -jax.nn.log_softmax(
                       project(w)[1][0])[yc[0, 0]])(w_glob))
  assert not np.allclose(plain["proj2"]["kernel"], expect["proj2"]["kernel"])


def test_moon_and_feddyn_client_state_bytes():
  spec = models.get_model("lenet5_proj")
  task = Classifier(module=spec.build(10), input_shape=spec.input_shape,
                    preprocess=lambda x: x.astype(jnp.float32),
                    num_classes=10)
  params = jax.eval_shape(lambda k: task.init(k)[0], jax.random.PRNGKey(0))
  n_moon = ledger_lib.num_params(params)
  assert n_moon == 44_426 - (84 * 10 + 10) + (84 * 84 + 84) + (84 * 256 + 256) \
      + (256 * 10 + 10)  # 75,046
  alg = moon(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=1))
  for n in (100, 10_000):
    assert client_state_bytes(alg, params, {}, n) == n * n_moon * 4
  base = models.get_model("lenet5")
  task = Classifier(module=base.build(10), input_shape=base.input_shape,
                    preprocess=lambda x: x.astype(jnp.float32),
                    num_classes=10)
  params = jax.eval_shape(lambda k: task.init(k)[0], jax.random.PRNGKey(0))
  alg = feddyn(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=1))
  for n in (100, 10_000):
    assert client_state_bytes(alg, params, {}, n) == n * 44_426 * 4


# ----------------------------------------------------------------------------
# FedDyn
# ----------------------------------------------------------------------------


def test_dynamic_regularizer_by_hand():
  reg = dynamic_regularizer(0.5)
  theta = {"w": jnp.array([1.0, 2.0])}
  server = {"w": jnp.array([0.0, 0.0])}
  grad = {"w": jnp.array([1.0, 1.0])}
  # 0.5/2 · (1 + 4) − (1 + 2) = −1.75
  ctx = RoundContext(round=jnp.int32(0), start_params=server,
                     start_batch_stats={}, client=grad)
  np.testing.assert_allclose(reg(theta, ctx), -1.75)


def test_feddyn_rounds_follow_algorithm_one():
  task = tiny_task()
  alpha = 0.5
  cohort = _cohort(num_steps=(2, 3, 1, 2))
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = feddyn(LocalTraining(task, optax.sgd(LR), batch_size=B, max_steps=3),
               alpha=alpha)
  server, clients = alg.init(params, stats, 8)  # 8 clients, 4 sampled
  sampled = _row(clients, jnp.arange(4))
  key = jax.random.PRNGKey(9)
  s1, c1, _ = alg.apply(server, sampled, cohort, key)
  # Round 1: ∇L_k = 0, so the client loss is FedProx's with μ = α.
  local = make_local_update(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                          max_steps=3),
                            regularizer=proximal_term(alpha))
  keys = client_keys(key, cohort.client_ids)
  run = jax.jit(local.run)
  thetas = [run(params, stats, local.optimizer.init(params),
                      cohort.x[i], cohort.y[i], cohort.num_examples[i],
                      cohort.num_steps[i], keys[i],
                      RoundContext(round=jnp.int32(0), start_params=params,
                                   start_batch_stats=stats)).params
            for i in range(4)]
  d = [tree_map(lambda a, b: a - b, t, params) for t in thetas]
  for i in range(4):
    _allclose(_row(c1["grad"], i), tree_map(lambda v: -alpha * v, d[i]),
              rtol=1e-4, atol=1e-6)
  h1 = tree_map(lambda *ds: -alpha * sum(ds) / 8, *d)
  _allclose(s1.extra["h"], h1, rtol=1e-4, atol=1e-7)
  # θ¹ = mean(θ_k) − h¹/α = θ⁰ + mean(d) + Σd/8 = θ⁰ + 1.5 · mean(d).
  _allclose(s1.params,
            tree_map(lambda p, *ds: p + 1.5 * sum(ds) / 4, params, *d),
            rtol=1e-4, atol=1e-6)

  # Round 2 on the same clients: their loss now carries −⟨∇L_k, θ⟩.
  s2, c2, _ = alg.apply(s1, c1, cohort, jax.random.PRNGKey(10))
  keys = client_keys(jax.random.PRNGKey(10), cohort.client_ids)
  reg = dynamic_regularizer(alpha)
  local = make_local_update(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                          max_steps=3), regularizer=reg)
  run = jax.jit(local.run)
  for i in range(4):
    g = _row(c1["grad"], i)
    theta = run(s1.params, stats, local.optimizer.init(s1.params),
                      cohort.x[i], cohort.y[i], cohort.num_examples[i],
                      cohort.num_steps[i], keys[i],
                      RoundContext(round=jnp.int32(0), start_params=s1.params,
                                   start_batch_stats=stats, client=g)).params
    _allclose(_row(c2["grad"], i),
              tree_map(lambda gg, t, s: gg - alpha * (t - s), g, theta,
                       s1.params), rtol=1e-4, atol=1e-6)
  assert alg.comm.upload == 1 and alg.comm.download == 1


def test_feddyn_rejects_bad_alpha():
  with pytest.raises(ValueError, match="alpha"):
    feddyn(LocalTraining(tiny_task(), optax.sgd(LR), batch_size=B, max_steps=1),
           alpha=0.0)


# ----------------------------------------------------------------------------
# Both: rounds loop, ledger, recompilation, resume
# ----------------------------------------------------------------------------


def _setup(name, bn=False, lr_decay=1.0):
  task = _proj_task(bn) if name == "moon" else tiny_task(bn)
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  num_steps = steps_for(data.num_examples, B, epochs=1)
  max_steps = int(jnp.max(num_steps))
  build = moon if name == "moon" else feddyn
  alg = build(LocalTraining(task, optax.sgd(LR), batch_size=B,
                            max_steps=max_steps,
                            schedule=round_decay(lr_decay)))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 4)
  state = ExperimentState(server, clients, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  evaluate = make_evaluator(task, x.reshape(-1, 4, 4, 1), y.reshape(-1),
                            batch_size=16)
  return alg, state, data, num_steps, evaluate


@pytest.mark.parametrize("name", ["moon", "feddyn"])
def test_no_recompilation_between_rounds(caplog, name):
  alg, state, data, num_steps, _ = _setup(name, lr_decay=0.9)
  rounds_compile_nothing(caplog, alg, state, data, num_steps,
                         clients_per_round=2)


@pytest.mark.parametrize("name,bn", [("moon", True), ("feddyn", False)])
def test_resume_is_bit_identical(tmp_path, name, bn):
  alg, state0, data, num_steps, evaluate = _setup(name, bn=bn, lr_decay=0.9)
  # Killed after round 2: a row of round 3 was written, never checkpointed.
  full, full_ledger, resumed, full_rows, rows = kill_resume.stale_row_resume(
      tmp_path, alg, state0, data, num_steps, evaluate=evaluate,
      clients_per_round=2, rounds=4, killed_after=2)
  assert rows == full_rows
  assert len(full_rows) == 4
  # One model each way per sampled client (the first download is the seed).
  n_bits = ledger_lib.num_params(state0.server.params) * 32
  totals = full_ledger.cumulative()
  assert totals["bytes_uploaded"] * 8 == 4 * 2 * n_bits
  assert totals["bytes_downloaded"] * 8 == 3 * 2 * n_bits
  # Only sampled clients' state changes: 2 of 4 a round, all 4 after 4 rounds
  # only if the draws covered them; at least the last round's 2 changed.
  leaf = jax.tree_util.tree_leaves(full.clients)[0]
  first = jax.tree_util.tree_leaves(state0.clients)[0]
  assert sum(not np.array_equal(leaf[i], first[i]) for i in range(4)) >= 2
  for a, b in zip(jax.tree_util.tree_leaves(full),
                  jax.tree_util.tree_leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
