"""Batched KIP: every client distills its local data in one jitted program.

Kernel Inducing Points (Nguyen et al., ICLR 2021; NeurIPS 2021) learns a small
support set whose kernel-ridge-regression predictions fit the local data. FedD3
(Song et al., Eq. 4) and HFLDD (Shi et al., Eq. 1) run it on every client.

The optimisation (:func:`make_distiller`) is written for ONE client and
mapped over the client axis, so all supports live in one array
``[C, S, H, W, Ch]``. The host runs segments of ``segment_iterations``
iterations (one batched program each) until every client has converged or
``max_iterations`` is reached; a converged client's ``lax.while_loop``
stops updating it.

Supports are optimised in the normalised space ``z = (x / 255 − mean) / std``
(where Adam's default learning rate 0.004 is meaningful) and sent as uint8
pixels. The settings travel as one :class:`KipOptions`.

Against the reference (KIP, Nguyen, Chen, Lee, ICLR 2021, Alg. 1 and App. A;
the authors' colab ``google-research/kip/KIP.ipynb``, reused by FedD3's code
``rruisong/FedD3`` ``utils/dd_kip.py``):

* Labels start one-hot, centred (``one_hot - 1/K``, App. A) only with
  ``centered_labels`` (off for FedD3's and HFLDD's presets); with
  ``learn_labels`` one Adam runs over ``(z, y)``, as the reference's.
* The ridge ``reg * tr(K_ss) / n * I`` is the reference's, solved in float32
  with a Cholesky jitter ladder (``fedjax_dd.kernels.krr``), not float64.
* :func:`fedjax_dd.kernels.kip_loss.kip_loss` sums over the K classes where
  the reference averages: K times larger, which Adam's steps ignore.
* Target batches are uniform with replacement unless ``balanced_targets``
  (class-balanced, with replacement; the reference's: balanced, without).
* :class:`KipResult` holds the support unclipped, as the reference evaluates
  it; :func:`quantize` clips for transmission. Clipping after optimisation
  loses the learned labels' gain, so ``clip_pixels`` projects onto the pixel
  range after every step (``experiments/results/kip_label_learning_mnist.md``).
* FedD3 and HFLDD servers train with cross-entropy on
  :func:`labels_to_targets` of learned labels: no reference counterpart.
* The paper's FC kernels use ``sigma_b^2 = 1e-4`` (App. A) where the colab,
  FedD3's code and :func:`fedjax_dd.kernels.native.fc_kernel` use
  ``b_std = 0.1``.
* ``client_normalization`` standardises each client's data by its own
  channel statistics, as FedD3's code does, and maps the support back with
  the caller's ``mean``/``std``, as the authors' server reads it; an image
  KIP did not move then comes back as an affine map of a raw one.

:data:`KIP_PAPER` gathers App. A's settings.

DP-KIP. With ``KipOptions.dp_clip > 0`` each client runs DP-KIP (Vinaroz &
Park, "Differentially Private Kernel Inducing Points using features from
ScatterNets (DP-KIP-ScatterNet)", TMLR 2023, arXiv 2301.13389, Alg. 1): with
one loss per target example,
``l_i(x_s, y_s) = 0.5 ||y_i - K_is (K_ss + lambda I)^{-1} y_s||^2``, each
step releases

    g = (sum_i clip_C(grad l_i) + N(0, sigma^2 C^2 I)) / B,

``clip_C(v) = v min(1, C / ||v||)`` over the support images (and labels,
with ``learn_labels``) jointly, before the same Adam step
(:func:`example_gradients`, :func:`private_gradient`). ``C`` is on this
module's loss scale, ``K`` times a reference clip. So that only the noised
gradients depend on the client's data, the support starts data-independent
(:func:`_dp_init_support`), target batches are drawn without replacement
(:func:`dp_target_batch`), and the budget is fixed (a stop on a target
batch's accuracy is not private).

A client's ``(epsilon, delta)`` over ``T`` iterations is
:func:`fedjax_dd.privacy.accounting.epsilon` ``(sigma, B / n, T, delta)``
(Poisson sampling at rate ``B / n`` standing in for the uniform draw);
:func:`dp_fields` reports the worst client's (the smallest ``n``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Protocol

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.core import checks
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.data.partition import class_counts
from fedjax_dd.data import validate
from fedjax_dd.data.stacked import sample_batch
from fedjax_dd.privacy import gaussian
from fedjax_dd.kernels.kip_loss import kip_loss, one_hot_labels

PyTree = Any
KernelFn = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class KipOptions:
  """KIP's optimisation settings, one name each (config key ``kip_<name>``).

  Defaults are FedD3's (App. C) and HFLDD's (Sec. V-A); HFLDD runs the
  fixed budget (``stop_accuracy=None``).

  Attributes:
    lr: Adam learning rate in the normalised space.
    max_iterations: iteration cap per client (the budget without a stop).
    target_batch_size: targets sampled from the client's data per iteration.
    reg: relative KRR ridge ``lambda``.
    learn_labels: also optimise the support labels (KIP Alg. 1).
    centered_labels: KIP's centred one-hot labels (``one_hot - 1/K``, App. A).
    balanced_targets: class-balanced target batches (:func:`balanced_batch`).
    clip_pixels: after every step, project the support images onto the
      pixel range ``[0, 255]``, so the uint8 upload is what was optimised.
    client_normalization: standardise each client's images by its own
      channel statistics (:func:`client_stats`; module docstring).
    stop_accuracy: per-client early stop on target-batch accuracy (FedD3's
      rule; a single-class batch never triggers it), or None.
    min_iterations: iterations before the early stop may trigger.
    segment_iterations: iterations per batched program between host checks
      (progress reports); the result does not depend on it.
    dp_clip: DP-KIP's per-example clipping norm ``C`` (module docstring);
      ``0`` (the default) is plain KIP, bit for bit. With ``C > 0``,
      ``stop_accuracy`` must be None or above 1, ``balanced_targets`` and
      ``client_normalization`` False.
    dp_noise_multiplier: DP-KIP's ``sigma`` (noise std ``sigma * C``);
      ``0`` with ``dp_clip > 0`` clips without noise (no guarantee).
  """
  lr: float = 0.004
  max_iterations: int = 3000
  target_batch_size: int = 10
  reg: float = 1e-6
  learn_labels: bool = False
  centered_labels: bool = False
  balanced_targets: bool = False
  clip_pixels: bool = False
  client_normalization: bool = False
  stop_accuracy: float | None = 0.999
  min_iterations: int = 0
  segment_iterations: int = 100
  dp_clip: float = 0.0
  dp_noise_multiplier: float = 0.0

  def __post_init__(self):
    # NaN would pass every comparison below and turn the supports into NaN.
    validate.finite_number("KipOptions.lr", self.lr, low=0.0, inclusive=False)
    validate.finite_number("KipOptions.reg", self.reg, low=0.0)
    if self.stop_accuracy is not None:
      # Above 1 never triggers (a fixed budget, as None).
      validate.finite_number("KipOptions.stop_accuracy", self.stop_accuracy,
                             low=0.0)
    if self.target_batch_size < 1:
      raise ValueError(
          f"target_batch_size must be >= 1, got {self.target_batch_size}.")
    if self.max_iterations < 0 or self.min_iterations < 0:
      raise ValueError("max_iterations and min_iterations must be >= 0, got "
                       f"{self.max_iterations}, {self.min_iterations}.")
    if self.segment_iterations < 1:
      raise ValueError(
          f"segment_iterations must be >= 1, got {self.segment_iterations}.")
    checks.check_number("KipOptions.dp_clip", self.dp_clip, 0.0)
    checks.check_number("KipOptions.dp_noise_multiplier",
                        self.dp_noise_multiplier, 0.0)
    if self.dp_noise_multiplier > 0 and self.dp_clip == 0:
      checks.refuse("KipOptions.dp_clip", "> 0 when dp_noise_multiplier > 0 "
                    "(the noise is sigma * dp_clip)", self.dp_clip)
    if (self.dp and self.stop_accuracy is not None
        and self.stop_accuracy <= 1):
      checks.refuse("KipOptions.stop_accuracy", "None or above 1 (no early "
                    "stop) with DP-KIP (dp_clip > 0): a stop on a target "
                    "batch's accuracy is not private", self.stop_accuracy)
    if self.dp and self.balanced_targets:
      checks.refuse("KipOptions.balanced_targets", "False with DP-KIP "
                    "(dp_clip > 0): the uniform draw without replacement is "
                    "the one the accountant's sampling rate describes",
                    self.balanced_targets)
    if self.dp and self.client_normalization:
      checks.refuse("KipOptions.client_normalization", "False with DP-KIP "
                    "(dp_clip > 0): a client's own channel statistics mix "
                    "all its examples into every target, outside the "
                    "per-example clipping", True)

  @property
  def dp(self) -> bool:
    """Whether DP-KIP is on (``dp_clip > 0``)."""
    return self.dp_clip > 0

  def program(self) -> KipOptions:
    """These settings with the host loop's (``max_iterations``,
    ``segment_iterations``) reset, so such runs share compiled programs."""
    return dataclasses.replace(self, max_iterations=KipOptions.max_iterations,
                               segment_iterations=KipOptions.segment_iterations)


# KIP App. A's settings for MNIST, support unbounded as in the reference.
# The target batch size (not given per experiment in App. A) is ours.
KIP_PAPER = KipOptions(lr=0.01, target_batch_size=1000, reg=1e-6,
                       learn_labels=True, centered_labels=True,
                       balanced_targets=True, stop_accuracy=None,
                       max_iterations=2000)


@flax.struct.dataclass
class KipState:
  """One client's optimisation state (stacked ``[C, ...]`` across clients).

  Attributes:
    z: support images in normalised space ``[S, H, W, Ch]``.
    y: support labels ``[S, K]``.
    mask: ``[S]`` True for real support points.
    opt_state: Adam state over ``(z, y)``.
    iteration: iterations done.
    converged: whether the early-stop criterion was met.
    accuracy: target-batch accuracy of the last iteration.
    loss: KIP loss of the last iteration.
    first_loss: KIP loss of the first iteration.
  """
  z: jax.Array
  y: jax.Array
  mask: jax.Array
  opt_state: PyTree
  iteration: jax.Array
  converged: jax.Array
  accuracy: jax.Array
  loss: jax.Array
  first_loss: jax.Array


class SegmentStore(Protocol):
  """Where :func:`distill_clients` keeps its state between segments.

  ``save(state, done)`` gets the batched :class:`KipState` and the
  iterations reached after every segment (the store may keep only some).
  ``resume(template)``, called once with the state's tree of
  ``jax.ShapeDtypeStruct``, returns a saved ``(state, done)`` or None to
  start from iteration 0. Iteration ``t`` draws its targets from
  ``fold_in(key_i, t)``, so a resumed call is bit-identical to an
  uninterrupted one. E.g. :class:`fedjax_dd.core.stage_cache.TreeCheckpoint`.
  """

  def resume(self, template: KipState) -> tuple[KipState, int] | None:
    ...

  def save(self, state: KipState, done: int) -> None:
    ...


@flax.struct.dataclass
class KipResult:
  """Distilled data of all clients.

  Attributes:
    x: ``[C, S, H, W, Ch]`` float32 pixels as optimised: in ``[0, 255]``
      with ``KipOptions.clip_pixels``, otherwise possibly outside it
      (:func:`quantize` clips).
    y: ``[C, S, K]`` support labels (one-hot, centred or learned).
    mask: ``[C, S]`` True for real support points.
    counts: ``[C]`` real support points per client.
    iterations: ``[C]`` iterations each client ran.
    converged: ``[C]`` early stop reached.
    accuracy: ``[C]`` last target-batch accuracy.
    loss: ``[C]`` last KIP loss.
    first_loss: ``[C]`` KIP loss of the first iteration (0 if none ran).
  """
  x: jax.Array
  y: jax.Array
  mask: jax.Array
  counts: jax.Array
  iterations: jax.Array
  converged: jax.Array
  accuracy: jax.Array
  loss: jax.Array
  first_loss: jax.Array

  @property
  def labels(self) -> jax.Array:
    """Hard labels ``[C, S]`` (argmax of the support labels)."""
    return jnp.argmax(self.y, axis=-1).astype(jnp.int32)


def quantize(x_pixels: jax.Array) -> jax.Array:
  """Float pixels to uint8 for transmission (8 bits per pixel channel)."""
  return jnp.clip(jnp.round(x_pixels), 0, 255).astype(jnp.uint8)


def dequantize(x_uint8: jax.Array) -> jax.Array:
  """uint8 pixels back to float32 on receipt."""
  return jnp.asarray(x_uint8, jnp.float32)


def _stack_class_counts(y, num_examples, num_classes: int) -> np.ndarray:
  """``[C, K]`` examples per (client, class) of stacked data, padding ignored.
  """
  y = np.asarray(y)
  n_max = y.shape[1]
  parts = [c * n_max + np.arange(int(n))
           for c, n in enumerate(np.asarray(num_examples))]
  return class_counts(y.reshape(-1), parts, num_classes)


def raw_upload_pairs(y, num_examples, num_classes: int,
                     images_per_class: int) -> np.ndarray:
  """``[P, 3]`` rows ``(client, class, count)`` whose KIP support would be raw.

  KIP initialises a class's support slots with the client's real images of
  it (:func:`_init_support`), so a class with ``1 <= count <=
  images_per_class`` examples puts all of them in the support; KRR then fits
  every target batch exactly and KIP stops with the raw images in place.
  """
  counts = _stack_class_counts(y, num_examples, num_classes)
  pairs = np.argwhere((counts >= 1) & (counts <= images_per_class))
  return np.column_stack([pairs, counts[pairs[:, 0], pairs[:, 1]]]
                         ) if pairs.size else np.zeros((0, 3), np.int64)


def check_privacy(y: np.ndarray, num_examples: np.ndarray, num_classes: int, *,
                  images_per_class: int = 1,
                  allow_raw_upload: bool = False) -> None:
  """FedD3 App. G: refuses supports that would be a client's raw images.

  Refuses the pairs of :func:`raw_upload_pairs`. Supports smaller than the
  class are not refused, though an early stop can leave an image within
  rounding of a raw one (``fedjax_dd.distill.privacy.upload_privacy``).

  Args:
    y: ``[C, N_max]`` labels of a padded client stack.
    num_examples: ``[C]`` real examples per client (padding is not counted).
    num_classes: K; every real label must be in ``[0, K)``.
    images_per_class: KIP's support slots per class, >= 1.
    allow_raw_upload: accept such pairs (nothing is checked).

  Raises:
    ValueError: naming the first such pair, unless ``allow_raw_upload``; or
      on a label outside ``[0, K)``.
  """
  images_per_class = validate.positive_int("images_per_class",
                                           images_per_class)
  pairs = raw_upload_pairs(y, num_examples, num_classes, images_per_class)
  if pairs.size and not allow_raw_upload:
    c, k, count = (int(v) for v in pairs[0])
    others = ""
    if len(pairs) > 1:
      more = ", ".join(f"client {int(a)} class {int(b)} ({int(m)})"
                       for a, b, m in pairs[1:5])
      others = (f"; {len(pairs)} (client, class) pairs in all: {more}"
                f"{', ...' if len(pairs) > 5 else ''}")
    raise ValueError(
        f"client {c} class {k} holds {count} example{'s' * (count != 1)} <= "
        f"images_per_class={images_per_class}: its KIP support would be "
        f"those raw images (FedD3 App. G){others}. Lower images_per_class "
        "below the smallest class, or set allow_raw_upload=True to accept "
        "raw uploads.")


def balanced_batch(key: jax.Array, x: jax.Array, y: jax.Array,
                   num_examples: jax.Array, batch_size: int,
                   num_classes: int) -> tuple[jax.Array, jax.Array]:
  """A class-balanced target batch from ONE client's padded data (KIP App. A).

  Slot ``j`` draws uniformly, with replacement, from the ``(j mod H)``-th
  of the ``H`` classes the client holds (in class order), so the first
  ``batch_size mod H`` classes get one slot more. Jit-able (``batch_size``,
  ``num_classes`` static); padding is never read.

  Args:
    key: PRNG key.
    x: ``[N_max, H, W, Ch]`` the client's examples.
    y: ``[N_max]`` its labels in ``[0, num_classes)``.
    num_examples: scalar real examples (``>= 1``).
    batch_size: ``B``.
    num_classes: K.

  Returns:
    ``(xb [B, H, W, Ch], yb [B])``.
  """
  n_max = y.shape[0]
  valid = jnp.arange(n_max) < num_examples
  # Padding sorts last (class K); each class's examples are contiguous.
  keyed = jnp.where(valid, y, num_classes)
  order = jnp.argsort(keyed, stable=True)
  counts = jnp.sum(keyed[None, :] == jnp.arange(num_classes)[:, None],
                   axis=1)                                     # [K]
  starts = jnp.cumsum(counts) - counts                          # [K]
  held = jnp.argsort(counts == 0, stable=True)                  # held first
  num_held = jnp.maximum(jnp.sum(counts > 0), 1)
  cls = held[jnp.arange(batch_size) % num_held]                 # [B]
  raw = jax.random.randint(key, (batch_size,), 0, 2**31 - 1)
  within = raw % jnp.maximum(counts[cls], 1)
  idx = order[starts[cls] + within]
  return x[idx], y[idx]


def _init_support(key, x, y, n, *, num_classes, images_per_class, support_size,
                  class_blocks):
  """Indices ``[S]`` and mask ``[S]`` of the initial support for one client.

  With ``images_per_class``, the held classes fill ``class_blocks`` blocks
  of ``images_per_class`` slots in class order, each with random images of
  its class; slots without an image are masked. Otherwise ``support_size``
  random local images (capped by ``n``).
  """
  n_max = y.shape[0]
  valid = jnp.arange(n_max) < n
  u = jax.random.uniform(key, (n_max,))
  if images_per_class is not None:
    is_class = (y[None, :] == jnp.arange(num_classes)[:, None]) & valid[None]
    counts = is_class.sum(axis=1)                                # [K]
    # Held classes first, in class order (argsort is stable).
    block_class = jnp.argsort(counts == 0)[:class_blocks]       # [B]
    scores = jnp.where(is_class, u[None, :], 2.0)[block_class]   # [B, N_max]
    order = jnp.argsort(scores, axis=1)[:, :images_per_class]    # [B, ipc]
    if images_per_class > n_max:  # more slots than images: masked below
      order = jnp.pad(order, ((0, 0), (0, images_per_class - n_max)))
    mask = (jnp.arange(images_per_class)[None, :]
            < counts[block_class][:, None])
    return order.reshape(-1), mask.reshape(-1)
  order = jnp.argsort(jnp.where(valid, u, 2.0))[:support_size]
  if support_size > n_max:  # more slots than images: masked
    order = jnp.pad(order, (0, support_size - n_max))
  return order, jnp.arange(support_size) < n


# DP-KIP's noise stream, apart from the target batches (fold_in(key, t)) and
# the support's initialisation (fold_in(key, 2**31 - 1)).
_DP_NOISE_STREAM = 2**31 - 2


def _dp_init_support(key, example_shape, *, num_classes, images_per_class,
                     support_size, class_blocks):
  """DP-KIP's initial support for one client, independent of its data.

  ``N(0, 1)`` images in normalised space (DP-KIP's ``rand_init``); with
  ``images_per_class`` block ``b`` of ``images_per_class`` slots holds class
  ``b`` (``class_blocks`` must be ``num_classes``), else slot ``j`` of
  ``support_size`` holds class ``j mod num_classes``. Every slot is real.

  Returns:
    ``(z [S, H, W, Ch], labels [S] int32, mask [S])``.
  """
  if images_per_class is not None:
    labels = jnp.repeat(jnp.arange(class_blocks, dtype=jnp.int32),
                        images_per_class)
  else:
    labels = jnp.arange(support_size, dtype=jnp.int32) % num_classes
  z = jax.random.normal(key, (labels.shape[0], *example_shape), jnp.float32)
  return z, labels, jnp.ones(labels.shape, bool)


def dp_target_batch(key: jax.Array, x: jax.Array, y: jax.Array,
                    num_examples: jax.Array, batch_size: int
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """DP-KIP's target batch from ONE client's padded data: ``min(B, n)``
  distinct examples drawn uniformly without replacement.

  Args:
    key: PRNG key.
    x: ``[N_max, H, W, Ch]`` the client's examples.
    y: ``[N_max]`` its labels.
    num_examples: scalar real examples ``n``.
    batch_size: ``B`` (static).

  Returns:
    ``(xb [B, H, W, Ch], yb [B], take [B] bool)``: ``take`` is False for
    the ``B - n`` surplus slots when ``n < B``, which must be left out.
  """
  n_max = y.shape[0]
  valid = jnp.arange(n_max) < num_examples
  order = jnp.argsort(jnp.where(valid, jax.random.uniform(key, (n_max,)),
                                2.0))
  if batch_size > n_max:
    order = jnp.pad(order, (0, batch_size - n_max))
  idx = order[:batch_size]
  return x[idx], y[idx], jnp.arange(batch_size) < num_examples


def example_gradients(kernel_fn: KernelFn, z: jax.Array, ys: jax.Array,
                      mask: jax.Array, xt: jax.Array, yt: jax.Array,
                      reg: float) -> tuple[jax.Array, jax.Array, PyTree]:
  """Per-example KIP losses and gradients for ONE client (DP-KIP Alg. 1).

  ``l_i`` (module docstring) is :func:`fedjax_dd.kernels.kip_loss.kip_loss`
  of target ``i`` alone, differentiated for every ``i`` under one ``vmap``.

  Args:
    kernel_fn: the kernel.
    z: ``[S, H, W, Ch]`` support images (normalised space).
    ys: ``[S, K]`` support labels.
    mask: ``[S]`` True for real support points.
    xt: ``[B, H, W, Ch]`` target images (normalised space).
    yt: ``[B, K]`` target labels.
    reg: the relative ridge ``lambda``.

  Returns:
    ``(losses [B], accuracies [B], (g_z [B, S, H, W, Ch], g_y [B, S, K]))``.
  """

  def example_loss(params, xt1, yt1):
    loss, aux = kip_loss(kernel_fn, params[0], params[1], xt1[None],
                         yt1[None], reg, support_mask=mask)
    return loss, aux.accuracy

  grads = jax.vmap(jax.value_and_grad(example_loss, has_aux=True),
                   in_axes=(None, 0, 0))
  (losses, accuracies), g = grads((z, ys), xt, yt)
  return losses, accuracies, g


def private_gradient(per_example: PyTree, take: jax.Array, key: jax.Array, *,
                     clip: float, noise_multiplier: float,
                     batch_size: int) -> PyTree:
  """DP-SGD's gradient from per-example gradients (DP-KIP Alg. 1; Abadi et
  al. 2016, Alg. 1): ``(sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B``.

  Args:
    per_example: pytree of ``[B, ...]`` leaves; ``g_i`` is slice ``i``.
    take: ``[B]`` bool, False for slots that are no example (left out).
    key: the noise key; leaf ``j`` draws from ``fold_in(key, j)``.
    clip: ``C > 0``, on the norm of ``g_i`` over all its leaves.
    noise_multiplier: ``sigma >= 0``.
    batch_size: ``B``, the divisor, whatever the count of taken slots.

  Returns:
    The pytree without the batch axis, leaves ``[...]``.
  """
  total = gaussian.noised_sum(per_example, key, clip=clip,
                              noise_multiplier=noise_multiplier, valid=take)
  return jax.tree_util.tree_map(lambda t: t / batch_size, total)


def dp_sampling_rate(num_examples, target_batch_size: int) -> float:
  """DP-KIP's worst sampling rate ``q = min(1, B / n)``, at the smallest ``n``.

  Args:
    num_examples: ``[C]`` real examples per client; clients without data
      (which run no step) are left out.
    target_batch_size: ``B``.

  Returns:
    ``q`` in ``(0, 1]``; ``0.0`` when no client holds data.
  """
  n = np.asarray(jax.device_get(num_examples)).reshape(-1)
  n = n[n > 0]
  if not n.size:
    return 0.0
  return float(min(1.0, int(target_batch_size) / int(n.min())))


def dp_fields(options: KipOptions, num_examples, *, steps: int,
              delta: float) -> dict[str, Any]:
  """``summary.json``'s DP fields of a DP-KIP distillation.

  Args:
    options: the run's :class:`KipOptions` (``dp_clip > 0``).
    num_examples: ``[C]`` real examples per client.
    steps: ``T``, the iterations the clients ran (the most of any client).
    delta: the guarantee's ``delta``.

  Returns:
    :func:`fedjax_dd.privacy.accounting.summary_fields` at the worst rate
    (:func:`dp_sampling_rate`), so ``dp_epsilon`` holds for every client.

  Raises:
    ImportError: dp-accounting is not installed (the ``privacy`` extra).
  """
  from fedjax_dd.privacy import accounting  # pylint: disable=g-import-not-at-top
  return accounting.summary_fields(
      clip=options.dp_clip, noise_multiplier=options.dp_noise_multiplier,
      sampling_rate=dp_sampling_rate(num_examples, options.target_batch_size),
      steps=int(steps), delta=delta)


def client_stats(x: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Channel mean and std ``([Ch], [Ch])`` of ONE client's real images.

  On the ``[0, 1]`` scale over the first ``n`` of ``x [N_max, H, W, Ch]``
  (uint8), as FedD3's code computes them. A zero std (a constant channel,
  or no images) becomes 1, so that channel is only centred.
  """
  valid = (jnp.arange(x.shape[0]) < n).astype(jnp.float32)[:, None, None,
                                                             None]
  v = x.astype(jnp.float32) / 255.0
  count = jnp.maximum(n, 1).astype(jnp.float32) * x.shape[1] * x.shape[2]
  mean = jnp.sum(v * valid, axis=(0, 1, 2)) / count
  var = jnp.sum(jnp.square(v - mean) * valid, axis=(0, 1, 2)) / count
  std = jnp.sqrt(var)
  return mean, jnp.where(std > 0, std, 1.0)


def make_distiller(kernel_fn: KernelFn, *, num_classes: int, mean, std,
                   images_per_class: int | None = None,
                   support_size: int | None = None,
                   class_blocks: int | None = None,
                   options: KipOptions = KipOptions(),
                   mapper: ClientMapper = ClientMapper(workload="kip")):
  """Builds the batched ``init`` and ``segment`` programs.

  Arguments as :func:`distill_clients` (``class_blocks`` defaulting to
  ``num_classes``; ``options``' host loop settings are not used).

  Returns:
    ``(init, segment, normalise)``: ``init(keys [C], x, y, n) -> KipState [C]``,
    ``segment(state, keys [C], x, y, n, until) -> KipState`` running each
    client until it converges or reaches iteration ``until``, and the map
    from uint8 pixels to the supports' space.
  """
  _check_support_args(images_per_class, support_size)
  validate.positive_int("num_classes", num_classes)
  target_batch_size = options.target_batch_size
  reg, learn_labels = options.reg, options.learn_labels
  centered_labels, min_iterations = options.centered_labels, options.min_iterations
  class_blocks = num_classes if class_blocks is None else class_blocks
  if not 1 <= class_blocks <= num_classes:
    raise ValueError(f"class_blocks must be in [1, {num_classes}], got "
                     f"{class_blocks}.")
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)
  opt = optax.adam(options.lr)
  # None: a fixed iteration budget with no accuracy stop (HFLDD Sec. IV).
  stop = jnp.inf if options.stop_accuracy is None else options.stop_accuracy

  def normalise(x):
    return (x.astype(jnp.float32) / 255.0 - mean) / std

  def normaliser(x, n):
    """The map from ONE client's uint8 pixels to its support's space."""
    if not options.client_normalization:
      return normalise
    m, s = client_stats(x, n)
    return lambda v: (v.astype(jnp.float32) / 255.0 - m) / s

  # The valid pixel range [0, 255] in normalised space, per channel.
  z_low, z_high = (0.0 - mean) / std, (1.0 - mean) / std

  def init_one(key, x, y, n):
    idx, mask = _init_support(key, x, y, n, num_classes=num_classes,
                              images_per_class=images_per_class,
                              support_size=support_size,
                              class_blocks=class_blocks)
    z = normaliser(x, n)(x[idx]) * mask[:, None, None, None]
    ys = one_hot_labels(y[idx], num_classes, centered_labels)
    ys = ys * mask[:, None]
    zero = jnp.zeros((), jnp.float32)
    return KipState(z=z, y=ys, mask=mask, opt_state=opt.init((z, ys)),
                    iteration=jnp.zeros((), jnp.int32),
                    converged=jnp.zeros((), bool), accuracy=zero, loss=zero,
                    first_loss=zero)

  def loss_fn(params, mask, xt, yt):
    z, ys = params
    return kip_loss(kernel_fn, z, ys, xt, yt, reg, support_mask=mask)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: KipState, key, x, y, n):
    batch_key = jax.random.fold_in(key, state.iteration)
    if options.balanced_targets:
      xb, yb = balanced_batch(batch_key, x, y, n, target_batch_size,
                              num_classes)
    else:
      xb, yb = sample_batch(batch_key, x, y, n, target_batch_size)
    xt = normaliser(x, n)(xb)
    yt = one_hot_labels(yb, num_classes, centered_labels)
    (loss, aux), (gz, gy) = grad_fn((state.z, state.y), state.mask, xt, yt)
    if not learn_labels:
      gy = jnp.zeros_like(gy)
    updates, opt_state = opt.update((gz, gy), state.opt_state)
    z, ys = optax.apply_updates((state.z, state.y), updates)
    m = state.mask
    if options.clip_pixels:
      z = jnp.clip(z, z_low, z_high)
    z = jnp.where(m[:, None, None, None], z, 0.0)
    ys = jnp.where(m[:, None], ys, 0.0)
    it = state.iteration + 1
    # Any support fits a single-class batch: counting it would stop a
    # one-class client at iteration 1 with its raw initial images.
    informative = jnp.any(yb != yb[0])
    converged = ((aux.accuracy >= stop) & (it >= min_iterations)
                 & informative)
    first_loss = jnp.where(state.iteration == 0, loss, state.first_loss)
    return KipState(z=z, y=ys, mask=m, opt_state=opt_state, iteration=it,
                    converged=converged, accuracy=aux.accuracy, loss=loss,
                    first_loss=first_loss)

  if options.dp:
    init_one, step = _dp_programs(
        kernel_fn, opt, normalise, (z_low, z_high), options,
        num_classes=num_classes, images_per_class=images_per_class,
        support_size=support_size, class_blocks=class_blocks)

  def segment_one(state, key, x, y, n, until):
    active = lambda s: (~s.converged) & (s.iteration < until) & (n > 0)
    return jax.lax.while_loop(active, lambda s: step(s, key, x, y, n), state)

  init = mapper.map(init_one, in_axes=(0, 0, 0, 0))
  segment = mapper.map(segment_one, in_axes=(0, 0, 0, 0, 0, None))
  return init, segment, normalise


