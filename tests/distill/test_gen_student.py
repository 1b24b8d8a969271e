"""Tests of the generator–student skeleton shared by DENSE/FedHydra and IGA."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.distill import gen_student


def test_generator_step_is_one_optimizer_step_and_keeps_the_extra_carry():
  # L(w) = (w - 3)² at w = 1: loss 4, gradient -4; SGD at 0.25 gives w = 2.
  def loss_fn(params, stats, target):
    return (params - target) ** 2, (stats + 1, {"m": params})

  opt = optax.sgd(0.25)

  def update(grads, opt_state, params):
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  w = jnp.float32(1.0)
  carry = gen_student.GenCarry(params=w, stats=jnp.int32(5),
                               opt_state=opt.init(w), best=("kept",))
  new, loss, aux = gen_student.generator_step(loss_fn, update, carry,
                                              jnp.float32(3.0))
  assert float(loss) == 4.0
  assert float(new.params) == 2.0
  assert int(new.stats) == 6
  assert float(aux["m"]) == 1.0
  assert new.best == ("kept",)


def test_split_keys_are_the_split_of_the_folded_key():
  key = jax.random.PRNGKey(7)
  got = gen_student.split_keys(key, jnp.int32(3), 2)
  want = jax.random.split(jax.random.fold_in(key, 3), 2)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert not np.array_equal(
      np.asarray(got), np.asarray(gen_student.split_keys(key, 4, 2)))


def test_alternate_runs_each_iterations_generator_steps_before_its_students():
  calls = []

  def generator(carry, student, i, g):
    calls.append(("g", i, g, student))
    return carry + 1, [{"g": carry}, {"g": -carry}]

  def student_steps(carry, i):
    calls.append(("n", i, carry))
    return i + 1

  def student_step(student, carry, i, s):
    calls.append(("s", i, s, carry))
    return student + 10, {"s": student}

  carry, student, gen_ms, stu_ms = gen_student.alternate(
      0, 100, iterations=2, generator_steps=2, generator=generator,
      student_steps=student_steps, student_step=student_step)
  assert calls == [("g", 0, 0, 100), ("g", 0, 1, 100), ("n", 0, 2),
                   ("s", 0, 0, 2),
                   ("g", 1, 0, 110), ("g", 1, 1, 110), ("n", 1, 4),
                   ("s", 1, 0, 4), ("s", 1, 1, 4)]
  assert (carry, student) == (4, 130)
  assert [m["g"] for m in gen_ms] == [0, 0, 1, -1, 2, -2, 3, -3]
  assert [m["s"] for m in stu_ms] == [100, 110, 120]


def test_mean_metrics_is_the_mean_and_compiles_once_for_any_step_count(
    caplog):
  import logging  # pylint: disable=g-import-not-at-top
  steps = [{"loss": jnp.float32(v), "acc": jnp.float32(v / 4)}
           for v in (1.0, 2.0, 6.0)]
  m = gen_student.mean_metrics(steps)
  assert float(m["loss"]) == 3.0 and float(m["acc"]) == 0.75
  assert float(gen_student.mean_metrics(steps[:1])["loss"]) == 1.0
  gen_student.mean_metrics(steps[:2])  # the sum and the division compiled
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    four = gen_student.mean_metrics(steps + steps[:1])
    six = gen_student.mean_metrics(steps + steps)
  assert (float(four["loss"]), float(six["loss"])) == (2.5, 3.0)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]


def test_jit_programs_compiles_the_named_ones_to_run_once(monkeypatch):
  import typing  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import clients  # pylint: disable=g-import-not-at-top

  class Programs(typing.NamedTuple):
    draw: typing.Any
    step: typing.Any

  once = []
  plain_once_jit = clients.once_jit
  monkeypatch.setattr(clients, "once_jit",
                      lambda fn, **kw: once.append(fn) or plain_once_jit(fn))
  p = gen_student.jit_programs(Programs, 3, once=("draw",),
                               draw=lambda k, x: x + k,
                               step=lambda k, x: x * k)
  assert len(once) == 1 and once[0].args == (3,)  # draw, with loop bound
  assert float(p.draw(1.0)) == 4.0 and float(p.step(2.0)) == 6.0
  with pytest.raises(ValueError, match=r"once names \['drew'\]"):
    gen_student.jit_programs(Programs, 3, once=("drew",), draw=abs, step=abs)
