"""Flax models and the model registry.

Every classifier is a ``flax.linen.Module`` with a ``num_classes`` field,
called as ``module.apply(variables, x, train=bool)`` on float32 NHWC images
``[B, H, W, Ch]`` and returning logits ``[B, num_classes]``. BatchNorm models
keep running statistics in the ``batch_stats`` collection; in training pass
``train=True, mutable=['batch_stats']``.

Example::

  spec = get_model("lenet5")
  module = spec.build(10)
  variables = init_model(module, jax.random.key(0), spec.input_shape)
  logits = module.apply(variables, x, train=False)
"""

import dataclasses
import types
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_dd.models.alexnet import AlexCifarNet, AlexNet
from fedjax_dd.models.cifar_cnn import HFLDDCifarCNN
from fedjax_dd.models.convnet import ConvNet
from fedjax_dd.models.fc import FC
from fedjax_dd.models.fedhydra_cnn import CNN2, CNN3, ConvBNNet
from fedjax_dd.models.generator import Generator
from fedjax_dd.models.lenet import DigitsCNN, LeNet5
from fedjax_dd.models.resnet import BasicBlock, ResNet, resnet18


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A registered classifier.

  Attributes:
    name: Registry key.
    build: ``build(num_classes) -> nn.Module``.
    input_shape: Canonical single-example input ``(H, W, Ch)``.
    has_batch_stats: Whether the model keeps a ``batch_stats`` collection
      (and so needs ``mutable=['batch_stats']`` when ``train=True``).
    description: One-line summary.
  """

  name: str
  build: Callable[[int], nn.Module]
  input_shape: tuple[int, int, int]
  has_batch_stats: bool
  description: str


_SPECS = (
    ModelSpec("lenet5", lambda k: LeNet5(num_classes=k), (28, 28, 1), False,
              "LeNet-5, ReLU + max-pool, VALID convs; 44,426 params @10."),
    ModelSpec("convnet3", lambda k: ConvNet(num_classes=k), (32, 32, 3), False,
              "ConvNet-3 width 128 with instance norm; 320,010 params @10."),
    ModelSpec("hfldd_cifar_cnn", lambda k: HFLDDCifarCNN(num_classes=k),
              (32, 32, 3), True,
              "HFLDD CIFAR-10 CNN, 4x[conv,ReLU,BN]x2+pool, widths 128; "
              "1,043,850 params @10."),
    ModelSpec("alexnet", lambda k: AlexNet(num_classes=k), (32, 32, 3), False,
              "Five-conv CIFAR AlexNet 64-192-384-256-256, MLP 384-192; "
              "3,900,682 params @10."),
    ModelSpec("alexcifarnet", lambda k: AlexCifarNet(num_classes=k),
              (32, 32, 3), False,
              "FedD3 reference AlexCifarNet (2 conv + LRN); "
              "1,756,426 params @10."),
    ModelSpec("resnet18", resnet18, (32, 32, 3), True,
              "CIFAR ResNet-18 (3x3 stem, BasicBlocks [2,2,2,2]); "
              "11,173,962 params @10."),
    ModelSpec("cnn2", lambda k: CNN2(num_classes=k), (28, 28, 1), True,
              "FedHydra CNN2: 2x[conv5x5,BN,ReLU,pool] 32-64 + dense; "
              "83,562 params @10."),
    ModelSpec("cnn3", lambda k: CNN3(num_classes=k), (32, 32, 3), True,
              "FedHydra CNN3: 3x[conv3x3,BN,ReLU,pool] 32-64-128 + dense; "
              "113,962 params @10."),
    ModelSpec("fc", lambda k: FC(num_classes=k), (28, 28, 1), False,
              "FC1: one hidden ReLU layer of 1024 on the flattened input "
              "(any input shape); 814,090 params @10 on 28x28x1."),
    ModelSpec("digits_cnn", lambda k: DigitsCNN(num_classes=k), (8, 8, 1),
              False,
              "Small CNN for 8x8 sklearn digits; 53,002 params @10."),
)

MODELS: Mapping[str, ModelSpec] = types.MappingProxyType(
    {spec.name: spec for spec in _SPECS})


def get_model(name: str) -> ModelSpec:
  """Returns the registered ``ModelSpec`` called ``name``.

  Raises:
    ValueError: If ``name`` is not registered (the message lists the names).
  """
  try:
    return MODELS[name]
  except KeyError:
    raise ValueError(
        f"Unknown model {name!r}; known models: {', '.join(sorted(MODELS))}."
    ) from None


def _init(module, key, input_shape, call_kwargs):
  x = jnp.zeros((1, *input_shape), jnp.float32)
  return module.init(key, x, train=False, **call_kwargs)


# Compiled once per (module config, input shape): flax modules with hashable
# fields compare by value, so re-initialising an equal module (every client,
# every test) reuses the executable instead of re-tracing a fresh closure.
_init_jit = jax.jit(_init, static_argnums=(0, 2))


def init_model(
    module: nn.Module,
    key: jax.Array,
    input_shape: tuple[int, ...],
    **call_kwargs: Any,
) -> dict[str, Any]:
  """Initialises ``module`` on a dummy batch of one example.

  Args:
    module: A model of this package.
    key: PRNG key for the parameter initialisers.
    input_shape: Single-example input shape, e.g. ``spec.input_shape``
      (``(nz,)`` for a ``Generator``).
    **call_kwargs: Extra array arguments for the call, e.g.
      ``y=jnp.zeros((1,), jnp.int32)`` for a conditional ``Generator``.

  Returns:
    Dict with ``'params'`` and, for BatchNorm models, ``'batch_stats'``.
  """
  input_shape = tuple(int(d) for d in input_shape)
  try:
    hash(module)
  except TypeError:  # e.g. a list-valued field: initialise eagerly.
    return dict(_init(module, key, input_shape, call_kwargs))
  return dict(_init_jit(module, key, input_shape, call_kwargs))


__all__ = [
    "AlexCifarNet", "AlexNet", "BasicBlock", "CNN2", "CNN3", "ConvBNNet",
    "ConvNet", "DigitsCNN", "FC", "Generator", "HFLDDCifarCNN", "LeNet5",
    "MODELS", "ModelSpec", "ResNet", "get_model", "init_model",
    "resnet18",
]
