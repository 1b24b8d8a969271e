"""ResNet for 32x32 inputs (He et al., 2016; CIFAR variant).

The CIFAR variant replaces the ImageNet stem (7x7 stride-2 conv + max-pool)
by a single 3x3 stride-1 convolution, so a 32x32 image reaches the last stage
at 4x4. Convolutions have no bias (each is followed by BatchNorm).
"""

import functools
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class BasicBlock(nn.Module):
  """Two 3x3 conv-BN layers with an identity or 1x1 conv-BN shortcut.

  Attributes:
    features: Output channels.
    stride: Stride of the first convolution (and of the projection).
    layers: The layer forms (``layers.LayerSet``); default: the policy's.
  """

  features: int
  stride: int = 1
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Applies the block to ``[B, H, W, Ch]``."""
    conv = functools.partial(self.layers.conv, self.features,
                             use_bias=False)
    y = conv((3, 3), strides=self.stride, padding=1, name="conv1")(x)
    y = nn.relu(layers.batch_norm(train, name="bn1")(y))
    y = conv((3, 3), padding=1, name="conv2")(y)
    y = layers.batch_norm(train, name="bn2")(y)
    if self.stride != 1 or x.shape[-1] != self.features:
      x = conv((1, 1), strides=self.stride, name="proj_conv")(x)
      x = layers.batch_norm(train, name="proj_bn")(x)
    return nn.relu(x + y)


class ResNet(nn.Module):
  """CIFAR ResNet with BasicBlocks; the defaults give ResNet-18.

  Stages have widths ``width * (1, 2, 4, 8)`` and strides ``(1, 2, 2, 2)``;
  global average pooling precedes the dense head. ResNet-18 with 3 input
  channels and 10 classes has 11,173,962 parameters (BN scale + bias
  counted; running statistics live in ``batch_stats``).

  Attributes:
    num_classes: Number of output logits.
    stage_sizes: Number of BasicBlocks per stage.
    width: Channels of the stem and the first stage.
    layers: The layer forms (``layers.LayerSet``); default: the policy's.
  """

  num_classes: int = 10
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  width: int = 64
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Images ``[B, H, W, Ch]`` float32 (32x32 canonical).
      train: If True, BatchNorm uses batch statistics and updates
        ``batch_stats`` (pass ``mutable=['batch_stats']``).

    Returns:
      Logits ``[B, num_classes]``.
    """
    layers.check_images(x, "ResNet")
    x = self.layers.conv(self.width, (3, 3), padding=1, use_bias=False,
                         name="stem_conv")(x)
    x = nn.relu(layers.batch_norm(train, name="stem_bn")(x))
    for i, num_blocks in enumerate(self.stage_sizes):
      for j in range(num_blocks):
        stride = 2 if i > 0 and j == 0 else 1
        x = BasicBlock(self.width * 2**i, stride, layers=self.layers,
                       name=f"stage{i + 1}_block{j + 1}")(x, train=train)
    x = jnp.mean(x, axis=(1, 2))
    return self.layers.dense(self.num_classes, name="fc")(x)


def resnet18(num_classes: int, layers: LayerSet = LayerSet()) -> ResNet:
  """ResNet-18 (BasicBlocks ``[2, 2, 2, 2]``, widths 64..512)."""
  return ResNet(num_classes=num_classes, stage_sizes=(2, 2, 2, 2), width=64,
                layers=layers)