def _dp_programs(kernel_fn, opt, normalise, z_range, options: KipOptions, *,
                 num_classes, images_per_class, support_size, class_blocks):
  """DP-KIP's ``init_one`` and ``step`` for ONE client (module docstring)."""
  if images_per_class is not None and class_blocks != num_classes:
    raise ValueError(
        f"class_blocks must be num_classes = {num_classes} with DP-KIP (every "
        "class gets its slots, so the support does not depend on the classes "
        f"a client holds), got {class_blocks}.")
  batch_size, reg = options.target_batch_size, options.reg
  learn_labels, centered = options.learn_labels, options.centered_labels
  clip, sigma = options.dp_clip, options.dp_noise_multiplier
  z_low, z_high = z_range

  def init_one(key, x, y, n):
    del y, n
    z, labels, mask = _dp_init_support(
        key, x.shape[1:], num_classes=num_classes,
        images_per_class=images_per_class, support_size=support_size,
        class_blocks=class_blocks)
    ys = one_hot_labels(labels, num_classes, centered)
    zero = jnp.zeros((), jnp.float32)
    return KipState(z=z, y=ys, mask=mask, opt_state=opt.init((z, ys)),
                    iteration=jnp.zeros((), jnp.int32),
                    converged=jnp.zeros((), bool), accuracy=zero, loss=zero,
                    first_loss=zero)

  def step(state: KipState, key, x, y, n):
    batch_key = jax.random.fold_in(key, state.iteration)
    noise_key = jax.random.fold_in(
        jax.random.fold_in(key, _DP_NOISE_STREAM), state.iteration)
    xb, yb, take = dp_target_batch(batch_key, x, y, n, batch_size)
    xt = normalise(xb)
    yt = one_hot_labels(yb, num_classes, centered)
    losses, accs, (gz, gy) = example_gradients(
        kernel_fn, state.z, state.y, state.mask, xt, yt, reg)
    if learn_labels:
      gz, gy = private_gradient((gz, gy), take, noise_key, clip=clip,
                                noise_multiplier=sigma, batch_size=batch_size)
    else:
      (gz,) = private_gradient((gz,), take, noise_key, clip=clip,
                               noise_multiplier=sigma, batch_size=batch_size)
      gy = jnp.zeros_like(state.y)
    updates, opt_state = opt.update((gz, gy), state.opt_state)
    z, ys = optax.apply_updates((state.z, state.y), updates)
    if options.clip_pixels:
      z = jnp.clip(z, z_low, z_high)
    count = jnp.maximum(jnp.sum(take), 1).astype(jnp.float32)
    loss = jnp.sum(jnp.where(take, losses, 0.0)) / count
    accuracy = jnp.sum(jnp.where(take, accs, 0.0)) / count
    first_loss = jnp.where(state.iteration == 0, loss, state.first_loss)
    # A fixed budget: no stop (KipOptions refuses stop_accuracy with DP).
    return KipState(z=z, y=ys, mask=state.mask, opt_state=opt_state,
                    iteration=state.iteration + 1,
                    converged=jnp.zeros((), bool), accuracy=accuracy,
                    loss=loss, first_loss=first_loss)

  return init_one, step


