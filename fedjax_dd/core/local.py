"""Local update for ONE client: a ``lax.scan`` of SGD-family steps.

The client axis is added elsewhere (``fedjax_dd.core.clients``). Here a client
owns padded data ``x [N_max, H, W, Ch]``, ``y [N_max]`` with ``num_examples``
valid rows, and makes ``num_steps <= max_steps`` steps, so clients with
different amounts of data get their own number of steps per epoch inside one
program and never train on padding (batches are drawn modulo
``num_examples``).

The steps run in a ``lax.while_loop`` that stops after the client's own
``num_steps`` (``skip_padding=True``, the default). Run unbatched (a chunk of
one client) it computes exactly the client's steps; under ``vmap`` JAX runs the
loop until the chunk's largest count and masks the finished clients, so a
chunk costs its own maximum, not the cohort's (``clients.client_stage`` sorts
the cohort by step count so that chunks hold similar counts).
``skip_padding=False`` is the former form: a ``lax.scan`` of ``max_steps``
iterations whose steps past ``num_steps`` are computed and masked. Both give
the same bits (``tests/core/test_local.py``).

What every algorithm's clients share (the task, optimizer, batch size, step
bound, augmentation, the learning-rate schedule over rounds and the client
mapper) is one value, :class:`LocalTraining`, built once (from a config by
``fedjax_dd.experiments.common.local_training``) and handed whole to every
algorithm factory and from there to :func:`make_local_update`.

The engine owns the round: every local update receives a typed
:class:`RoundContext` (the round's index, the model the client starts from,
and the algorithm's own broadcast and per-client values), and the update
scales the optimizer's steps by ``training.schedule(ctx.round)`` itself. No
algorithm counts rounds or packs the factor into its context.

Algorithms customise the update through pure hooks of the context:

* ``regularizer(params, ctx) -> scalar`` added to the loss (FedProx);
* ``grad_correction(grads, ctx) -> grads`` (SCAFFOLD's control variates);
* ``loss(params, batch_stats, xb, yb, ctx) -> (loss, (new_stats, accuracy))``
  in place of the task's cross-entropy, for a loss that needs the batch
  beyond the logits (MOON's model-contrastive term on the projection).
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

# The augmentation key of a step is folded off its batch key at this index;
# the batch key itself is unchanged, so runs without augmentation keep their
# batches.
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

  Same values as ``optax.apply_updates``. XLA:CPU's classic runtime (jax
  0.5.x) rewrites ``p + (−lr · conv_weight_grad)`` into a oneDNN
  convolution with a fused sum that runs much slower than the plain
  convolution; the subtraction form keeps the fast convolution
  (experiments/perf_notes.md, "Measurements moved from docstrings").
  """
  return jax.tree_util.tree_map(
      lambda p, u: (p - (-u)).astype(p.dtype), params, updates)


@dataclasses.dataclass(frozen=True)
class LocalTraining:
  """How every client of an algorithm trains locally, as one value.

  Built once (a notebook by hand, the entry point from the config's
  ``client`` and ``engine`` groups) and handed whole to an algorithm
  factory, which passes it on to :func:`make_local_update` with only its
  own hooks (a regulariser, a gradient correction, a loss). Frozen, and
  hashable when its callables are; :func:`dataclasses.replace` gives a
  variant.

  Attributes:
    task: the classifier every client trains.
    optimizer: the local optax optimizer, fresh per client (the entry
      point's: clip -> weight decay -> SGD / Adam(W), ``client.*``).
    batch_size: examples per step ``B``. A batch never holds more draws
      than the largest client has examples (``N_max``, the padded length):
      with ``B > N_max`` each step draws ``N_max`` (one log line), since
      every draw past the data repeats an example at the cost of a larger
      program (``B / N_max`` times the work). Below ``N_max`` nothing
      changes.
    max_steps: the largest step count a client may be given (the cohort's
      largest); ``num_steps`` is clipped to it (:func:`fedjax_dd.fit`
      refuses larger counts).
    mapper: how the cohort's clients are laid out on the devices
      (:class:`~fedjax_dd.core.clients.ClientMapper`): the layout, not
      what each client computes.
    augment: optional ``(key, xb [B, H, W, Ch] uint8) -> xb`` applied to
      each sampled batch before the loss (:func:`flip_and_crop`). Its key is
      folded off the batch key, so the batches (and every result without
      augmentation) are those of a run without it.
    schedule: an optax schedule of the round: the round of 0-based index
      ``i`` (:attr:`RoundContext.round`) trains at the optimizer's learning
      rate times ``schedule(i)``, the factor multiplying its updates (exact
      for SGD with or without momentum and weight decay, and Adam(W)).
      :func:`round_decay` ``(gamma)`` is FedFTG's ``lr *
      lr_decay_per_round**i`` (DisUE Sec. 5.1: 0.998). ``None`` (default):
      a constant rate, and states and results are exactly those without a
      schedule.
    unroll: ``lax.scan`` unroll factor (``skip_padding=False`` only).
    skip_padding: stop each client's loop after its own ``num_steps``
      (``lax.while_loop``) instead of computing and masking ``max_steps``
      steps (``lax.scan``); the results are the same.

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
  of one config are equal (a cache key) and print their setting.

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
    training: the clients' local training (:class:`LocalTraining`). With a
      ``schedule``, the optimizer's updates are multiplied by
      ``training.schedule(ctx.round)``.
    regularizer: optional ``(params, ctx) -> scalar`` added to the loss;
      ``ctx`` is the client's :class:`RoundContext`, as for the hooks below.
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
    Optional ``first_step`` and ``stop_step`` (ints or traced scalars) make
    it run only the steps ``[first_step, min(num_steps, stop_step))`` from
    the given state: spans run one after another, each from the last one's
    ``params``, ``batch_stats`` and ``opt_state``, compute the steps of one
    call (step ``t`` draws its batch from ``fold_in(key, t)``), so a long
    local training can be checkpointed between spans. ``loss``, ``accuracy``
    and ``steps`` then cover the span.
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
    # Steps [first_step, limit): a span of the client's own count, so that
    # spans run one after another give the steps of one call (each step's
    # batch key is folded from its global index t).
    limit = jnp.minimum(num_steps, max_steps)
    if stop_step is not None:
      limit = jnp.minimum(limit, stop_step)
    if skip_padding:
      # The same step body as the scan below (its mask is then always on,
      # except for clients a vmap carries past their own count), so both
      # forms compute the same values.

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
  # A zero, fractional or negative batch gives step counts that look
  # plausible ([2 2 2 2] at batch_size=0) or negative: refused here.
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

  The CIFAR augmentation of FedFTG's client training (``utils/util_dataset.py``
  ``Dataset.__getitem__``, followed by DisUE Sec. 5.1): each image is
  flipped left-right with probability ``flip_prob`` and, with probability
  ``crop_prob`` (FedFTG: 0.5; torchvision's ``RandomCrop(padding=4)``: 1),
  zero-padded by ``pad`` on each side and cropped back to ``H x W`` at a
  uniform offset in ``[0, 2 * pad]``. FedFTG pads with zeros after
  normalisation (the mean colour); here the padding is a zero pixel of the
  raw image (black), before normalisation.

  Flips are wrong for digits and text (a mirrored 2 or 7 is not a digit):
  the presets decide whether to augment; nothing turns it on by default.

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
