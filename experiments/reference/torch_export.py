r"""Exports a run's client models (our Flax CNNs) as PyTorch state dicts.

For running a reference implementation on exactly our teachers (DENSE's
server distillation, ``dense_adapter.py``). Runs in the project's
environment with torch installed:

  .venv/bin/python experiments/reference/torch_export.py \
      --workdir=TEACHERS --preset=mnist_a0.5 --out=teachers.pt

``TEACHERS`` is the workdir of a FedHydra / DENSE / one-shot FedAvg run of
``experiments/configs/fedhydra.py:<preset>`` (``r1/clients`` holds the
client models).
``teachers.pt`` is what DENSE's ``loop_df_fl.py --type=pretrain`` saves: a
list of ``m`` state dicts of one architecture, plus (in a dict around it)
the architecture and the normalisation our task applies, so a model built by
:func:`build_torch` reproduces our logits on images in ``[0, 1]``.

The architectures are :class:`fedjax_dd.models.fedhydra_cnn.ConvBNNet`'s
(``cnn2``, ``cnn3``): ``len(features)`` blocks of ``conv k×k SAME (no bias)
-> BN -> ReLU -> max-pool 2`` and one dense layer. Layout changes:

* conv kernels ``[k, k, in, out]`` (HWIO) -> ``[out, in, k, k]`` (OIHW);
* BatchNorm ``scale / bias / mean / var`` -> ``weight / bias / running_mean
  / running_var`` (epsilon 1e-5 in both, :mod:`fedjax_dd.models.layers`);
* the dense kernel ``[h·w·c, K]`` flattens NHWC features, PyTorch flattens
  NCHW: its rows are permuted to ``(c, h, w)`` order and it is transposed.

The wrapper :class:`Normalized` puts our ``(x − mean) / std`` in front, so
the reference's code feeds the models images in ``[0, 1]``, as its own MNIST
loader (``ToTensor`` without normalisation) and generator (sigmoid) do.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Sequence

import numpy as np

PyTree = Any


def nhwc_rows_to_nchw(a: np.ndarray, hwc: Sequence[int]) -> np.ndarray:
  """Reorders the rows of ``a [H·W·C, ...]`` from ``(h, w, c)`` order (Flax's
  flattening of NHWC maps) to ``(c, h, w)`` (PyTorch's of NCHW)."""
  h, w, c = hwc
  return a.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(a.shape)


def nchw_rows_to_nhwc(a: np.ndarray, hwc: Sequence[int]) -> np.ndarray:
  """The inverse of :func:`nhwc_rows_to_nchw`."""
  h, w, c = hwc
  return a.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(a.shape)


def flax_to_torch(params: PyTree, batch_stats: PyTree, *,
                  features: Sequence[int], image_hw: tuple[int, int]
                  ) -> dict[str, np.ndarray]:
  """One ConvBNNet's variables as a PyTorch state dict of numpy arrays.

  Args:
    params: the Flax parameters (``conv<i>``, ``bn<i>``, ``fc``).
    batch_stats: the BatchNorm statistics (``bn<i>``: ``mean``, ``var``).
    features: the conv widths, e.g. ``(32, 64)`` for ``cnn2``.
    image_hw: the input's ``(H, W)``; the dense layer reads
      ``H / 2^n × W / 2^n`` feature maps.

  Returns:
    ``{name: array}`` with the names of :func:`build_torch`'s module
    (``blocks.<i>.0`` conv, ``blocks.<i>.1`` BN, ``fc``), float32, plus
    ``num_batches_tracked`` as PyTorch keeps it.
  """
  params, batch_stats = _host(params), _host(batch_stats)
  sd = {}
  for i in range(len(features)):
    kernel = params[f"conv{i + 1}"]["kernel"]
    sd[f"blocks.{i}.0.weight"] = np.transpose(kernel, (3, 2, 0, 1))
    bn, stats = params[f"bn{i + 1}"], batch_stats[f"bn{i + 1}"]
    sd[f"blocks.{i}.1.weight"] = bn["scale"]
    sd[f"blocks.{i}.1.bias"] = bn["bias"]
    sd[f"blocks.{i}.1.running_mean"] = stats["mean"]
    sd[f"blocks.{i}.1.running_var"] = stats["var"]
    sd[f"blocks.{i}.1.num_batches_tracked"] = np.zeros((), np.int64)
  h, w = (s // 2 ** len(features) for s in image_hw)
  kernel = params["fc"]["kernel"]           # [h·w·c, K], rows in (h, w, c).
  sd["fc.weight"] = nhwc_rows_to_nchw(np.asarray(kernel),
                                      (h, w, features[-1])).T
  sd["fc.bias"] = params["fc"]["bias"]
  # Writable copies: torch.from_numpy warns on read-only device buffers.
  return {n: np.array(a, np.int64 if a.dtype == np.int64 else np.float32)
          for n, a in sd.items()}


def _host(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def build_torch(features: Sequence[int], kernel_size: int, num_classes: int,
                channels: int, image_hw: tuple[int, int]):
  """The PyTorch ConvBNNet whose state dict :func:`flax_to_torch` writes.

  PyTorch's default initialisation (the reference's student starts so).
  """
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class ConvBNNet(nn.Module):
    """``[conv (no bias) -> BN -> ReLU -> max-pool 2] × n -> dense``."""

    def __init__(self):
      super().__init__()
      blocks, c = [], channels
      for width in features:
        blocks.append(nn.Sequential(
            nn.Conv2d(c, width, kernel_size, padding=kernel_size // 2,
                      bias=False),
            nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2)))
        c = width
      self.blocks = nn.Sequential(*blocks)
      h, w = (s // 2 ** len(features) for s in image_hw)
      self.fc = nn.Linear(c * h * w, num_classes)

    def forward(self, x):
      return self.fc(torch.flatten(self.blocks(x), 1))

  return ConvBNNet()


def normalized(model, mean: Sequence[float], std: Sequence[float]):
  """``model`` reading images in ``[0, 1]`` NCHW: ``model((x − mean) / std)``."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class Normalized(nn.Module):

    def __init__(self):
      super().__init__()
      self.model = model
      shape = (1, len(mean), 1, 1)
      self.register_buffer(
          "mean", torch.tensor(np.asarray(mean, np.float32)).reshape(shape))
      self.register_buffer(
          "std", torch.tensor(np.asarray(std, np.float32)).reshape(shape))

    def forward(self, x):
      return self.model((x - self.mean) / self.std)

  return Normalized()


def load_clients(workdir: str, preset: str):
  """A run's round-1 client models and its task.

  Args:
    workdir: the run's directory.
    preset: the ``experiments/configs/fedhydra.py`` preset it ran (its model
      and data; checked against the run's ``config.json``).

  Returns:
    ``(params [m, ...], batch_stats [m, ...], config, prepared)``: the stacked
    client variables of the run's one architecture, the run's config and
    its prepared data (:func:`fedjax_dd.experiments.common.load_and_prepare`:
    the normalisation statistics and the test set).
  """
  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp
  from fedjax_dd.core.algorithm import Teachers
  from fedjax_dd.core.checkpoint import CheckpointStore
  from fedjax_dd.experiments import common
  from fedjax_dd.experiments.configs import fedhydra
  from fedjax_dd.models import get_model
  # pylint: enable=g-import-not-at-top
  config = fedhydra.get_config(preset)
  with open(os.path.join(workdir, "config.json")) as f:
    recorded = json.load(f)  # The run's settings, flat ("model.name": ...).
  for key in ("model.name", "model.client_models", "data.dataset",
              "data.num_clients", "data.input_shape"):
    ours = config
    for part in key.split("."):
      ours = ours[part]
    ours = list(ours) if isinstance(ours, tuple) else ours
    if key in recorded and recorded[key] != ours:
      raise ValueError(f"{workdir!r} ran {key}={recorded[key]!r}, preset "
                       f"{preset!r} has {ours!r}.")
  if config.model.client_models:
    raise ValueError("Only runs whose clients share one architecture.")
  prepared = common.load_and_prepare(config)
  module = get_model(config.model.name).build(prepared.dataset.num_classes)
  shape = (1, *prepared.task.input_shape)
  v = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0),
                                         jnp.zeros(shape), train=False))
  m = config.data.num_clients
  stack = lambda t: jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct((m, *a.shape), a.dtype), t)
  template = Teachers(vars=((stack(v["params"]), stack(v["batch_stats"])),),
                      num_examples=jax.ShapeDtypeStruct((m,), jnp.int32))
  with CheckpointStore(os.path.join(workdir, "r1", "clients"),
                       max_to_keep=1) as store:
    restored = store.restore(template)
  if restored is None:
    raise ValueError(f"{workdir!r} holds no round-1 client checkpoint.")
  (params, stats), = restored[1].vars
  return params, stats, config, prepared


def export(workdir: str, preset: str, out: str) -> dict[str, Any]:
  """Writes ``workdir``'s client models to ``out`` (``torch.save``).

  Returns:
    The saved dict's metadata (everything but the state dicts).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from fedjax_dd.models import get_model  # pylint: disable=g-import-not-at-top
  params, stats, config, prepared = load_clients(workdir, preset)
  module = get_model(config.model.name).build(prepared.dataset.num_classes)
  features, k = tuple(module.features), int(module.kernel_size)
  hw = tuple(prepared.task.input_shape[:2])
  m = config.data.num_clients
  take = lambda t, i: jax.tree_util.tree_map(lambda a: a[i], t)
  state_dicts = [
      {n: torch.from_numpy(a) for n, a in flax_to_torch(
          take(params, i), take(stats, i), features=features,
          image_hw=hw).items()} for i in range(m)]
  meta = {"model": config.model.name, "features": features,
          "kernel_size": k, "num_classes": prepared.dataset.num_classes,
          "channels": int(prepared.task.input_shape[2]), "image_hw": hw,
          "mean": np.asarray(prepared.mean, np.float32).reshape(-1).tolist(),
          "std": np.asarray(prepared.std, np.float32).reshape(-1).tolist(),
          "dataset": config.data.dataset, "workdir": os.path.abspath(workdir)}
  torch.save({"state_dicts": state_dicts, **meta}, out)
  return meta


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True,
                      help="a run whose r1/clients holds the client models")
  parser.add_argument("--preset", default="mnist_a0.5",
                      help="the experiments/configs/fedhydra.py preset it ran")
  parser.add_argument("--out", required=True, help="output .pt file")
  args = parser.parse_args(argv)
  print(json.dumps(export(args.workdir, args.preset, args.out)))


if __name__ == "__main__":
  main()
