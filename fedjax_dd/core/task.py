"""A classification task: a Flax module plus on-device preprocessing.

Everything that turns uint8 images into logits and losses lives here, so that
local training, evaluation and distillation share one definition.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Classifier:
  """A Flax classifier and the preprocessing applied to raw uint8 inputs.

  Attributes:
    module: a Flax module called as ``module.apply(variables, x, train=...)``
      returning logits ``[B, num_classes]``.
    input_shape: ``(H, W, Ch)`` the module expects.
    preprocess: maps uint8 images ``[B, H, W, Ch]`` to float32 model inputs
      (normalisation happens on the device, inside the jitted program).
    num_classes: number of classes.
    param_init: optional ``(params, key) -> params`` applied after the
      module's own initialisation (e.g.
      :func:`fedjax_dd.models.param_init.torch_default`); None: Flax's.
  """
  module: nn.Module
  input_shape: tuple[int, int, int]
  preprocess: Callable[[jax.Array], jax.Array]
  num_classes: int
  param_init: Callable[[PyTree, jax.Array], PyTree] | None = None

  def init(self, key: jax.Array) -> tuple[PyTree, PyTree]:
    """Returns ``(params, batch_stats)``; ``batch_stats`` is ``{}`` without BN.

    One jitted program per task (:func:`fedjax_dd.core.clients.once_jit`).
    """
    return _init_program()(self, key)

  def _init(self, key: jax.Array) -> tuple[PyTree, PyTree]:
    x = jnp.zeros((1, *self.input_shape), jnp.float32)
    variables = self.module.init(key, x, train=False)
    params = variables["params"]
    if self.param_init is not None:
      # A key of its own, so the layers' draw is the same with or without.
      params = self.param_init(params, jax.random.fold_in(key, 1))
    return params, variables.get("batch_stats", {})

  def apply(self, params: PyTree, batch_stats: PyTree, x: jax.Array, *,
            train: bool, method: Any = None) -> tuple[Any, PyTree]:
    """Logits ``[B, K]`` for float inputs, and the updated BatchNorm stats.

    ``method``: another method of the module to call instead (e.g.
    ``ProjectionNet.project``, MOON's projection and logits); its output is
    returned in place of the logits.

    The outputs are float32 whatever the module's compute dtype, so every
    loss built on them, and its gradients, run in float32.
    """
    variables = {"params": params}
    kwargs = {} if method is None else {"method": method}
    if batch_stats:
      variables["batch_stats"] = batch_stats
      if train:
        out, updates = self.module.apply(
            variables, x, train=True, mutable=["batch_stats"], **kwargs)
        return _as_float32(out), updates["batch_stats"]
    return (_as_float32(self.module.apply(variables, x, train=train,
                                          **kwargs)), batch_stats)

  def loss(self, params: PyTree, batch_stats: PyTree, x_uint8: jax.Array,
           y: jax.Array, *, train: bool = True,
           weights: jax.Array | None = None) -> tuple[jax.Array, tuple[PyTree, jax.Array]]:
    """Mean cross-entropy on a uint8 batch, for hard or soft targets.

    Args:
      params: model parameters.
      batch_stats: BatchNorm statistics (``{}`` if none).
      x_uint8: ``[B, H, W, Ch]`` uint8 images.
      y: ``[B]`` int labels, or ``[B, K]`` float target distributions (e.g.
        KIP's learned labels, FedD3 Sec. 3.2 / HFLDD Eq. 1, which the server
        trains on as they were sent rather than their argmax).
      train: BatchNorm mode.
      weights: optional ``[B]`` example weights (e.g. a padding mask).

    Returns:
      ``(loss, (new_batch_stats, accuracy))``; with soft targets the accuracy
      compares the argmax of logits and targets.
    """
    logits, new_stats = self.apply(
        params, batch_stats, self.preprocess(x_uint8), train=train)
    if y.ndim == logits.ndim:
      targets = y.astype(jnp.float32)
      ce = optax.softmax_cross_entropy(logits, targets)
      hard = jnp.argmax(targets, -1)
    elif y.ndim == logits.ndim - 1:
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
      hard = y
    else:
      raise ValueError(
          f"y must be [B] int labels or [B, {self.num_classes}] targets; got "
          f"shape {y.shape}.")
    correct = (jnp.argmax(logits, -1) == hard).astype(jnp.float32)
    if weights is None:
      return ce.mean(), (new_stats, correct.mean())
    total = jnp.maximum(weights.sum(), 1.0)
    return (ce * weights).sum() / total, (new_stats,
                                          (correct * weights).sum() / total)


def _as_float32(tree: PyTree) -> PyTree:
  """``tree`` with its floating leaves narrower than float32 (a bfloat16
  model's outputs) cast to float32; other leaves as they are."""
  return jax.tree_util.tree_map(
      lambda v: v.astype(jnp.float32)
      if jnp.issubdtype(v.dtype, jnp.floating) and v.dtype.itemsize < 4
      else v, tree)


@functools.cache
def _init_program() -> Callable[..., tuple[PyTree, PyTree]]:
  """:meth:`Classifier.init`'s program, built on first use (the policy
  reads the platform, which importing must not start)."""
  # pylint: disable-next=g-import-not-at-top
  from fedjax_dd.core import clients
  return clients.once_jit(Classifier._init, op_by_op=True, static_argnums=0)
