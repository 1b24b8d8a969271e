"""Traced hyperparameters on the run axis, beyond the client learning rate.

Each run of a grid over FedProx's ``mu``, FedDyn's ``alpha``, a server
learning rate (FedAvg with a server optimizer, SCAFFOLD's ``η_g``), both of
SCAFFOLD's rates, or a weight decay traced into the clients' optimizer must
give the rows :func:`fedjax_dd.fit` gives with that value as a number. The
runs differ in seed too, so a value that reached the wrong run would show.
Tolerance: ``RTOL`` of tests/core/test_run_axis.py, for the reason given
there (the batched program rounds its float32 reductions differently in
the last bits).
"""

import jax
import numpy as np
import optax
import pytest

import fedjax_dd
from fedjax_dd.core import fit as fit_lib
from fedjax_dd.core import run_axis
from tests.core import test_run_axis as base

SEEDS = (0, 1, 2)


def _fedprox(p, most, mu):
  return fedjax_dd.fedprox(base._training(p, most), mu=mu)  # pylint: disable=protected-access


def _feddyn(p, most, alpha):
  return fedjax_dd.feddyn(base._training(p, most), alpha=alpha)  # pylint: disable=protected-access


def _fedavg_server(p, most, lr):
  return fedjax_dd.fedavg(base._training(p, most),  # pylint: disable=protected-access
                          server_optimizer=optax.sgd(lr))


def _scaffold_server(p, most, lr):
  return fedjax_dd.scaffold(base._training(p, most), learning_rate=0.1,  # pylint: disable=protected-access
                            server_learning_rate=lr)


def _weight_decay(p, most, wd):
  return fedjax_dd.fedavg(fedjax_dd.LocalTraining(
      p.task, optax.chain(optax.add_decayed_weights(wd), optax.sgd(0.1)),
      batch_size=3, max_steps=most))


CASES = {
    "client.mu": (_fedprox, [0.0, 0.3, 1.0]),
    "feddyn.alpha": (_feddyn, [0.01, 0.1, 0.3]),
    "server.lr": (_fedavg_server, [0.5, 1.0, 1.5]),
    "scaffold.server.lr": (_scaffold_server, [0.5, 1.0, 1.5]),
    "client.weight_decay": (_weight_decay, [0.0, 0.01, 0.1]),
}


# The command line's grid test (tests/experiments/test_axis_sweep.py,
# test_traced_grid_keys_equal_separate_runs) covers FedProx's mu, FedDyn's
# alpha, SCAFFOLD's server rate and the weight decay through this function;
# those cases run here with -m slow only. FedAvg's server rate has no
# command-line twin.
_CLI_COVERED = ("client.mu", "feddyn.alpha", "scaffold.server.lr",
                "client.weight_decay")


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.slow) if c in _CLI_COVERED else c
    for c in sorted(CASES)])
def test_grid_rows_match_separate_runs(tmp_path, case):
  make, values = CASES[case]
  p = base._prepared()  # pylint: disable=protected-access
  data, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  most = int(steps.max())
  result = run_axis.fit_runs(
      lambda seed, hp: make(p, most, hp[case]), p, data, steps, seeds=SEEDS,
      rounds=2, clients_per_round=2, workdir=tmp_path / "grid",
      hparams={case: values}, progress=False)
  finals = []
  for i, (seed, value) in enumerate(zip(SEEDS, values)):
    single = fit_lib.fit(make(p, most, value), p, data, steps, rounds=2,
                         clients_per_round=2, seed=seed,
                         workdir=tmp_path / f"fit_{i}", progress=False)
    base.assert_rows_close(result.rows[i], single.rows)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=base.RTOL,
                                                atol=base.ATOL),
        result.run_state(i).server.params, single.state.server.params)
    finals.append(result.rows[i][-1]["train_loss"])
  assert len(set(finals)) == len(values)


def test_scaffold_both_rates_traced(tmp_path):
  """SCAFFOLD divides its variate update by the client rate: traced with
  the optimizer's rate, each run matches its own ``fit``."""
  p = base._prepared()  # pylint: disable=protected-access
  data, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  most = int(steps.max())
  rates = [(0.03, 1.0), (0.1, 0.5)]

  def make(lr, server_lr):
    return fedjax_dd.scaffold(base._training(p, most, lr=lr),  # pylint: disable=protected-access
                              learning_rate=lr,
                              server_learning_rate=server_lr)

  result = run_axis.fit_runs(
      lambda seed, hp: make(hp["client.lr"], hp["server.lr"]), p, data,
      steps, seeds=[0, 1], rounds=2, clients_per_round=2,
      workdir=tmp_path / "grid",
      hparams={"client.lr": [r[0] for r in rates],
               "server.lr": [r[1] for r in rates]}, progress=False)
  for i, (lr, server_lr) in enumerate(rates):
    single = fit_lib.fit(make(lr, server_lr), p, data, steps, rounds=2,
                         clients_per_round=2, seed=i,
                         workdir=tmp_path / f"fit_{i}", progress=False)
    base.assert_rows_close(result.rows[i], single.rows)


def test_a_concrete_value_is_still_checked_per_run(tmp_path):
  """Each run's builder sees its concrete value first: a bad one is the
  factory's own refusal, before anything runs."""
  p = base._prepared()  # pylint: disable=protected-access
  data, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  most = int(steps.max())
  with pytest.raises(ValueError, match="FedProx mu must be >= 0, got -0.1"):
    run_axis.fit_runs(lambda s, hp: _fedprox(p, most, hp["client.mu"]), p,
                      data, steps, seeds=[0, 1], rounds=1,
                      clients_per_round=2, workdir=tmp_path / "w",
                      hparams={"client.mu": [0.1, -0.1]}, progress=False)
  with pytest.raises(ValueError, match="FedDyn alpha must be a positive"):
    run_axis.fit_runs(lambda s, hp: _feddyn(p, most, hp["feddyn.alpha"]), p,
                      data, steps, seeds=[0, 1], rounds=1,
                      clients_per_round=2, workdir=tmp_path / "w",
                      hparams={"feddyn.alpha": [0.0, 0.1]}, progress=False)


def test_a_builder_that_needs_a_concrete_value_is_refused(tmp_path):
  """A builder that reads a hyperparameter as a Python number cannot be
  traced: one line naming the hyperparameters, before any row."""
  p = base._prepared()  # pylint: disable=protected-access
  data, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  most = int(steps.max())

  def build(seed, hp):
    del seed
    return fedjax_dd.fedavg(base._training(p, most,  # pylint: disable=protected-access
                                           lr=float(hp["client.lr"])))

  with pytest.raises(run_axis.RunAxisError) as info:
    run_axis.fit_runs(build, p, data, steps, seeds=[0, 1], rounds=1,
                      clients_per_round=2, workdir=tmp_path / "w",
                      hparams={"client.lr": [0.1, 0.2]}, progress=False)
  message = str(info.value)
  assert "\n" not in message
  assert "['client.lr']" in message and "traced" in message, message
  assert not (tmp_path / "w" / "seed_0" / "metrics.jsonl").exists()
