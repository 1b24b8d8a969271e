"""The CIFAR-10 CNN of HFLDD (hierarchical FL with dataset distillation).

The HFLDD paper describes its CIFAR-10 model as four blocks of ``[conv, ReLU,
BN, conv, ReLU, BN, max-pool]`` followed by a single dense layer, with
1,020,160 parameters, but does not list the widths. Counts of width patterns
with 3x3 SAME convolutions (conv biases and BN scale + bias counted, 10
classes):

================================  ==========  ==========
widths (both convs of a block)     params      vs paper
================================  ==========  ==========
128, 128, 128, 128                 1,043,850   +2.3%
16, 16, 128, 256                   1,070,714   +5.0%
64, 64, 64, 256                      936,266   -8.2%
32, 64, 128, 256 (doubling)        1,184,426   +16.1%
================================  ==========  ==========

Constant width 128, the closest regular pattern and the width of the
dataset-distillation ConvNet, is the default.
"""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd import policy
from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class HFLDDCifarCNN(nn.Module):
  """Four ``[conv, ReLU, BN, conv, ReLU, BN, max-pool]`` blocks + dense.

  See the module docstring for the width choice; 1,043,850 parameters with
  the default widths and 10 classes (paper: 1,020,160).

  Attributes:
    num_classes: Number of output logits.
    features: Output channels of the two convolutions of each block.
    weight_grads: Each convolution's kernel gradient with ``lax``
      (``layers.conv_function``), in order; None: ``policy.kernel_grads``.
    layers: The layer forms (``layers.LayerSet``); default: the policy's.
  """

  num_classes: int = 10
  features: Sequence[int] = (128, 128, 128, 128)
  weight_grads: Sequence[str] | None = None
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Images ``[B, 32, 32, 3]`` float32 (any ``H, W >= 2**len(features)``).
      train: If True, BatchNorm uses batch statistics and updates
        ``batch_stats`` (pass ``mutable=['batch_stats']``).

    Returns:
      Logits ``[B, num_classes]``.

    Raises:
      ValueError: If the input is not NHWC or too small for the poolings.
    """
    layers.check_images(x, "HFLDDCifarCNN")
    if min(x.shape[1:3]) < 2 ** len(self.features):
      raise ValueError(
          f"HFLDDCifarCNN with {len(self.features)} blocks needs H, W >= "
          f"{2 ** len(self.features)}, got {x.shape[1:3]}.")
    num_convs = 2 * len(self.features)
    grads = (policy.kernel_grads("HFLDDCifarCNN", num_convs)
             if self.weight_grads is None else tuple(self.weight_grads))
    if len(grads) != num_convs:
      raise ValueError(f"HFLDDCifarCNN has {num_convs} convolutions but "
                       f"{len(grads)} weight_grads.")
    for i, width in enumerate(self.features):
      for j in (1, 2):
        x = self.layers.conv(width, (3, 3), padding="SAME",
                             weight_grad=grads[2 * i + j - 1],
                             name=f"conv{i + 1}_{j}")(x)
        x = nn.relu(x)
        x = layers.batch_norm(train, name=f"bn{i + 1}_{j}")(x)
      x = layers.max_pool(x)
    x = layers.flatten(x)
    return self.layers.dense(self.num_classes, name="fc")(x)
