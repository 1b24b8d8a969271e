"""The run axis' evaluation, and what ``fit`` accepts that ``fit_runs`` must.

* Evaluation: one program scores the R runs' models
  (``make_run_evaluator``), each run's figures equal to the per-run
  evaluator's to ``RTOL`` under a vmap (tests/core/test_run_axis.py says why
  not bit for bit), and bit for bit in chunks of one run.
* ``fit``'s options: ``initial_model``, ``run_key``, ``ledger`` and
  ``tensorboard`` act per run as ``fit``'s do; ``personal`` and grouped
  client data (FedSeq's layout, which ``fit`` takes) are refused in one
  line before anything is written.
"""

import collections
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dd
from fedjax_dd.core import evaluate as evaluate_lib
from fedjax_dd.core import fit as fit_lib
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core import run_axis
from fedjax_dd.data.stacked import ClientData
from tests.core import test_run_axis as base

_Server = collections.namedtuple("_Server", "params batch_stats extra")


def _models(p, seeds):
  return [p.task.init(jax.random.PRNGKey(s)) for s in seeds]


def _close(a, b):
  assert a.keys() == b.keys()
  for k in a:
    if isinstance(a[k], list):
      np.testing.assert_allclose(np.asarray(a[k], float),
                                 np.asarray(b[k], float), rtol=base.RTOL,
                                 atol=base.ATOL, err_msg=k)
    else:
      np.testing.assert_allclose(a[k], b[k], rtol=base.RTOL, atol=base.ATOL,
                                 err_msg=k)


@pytest.mark.parametrize("per_class,run_chunk",
                         [(False, None), (True, None), (True, 1), (False, 2)])
def test_run_evaluator_equals_per_run_evaluation(per_class, run_chunk):
  """One vmap, or chunks (of 2: a padded last chunk); chunks of one run
  (the CPU policy's) give the per-run evaluator's bits."""
  p = base._prepared()  # pylint: disable=protected-access
  ds = p.dataset
  models = _models(p, (0, 1, 2))
  one = evaluate_lib.make_evaluator(p.task, ds.x_test, ds.y_test,
                                    per_class=per_class, batch_size=7)
  runs = evaluate_lib.make_run_evaluator(p.task, ds.x_test, ds.y_test,
                                         per_class=per_class, batch_size=7,
                                         run_chunk=run_chunk)
  params, batch_stats = run_axis.stack_runs(models)
  got = runs(params, batch_stats)
  assert len(got) == 3
  for (mp, ms), g in zip(models, got):
    if run_chunk == 1:
      assert g == one(mp, ms)
    else:
      _close(g, one(mp, ms))
  # The runs' models differ, so their figures do.
  assert len({g["loss"] for g in got}) == 3


def test_server_runs_evaluate_their_extra_models_too():
  """``extra[EVAL_MODELS]`` models (e.g. IGA's) are scored per run as
  ``rounds.evaluate_server`` scores them for one run."""
  p = base._prepared()  # pylint: disable=protected-access
  ds = p.dataset
  models = _models(p, (0, 1))
  others = _models(p, (5, 6))
  servers = [_Server(m[0], m[1], {rounds_lib.EVAL_MODELS: {
      "iga": {"params": o[0], "batch_stats": o[1]}}})
             for m, o in zip(models, others)]
  stacked = run_axis.stack_runs(servers)
  one = evaluate_lib.make_evaluator(p.task, ds.x_test, ds.y_test)
  runs = evaluate_lib.make_run_evaluator(p.task, ds.x_test, ds.y_test)
  got = run_axis.evaluate_server_runs(runs, stacked)
  for server, g in zip(servers, got):
    want = rounds_lib.evaluate_server(one, server)
    assert set(g) == {"accuracy", "loss", "accuracy_iga", "loss_iga"}
    _close(g, want)


