"""FedFTG's conditional generator ``CGeneratorA`` (also used by DisUE).

FedFTG (Zhang et al., CVPR 2022) and DisUE (Leng et al., Sec. 5.1: "the
generator architecture from Zhang et al. (2022) is employed") fine-tune the
global model on samples of one server-side generator ``x̂ = G(z, y)``
conditioned on the label ``y``. This is our Flax version of the architecture in
FedFTG's released code (``models/gan_models.py``, class ``CGeneratorA``).
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_dd.models import layers
from fedjax_dd.models.layers import LayerSet


class CGeneratorA(nn.Module):
  """Noise ``z [B, nz]``, labels ``y [B]`` -> normalised ``[B, H, W, Ch]``.

  Layout for ``out_shape = (H, W, Ch)``, ``s = (H/4, W/4)`` (FedFTG's
  ``init_size = img_size // 4``)::

    dense nz -> s·ngf (noise branch), reshape [B, H/4, W/4, ngf]
    dense one_hot(y) -> s·ngf (label branch), reshape [B, H/4, W/4, ngf]
    concat channels -> 2ngf, BN
    nearest-upsample x2 -> conv 3x3 2ngf -> BN -> LeakyReLU(0.2)
    nearest-upsample x2 -> conv 3x3 ngf  -> BN -> LeakyReLU(0.2)
    conv 3x3 Ch -> tanh -> BN without scale and bias

  The label enters as a one-hot vector through its own dense layer, as in
  FedFTG, and its feature map is concatenated with the noise's (unlike
  :class:`fedjax_dd.models.Generator`, which multiplies a label embedding
  into ``z``).

  **Output space.** The last layer is FedFTG's ``BatchNorm2d(Ch,
  affine=False)`` after the ``tanh``: images are standardised per channel
  and fed to the classifiers as they are, with no ``[0, 1]`` range.
  ``output_space = "normalised"`` says so, and
  :func:`fedjax_dd.distill.ensemble.generator_input_fn` is then the
  identity. BatchNorm uses PyTorch's momentum/epsilon
  (:func:`layers.batch_norm`), as the reference does.

  **Biases before BatchNorm (``conv_bias``).** As in FedFTG's code, ``conv1``
  and ``conv2`` have a bias by default, although the following BatchNorm
  subtracts it: its exact gradient is zero, but Adam scales the rounding
  noise up to steps of the learning rate, which the inference-mode output
  (running means at older biases) sees. ``conv_bias=False`` removes them
  (same training-mode function). The default keeps the reference's biases,
  which did better in DisUE (experiments/perf_notes.md).

  Attributes:
    out_shape: output image shape ``(H, W, Ch)``; ``H, W`` divisible by 4.
    nz: noise dimension (FedFTG: 100 for CIFAR-10, 256 for CIFAR-100).
    ngf: base number of channels (FedFTG: 64).
    num_classes: number of labels.
    conditional: always True: ``__call__`` takes the labels.
    output_space: always ``"normalised"`` (see above).
    conv_bias: whether ``conv1`` and ``conv2`` (each before a BatchNorm)
      have a bias, as in FedFTG's code (see above).
    layers: The layer forms (``layers.LayerSet``; ``"auto"`` convolutions
      are ``lax`` here). The images are float32 whatever its ``dtype``.
  """

  out_shape: tuple = (32, 32, 3)
  nz: int = 100
  ngf: int = 64
  num_classes: int = 10
  conditional: bool = True
  output_space: str = "normalised"
  conv_bias: bool = True
  layers: LayerSet = LayerSet()

  @nn.compact
  def __call__(self, z: jnp.ndarray, y: Optional[jnp.ndarray] = None,
               train: bool = True) -> jnp.ndarray:
    """Generates images.

    Args:
      z: noise ``[B, nz]`` float32.
      y: integer labels ``[B]`` in ``[0, num_classes)``.
      train: BatchNorm on batch statistics, updating the running statistics
        (pass ``mutable=['batch_stats']``), instead of the running ones.

    Returns:
      Images ``[B, H, W, Ch]`` float32 in the classifiers' input space.

    Raises:
      ValueError: on a bad ``out_shape``, ``z`` not ``[B, nz]``, a missing
        ``y`` or ``y`` not ``[B]``, or ``conditional`` / ``output_space`` set
        to other values.
    """
    if not self.conditional or self.output_space != "normalised":
      raise ValueError("CGeneratorA is conditional with normalised output; "
                       "do not override conditional or output_space.")
    if len(self.out_shape) != 3 or any(int(d) < 1 for d in self.out_shape):
      raise ValueError(f"out_shape must be (H, W, Ch) with positive entries, "
                       f"got {self.out_shape}.")
    h, w, ch = (int(d) for d in self.out_shape)
    if h % 4 or w % 4:
      raise ValueError(f"CGeneratorA needs H and W divisible by 4 (two x2 "
                       f"upsamplings), got out_shape {self.out_shape}.")
    if z.ndim != 2 or z.shape[1] != self.nz:
      raise ValueError(f"z must have shape [B, {self.nz}], got {z.shape}.")
    if y is None:
      raise ValueError("CGeneratorA needs labels y [B].")
    if y.shape != (z.shape[0],):
      raise ValueError(f"y must have shape [{z.shape[0]}], got {y.shape}.")

    ls = self.layers.for_model(CGeneratorA.__name__)
    b, h0, w0 = z.shape[0], h // 4, w // 4
    noise = ls.dense(h0 * w0 * self.ngf, name="noise_fc")(z)
    onehot = jax.nn.one_hot(y, self.num_classes, dtype=z.dtype)
    label = ls.dense(h0 * w0 * self.ngf, name="label_fc")(onehot)
    x = jnp.concatenate([noise.reshape(b, h0, w0, self.ngf),
                         label.reshape(b, h0, w0, self.ngf)], axis=-1)
    x = layers.batch_norm(train, name="bn0")(x)
    for i, width in enumerate((2 * self.ngf, self.ngf)):
      x = _upsample2(x)
      x = ls.conv(width, (3, 3), padding="SAME", use_bias=self.conv_bias,
                  name=f"conv{i + 1}")(x)
      x = nn.leaky_relu(layers.batch_norm(train, name=f"bn{i + 1}")(x),
                        negative_slope=0.2)
    x = jnp.tanh(ls.conv(ch, (3, 3), padding="SAME", name="conv3")(x))
    return nn.BatchNorm(use_running_average=not train,
                        momentum=layers.BN_MOMENTUM,
                        epsilon=layers.BN_EPSILON, use_scale=False,
                        use_bias=False, name="bn_out")(
                            # At least float32: float64 stays float64.
                            x.astype(jnp.promote_types(x.dtype, jnp.float32)))


def _upsample2(x: jnp.ndarray) -> jnp.ndarray:
  """Nearest-neighbour x2 upsampling of ``[B, H, W, C]`` (a broadcast)."""
  b, h, w, c = x.shape
  x = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c))
  return x.reshape(b, 2 * h, 2 * w, c)
