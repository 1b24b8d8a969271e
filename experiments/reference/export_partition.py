r"""Exports the client index sets of a preset's partition, for a reference
implementation to train on exactly our clients.

  .venv/bin/python experiments/reference/export_partition.py \
      --preset=fmnist_dir0.01 --seed=0 --out=part_seed0.npz

The partition is the one the entry point builds for
``experiments/configs/fedftg.py:<preset>`` with ``--seeds=<seed>`` (``seed =
data.seed = <seed>``): :func:`fedjax_dd.experiments.common.partition` on the
train labels of :func:`fedjax_dd.experiments.common.load_dataset`. The file
(``.npz``) holds

* ``indices``: every client's train indices, concatenated (int64);
* ``offsets [N + 1]``: client ``k`` owns ``indices[offsets[k]:offsets[k+1]]``;
* ``mean [Ch]``, ``std [Ch]``: the channel statistics our task normalises
  with (``(x / 255 - mean) / std``; ``std`` floored as in
  :func:`fedjax_dd.experiments.common.load_and_prepare`);
* ``dataset``, ``partition``, ``data_seed``, ``num_classes``: what it was
  made from (``partition`` as JSON).
"""

from __future__ import annotations

import argparse
import json
from typing import Sequence

import numpy as np


def pack(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """``(indices, offsets)`` of a list of index arrays (see the module doc)."""
  sizes = np.asarray([len(p) for p in parts], np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  indices = (np.concatenate([np.asarray(p, np.int64) for p in parts])
             if len(parts) else np.zeros((0,), np.int64))
  return indices, offsets


def unpack(indices: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
  """Inverse of :func:`pack`."""
  return [indices[offsets[k]:offsets[k + 1]] for k in range(len(offsets) - 1)]


def export(config, path: str) -> dict:
  """Writes ``config``'s partition and channel statistics to ``path``.

  Returns:
    A summary: clients, sizes, classes per client.
  """
  from fedjax_dd.experiments import common  # pylint: disable=g-import-not-at-top
  # The run's own preparation: the same data and normalisation statistics.
  prepared = common.load_and_prepare(config)
  ds = prepared.dataset
  parts = common.partition(config, ds.y_train)
  indices, offsets = pack(parts)
  np.savez(path, indices=indices, offsets=offsets,
           mean=prepared.mean, std=prepared.std,
           dataset=np.asarray(config.data.dataset),
           partition=np.asarray(json.dumps(config.data.partition.to_dict())),
           data_seed=np.asarray(int(config.data.seed)),
           num_classes=np.asarray(int(ds.num_classes)))
  sizes = np.diff(offsets)
  held = [len(np.unique(ds.y_train[p])) for p in parts]
  return {"clients": len(parts), "size_min": int(sizes.min()),
          "size_max": int(sizes.max()), "classes_per_client_mean":
          float(np.mean(held))}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config_module", default="fedftg",
                  help="module of experiments/configs with get_config(preset)")
  ap.add_argument("--preset", default="fmnist_dir0.01")
  ap.add_argument("--seed", type=int, default=0,
                  help="seed = data.seed, as --seeds does")
  ap.add_argument("--data_dir", default="")
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  import importlib  # pylint: disable=g-import-not-at-top
  mod = importlib.import_module(
      f"fedjax_dd.experiments.configs.{args.config_module}")
  config = mod.get_config(args.preset)
  config.seed = args.seed
  config.data.seed = args.seed
  if args.data_dir:
    config.data.data_dir = args.data_dir
  print(json.dumps(export(config, args.out)))


if __name__ == "__main__":
  main()
