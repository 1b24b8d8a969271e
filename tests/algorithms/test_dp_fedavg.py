"""DP-FedAvg (McMahan et al., ICLR 2018): clipping, noise and what the
aggregate equals without them; kill-and-resume with noise on."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import dp_fedavg as dp_lib
from fedjax_dd.algorithms import stages
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import checks
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.privacy import gaussian
from tests.algorithms import kill_resume
from tests.conftest import synthetic_clients, tiny_task

LR = 0.1


def _training(task=None):
  return LocalTraining(task or tiny_task(), optax.sgd(LR), batch_size=4,
                       max_steps=3, mapper=ClientMapper(backend="vmap"))


def _cohort(sizes=(5, 9, 12, 7)):
  x, y, n = synthetic_clients(sizes=sizes)
  return Cohort(x=jnp.asarray(x), y=jnp.asarray(y),
                num_examples=jnp.asarray(n),
                num_steps=jnp.full((4,), 3, jnp.int32),
                client_ids=jnp.arange(4))


def _round(alg, cohort, key=jax.random.PRNGKey(5)):
  params, stats = tiny_task().init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 4)
  new, _, metrics = alg.apply(server, clients, cohort, key)
  return params, new.params, metrics


def _delta(new, old):
  return jax.tree_util.tree_map(lambda a, b: np.asarray(a) - np.asarray(b),
                                new, old)


def _norm(tree):
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(l, np.float64)))
                           for l in jax.tree_util.tree_leaves(tree))))


def test_clip_deltas_by_hand():
  # Client 0: norm 5 over two leaves, clipped to 1 along its direction;
  # client 1: norm 0.5, kept exactly; client 2: zero.
  deltas = {"a": jnp.asarray([[3.0, 0.0], [0.3, 0.0], [0.0, 0.0]]),
            "b": jnp.asarray([[4.0], [0.4], [0.0]])}
  clipped, norms = gaussian.clip_rows(deltas, 1.0)
  np.testing.assert_allclose(norms, [5.0, 0.5, 0.0], rtol=1e-6)
  np.testing.assert_allclose(clipped["a"], [[0.6, 0.0], [0.3, 0.0],
                                            [0.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(clipped["b"], [[0.8], [0.4], [0.0]], rtol=1e-6)
  np.testing.assert_array_equal(clipped["a"][1], deltas["a"][1])  # exact
  # Without noise the aggregate is the clipped sum over qN = 2:
  # ([0.9, 0], [1.2]) / 2.
  agg = dp_lib.dp_aggregator(clip=1.0, noise_multiplier=0.0,
                             expected_clients=2.0)
  cohort = Cohort(x=None, y=None, num_examples=jnp.asarray([1, 1, 1]),
                  num_steps=None, client_ids=jnp.arange(3))
  out = agg.fn(deltas, cohort, None, jax.random.PRNGKey(0))
  np.testing.assert_allclose(out["a"], [0.45, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out["b"], [0.6], rtol=1e-6)


def test_without_noise_and_a_large_clip_it_is_the_uniform_mean():
  # qN = S = 4 and every delta within the clip: sum_k Delta_k / 4, the
  # unweighted mean of the deltas, which plain FedAvg computes with equal
  # weights (to float rounding: a sum, then a division, against a dot
  # product with weights 1/4).
  cohort = _cohort()
  dp = dp_lib.dp_fedavg(_training(), clip=1e6, noise_multiplier=0.0,
                        expected_clients=4)
  uniform = fedavg(_training(), aggregator=lambda d, c, r: stages.
                   weighted_mean(d, jnp.ones_like(c.num_examples)))
  _, got, _ = _round(dp, cohort)
  _, want, _ = _round(uniform, cohort)
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # FedAvg's example weights (5, 9, 12, 7) give another model ...
  old, plain, _ = _round(fedavg(_training()), cohort)
  assert _norm(_delta(plain, got)) > 1e-3 * _norm(_delta(plain, old))
  # ... unless every client holds as many examples.
  equal = _cohort(sizes=(8, 8, 8, 8))
  _, got, _ = _round(dp, equal)
  _, want, _ = _round(fedavg(_training()), equal)
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_small_clip_bounds_the_server_step():
  # Each delta has norm <= C after clipping; their sum over qN = S has
  # norm <= C; with sgd(1.0) that is the server's step.
  cohort = _cohort()
  old, free, _ = _round(dp_lib.dp_fedavg(
      _training(), clip=1e6, noise_multiplier=0.0, expected_clients=4),
      cohort)
  clip = 0.1 * _norm(_delta(free, old))
  _, new, _ = _round(dp_lib.dp_fedavg(
      _training(), clip=clip, noise_multiplier=0.0, expected_clients=4),
      cohort)
  assert 0.0 < _norm(_delta(new, old)) <= clip * (1 + 1e-5)


def test_noise_std_is_the_multiplier_times_the_clip():
  zeros = {"w": jnp.zeros((3, 200_000)), "b": jnp.zeros((3, 1000))}
  total = gaussian.noised_sum(zeros, jax.random.PRNGKey(1), clip=0.5,
                              noise_multiplier=2.0)
  w = np.asarray(total["w"], np.float64)
  assert abs(w.std() - 1.0) < 0.01 and abs(w.mean()) < 0.01
  # Each leaf draws its own noise.
  assert abs(np.corrcoef(w[:1000], np.asarray(total["b"]))[0, 1]) < 0.15
  agg = dp_lib.dp_aggregator(clip=0.5, noise_multiplier=2.0,
                             expected_clients=4.0)
  cohort = Cohort(x=None, y=None, num_examples=jnp.ones((3,), jnp.int32),
                  num_steps=None, client_ids=jnp.arange(3))
  out = np.asarray(agg.fn(zeros, cohort, None, jax.random.PRNGKey(2))["w"])
  assert abs(out.std() - 0.25) < 0.0025


def test_noise_comes_from_the_round_key():
  cohort = _cohort()
  alg = dp_lib.dp_fedavg(_training(), clip=1.0, noise_multiplier=1.0,
                         expected_clients=4)
  _, a, _ = _round(alg, cohort, jax.random.PRNGKey(7))
  _, b, _ = _round(alg, cohort, jax.random.PRNGKey(7))
  _, c, _ = _round(alg, cohort, jax.random.PRNGKey(8))
  assert _norm(_delta(a, b)) == 0.0 and _norm(_delta(a, c)) > 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"clip": 0.0}, "DP-FedAvg clip must be a finite number > 0, got 0.0."),
    ({"clip": -1.0}, "DP-FedAvg clip must be a finite number > 0, got -1.0."),
    ({"clip": float("nan")},
     "DP-FedAvg clip must be a finite number > 0, got nan."),
    ({"noise_multiplier": -0.5},
     "DP-FedAvg noise_multiplier must be a finite number >= 0, got -0.5."),
    ({"expected_clients": 0},
     "DP-FedAvg expected_clients must be a finite number > 0, got 0."),
])
def test_bad_settings_are_refused_in_one_line(kwargs, message):
  args = {"clip": 1.0, "noise_multiplier": 1.0, "expected_clients": 4,
          **kwargs}
  with pytest.raises(checks.SettingError) as e:
    dp_lib.dp_fedavg(_training(), **args)
  assert str(e.value) == message


def test_a_model_with_batch_norm_is_refused():
  task = tiny_task(bn=True)
  alg = dp_lib.dp_fedavg(_training(task), clip=1.0, noise_multiplier=1.0,
                         expected_clients=4)
  params, stats = task.init(jax.random.PRNGKey(0))
  with pytest.raises(checks.SettingError, match="BatchNorm statistics"):
    alg.init(params, stats, 4)


def test_killed_and_resumed_run_equals_the_uninterrupted_one(tmp_path):
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))

  def state(alg):
    params, stats = task.init(jax.random.PRNGKey(0))
    server, clients = alg.init(params, stats, 4)
    return ExperimentState(server, clients, jax.random.PRNGKey(1),
                           jnp.asarray(0, jnp.int32))

  opts = rounds_lib.RoundsOptions(num_rounds=4, clients_per_round=2,
                                  progress=False, checkpoint_every=1)
  full = kill_resume.check(
      tmp_path, lambda tick: dp_lib.dp_fedavg(
          _training(task), clip=0.5, noise_multiplier=1.0,
          expected_clients=2),
      state, data, jnp.full((4,), 2, jnp.int32), opts,
      [("apply", 2), ("row", 2), ("apply", 1)])
  assert all(np.isfinite(r["train_loss"]) for r in full.rows)
