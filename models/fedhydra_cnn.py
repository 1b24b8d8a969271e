"""FedHydra's client CNNs: ``CNN2`` (MNIST/FMNIST) and ``CNN3`` (SVHN/CIFAR).

FedHydra (data-free one-shot FL with model and data stratification) trains a
server model by data-free knowledge distillation from the client models. The
generator is trained to match the BatchNorm running statistics of the client
models, so both CNNs put BatchNorm after every convolution.

The paper gives only the layer structure; the widths are ours and follow the
common small-CNN choices of the data-free FL literature:

* ``CNN2``: 5x5 convs with 32 and 64 channels (28 -> 14 -> 7).
* ``CNN3``: 3x3 convs with 32, 64 and 128 channels (32 -> 16 -> 8 -> 4).

Each conv block is ``conv (no bias) -> BN -> ReLU -> max-pool 2``; the conv
bias is dropped because BN's learned bias subsumes it. A single dense layer
maps the flattened features to the logits.
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
      class's name (CNN3's are matmuls on CPU, CNN2's lax's); empty:
      ``"lax"`` for all. The same gradient to float rounding, another speed.
    layers: The layer forms (``layers.LayerSet``); its ``"auto"``
      convolution form is the class's own (``policy.FORWARD_CONV_MODELS``),
      the other defaults the policy's. Same parameters in every set.
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

  Parameters with 10 classes::

    conv1 5*5*1*32 = 800     bn1 64
    conv2 5*5*32*64 = 51,200 bn2 128
    dense 7*7*64*10 + 10 = 31,370
    total 83,562
  """

  features: Sequence[int] = (32, 64)
  kernel_size: int = 5


class CNN3(ConvBNNet):
  """Three-block CNN for ``[B, 32, 32, 3]`` (SVHN, CIFAR-10).

  Parameters with 10 classes::

    conv1 3*3*3*32 = 864      bn1 64
    conv2 3*3*32*64 = 18,432  bn2 128
    conv3 3*3*64*128 = 73,728 bn3 256
    dense 4*4*128*10 + 10 = 20,490
    total 113,962
  """

  features: Sequence[int] = (32, 64, 128)
  kernel_size: int = 3
