"""LeNet-5 for 28x28 inputs and a small LeNet-style net for 8x8 digits."""

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class LeNet5(nn.Module):
  """LeNet-5 (LeCun et al., 1998) on ``[B, 28, 28, Ch]`` inputs.

  Layout (VALID convolutions, no padding)::

    conv 6 5x5 -> ReLU -> max-pool 2   # 28 -> 24 -> 12
    conv 16 5x5 -> ReLU -> max-pool 2  # 12 -> 8 -> 4
    dense 120 -> ReLU -> dense 84 -> ReLU -> dense num_classes

  ReLU and max-pooling replace the original's tanh/sigmoid and trainable
  sub-sampling, as in the FL/dataset-distillation baselines. 44,426
  parameters with one input channel and 10 classes; other inputs work if
  both convolutions fit.

  Attributes:
    num_classes: Number of output logits.
    layers: The layer forms (``layers.LayerSet``; ``phase_split`` applies
      to the first convolution and its pool); default: the policy's.
  """

  num_classes: int = 10
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Computes logits.

    Args:
      x: Images ``[B, H, W, Ch]`` float32 (28x28 for the canonical model).
      train: Unused (no BatchNorm/dropout); present for a uniform interface.

    Returns:
      Logits ``[B, num_classes]``.
    """
    del train
    layers.check_images(x, "LeNet5")
    ls = self.layers
    x = ls.conv_relu_max_pool(6, (5, 5), name="conv1")(x)
    x = nn.relu(ls.conv(16, (5, 5), padding="VALID", name="conv2")(x))
    x = layers.max_pool(x)
    x = layers.flatten(x)
    x = nn.relu(ls.dense(120, name="fc1")(x))
    x = nn.relu(ls.dense(84, name="fc2")(x))
    return ls.dense(self.num_classes, name="fc3")(x)


class DigitsCNN(nn.Module):
  """Small conv net for the 8x8x1 scikit-learn digits.

  Layout (SAME convolutions)::

    conv 32 3x3 -> ReLU -> max-pool 2  # 8 -> 4
    conv 64 3x3 -> ReLU -> max-pool 2  # 4 -> 2
    dense 128 -> ReLU -> dense num_classes

  53,002 parameters for 10 classes; the model of the digits preset
  (``experiments/configs/centralized.py:digits``).

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
      x: Images ``[B, 8, 8, 1]`` float32.
      train: Unused; present for a uniform interface.

    Returns:
      Logits ``[B, num_classes]``.
    """
    del train
    layers.check_images(x, "DigitsCNN")
    ls = self.layers
    x = nn.relu(ls.conv(32, (3, 3), padding="SAME", name="conv1")(x))
    x = layers.max_pool(x)
    x = nn.relu(ls.conv(64, (3, 3), padding="SAME", name="conv2")(x))
    x = layers.max_pool(x)
    x = layers.flatten(x)
    x = nn.relu(ls.dense(128, name="fc1")(x))
    return ls.dense(self.num_classes, name="fc2")(x)