def _check_support_args(images_per_class, support_size) -> None:
  if (images_per_class is None) == (support_size is None):
    raise ValueError("Give exactly one of images_per_class and support_size, "
                     f"got images_per_class={images_per_class!r}, "
                     f"support_size={support_size!r}.")
  if images_per_class is not None:
    validate.positive_int("images_per_class", images_per_class)
  else:
    validate.positive_int("support_size", support_size)


def _nonfinite_error(state: KipState, x, n) -> ValueError:
  """Why some clients' supports or losses are NaN/inf (the kernel or data)."""
  bad = np.flatnonzero(~np.asarray(jax.device_get(
      jnp.isfinite(state.loss) & jnp.all(
          jnp.isfinite(state.z.reshape(state.z.shape[0], -1)), axis=1))))
  c = int(bad[0])
  host = validate.host_values(x, fetch=False)
  if host is not None:
    own = host[c, :int(np.asarray(jax.device_get(n))[c])]
    if own.size and own.min() == own.max():
      cause = (f"client {c}'s images are constant (every pixel "
               f"{int(own.min())}): the kernel matrix has zero variance and "
               "is singular")
    else:
      cause = (f"kernel_fn returned non-finite values on client {c}'s "
               "images (its images are finite uint8)")
  else:
    cause = f"kernel_fn returned non-finite values on client {c}'s images"
  return ValueError(
      f"KIP gave a non-finite loss or support for {bad.size} client"
      f"{'s' * (bad.size != 1)} (clients {bad[:5].tolist()}"
      f"{', ...' if bad.size > 5 else ''}): {cause}.")


