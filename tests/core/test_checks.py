"""The one place that decides what a setting may be (fedjax_dd.core.checks),
and the library doors that use it: local_steps, LocalTraining, fit and the
loops' options (issue 76)."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_dd
from fedjax_dd.core import checks
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.data.stacked import ClientData
from tests.conftest import synthetic_clients, tiny_task


def test_each_check_names_the_setting_the_bound_and_the_value():
  assert checks.check_int("k", 3, 1) == 3
  assert checks.check_int("k", np.int64(3), 1) == 3
  assert checks.check_int("k", jnp.asarray(3), 1) == 3   # steps.max()
  for bad in (0, 2.5, 3.0, True, "3", None):
    with pytest.raises(checks.SettingError, match=r"^k must be an int >= 1, "
                       f"got {bad!r}.$".replace("(", r"\(").replace(")", r"\)")):
      checks.check_int("k", bad, 1)
  assert checks.check_whole("r", 2.0, 1) == 2
  with pytest.raises(checks.SettingError, match="whole number >= 1, got 2.7"):
    checks.check_whole("r", 2.7, 1)
  assert checks.check_number("x", 0.5, 0.0, 1.0) == 0.5
  for bad in (float("nan"), float("inf"), -1, "0.5", True):
    with pytest.raises(checks.SettingError, match="finite number >= 0"):
      checks.check_number("x", bad, 0.0, 1.0)
  with pytest.raises(checks.SettingError, match=r"; set --config\.x\.$"):
    checks.check_number("config.x", -1, 0.0, fix="set --config.x")
  assert checks.check_choice("c", "a", ("a", "b")) == "a"
  with pytest.raises(checks.SettingError, match=r"one of \['a', 'b'\]"):
    checks.check_choice("c", "z", ("a", "b"))


def test_a_negative_budget_is_refused_not_read_as_none():
  assert checks.check_budget("max_seconds", 0) == 0.0
  for build in (lambda: loop_lib.LoopOptions(num_steps=2, max_seconds=-1),
                lambda: rounds_lib.RoundsOptions(num_rounds=2,
                                                 clients_per_round=1,
                                                 max_seconds=-1)):
    with pytest.raises(checks.SettingError,
                       match=r"max_seconds must be a finite number >= 0, "
                       r"got -1"):
      build()


def _data():
  x, y, n = synthetic_clients()
  return ClientData(x=x, y=y, num_examples=n)


@pytest.mark.parametrize("batch_size", [0, 16.5, -16, 16.0])
def test_local_steps_refuses_a_batch_size_that_is_not_a_positive_int(
    batch_size):
  # Before: [2 2 2 2] at 0, fractional counts at 16.5, negative at -16.
  with pytest.raises(checks.SettingError,
                     match=f"^batch_size must be an int >= 1, got "
                     f"{batch_size!r}."):
    fedjax_dd.local_steps(_data(), batch_size=batch_size, epochs=1.0)


def test_local_steps_refuses_no_epochs_and_negative_steps():
  with pytest.raises(checks.SettingError, match="epochs must be a finite"):
    fedjax_dd.local_steps(_data(), batch_size=4, epochs=0.0)
  with pytest.raises(checks.SettingError, match="steps must be an int >= 0"):
    fedjax_dd.local_steps(_data(), batch_size=4, steps=-1)
  # The hand-checkable good case: clients of 6 and 3 examples at B = 4.
  # ceil(1.5 * ceil(n / 4)): 6 -> ceil(1.5 * 2) = 3, 3 -> ceil(1.5) = 2.
  from fedjax_dd.core.local import steps_for  # pylint: disable=g-import-not-at-top
  got = steps_for(jnp.asarray([6, 3, 0]), 4, epochs=1.5)
  np.testing.assert_array_equal(got, [3, 2, 0])


@pytest.mark.parametrize("optimizer", ["sgd", object(), None])
def test_local_training_refuses_an_optimizer_that_is_no_transformation(
    optimizer):
  with pytest.raises(checks.SettingError,
                     match="LocalTraining.optimizer must be an "
                     "optax.GradientTransformation"):
    fedjax_dd.LocalTraining(tiny_task(), optimizer, batch_size=4,
                            max_steps=2)
  # A name says how to build it.
  if optimizer == "sgd":
    with pytest.raises(checks.SettingError, match=r"optax\.sgd\("):
      fedjax_dd.LocalTraining(tiny_task(), optimizer, batch_size=4,
                              max_steps=2)


def test_local_training_takes_a_jax_step_count():
  steps = jnp.asarray([3, 5])
  t = fedjax_dd.LocalTraining(tiny_task(), optax.sgd(0.1), batch_size=4,
                              max_steps=steps.max())
  assert int(t.max_steps) == 5


def test_fit_refuses_fractional_or_negative_step_counts_and_budgets(
    tmp_path):
  data = _data()
  task = tiny_task()
  # Refused before the dataset is read: none is needed.
  prepared = fedjax_dd.core.prepare.Prepared(dataset=None, task=task,
                                             spec=None, mean=None, std=None)
  algo = fedjax_dd.fedavg(fedjax_dd.LocalTraining(
      task, optax.sgd(0.1), batch_size=4, max_steps=3))
  bad = [(jnp.asarray([1.5, 2.0, 2.0, 1.0]), "must hold ints"),
         (jnp.asarray([1, -2, 2, 1]), "must be >= 0")]
  for steps, message in bad:
    with pytest.raises(checks.SettingError, match=f"fit: num_steps {message}"):
      fedjax_dd.fit(algo, prepared, data, steps, rounds=1,
                    clients_per_round=2, workdir=str(tmp_path / "w"))
  with pytest.raises(checks.SettingError, match="fit: max_seconds must be"):
    fedjax_dd.fit(algo, prepared, data, jnp.asarray([1, 1, 1, 1]), rounds=1,
                  clients_per_round=2, max_seconds=-1,
                  workdir=str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()   # refused before the workdir
