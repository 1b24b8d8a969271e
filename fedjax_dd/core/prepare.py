"""A dataset made ready for a model: resized, normalised, and its task built.

Used by the entry point and notebooks alike, so both get the same
normalisation and layer forms::

  prepared = fedjax_dd.prepare("digits", "digits_cnn")
  prepared.task          # Classifier: module, input shape, preprocessing
  prepared.dataset       # Dataset resized to the model's input
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import numpy as np

from fedjax_dd import models
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import preprocess
from fedjax_dd.data import sources

_log = logging.getLogger(__name__)

# Floor of the channel std: a constant channel would divide by zero.
MIN_STD = 1e-3


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A dataset resized for the model, plus the task built on it.

  ``mean`` / ``std`` are THE normalisation of a run (the task's
  preprocessing, KIP's space, the KRR checks): computed once here.
  """
  dataset: sources.Dataset
  task: Classifier
  spec: models.ModelSpec
  mean: np.ndarray  # [Ch] train-split channel mean on the [0, 1] scale
  std: np.ndarray   # [Ch] train-split channel std, at least MIN_STD


def prepare(dataset: sources.Dataset | str, model: str, *,
            input_shape: tuple[int, int, int] | None = None,
            resize_method: str = "bilinear",
            conv_impl: str = "auto",
            compute_dtype: str = "auto",
            data_dir: str | None = None,
            init: str = "",
            proj_dim: int = 0) -> Prepared:
  """Resizes ``dataset`` for ``model`` and builds its classifier.

  Args:
    dataset: a loaded :class:`~fedjax_dd.data.sources.Dataset`, or a name
      for :func:`~fedjax_dd.data.sources.load_dataset` (``"digits"``,
      ``"npz:PATH"``, a TFDS name).
    model: a name of :func:`fedjax_dd.models.get_model`.
    input_shape: ``(H, W, Ch)`` the images are resized to; default the
      model's own.
    resize_method: ``jax.image.resize`` method for a resize.
    conv_impl: the convolution form (:data:`fedjax_dd.models.CONV_IMPLS`);
      ``"auto"`` is the policy's measured form for this platform and jax.
    compute_dtype: the dtype of the model's convolutions and matmuls,
      ``"auto"`` (the policy's: float32 on CPU, bfloat16 on GPU and TPU),
      ``"float32"`` or ``"bfloat16"``; parameters and losses stay float32.
    data_dir: TFDS data directory, when ``dataset`` is a TFDS name.
    init: the parameter initialisation
      (:data:`fedjax_dd.models.param_init.INIT_SCHEMES`): ``""`` the layers'
      own (Flax's), ``"torch"`` PyTorch's defaults.
    proj_dim: the projection head's width of a MOON model
      (:data:`fedjax_dd.models.PROJECTED`); ``0`` its default (256, MOON's
      ``--out_dim``).

  Returns:
    A :class:`Prepared`; inputs are normalised by the train split's channel
    statistics, std floored at :data:`MIN_STD`.

  Raises:
    ValueError: an unknown model name or dataset, or a ``proj_dim`` for a
      model without a projection head or below 0 (before any compute).
  """
  spec = models.get_model(model)  # unknown names fail before the load
  param_init = models.param_init.init_scheme(init)  # so do unknown inits
  build_options = {}
  if proj_dim:  # like the checks above, before the load
    if int(proj_dim) < 1:
      raise ValueError(f"proj_dim must be at least 1 (0: the model's "
                       f"default), got {proj_dim}.")
    if model not in models.PROJECTED:
      raise ValueError(
          f"proj_dim={proj_dim} is the width of MOON's projection head; "
          f"{model!r} has none (a '<name>_proj' model has: "
          f"{', '.join(sorted(models.PROJECTED))}).")
    build_options["proj_dim"] = int(proj_dim)
  ds = (sources.load_dataset(dataset, data_dir=data_dir)
        if isinstance(dataset, str) else dataset)
  target = tuple(input_shape or spec.input_shape)
  if ds.x_train.shape[1:] != target:
    source = ds.x_train.shape[1:]
    ds = dataclasses.replace(
        ds,
        x_train=preprocess.resize_images(ds.x_train, target,
                                         method=resize_method),
        x_test=preprocess.resize_images(ds.x_test, target,
                                        method=resize_method))
    _log.warning(
        "%s: images resized from %s to %s (%s) for model %s.", ds.name,
        "x".join(map(str, source)), "x".join(map(str, target)),
        resize_method, model)
  mean, std = preprocess.channel_stats(ds.x_train)
  mean = np.asarray(mean, np.float32)
  std = np.maximum(np.asarray(std, np.float32), np.float32(MIN_STD))
  module = spec.build(ds.num_classes, conv_impl=conv_impl,
                      compute_dtype=compute_dtype, **build_options)
  task = Classifier(module=module, input_shape=target,
                    preprocess=functools.partial(preprocess.normalize,
                                                 mean=mean, std=std),
                    num_classes=ds.num_classes, param_init=param_init)
  return Prepared(dataset=ds, task=task, spec=spec, mean=mean, std=std)
