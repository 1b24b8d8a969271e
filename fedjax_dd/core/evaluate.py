"""Jitted evaluation of a global model, or of every client's model at once."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core.clients import ClientMapper, engine_jit
from fedjax_dd.core.task import Classifier

PyTree = Any


def _batched(x: np.ndarray, y: np.ndarray, batch_size: int):
  """Pads ``x [N, ...]`` to ``[M, batch_size, ...]`` with a ``[M, batch_size]`` mask."""
  n = x.shape[0]
  if n == 0:
    raise ValueError("Cannot evaluate on an empty split.")
  m = -(-n // batch_size)
  pad = m * batch_size - n
  xp = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
  yp = np.concatenate([y, np.zeros((pad,), y.dtype)])
  mask = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])
  return (jnp.asarray(xp.reshape(m, batch_size, *x.shape[1:])),
          jnp.asarray(yp.reshape(m, batch_size)),
          jnp.asarray(mask.reshape(m, batch_size)))


def _evaluate_one(task: Classifier, params, batch_stats, xs, ys, masks):
  """Accuracy and loss of one model over pre-batched data ``[M, B, ...]``."""

  def body(carry, batch):
    xb, yb, mb = batch
    loss, (_, acc) = task.loss(params, batch_stats, xb, yb, train=False,
                               weights=mb)
    w = mb.sum()
    return (carry[0] + loss * w, carry[1] + acc * w, carry[2] + w), None

  zero = jnp.zeros((), jnp.float32)
  (loss, acc, total), _ = jax.lax.scan(body, (zero, zero, zero),
                                       (xs, ys, masks))
  return {"accuracy": acc / total, "loss": loss / total}


def make_evaluator(task: Classifier, x: np.ndarray, y: np.ndarray, *,
                   batch_size: int = 1000) -> Callable[[PyTree, PyTree], dict[str, float]]:
  """Returns ``evaluate(params, batch_stats) -> {"accuracy", "loss"}``.

  The split is padded to whole batches once and kept on the device; padded
  rows carry zero weight.
  """
  xs, ys, masks = _batched(np.asarray(x), np.asarray(y), batch_size)
  fn = engine_jit(lambda p, s: _evaluate_one(task, p, s, xs, ys, masks))

  def evaluate(params, batch_stats):
    return {k: float(v) for k, v in jax.device_get(fn(params, batch_stats)).items()}

  return evaluate


def make_client_evaluator(task: Classifier, x: np.ndarray, y: np.ndarray, *,
                          mapper: ClientMapper = ClientMapper(),
                          batch_size: int = 1000) -> Callable[[PyTree, PyTree], dict[str, np.ndarray]]:
  """Evaluates stacked client models ``[C, ...]`` on one split in one program.

  Returns:
    ``evaluate(params [C, ...], batch_stats [C, ...]) -> {"accuracy" [C],
    "loss" [C]}`` as NumPy arrays.
  """
  xs, ys, masks = _batched(np.asarray(x), np.asarray(y), batch_size)
  mapped = mapper.map(
      lambda p, s, xs, ys, ms: _evaluate_one(task, p, s, xs, ys, ms),
      in_axes=(0, 0, None, None, None))

  def evaluate(params, batch_stats):
    return jax.device_get(mapped(params, batch_stats, xs, ys, masks))

  return evaluate