@functools.lru_cache(maxsize=16)
def _cached_distiller(kernel_fn, **kwargs):
  """:func:`make_distiller` memoised, so repeated calls reuse compiled programs."""
  return make_distiller(kernel_fn, **kwargs)


def distill_clients(key: jax.Array, x, y, num_examples, *, num_classes: int,
                    kernel_fn: KernelFn, mean, std,
                    images_per_class: int | None = None,
                    support_size: int | None = None,
                    class_blocks: int | None = None,
                    options: KipOptions = KipOptions(),
                    mapper: ClientMapper = ClientMapper(workload="kip"),
                    progress: Callable[[int, int], None] | None = None,
                    allow_raw_upload: bool | None = None,
                    segment_store: SegmentStore | None = None
                    ) -> KipResult:
  """Distills every client's data with KIP; notebook-friendly.

  Args:
    key: PRNG key; client ``i`` uses ``fold_in(key, i)``.
    x: ``[C, N_max, H, W, Ch]`` uint8 client images (NumPy or JAX); float
      images are refused.
    y: ``[C, N_max]`` int class indices in ``[0, num_classes)`` (not one-hot).
    num_examples: ``[C]`` valid examples per client, in ``[0, N_max]``.
    num_classes: K, >= 1.
    kernel_fn: e.g. ``fedjax_dd.kernels.native.fc_kernel()``.
    mean: per-channel mean (``[Ch]`` or a scalar, on the ``[0, 1]`` scale).
    std: per-channel std (``[Ch]`` or a scalar), finite and > 0.
    images_per_class: Img/Cls for each class a client holds (FedD3), or
    support_size: a fixed support size per client (HFLDD's |D̃_i|), capped
      by each client's count (with a warning); exactly one, >= 1.
    class_blocks: with ``images_per_class``, the classes a support has room
      for (``S = class_blocks · images_per_class``); default and minimum:
      the most classes any client holds (more only adds masked slots).
    options: the optimisation settings (:class:`KipOptions`); with
      ``dp_clip > 0`` (DP-KIP), ``class_blocks`` defaults to
      ``num_classes``, no raw-upload check applies and a ``support_size``
      is not capped by a client's count.
    mapper: client-axis backend.
    progress: optional ``callback(iterations_done, clients_converged)``.
    allow_raw_upload: with ``images_per_class``, what to do with raw
      supports (:func:`check_privacy`): False refuses them, True accepts
      them, None (for callers that ran :func:`check_privacy` themselves)
      accepts them with a warning.
    segment_store: optional :class:`SegmentStore` to save and resume from,
      keyed by the caller to these arguments.

  Returns:
    A :class:`KipResult` (float pixels; see :func:`quantize`).

  Raises:
    ValueError: before compute, on any argument outside the ranges above
      (shapes, dtypes, labels, counts, ``mean``/``std``, not exactly one of
      ``images_per_class`` / ``support_size``, ``class_blocks`` too small)
      or raw supports with ``allow_raw_upload=False``; after compute, if
      some client's loss or support is not finite (naming the cause).
  """
  if not isinstance(options, KipOptions):
    raise ValueError(f"options must be a KipOptions, got "
                     f"{type(options).__name__}.")
  validate.positive_int("num_classes", num_classes)
  _check_support_args(images_per_class, support_size)
  validate.client_stack(x, y, num_examples, num_classes=num_classes,
                        fetch=True)
  validate.channel_stats(mean, std, np.shape(x)[-1])
  y_host = np.asarray(jax.device_get(y))
  n_host = np.asarray(jax.device_get(num_examples))
  if options.dp:
    # DP-KIP's noise support has room for every class: no raw image, and a
    # layout independent of the data.
    if images_per_class is not None and class_blocks is None:
      class_blocks = num_classes
  elif images_per_class is not None:
    held = _stack_class_counts(y_host, n_host, num_classes) > 0
    most = max(int(held.sum(axis=1).max(initial=0)), 1)
    if class_blocks is None:
      class_blocks = most
    elif class_blocks < most:
      raise ValueError(f"class_blocks={class_blocks} leaves out classes: a "
                       f"client holds {most} classes.")
    if allow_raw_upload is None:
      raw = raw_upload_pairs(y_host, n_host, num_classes, images_per_class)
      if raw.size:
        logging.warning(
            "KIP: %d (client, class) pairs hold at most images_per_class=%d "
            "examples, so their support is their raw images (e.g. client %d "
            "class %d, %d examples).", len(raw), images_per_class,
            *(int(v) for v in raw[0]))
    else:
      check_privacy(y_host, n_host, num_classes,
                    images_per_class=images_per_class,
                    allow_raw_upload=allow_raw_upload)
  x_in = x
  x, y = jnp.asarray(x), jnp.asarray(y, jnp.int32)
  n = jnp.asarray(num_examples, jnp.int32)
  if support_size is not None and not options.dp:
    short = np.flatnonzero(n_host < support_size)
    if short.size:
      logging.warning(
          "KIP: %d clients hold fewer than %d examples; their support is capped "
          "at their local count (e.g. client %d has %d).", short.size,
          support_size, short[0], int(n_host[short[0]]))
  init, segment, _ = _cached_distiller(
      kernel_fn, num_classes=num_classes,
      mean=tuple(np.asarray(mean, np.float32).reshape(-1).tolist()),
      std=tuple(np.asarray(std, np.float32).reshape(-1).tolist()),
      images_per_class=images_per_class, support_size=support_size,
      class_blocks=class_blocks, options=options.program(), mapper=mapper)
  ids = jnp.arange(x.shape[0])
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)
  init_keys = jax.vmap(lambda k: jax.random.fold_in(k, 2**31 - 1))(keys)
  saved = None
  if segment_store is not None:
    saved = segment_store.resume(
        jax.eval_shape(init, init_keys, x, y, n))
  if saved is None:
    state, done = init(init_keys, x, y, n), 0
  else:
    state, done = saved
    done = int(done)
    finished = np.asarray(jax.device_get(state.converged | (n == 0)))
    if progress is not None:
      progress(done, int(finished.sum()))
    if done > 0 and finished.all():
      done = options.max_iterations  # the saved segment was the last
  while done < options.max_iterations:
    done = min(done + options.segment_iterations, options.max_iterations)
    state = segment(state, keys, x, y, n, jnp.asarray(done, jnp.int32))
    finished = np.asarray(jax.device_get(state.converged | (n == 0)))
    if segment_store is not None:
      segment_store.save(state, done)
    if progress is not None:
      progress(done, int(finished.sum()))
    if finished.all():
      break
  ran = np.asarray(jax.device_get(state.iteration)) > 0
  finite = np.asarray(jax.device_get(
      jnp.isfinite(state.loss) & jnp.all(
          jnp.isfinite(state.z.reshape(state.z.shape[0], -1)), axis=1)))
  if not finite[ran].all():
    raise _nonfinite_error(state, x_in, num_examples)
  # Not clipped: the support as optimised, which is what KRR with the
  # learned labels was fitted to (quantize clips for transmission).
  pixels = (state.z * jnp.asarray(std, jnp.float32) +
            jnp.asarray(mean, jnp.float32)) * 255.0
  pixels = pixels * state.mask[..., None, None, None]
  return KipResult(x=pixels, y=state.y, mask=state.mask,
                   counts=state.mask.sum(axis=1).astype(jnp.int32),
                   iterations=state.iteration, converged=state.converged,
                   accuracy=state.accuracy, loss=state.loss,
                   first_loss=state.first_loss)


