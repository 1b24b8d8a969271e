"""AlexNet variants for 32x32 inputs.

* :class:`AlexNet` -- the five-conv AlexNet scaled down to CIFAR, as used for
  the FedD3 CIFAR-10 baselines. The ImageNet 4096-4096 classifier is
  replaced by 384-192 (FedD3's ``AlexCifarNet``'s) to keep it trainable per
  client on a CPU; dropout is omitted so ``train=True`` needs no RNG stream.
* :class:`AlexCifarNet` -- the two-conv "AlexNet customised for CIFAR-10"
  of the FedD3 reference code.
"""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class AlexNet(nn.Module):
  """Five-conv AlexNet for ``[B, 32, 32, Ch]`` inputs.

  Layout::

    conv 64 -> ReLU -> max-pool 2     # 32 -> 16
    conv 192 -> ReLU -> max-pool 2    # 16 -> 8
    conv 384 -> ReLU
    conv 256 -> ReLU
    conv 256 -> ReLU -> max-pool 2    # 8 -> 4
    dense 384 -> ReLU -> dense 192 -> ReLU -> dense num_classes

  All convolutions are 3x3 SAME with bias; 3,900,682 parameters with 3
  input channels and 10 classes.

  Attributes:
    num_classes: Number of output logits.
    hidden: Widths of the hidden dense layers of the classifier.
    layers: The layer forms (``layers.LayerSet``); default: the policy's.
  """

  num_classes: int = 10
  hidden: Sequence[int] = (384, 192)
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Images ``[B, H, W, Ch]`` float32 with ``H, W >= 8`` (32 canonical).
      train: Unused (no dropout/BatchNorm); present for a uniform interface.

    Returns:
      Logits ``[B, num_classes]``.
    """
    del train
    layers.check_images(x, "AlexNet")
    if min(x.shape[1:3]) < 8:
      raise ValueError(f"AlexNet needs H, W >= 8, got {x.shape[1:3]}.")
    for i, (width, pool) in enumerate(
        [(64, True), (192, True), (384, False), (256, False), (256, True)]):
      x = self.layers.conv(width, (3, 3), padding="SAME",
                           name=f"conv{i + 1}")(x)
      x = nn.relu(x)
      if pool:
        x = layers.max_pool(x)
    x = layers.flatten(x)
    for i, width in enumerate(self.hidden):
      x = nn.relu(self.layers.dense(width, name=f"fc{i + 1}")(x))
    return self.layers.dense(self.num_classes, name="head")(x)


class AlexCifarNet(nn.Module):
  """FedD3's two-conv ``AlexCifarNet`` for ``[B, 32, 32, Ch]`` inputs.

  ``conv 64 5x5 -> ReLU -> max-pool -> LRN -> conv 64 5x5 -> ReLU -> LRN ->
  max-pool -> dense 384 -> dense 192 -> dense num_classes``. Max-pools are
  3x3, stride 2, padding 1 (32 -> 16 -> 8); LRN uses size 4, alpha 0.001/9,
  beta 0.75, k 1 (``layers.local_response_norm``). 1,756,426 parameters
  with 3 input channels and 10 classes.

  Attributes:
    num_classes: Number of output logits.
    layers: The layer forms (``layers.LayerSet``); default: the policy's.
  """

  num_classes: int = 10
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Images ``[B, H, W, Ch]`` float32 (32x32 canonical).
      train: Unused; present for a uniform interface.

    Returns:
      Logits ``[B, num_classes]``.
    """
    del train
    layers.check_images(x, "AlexCifarNet")

    def pool(y):
      # Overlapping 3/2 pooling cannot use the reshape form.
      return nn.max_pool(y, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))

    def lrn(y):
      return layers.local_response_norm(y, 4, alpha=0.001 / 9.0, beta=0.75,
                                        k=1.0)

    ls = self.layers
    x = nn.relu(ls.conv(64, (5, 5), padding="SAME", name="conv1")(x))
    x = lrn(pool(x))
    x = nn.relu(ls.conv(64, (5, 5), padding="SAME", name="conv2")(x))
    x = pool(lrn(x))
    x = layers.flatten(x)
    x = nn.relu(ls.dense(384, name="fc1")(x))
    x = nn.relu(ls.dense(192, name="fc2")(x))
    return ls.dense(self.num_classes, name="fc3")(x)
