"""Local update for ONE client: a ``lax.scan`` of SGD-family steps.

The client axis is added by ``fedjax_dd.core.clients``. A client owns padded
data ``x [N_max, H, W, Ch]``, ``y [N_max]`` with ``num_examples`` valid rows
and makes its own ``num_steps <= max_steps`` steps, never training on
padding (batches are drawn modulo ``num_examples``).

The steps run in a ``lax.while_loop`` that stops after the client's own
``num_steps`` (``skip_padding=True``, the default); under ``vmap`` it runs to
the chunk's largest count and masks finished clients, so a chunk costs its own
maximum (``clients.client_stage`` buckets clients by step count).
``skip_padding=False`` is a ``lax.scan`` of ``max_steps`` masked steps; both
give the same bits.

What every algorithm's clients share is one value, :class:`LocalTraining`,
handed whole to every algorithm factory and from there to
:func:`make_local_update`. Every local update receives a
:class:`RoundContext` and scales its steps by
``training.schedule(ctx.round)`` itself: no algorithm counts rounds.

Algorithms customise the update through pure hooks of the context:

* ``regularizer(params, ctx) -> scalar`` added to the loss (FedProx);
* ``grad_correction(grads, ctx) -> grads`` (SCAFFOLD's control variates);
* ``loss(params, batch_stats, xb, yb, ctx) -> (loss, (new_stats, accuracy))``
  in place of the task's cross-entropy (MOON's model-contrastive term).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, NamedTuple

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_dd.core import checks
from fedjax_dd.core.clients import ClientMapper
# Built by the client stage; re-exported here beside the hooks it feeds.
from fedjax_dd.core.clients import RoundContext  # noqa: F401
from fedjax_dd.core.task import Classifier
from fedjax_dd.data.stacked import sample_batch

PyTree = Any

_log = logging.getLogger(__name__)
# (batch_size, N_max) pairs whose capped batch was already logged.
_capped_logged: set[tuple[int, int]] = set()

# The augmentation key is folded off the batch key at this index, leaving the
# batch key (and a run without augmentation's batches) unchanged.
_AUGMENT_STREAM = 1


@flax.struct.dataclass
class LocalResult:
  """What one client returns after local training.

  Attributes:
    params: updated parameters.
    batch_stats: updated BatchNorm statistics (``{}`` without BN).
    opt_state: the local optimizer state after training.
    loss: mean training loss over the active steps.
    accuracy: mean training-batch accuracy over the active steps.
    steps: number of active (unmasked) steps, as float32.
  """
  params: PyTree
  batch_stats: PyTree
  opt_state: PyTree
  loss: jax.Array
  accuracy: jax.Array
  steps: jax.Array


class LocalUpdate(NamedTuple):
  """Per-client local training built by :func:`make_local_update`."""
  run: Callable[..., LocalResult]
  optimizer: optax.GradientTransformation
  batch_size: int


def apply_updates(params: PyTree, updates: PyTree) -> PyTree:
  """``params + updates``, written as ``params − (−updates)``.

  Same values as ``optax.apply_updates``; the subtraction keeps XLA:CPU's
  classic runtime from fusing the sum into a slower oneDNN convolution
  (see experiments/perf_notes.md).
  """
  return jax.tree_util.tree_map(
      lambda p, u: (p - (-u)).astype(p.dtype), params, updates)


@dataclasses.dataclass(frozen=True)
class LocalTraining:
  """How every client of an algorithm trains locally, as one value.

  Handed to an algorithm factory, which passes it to
  :func:`make_local_update` with its own hooks. Frozen, and hashable when
  its callables are.

  Attributes:
    task: the classifier every client trains.
    optimizer: the local optax optimizer, fresh per client (the entry
      point's: clip -> weight decay -> SGD / Adam(W), ``client.*``).
    batch_size: examples per step ``B``, capped to the padded length
      ``N_max`` (:func:`effective_batch_size`): draws past the data would
      only repeat examples at a larger program's cost.
    max_steps: the largest step count a client may be given; ``num_steps``
      is clipped to it (:func:`fedjax_dd.fit` refuses larger counts).
    mapper: how the cohort's clients are laid out on the devices
      (:class:`~fedjax_dd.core.clients.ClientMapper`).
    augment: optional ``(key, xb [B, H, W, Ch] uint8) -> xb`` applied to
      each sampled batch before the loss (:func:`flip_and_crop`). Its key is
      folded off the batch key, so the batches are those of a run without it.
    schedule: an optax schedule of the 0-based round ``i``
      (:attr:`RoundContext.round`): the optimizer's updates are multiplied
      by ``schedule(i)`` (exact for SGD, momentum, weight decay and
      Adam(W)). :func:`round_decay` is FedFTG's ``lr *
      lr_decay_per_round**i`` (DisUE Sec. 5.1: 0.998). ``None`` (default):
      a constant rate.
    unroll: ``lax.scan`` unroll factor (``skip_padding=False`` only).
    skip_padding: a ``lax.while_loop`` to each client's own ``num_steps``
      instead of a masked ``lax.scan`` of ``max_steps``; same results.

  Raises:
    fedjax_dd.core.checks.SettingError: ``optimizer`` not an optax
      transformation, ``batch_size`` or ``max_steps`` not an int >= 1, or
      ``schedule`` neither ``None`` nor callable.
  """
  task: Classifier
  optimizer: optax.GradientTransformation
  batch_size: int
  max_steps: int
  mapper: ClientMapper = ClientMapper()
  augment: Callable[[jax.Array, jax.Array], jax.Array] | None = None
  schedule: Callable[[jax.Array], jax.Array] | None = None
  unroll: int = 1
  skip_padding: bool = True

  def __post_init__(self):
    checks.check_transformation("LocalTraining.optimizer", self.optimizer)
    checks.check_int("max_steps", self.max_steps, 1)
    checks.check_int("batch_size", self.batch_size, 1)
    if self.schedule is not None and not callable(self.schedule):
      checks.refuse("LocalTraining.schedule",
                    "None or an optax schedule (a function of the round)",
                    self.schedule)

  @property
  def decays(self) -> bool:
    """Whether the learning rate changes over rounds (a ``schedule``)."""
    return self.schedule is not None


@dataclasses.dataclass(frozen=True)
class RoundDecay:
  """The schedule ``i -> gamma**i`` of the round index ``i``
  (``optax.exponential_decay(1, 1, gamma)``): FedFTG's per-round decay of
  the client rate, ``lr * lr_decay_per_round**i`` (DisUE Sec. 5.1).

  A frozen value rather than a closure, so that two :class:`LocalTraining`
  of one config are equal (a cache key).

  Attributes:
    gamma: the per-round factor, a finite number > 0.
  """
  gamma: float

  def __call__(self, round_index: jax.Array) -> jax.Array:
    return optax.exponential_decay(1.0, 1, self.gamma)(round_index)


def round_decay(gamma: float) -> RoundDecay | None:
  """:class:`RoundDecay` ``(gamma)``, or ``None`` (a constant rate) for
  ``gamma == 1``.

  Raises:
    fedjax_dd.core.checks.SettingError: ``gamma`` not a positive finite
      number.
  """
  checks.check_number("lr_decay", gamma, 0.0, low_open=True)
  if float(gamma) == 1.0:
    return None
  return RoundDecay(float(gamma))


def make_local_update(
    training: LocalTraining,
    *,
    regularizer: Callable[[PyTree, PyTree], jax.Array] | None = None,
    grad_correction: Callable[[PyTree, PyTree], PyTree] | None = None,
    loss: Callable[..., tuple[jax.Array, tuple[PyTree, jax.Array]]]
    | None = None,
) -> LocalUpdate:
  """Builds ``run(params, batch_stats, opt_state, x, y, n, num_steps, key, ctx)``.

  Args:
    training: the clients' local training (:class:`LocalTraining`).
    regularizer: optional ``(params, ctx) -> scalar`` added to the loss;
      ``ctx`` is the client's :class:`RoundContext`.
    grad_correction: optional ``(grads, ctx) -> grads``.
    loss: optional ``(params, batch_stats, xb, yb, ctx) -> (loss,
      (new_batch_stats, accuracy))`` replacing ``task.loss`` (in training
      mode) on every batch; ``regularizer`` is still added.

  Returns:
    A :class:`LocalUpdate` whose ``run`` takes, for one client, ``params``,
    ``batch_stats``, ``opt_state``, ``x [N_max, H, W, Ch] uint8``,
    ``y [N_max]``, ``n`` (valid examples), ``num_steps`` (active steps,
    ``<= max_steps``), ``key`` and ``ctx`` (a :class:`RoundContext`), and
    returns a :class:`LocalResult`.
    Optional ``first_step`` and ``stop_step`` (ints or traced scalars) run
    only the steps ``[first_step, min(num_steps, stop_step))``; consecutive
    spans compute the steps of one call
    (:func:`fedjax_dd.core.clients.client_span_stage`). ``loss``,
    ``accuracy`` and ``steps`` then cover the span.
  """
  task, optimizer = training.task, training.optimizer
  schedule = training.schedule
  batch_size, max_steps = training.batch_size, training.max_steps
  augment, unroll = training.augment, training.unroll
  skip_padding = training.skip_padding

  if loss is None:
    batch_loss = lambda p, s, xb, yb, ctx: task.loss(p, s, xb, yb, train=True)
  else:
    batch_loss = loss

  def loss_fn(params, batch_stats, xb, yb, ctx):
    value, (new_stats, acc) = batch_loss(params, batch_stats, xb, yb, ctx)
    if regularizer is not None:
      value = value + regularizer(params, ctx)
    return value, (new_stats, acc)

  value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)

  def run(params, batch_stats, opt_state, x, y, n, num_steps, key, ctx,
          first_step=0, stop_step=None):

    batch = effective_batch_size(batch_size, x.shape[0])

    def step(carry, t):
      params, batch_stats, opt_state, loss_sum, acc_sum = carry
      batch_key = jax.random.fold_in(key, t)
      xb, yb = sample_batch(batch_key, x, y, n, batch)
      if augment is not None:
        xb = augment(jax.random.fold_in(batch_key, _AUGMENT_STREAM), xb)
      (loss, (new_stats, acc)), grads = value_and_grad(
          params, batch_stats, xb, yb, ctx)
      if grad_correction is not None:
        grads = grad_correction(grads, ctx)
      updates, new_opt = optimizer.update(grads, opt_state, params)
      if schedule is not None:
        scale = schedule(ctx.round)
        updates = jax.tree_util.tree_map(
            lambda u: u * jnp.asarray(scale, u.dtype), updates)
      new_params = apply_updates(params, updates)
      active = (t >= first) & (t < limit)
      keep = lambda new, old: jax.tree_util.tree_map(
          lambda a, b: jnp.where(active, a, b), new, old)
      act = active.astype(jnp.float32)
      carry = (keep(new_params, params), keep(new_stats, batch_stats),
               keep(new_opt, opt_state), loss_sum + act * loss,
               acc_sum + act * acc)
      return carry, None

    zero = jnp.zeros((), jnp.float32)
    init = (params, batch_stats, opt_state, zero, zero)
    first = jnp.asarray(first_step, jnp.int32)
    # Steps [first_step, limit); batch keys fold the global index t, so
    # consecutive spans give the steps of one call.
    limit = jnp.minimum(num_steps, max_steps)
    if stop_step is not None:
      limit = jnp.minimum(limit, stop_step)
    if skip_padding:
      # The scan's step body, so both forms compute the same values.

      def body(loop_carry):
        t, carry = loop_carry
        return t + 1, step(carry, t)[0]

      _, (params, batch_stats, opt_state, loss_sum, acc_sum) = (
          jax.lax.while_loop(lambda c: c[0] < limit, body, (first, init)))
    else:
      (params, batch_stats, opt_state, loss_sum, acc_sum), _ = jax.lax.scan(
          step, init, jnp.arange(max_steps), unroll=unroll)
    steps = jnp.maximum(limit - first, 0).astype(jnp.float32)
    denom = jnp.maximum(steps, 1.0)
    return LocalResult(params, batch_stats, opt_state, loss_sum / denom,
                       acc_sum / denom, steps)

  return LocalUpdate(run=run, optimizer=optimizer, batch_size=batch_size)


def effective_batch_size(batch_size: int, max_examples: int) -> int:
  """``min(B, N_max)``: the batch a local step draws from clients padded to
  ``N_max`` examples; logs one line (once per pair) when it caps ``B``."""
  if batch_size <= max_examples or max_examples < 1:
    return batch_size
  if (batch_size, max_examples) not in _capped_logged:
    _capped_logged.add((batch_size, max_examples))
    _log.warning(
        "batch_size %d is larger than the largest client's %d examples; "
        "local steps draw batches of %d.", batch_size, max_examples,
        max_examples)
  return max_examples


def steps_for(num_examples: jax.Array, batch_size: int, *,
              epochs: float | None = None,
              steps: int | None = None) -> jax.Array:
  """Active local steps per client: ``epochs * ceil(n / B)`` or a fixed count.

  Exactly one of ``epochs`` and ``steps`` must be given. Clients with no data
  get zero steps.

  Raises:
    fedjax_dd.core.checks.SettingError: ``batch_size`` not an int >= 1,
      ``epochs`` not a finite number > 0, or ``steps`` not an int >= 0.
  """
  if (epochs is None) == (steps is None):
    raise ValueError("Give exactly one of `epochs` and `steps`.")
  # A bad batch gives plausible-looking or negative step counts: refused.
  batch_size = checks.check_int("batch_size", batch_size, 1)
  if epochs is not None:
    epochs = checks.check_number("epochs", epochs, 0.0, low_open=True)
  else:
    steps = checks.check_int("steps", steps, 0)
  n = jnp.asarray(num_examples)
  if steps is not None:
    return jnp.where(n > 0, steps, 0).astype(jnp.int32)
  per_epoch = -(-n // batch_size)
  return jnp.ceil(per_epoch * epochs).astype(jnp.int32)


def flip_and_crop(pad: int = 4, *, flip_prob: float = 0.5,
                  crop_prob: float = 0.5
                  ) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """Random horizontal flip and zero-padded random crop, per example.

  The CIFAR augmentation of FedFTG's client training (followed by DisUE
  Sec. 5.1): a left-right flip with probability ``flip_prob`` and, with
  probability ``crop_prob`` (FedFTG: 0.5; torchvision's
  ``RandomCrop(padding=4)``: 1), a crop at a uniform offset of the image
  zero-padded by ``pad`` (black raw pixels, unlike FedFTG's mean colour).
  Off by default: flips are wrong for digits and text.

  Args:
    pad: padding per side in pixels, >= 0.
    flip_prob: probability of a horizontal flip.
    crop_prob: probability of the padded random crop.

  Returns:
    ``augment(key, xb [B, H, W, Ch]) -> [B, H, W, Ch]`` of ``xb``'s dtype
    (uint8 images), jittable and vmappable.
  """
  if pad < 0:
    raise ValueError(f"pad must be >= 0, got {pad}.")
  for name, p in (("flip_prob", flip_prob), ("crop_prob", crop_prob)):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"{name} must be in [0, 1], got {p}.")

  def augment(key: jax.Array, xb: jax.Array) -> jax.Array:
    b, h, w, ch = xb.shape
    k_flip, k_crop, k_off = jax.random.split(key, 3)
    flip = jax.random.bernoulli(k_flip, flip_prob, (b,))
    crop = jax.random.bernoulli(k_crop, crop_prob, (b,))
    offsets = jax.random.randint(k_off, (b, 2), 0, 2 * pad + 1)
    # The centre offset (pad, pad) is the uncropped image.
    offsets = jnp.where(crop[:, None], offsets, pad)
    padded = jnp.pad(xb, ((0, 0), (pad, pad), (pad, pad), (0, 0)))

    def one(img, f, off):
      img = jnp.where(f, img[:, ::-1], img)
      return jax.lax.dynamic_slice(img, (off[0], off[1], 0), (h, w, ch))

    return jax.vmap(one)(padded, flip, offsets)

  return augment