def labels_to_targets(y: jax.Array | np.ndarray, *, centered: bool) -> np.ndarray:
  """KIP support labels ``[..., K]`` to cross-entropy target distributions.

  Centring is undone (``+ 1/K``); negative entries are clipped to zero and
  rows renormalised, a row with no positive entry becoming the one-hot of
  its argmax.

  Args:
    y: ``[..., K]`` support labels.
    centered: whether they were built with KIP's centred convention.

  Returns:
    ``[..., K]`` float32 rows on the probability simplex.
  """
  y = np.asarray(y, np.float32)
  k = y.shape[-1]
  if centered:
    y = y + np.float32(1.0 / k)
  pos = np.clip(y, 0.0, None)
  total = pos.sum(-1, keepdims=True)
  fallback = np.eye(k, dtype=np.float32)[np.argmax(y, -1)]
  with np.errstate(invalid="ignore", divide="ignore"):
    out = np.where(total > 1e-12, pos / np.where(total > 0, total, 1.0),
                   fallback)
  return out.astype(np.float32)


def loss_summary(iterations, first_loss, last_loss) -> dict[str, float]:
  """KIP loss at the first and last iteration, min and median over clients.

  Clients that ran no iteration (no data) are left out.

  Args:
    iterations: ``[C]`` iterations each client ran (``KipResult.iterations``).
    first_loss: ``[C]`` loss at the first iteration.
    last_loss: ``[C]`` loss at the last iteration (``KipResult.loss``).

  Returns:
    ``{"first_min", "first_median", "last_min", "last_median"}``, or ``{}``
    when no client ran.
  """
  ran = np.asarray(iterations) > 0
  if not ran.any():
    return {}
  first = np.asarray(first_loss, np.float64)[ran]
  last = np.asarray(last_loss, np.float64)[ran]
  return {"first_min": float(first.min()),
          "first_median": float(np.median(first)),
          "last_min": float(last.min()),
          "last_median": float(np.median(last))}


def flatten_support(result: KipResult, *, quantized: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """All clients' real support points as host arrays (the server's union).

  Returns:
    ``(x [M, H, W, Ch], y_soft [M, K], owner [M])``; ``x`` is uint8 when
    ``quantized`` (what is actually transmitted) else float32 pixels.
  """
  res = jax.device_get(result)
  mask = np.asarray(res.mask)
  x = np.asarray(quantize(res.x)) if quantized else np.asarray(res.x)
  owner = np.broadcast_to(np.arange(mask.shape[0])[:, None], mask.shape)
  return x[mask], np.asarray(res.y)[mask], owner[mask]
