"""FedHydra's client CNNs: ``CNN2`` (MNIST/FMNIST) and ``CNN3`` (SVHN/CIFAR).

FedHydra's generator matches the client models' BatchNorm running
statistics, so both CNNs put BatchNorm after every convolution. The paper
gives only the layer structure; the widths are ours (common small-CNN
choices of the data-free FL literature):

* ``CNN2``: 5x5 convs with 32 and 64 channels (28 -> 14 -> 7).
* ``CNN3``: 3x3 convs with 32, 64 and 128 channels (32 -> 16 -> 8 -> 4).

Each conv block is ``conv (no bias, BN's bias subsumes it) -> BN -> ReLU ->
max-pool 2``; one dense layer maps the flattened features to the logits.
"""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd import policy
from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class ConvBNNet(nn.Module):
  """``len(features)`` blocks of ``[conv SAME -> BN -> ReLU -> max-pool 2]``.

  Attributes:
    num_classes: Number of output logits.
    features: Output channels of each conv block.
    kernel_size: Square kernel size of every convolution.
    weight_grads: Each convolution's kernel gradient with ``lax``
      (``layers.conv_function``); None: ``policy.kernel_grads`` of the
      class's name; empty: ``"lax"`` for all.
    layers: The layer forms (``layers.LayerSet``); ``"auto"`` convolutions
      are the class's own (``policy.FORWARD_CONV_MODELS``), the rest the
      policy's.
  """

  num_classes: int = 10
  features: Sequence[int] = (32, 64)
  kernel_size: int = 5
  weight_grads: Sequence[str] | None = None
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Images ``[B, H, W, Ch]`` float32 with ``H, W >= 2**len(features)``.
      train: If True, BatchNorm uses batch statistics and updates
        ``batch_stats`` (pass ``mutable=['batch_stats']``).

    Returns:
      Logits ``[B, num_classes]``.

    Raises:
      ValueError: If the input is not NHWC or too small for the poolings.
    """
    name = type(self).__name__
    layers.check_images(x, name)
    if min(x.shape[1:3]) < 2 ** len(self.features):
      raise ValueError(
          f"{name} with {len(self.features)} blocks needs H, W >= "
          f"{2 ** len(self.features)}, got {x.shape[1:3]}.")
    if self.weight_grads is None:
      grads = policy.kernel_grads(name, len(self.features))
    else:
      grads = tuple(self.weight_grads) or ("lax",) * len(self.features)
    if len(grads) != len(self.features):
      raise ValueError(
          f"{name} has {len(self.features)} convolutions but "
          f"{len(grads)} weight_grads.")
    k = self.kernel_size
    # "auto" is this class's form (policy.FORWARD_CONV_MODELS).
    ls = self.layers.for_model(name)
    for i, width in enumerate(self.features):
      x = ls.conv(width, (k, k), padding="SAME", weight_grad=grads[i],
                  use_bias=False, name=f"conv{i + 1}")(x)
      x = nn.relu(layers.batch_norm(train, name=f"bn{i + 1}")(x))
      x = layers.max_pool(x)
    x = layers.flatten(x)
    return ls.dense(self.num_classes, name="fc")(x)


class CNN2(ConvBNNet):
  """Two-block CNN for ``[B, 28, 28, 1]`` (MNIST, FMNIST).

  83,562 parameters with 10 classes.
  """

  features: Sequence[int] = (32, 64)
  kernel_size: int = 5


class CNN3(ConvBNNet):
  """Three-block CNN for ``[B, 32, 32, 3]`` (SVHN, CIFAR-10).

  113,962 parameters with 10 classes.
  """

  features: Sequence[int] = (32, 64, 128)
  kernel_size: int = 3
