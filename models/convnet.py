"""ConvNet-D: the standard dataset-distillation backbone.

The "ConvNet" of dataset condensation / KIP / MTT (Gidaris & Komodakis 2018
style): ``depth`` blocks of ``[conv width 3x3 SAME -> instance norm -> ReLU ->
avg-pool 2]`` followed by one dense layer.
"""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd import policy
from fedjax_dd.models import fused_block
from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class ConvNet(nn.Module):
  """ConvNet-``depth`` with instance normalisation.

  Instance norm has a learned per-channel scale and bias (2 * width params per
  block) and no running statistics, so the model keeps no ``batch_stats``.

  The layers are ``layers.Conv`` and ``layers.InstanceNorm``: the
  parameters of ``nn.Conv`` and ``nn.InstanceNorm``, the same function to
  float rounding, in forms faster on CPU; the first block may be one
  function (the layer set's ``fuse_first_block``,
  :mod:`fedjax_dd.models.fused_block`). The convolutions' biases are
  parameters but are not added: instance norm cancels them exactly.

  320,010 parameters for ``[B, 32, 32, 3]`` input, 10 classes, width 128,
  depth 3; 308,746 on ``[B, 28, 28, 1]`` (VALID pooling: 28 -> 14 -> 7 ->
  3).

  Attributes:
    num_classes: Number of output logits.
    width: Channels of every convolution.
    depth: Number of conv blocks (each halves the spatial size).
    weight_grads: Each convolution's kernel gradient with ``lax``
      (``layers.conv_function``); None: ``policy.kernel_grads``.
    layers: The layer forms (``layers.LayerSet``); default: the policy's.
  """

  num_classes: int = 10
  width: int = 128
  depth: int = 3
  weight_grads: Sequence[str] | None = None
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Images ``[B, H, W, Ch]`` float32 with ``H, W >= 2**depth``.
      train: Unused (instance norm has no running statistics).

    Returns:
      Logits ``[B, num_classes]``.

    Raises:
      ValueError: If the input is not NHWC, depth/width are not positive or
        the image is too small for ``depth`` poolings.
    """
    del train
    layers.check_images(x, "ConvNet")
    if self.depth < 1 or self.width < 1:
      raise ValueError(
          f"depth and width must be >= 1, got {self.depth}, {self.width}.")
    if min(x.shape[1:3]) < 2**self.depth:
      raise ValueError(
          f"ConvNet depth {self.depth} needs H, W >= {2**self.depth}, got "
          f"{x.shape[1:3]}.")
    ls = self.layers
    fuse = ls.fuses_first_block()
    grads = (policy.kernel_grads("ConvNet", self.depth)
             if self.weight_grads is None else tuple(self.weight_grads))
    if len(grads) != self.depth:
      raise ValueError(f"ConvNet has {self.depth} convolutions but "
                       f"{len(grads)} weight_grads.")
    for i in range(self.depth):
      if i == 0 and fuse:
        # The variables of conv1 and norm1 (names, shapes, initial values)
        # as the layers below declare them, one function computing them.
        kernel, _ = fused_block.ConvVariables(
            self.width, (3, 3), name="conv1")(x.shape[-1])
        scale, bias = fused_block.InstanceNormVariables(name="norm1")(
            self.width)
        x, kernel, scale, bias = ls.promote(x, kernel, scale, bias)
        x = fused_block.conv_instance_norm_relu_avg_pool(
            x, kernel, scale, bias, epsilon=1e-5)
        continue
      # The bias is declared (nn.Conv's variables) but not added: the
      # instance norm right after cancels it exactly.
      x = ls.hot_conv(self.width, (3, 3), padding="SAME",
                      weight_grad=grads[i], apply_bias=False,
                      name=f"conv{i + 1}")(x)
      x = ls.instance_norm(epsilon=1e-5, name=f"norm{i + 1}")(x)
      x = nn.relu(x)
      x = layers.avg_pool(x)
    x = layers.flatten(x)
    return ls.dense(self.num_classes, name="fc")(x)
