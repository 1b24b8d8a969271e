"""Fully connected ReLU network, the finite-width counterpart of KIP's FC."""

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class FC(nn.Module):
  """``depth`` hidden ReLU layers of ``width`` units on the flattened input.

  Parameters for ``D`` input features, width ``W``, depth ``L >= 1`` and ``K``
  classes: ``(D + 1) * W + (L - 1) * (W + 1) * W + (W + 1) * K``; with
  ``L = 0`` it is a linear classifier, ``(D + 1) * K``.

  Attributes:
    num_classes: Number of output logits.
    width: Units per hidden layer.
    depth: Number of hidden layers (0 gives a linear model).
    layers: The layer forms (``layers.LayerSet``); only its compute
      ``dtype`` applies here (no convolutions).
  """

  num_classes: int = 10
  width: int = 1024
  depth: int = 1
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Inputs ``[B, ...]`` of any trailing shape (e.g. ``[B, H, W, Ch]``);
        flattened to ``[B, D]``.
      train: Unused; present for a uniform interface.

    Returns:
      Logits ``[B, num_classes]``.

    Raises:
      ValueError: If ``x`` has no feature axes or depth/width are invalid.
    """
    del train
    if x.ndim < 2:
      raise ValueError(f"FC expects [B, ...] input, got shape {x.shape}.")
    if self.depth < 0 or (self.depth > 0 and self.width < 1):
      raise ValueError(
          f"Invalid FC depth/width: {self.depth}, {self.width}.")
    x = layers.flatten(x)
    for i in range(self.depth):
      x = nn.relu(self.layers.dense(self.width, name=f"fc{i + 1}")(x))
    return self.layers.dense(self.num_classes, name="head")(x)
