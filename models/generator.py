"""Image generator for data-free knowledge distillation (FedHydra Sec. 4.1.3).

The server trains this generator so that the client models (teachers) give
confident predictions on its samples whose intermediate statistics match the
teachers' BatchNorm running statistics, then distils the teachers into the
global model on the generated images.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class Generator(nn.Module):
  """Noise ``z [B, nz]`` -> images ``[B, H, W, Ch]`` in ``(0, 1)``.

  Layout for ``out_shape = (H, W, Ch)`` with ``H, W`` divisible by 4 (the
  generator of DENSE's and FedHydra's released code)::

    dense nz -> (H/4)*(W/4)*2ngf, reshape to [B, H/4, W/4, 2ngf]
    BN -> nearest-upsample x2 -> conv 3x3 2ngf (no bias)   # H/4 -> H/2
    BN -> LeakyReLU(0.2) -> nearest-upsample x2 -> conv 3x3 ngf (no bias)
    BN -> LeakyReLU(0.2) -> conv 3x3 Ch                    # H -> H
    sigmoid

  Upsampling + 3x3 convolution avoids transposed convolutions' checkerboard
  pattern, and its gradient is much cheaper on XLA:CPU. The sigmoid yields
  the range of un-normalised pixel data; callers normalise as for real
  data before feeding a classifier.

  Conditional variant (``conditional=True``): a learned label embedding
  ``[num_classes, nz]`` (initialised N(0, 1)) is multiplied element-wise into
  ``z`` before the dense layer (FedGen/ACGAN-style), keeping the dense
  layer's input size at ``nz``.

  Attributes:
    out_shape: Output image shape ``(H, W, Ch)``, e.g. ``(28, 28, 1)`` or
      ``(32, 32, 3)``.
    nz: Noise dimension.
    ngf: Base number of generator channels.
    conditional: Whether ``__call__`` takes labels ``y``.
    num_classes: Number of labels of the conditional variant.
    layers: The layer forms (``layers.LayerSet``; ``"auto"`` convolutions
      are ``lax`` here). The images are float32 whatever its ``dtype``.
  """

  out_shape: tuple = (32, 32, 3)
  nz: int = 100
  ngf: int = 64
  conditional: bool = False
  num_classes: int = 10
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(
      self,
      z: jnp.ndarray,
      y: Optional[jnp.ndarray] = None,
      train: bool = True,
  ) -> jnp.ndarray:
    """Generates images.

    Args:
      z: Noise ``[B, nz]`` float32.
      y: Integer labels ``[B]`` in ``[0, num_classes)``; required iff
        ``conditional``.
      train: If True, BatchNorm uses batch statistics and updates
        ``batch_stats`` (pass ``mutable=['batch_stats']``).

    Returns:
      Images ``[B, H, W, Ch]`` float32 in ``(0, 1)``.

    Raises:
      ValueError: On a bad ``out_shape``, a ``z`` that is not ``[B, nz]``, a
        missing ``y`` for the conditional variant, a ``y`` passed to the
        unconditional one, or ``y`` not of shape ``[B]``.
    """
    if len(self.out_shape) != 3 or any(
        int(d) < 1 for d in self.out_shape):
      raise ValueError(
          f"out_shape must be (H, W, Ch) with positive entries, got "
          f"{self.out_shape}.")
    h, w, ch = (int(d) for d in self.out_shape)
    if h % 4 or w % 4:
      raise ValueError(
          f"Generator needs H and W divisible by 4 (two stride-2 upsamplings), "
          f"got out_shape {self.out_shape}.")
    if z.ndim != 2 or z.shape[1] != self.nz:
      raise ValueError(
          f"z must have shape [B, {self.nz}], got {z.shape}.")
    if self.conditional:
      if y is None:
        raise ValueError("A conditional Generator needs labels y [B].")
      if y.shape != (z.shape[0],):
        raise ValueError(
            f"y must have shape [{z.shape[0]}], got {y.shape}.")
      emb = nn.Embed(self.num_classes, self.nz,
                     embedding_init=nn.initializers.normal(1.0),
                     name="label_embed")(y)
      z = z * emb
    elif y is not None:
      raise ValueError(
          "Labels y were passed to an unconditional Generator; build it with "
          "conditional=True.")

    ls = self.layers.for_model(Generator.__name__)
    c0 = 2 * self.ngf
    x = ls.dense(h // 4 * (w // 4) * c0, name="fc")(z)
    x = x.reshape(z.shape[0], h // 4, w // 4, c0)
    x = layers.batch_norm(train, name="bn1")(x)
    for i, width in enumerate([c0, self.ngf]):
      if i:
        x = nn.leaky_relu(layers.batch_norm(train, name=f"bn{i + 1}")(x),
                          negative_slope=0.2)
      x = _upsample2(x)
      x = ls.conv(width, (3, 3), padding="SAME", use_bias=False,
                  name=f"conv{i + 1}")(x)
    x = nn.leaky_relu(layers.batch_norm(train, name="bn3")(x),
                      negative_slope=0.2)
    x = ls.conv(ch, (3, 3), padding="SAME", name="conv3")(x)
    # At least float32; float64 kept for the float64 gradient checks.
    return nn.sigmoid(x.astype(jnp.promote_types(x.dtype, jnp.float32)))


def _upsample2(x: jnp.ndarray) -> jnp.ndarray:
  """Nearest-neighbour x2 upsampling of ``[B, H, W, C]`` (a broadcast)."""
  b, h, w, c = x.shape
  x = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c))
  return x.reshape(b, 2 * h, 2 * w, c)