def test_fit_options_act_per_run_as_in_fit(tmp_path):
  """A shared initial model, a rounds' key per run and a ledger per run:
  each run's rows and ledger equal ``fit``'s with the same options."""
  p = base._prepared()  # pylint: disable=protected-access
  data, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  algo = fedjax_dd.fedavg(base._training(p, int(steps.max())))  # pylint: disable=protected-access
  start = p.task.init(jax.random.PRNGKey(42))
  keys = [jax.random.PRNGKey(7), jax.random.PRNGKey(8)]
  ledgers = [ledger_lib.Ledger().record(0, kind="upload", bits=b, count=2)
             for b in (800, 1600)]
  result = run_axis.fit_runs(
      algo, p, data, steps, seeds=[0, 1], rounds=2, clients_per_round=2,
      workdir=tmp_path / "axis", initial_model=start, run_key=keys,
      ledger=ledgers, tensorboard=True, progress=False)
  for i in range(2):
    single = fit_lib.fit(algo, p, data, steps, rounds=2, clients_per_round=2,
                         seed=i, workdir=tmp_path / f"fit_{i}",
                         initial_model=start, run_key=keys[i],
                         ledger=ledgers[i], progress=False)
    base.assert_rows_close(result.rows[i], single.rows)
    assert result.ledgers[i].to_dict() == single.ledger.to_dict()
    assert os.listdir(tmp_path / "axis" / f"seed_{i}" / "tensorboard")
  # The rounds' keys, not the seeds, drew the cohorts: a sweep with the
  # seeds' own keys differs.
  plain = run_axis.fit_runs(
      algo, p, data, steps, seeds=[0, 1], rounds=2, clients_per_round=2,
      initial_model=start, progress=False)
  assert plain.rows[0] != result.rows[0]


def test_personal_evaluation_and_mislength_options_are_refused(tmp_path):
  p = base._prepared()  # pylint: disable=protected-access
  data, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  algo = fedjax_dd.fedavg(base._training(p, int(steps.max())))  # pylint: disable=protected-access
  kw = dict(seeds=[0, 1], rounds=1, clients_per_round=2,
            workdir=tmp_path / "w", progress=False)
  with pytest.raises(run_axis.RunAxisError,
                     match=r"^fit_runs: personal= .* not on the run axis"):
    run_axis.fit_runs(algo, p, data, steps, personal=lambda state: {}, **kw)
  assert not os.path.exists(tmp_path / "w")
  with pytest.raises(ValueError, match="run_key gives 3 entries for 2 runs"):
    run_axis.fit_runs(algo, p, data, steps,
                      run_key=[jax.random.PRNGKey(0)] * 3, **kw)
  with pytest.raises(ValueError, match="initial_model gives 1 entries"):
    run_axis.fit_runs(algo, p, data, steps,
                      initial_model=[p.task.init(jax.random.PRNGKey(0))],
                      **kw)


def test_grouped_client_data_is_refused_in_one_line(tmp_path):
  """fit takes FedSeq's grouped layout [G, M, N_max, ...]; fit_runs names
  it rather than failing on the image shape."""
  p = base._prepared()  # pylint: disable=protected-access
  d, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  grouped = ClientData(x=jnp.stack([d.x[:2], d.x[2:]]),
                       y=jnp.stack([d.y[:2], d.y[2:]]),
                       num_examples=jnp.stack([d.num_examples[:2],
                                               d.num_examples[2:]]))
  algo = fedjax_dd.fedavg(base._training(p, int(steps.max())))  # pylint: disable=protected-access
  with pytest.raises(run_axis.RunAxisError,
                     match=r"^fit_runs: grouped client data \(num_examples "
                     r"of shape \(2, 2\)"):
    run_axis.fit_runs(algo, p, grouped, jnp.stack([steps[:2], steps[2:]]),
                      seeds=[0, 1], rounds=1, clients_per_round=1,
                      workdir=tmp_path / "w", progress=False)
