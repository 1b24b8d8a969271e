"""The generator–student skeleton shared by DENSE/FedHydra and IGA.

Both data-free loops alternate a server-side generator ``x̂ = G(z[, y])``,
trained against a frozen teacher ensemble, with a student distilled from the
ensemble on ``x̂``: :mod:`fedjax_dd.distill.dfkd` (DENSE, FedHydra's HASA
Alg. 1, Eqs. 12–19) and :mod:`fedjax_dd.distill.iga` (DisUE Eqs. 9–13 after
FedFTG). This module holds what the two share; each keeps its own losses,
draws and state.

The steps are single jitted programs driven by a host loop rather than one
``lax.scan``: XLA:CPU runs them much slower inside a rolled while loop, and
unrolling ``T_G = 30`` steps is slow to compile (experiments/perf_notes.md).
The random inputs are drawn by a separate program, since XLA:CPU's oneDNN
rewriter aborts on dot operands computed from PRNG bits in the same program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax

from fedjax_dd.core import clients
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import ensemble

PyTree = Any
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Loop:
  """The models every generator–student loop fixes (subclassed per loop)."""
  generator: nn.Module
  student: Classifier

  @property
  def nz(self) -> int:
    return ensemble.generator_nz(self.generator)

  @property
  def num_classes(self) -> int:
    return self.student.num_classes


class GenCarry(NamedTuple):
  """The generator's state across its steps of one epoch or round.

  Attributes:
    params: what the generator's optimizer updates (IGA: the generator's
      parameters; DENSE: ``(parameters, noise z [B, nz])``).
    stats: the generator's BatchNorm statistics.
    opt_state: the optimizer's state over ``params``.
    best: the loop's own extra carry (DENSE: ``(lowest L_Gen, its images
      [B, H, W, Ch])``; IGA: ``()``).
  """
  params: PyTree
  stats: PyTree
  opt_state: PyTree
  best: PyTree = ()


UpdateFn = Callable[[PyTree, PyTree, PyTree], tuple[PyTree, PyTree]]


def generator_step(loss_fn: Callable[..., Any], update: UpdateFn,
                   carry: GenCarry, *args
                   ) -> tuple[GenCarry, jax.Array, PyTree]:
  """One optimizer step on the generator.

  Args:
    loss_fn: ``(params, stats, *args) -> (loss, (new_stats, aux))``.
    update: ``(grads, opt_state, params) -> (new_params, new_opt_state)``.
    carry: the generator before the step; ``carry.best`` passes through.
    *args: the rest of ``loss_fn``'s arguments.

  Returns:
    ``(carry, loss, aux)``: the stepped generator, the loss before the step
    and ``loss_fn``'s ``aux``.
  """
  (loss, (stats, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      carry.params, carry.stats, *args)
  params, opt_state = update(grads, carry.opt_state, carry.params)
  return GenCarry(params=params, stats=stats, opt_state=opt_state,
                  best=carry.best), loss, aux


def split_keys(key: jax.Array, index: jax.Array, num: int) -> jax.Array:
  """``num`` keys of epoch or round ``index``: ``split(fold_in(key, index))``.

  So an epoch's randomness does not depend on how the run was resumed.
  """
  return jax.random.split(jax.random.fold_in(key, index), num)


def init_generator(loop: Loop, key: jax.Array
                   ) -> tuple[PyTree, PyTree, jax.Array]:
  """A fresh generator from ``key``'s first half and the run's root key.

  Returns:
    ``(gen_params, gen_stats, run_key)``.
  """
  init_key, run_key = jax.random.split(key)
  gp, gs = ensemble.init_generator(loop.generator, init_key)
  return gp, gs, run_key


def alternate(carry: GenCarry, student: PyTree, *, iterations: int,
              generator_steps: int,
              generator: Callable[[GenCarry, PyTree, int, int],
                                  tuple[GenCarry, Sequence[Metrics]]],
              student_steps: Callable[[GenCarry, int], int],
              student_step: Callable[[PyTree, GenCarry, int, int],
                                     tuple[PyTree, Metrics]],
              ) -> tuple[GenCarry, PyTree, list[Metrics], list[Metrics]]:
  """The host loop: per iteration, the generator's steps, then the student's.

  Args:
    carry: the generator's carry.
    student: the student's carry (any pytree the steps pass on).
    iterations: ``I``.
    generator_steps: generator steps per iteration.
    generator: ``(carry, student, i, g) -> (carry, [metrics])``, generator
      step ``g`` of iteration ``i`` (may run several programs).
    student_steps: ``(carry, i) -> n``: after iteration ``i``'s generator
      steps, how many student steps follow (it may run a program too).
    student_step: ``(student, carry, i, s) -> (student, metrics)``.

  Returns:
    ``(carry, student, generator metrics, student metrics)``, the metrics in
    step order.
  """
  gen_ms, stu_ms = [], []
  for i in range(iterations):
    for g in range(generator_steps):
      carry, ms = generator(carry, student, i, g)
      gen_ms.extend(ms)
    for s in range(student_steps(carry, i)):
      student, m = student_step(student, carry, i, s)
      stu_ms.append(m)
  return carry, student, gen_ms, stu_ms


def mean_metrics(step_metrics: Sequence[Metrics]) -> dict[str, jax.Array]:
  """Each metric's mean over the steps of an epoch.

  A running sum and one division, not ``jnp.mean(jnp.stack(...))``: eager
  stacking compiles anew for each number of steps, which changes from epoch
  to epoch as the pool fills.

  Args:
    step_metrics: one dict of scalar arrays per step, all with the same keys
      (at least one step).

  Returns:
    ``{name: mean}``.
  """
  n = len(step_metrics)
  total = dict(step_metrics[0])
  for m in step_metrics[1:]:
    total = {k: v + m[k] for k, v in total.items()}
  return {k: v / n for k, v in total.items()}


def jit_programs(programs: type, loop: Loop, *, once: tuple[str, ...] = (),
                 **fns: Callable[..., Any]):
  """The loop's programs, each ``fn(loop, ...)`` jitted once with ``loop`` bound.

  Args:
    programs: a ``NamedTuple`` class with one field per program.
    loop: the static settings every program closes over.
    once: the fields compiled with :func:`fedjax_dd.core.clients.once_jit`
      (those whose compilation is most of their cost, such as an epoch's
      random draws); the others use ``jax.jit``.
    **fns: the programs' pure functions by field name.

  Raises:
    ValueError: a name in ``once`` that is not one of ``fns``.
  """
  unknown = sorted(set(once) - set(fns))
  if unknown:
    raise ValueError(f"jit_programs: once names {unknown}, which are not "
                     f"programs of {sorted(fns)}.")
  return programs(**{
      name: (clients.once_jit if name in once else jax.jit)(
          functools.partial(fn, loop)) for name, fn in fns.items()})
