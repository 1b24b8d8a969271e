"""Flax models and the model registry.

Every classifier is a ``flax.linen.Module`` with a ``num_classes`` field,
called as ``module.apply(variables, x, train=bool)`` on float32 NHWC images
``[B, H, W, Ch]`` and returning logits ``[B, num_classes]``. BatchNorm models
keep running statistics in the ``batch_stats`` collection; in training pass
``train=True, mutable=['batch_stats']``.

Example::

  spec = get_model("lenet5")
  module = spec.build(10)  # the policy's forms, as the entry point gets them
  plain = LeNet5(10, layers=LayerSet(conv_impl="lax", phase_split=False))
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
from fedjax_dd.models.layers import CONV_IMPLS, LayerSet, resolve_conv_impl
from fedjax_dd.models.lenet import DigitsCNN, LeNet5
from fedjax_dd.models import param_init
from fedjax_dd.models.projection import ProjectionNet, projection_builder
from fedjax_dd.models.resnet import BasicBlock, ResNet, resnet18


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A registered classifier.

  Attributes:
    name: Registry key.
    build: ``build(num_classes, conv_impl="auto", compute_dtype="auto")
      -> nn.Module`` whose ``layers`` field is ``LayerSet.from_policy(
      conv_impl, compute_dtype, model=<class>)``. ``conv_impl``
      (:data:`CONV_IMPLS`; models without convolutions check and ignore
      it) and ``compute_dtype`` (``"auto"``, ``"float32"`` or
      ``"bfloat16"``) do not change the parameters; ``"auto"`` is
      :mod:`fedjax_dd.policy`'s. Parameters, BatchNorm statistics and the
      losses stay float32.
    input_shape: Canonical single-example input ``(H, W, Ch)``.
    has_batch_stats: Whether the model keeps a ``batch_stats`` collection
      (and so needs ``mutable=['batch_stats']`` when ``train=True``).
    description: One-line summary.
    head: The name of the model's output ``Dense`` (``""``: none named),
      which :class:`ProjectionNet` skips to read the representation.
  """

  name: str
  build: Callable[..., nn.Module]
  input_shape: tuple[int, int, int]
  has_batch_stats: bool
  description: str
  head: str = ""


def _builder(make: Callable[..., nn.Module],
             model: str | None = None) -> Callable[..., nn.Module]:
  """``build(num_classes, conv_impl="auto", compute_dtype="auto")`` for
  ``make(num_classes, layers=LayerSet)``; ``model``: the class name whose
  own ``"auto"`` form applies (:func:`fedjax_dd.policy.conv_form`)."""

  def build(num_classes: int, conv_impl: str = "auto",
            compute_dtype: str = "auto") -> nn.Module:
    # Validates the names as well.
    return make(num_classes, layers=LayerSet.from_policy(
        conv_impl, compute_dtype, model=model))

  return build


def _cls(cls: type[nn.Module]) -> Callable[..., nn.Module]:
  return _builder(lambda k, **kw: cls(num_classes=k, **kw),
                  model=cls.__name__)


_SPECS = (
    ModelSpec("lenet5", _cls(LeNet5), (28, 28, 1), False,
              "LeNet-5, ReLU + max-pool, VALID convs; 44,426 params @10.",
              head="fc3"),
    ModelSpec("convnet3", _cls(ConvNet), (32, 32, 3), False,
              "ConvNet-3 width 128 with instance norm; 320,010 params @10.",
              head="fc"),
    ModelSpec("hfldd_cifar_cnn", _cls(HFLDDCifarCNN),
              (32, 32, 3), True,
              "HFLDD CIFAR-10 CNN, 4x[conv,ReLU,BN]x2+pool, widths 128; "
              "1,043,850 params @10.",
              head="fc"),
    ModelSpec("alexnet", _cls(AlexNet), (32, 32, 3), False,
              "Five-conv CIFAR AlexNet 64-192-384-256-256, MLP 384-192; "
              "3,900,682 params @10.",
              head="head"),
    ModelSpec("alexcifarnet", _cls(AlexCifarNet),
              (32, 32, 3), False,
              "FedD3 reference AlexCifarNet (2 conv + LRN); "
              "1,756,426 params @10.",
              head="fc3"),
    ModelSpec("resnet18", _builder(resnet18), (32, 32, 3), True,
              "CIFAR ResNet-18 (3x3 stem, BasicBlocks [2,2,2,2]); "
              "11,173,962 params @10.",
              head="fc"),
    ModelSpec("cnn2", _cls(CNN2), (28, 28, 1), True,
              "FedHydra CNN2: 2x[conv5x5,BN,ReLU,pool] 32-64 + dense; "
              "83,562 params @10.",
              head="fc"),
    ModelSpec("cnn3", _cls(CNN3), (32, 32, 3), True,
              "FedHydra CNN3: 3x[conv3x3,BN,ReLU,pool] 32-64-128 + dense; "
              "113,962 params @10.",
              head="fc"),
    ModelSpec("fc", _builder(lambda k, **kw: FC(num_classes=k, **kw)),
              (28, 28, 1), False,
              "FC1: one hidden ReLU layer of 1024 on the flattened input "
              "(any input shape); 814,090 params @10 on 28x28x1.",
              head="head"),
    ModelSpec("digits_cnn", _cls(DigitsCNN), (8, 8, 1),
              False,
              "Small CNN for 8x8 sklearn digits; 53,002 params @10.",
              head="fc2"),
)

MODELS: Mapping[str, ModelSpec] = types.MappingProxyType(
    {spec.name: spec for spec in _SPECS})

# MOON's networks (models/projection.py), ``<name>_proj``. Kept apart from
# MODELS, whose every entry the model tests run.
PROJECTED: Mapping[str, ModelSpec] = types.MappingProxyType({
    f"{spec.name}_proj": ModelSpec(
        f"{spec.name}_proj", projection_builder(spec.build, spec.head),
        spec.input_shape, spec.has_batch_stats,
        f"{spec.name} without {spec.head!r}, MOON's projection head "
        "(d -> d -> 256) and output layer.")
    for spec in _SPECS})


def get_model(name: str) -> ModelSpec:
  """Returns the registered ``ModelSpec`` called ``name`` (or its MOON
  variant ``<name>_proj``, :data:`PROJECTED`).

  Raises:
    ValueError: If ``name`` is not registered (the message lists the names).
  """
  try:
    return MODELS[name] if name in MODELS else PROJECTED[name]
  except KeyError:
    raise ValueError(
        f"Unknown model {name!r}; known models: {', '.join(sorted(MODELS))}."
    ) from None


def _init(module, key, input_shape, call_kwargs):
  x = jnp.zeros((1, *input_shape), jnp.float32)
  return module.init(key, x, train=False, **call_kwargs)


# Compiled once per (module config, input shape): flax modules with hashable
# fields compare by value, so an equal module reuses the executable.
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
    "AlexCifarNet", "AlexNet", "BasicBlock", "CNN2", "CNN3", "CONV_IMPLS",
    "ConvBNNet", "ConvNet", "DigitsCNN", "FC", "Generator", "HFLDDCifarCNN",
    "LayerSet", "LeNet5",
    "MODELS", "ModelSpec", "PROJECTED", "ProjectionNet", "ResNet", "get_model", "init_model",
    "param_init", "resnet18", "resolve_conv_impl",
]
