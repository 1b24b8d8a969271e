"""FedSeq: ring training inside superclients, FedAvg across them, Eq. 19."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import fedseq
from fedjax_dd.core.keys import client_keys
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState
from fedjax_dd.core.local import LocalTraining, make_local_update
from fedjax_dd.data.stacked import ClientData
from tests.conftest import synthetic_clients, tiny_task, tracing_task

LR, B, MAX = 0.1, 4, 3


def _grouped(groups=((2, 0), (1, 3)), steps=(2, 3, 1, 2)):
  x, y, n = synthetic_clients()
  data = ClientData(x=x, y=y, num_examples=n)
  return fedseq.group_data(data, np.array(steps),
                           [np.array(g) for g in groups]), (x, y, n)


def test_group_data_shapes_and_padding():
  (g, steps, ids), (x, _, n) = _grouped(groups=((2, 0), (3,)))
  assert g.x.shape == (2, 2, 12, 4, 4, 1) and g.y.shape == (2, 2, 12)
  np.testing.assert_array_equal(ids, [[2, 0], [3, -1]])
  np.testing.assert_array_equal(g.num_examples, [[12, 5], [7, 0]])
  np.testing.assert_array_equal(steps, [[1, 2], [2, 0]])
  np.testing.assert_array_equal(g.x[0, 1], x[0])
  assert (g.x[1, 1] == 0).all()


def _reference_ring(task, params, stats, x, y, n, steps, key, order):
  local = make_local_update(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                          max_steps=MAX))
  run = jax.jit(local.run)
  for i in order:
    res = run(params, stats, local.optimizer.init(params), jnp.asarray(x[i]),
              jnp.asarray(y[i]), n[i], steps[i], jax.random.fold_in(key, i), ())
    params, stats = res.params, res.batch_stats
  return params


def _close(a, b):
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def _ring_state(task, key_seed, num_rounds):
  """A two-superclient FedSeq (group size 2) on :func:`_grouped`'s data, its
  first state from ``task``'s init and key ``key_seed``, and the options of
  ``num_rounds`` rounds: ``(alg, state, g, steps, opts, params, stats)``."""
  (g, steps, _), _ = _grouped()
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = fedseq.fedseq(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                    max_steps=MAX), group_size=2)
  server, clients = alg.init(params, stats, 2)
  state = ExperimentState(server=server, clients=clients,
                          key=jax.random.PRNGKey(key_seed),
                          round=jnp.asarray(0))
  opts = rounds_lib.RoundsOptions(num_rounds=num_rounds, clients_per_round=2,
                                  progress=False)
  return alg, state, g, steps, opts, params, stats


def test_rounds_match_sequential_reference_and_ring_rotates():
  task = tiny_task()
  alg, state, g, steps, opts, params, stats = _ring_state(task, 3, 2)
  expected = params
  states = []
  state1, _, _ = rounds_lib.run_rounds(
      alg, state, g, jnp.asarray(steps), opts,
      on_round=lambda s, r: states.append(s))
  gx, gy, gn = np.asarray(g.x), np.asarray(g.y), np.asarray(g.num_examples)
  for r, st in enumerate(states, start=1):
    train_key = jax.random.split(jax.random.fold_in(state.key, r))[1]
    keys = client_keys(train_key, jnp.arange(2))
    start = (r - 1) % 2                       # ring start rotates per round
    outs = [_reference_ring(task, expected, stats, gx[o], gy[o], gn[o],
                            steps[o], keys[o], [(start + t) % 2 for t in range(2)])
            for o in range(2)]
    w = gn.sum(1) / gn.sum()                  # 14 and 16 examples
    expected = jax.tree_util.tree_map(lambda a, b: w[0] * a + w[1] * b, *outs)
    _close(st.server.params, expected)
    assert int(st.round) == r
  assert int(state1.round) == 2


def test_padding_member_leaves_model_unchanged():
  task = tiny_task()
  (g, steps, _), (x, y, n) = _grouped(groups=((1,), (3, 0)))
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = fedseq.fedseq(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                    max_steps=MAX), group_size=2)
  server, _ = alg.init(params, stats, 2)
  cohort = Cohort(x=jnp.asarray(g.x[:1]), y=jnp.asarray(g.y[:1]),
                  num_examples=jnp.asarray(g.num_examples[:1]),
                  num_steps=jnp.asarray(steps[:1]), client_ids=jnp.arange(1))
  key = jax.random.PRNGKey(5)
  new, _, m = alg.apply(server, {}, cohort, key)
  k0 = client_keys(key, jnp.arange(1))[0]
  ref = _reference_ring(task, params, stats, x[[1]], y[[1]], n[[1]],
                        np.array([3]), k0, [0])
  _close(new.params, ref)
  np.testing.assert_allclose(m["local_steps_mean"], 3.0)


def test_eq19_formula_by_hand():
  # O = 10 superclients of J = 10, |w| = 1,000 params, B1 = 32, T = 3:
  # Eq. 19 = 10 * 1000 * 32 * ((2*3 - 1) + 3*10) = 320,000 * 35.
  assert fedseq.eq19_bits(num_groups=10, group_size=10, num_params=1000,
                          rounds=3) == 11_200_000
  # Physical: 3 rounds x 9 hand-offs instead of 3 x 10: 320,000 * 32.
  assert fedseq.eq19_bits(num_groups=10, group_size=10, num_params=1000,
                          rounds=3, traffic="physical") == 10_240_000
  assert fedseq.eq19_bits(num_groups=2, group_size=3, num_params=5, rounds=1,
                          bits_per_param=8) == 2 * 5 * 8 * (1 + 3)
  assert fedseq.eq19_bits(num_groups=2, group_size=3, num_params=5,
                          rounds=0) == 0
  assert fedseq.handoffs_per_round(10) == 10
  assert fedseq.handoffs_per_round(10, "physical") == 9
  with pytest.raises(ValueError, match="traffic"):
    fedseq.eq19_bits(num_groups=1, group_size=2, num_params=1, rounds=1,
                     traffic="ring")


@pytest.mark.parametrize("traffic,transfers", [("eq19", 2), ("physical", 1)])
def test_ledger_counts_eq19_or_physical_handoffs(traffic, transfers):
  task = tiny_task()
  (g, steps, _), _ = _grouped()
  params, stats = task.init(jax.random.PRNGKey(0))
  alg = fedseq.fedseq(LocalTraining(task, optax.sgd(LR), batch_size=B,
                                    max_steps=MAX), group_size=2,
                      traffic=traffic)
  assert alg.comm.upload == 1 + transfers and alg.comm.download == 1
  server, clients = alg.init(params, stats, 2)
  state = ExperimentState(server=server, clients=clients,
                          key=jax.random.PRNGKey(1), round=jnp.asarray(0))
  opts = rounds_lib.RoundsOptions(num_rounds=2, clients_per_round=2,
                                  progress=False)
  _, ledger, _ = rounds_lib.run_rounds(alg, state, g, jnp.asarray(steps), opts)
  p = ledger_lib.num_params(params)
  # O = 2, T = 2: one download, two uploads and 2 * transfers hand-offs per
  # superclient.
  want = 2 * p * 32 * (1 + 2 + 2 * transfers)
  assert ledger.cumulative()["bits_total"] == want == fedseq.eq19_bits(
      num_groups=2, group_size=2, num_params=p, rounds=2, traffic=traffic)


def test_eq19_ledger_and_no_recompilation():
  traces = []
  task = tracing_task(traces)
  alg, state, g, steps, opts, params, _ = _ring_state(task, 1, 3)
  marks = []
  state, ledger, rows = rounds_lib.run_rounds(
      alg, state, g, jnp.asarray(steps), opts,
      on_round=lambda s, r: marks.append(len(traces)))
  p = ledger_lib.num_params(params)
  want = fedseq.eq19_bits(num_groups=2, group_size=2, num_params=p, rounds=3)
  assert want == 2 * p * 32 * (5 + 3 * 2)     # Eq. 19: (2T - 1) + T J
  assert ledger.cumulative()["bits_total"] == want
  assert marks[0] == marks[-1] > 0          # traced in round 1 only
  assert all(np.isfinite(r["train_loss"]) for r in rows)
