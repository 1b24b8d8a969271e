"""Jitted evaluation of a global model, or of every client's model at once."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core.clients import ClientMapper, engine_jit, map_leading_axis
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import validate

PyTree = Any


def batched(x, y, batch_size: int, num_examples=None):
  """Pads ``x [*L, N, ...]`` and ``y [*L, N]`` to ``M`` batches of
  ``batch_size``: ``x [*L, M, B, ...]``, ``y [*L, M, B]`` and a mask
  ``[*L, M, B]`` that is 1 on the first ``num_examples [*L]`` examples of
  each leading index (default all ``N``) and 0 on the rest and the padding.
  ``*L`` is empty for one split, ``[C]`` for padded clients."""
  x, y = np.asarray(x), np.asarray(y)
  lead, n = y.shape[:-1], y.shape[-1]
  if n == 0:
    raise ValueError("Cannot evaluate on an empty split.")
  k = len(lead)
  m = -(-n // batch_size)
  pad = m * batch_size - n
  xp = np.concatenate(
      [x, np.zeros((*lead, pad, *x.shape[k + 1:]), x.dtype)], axis=k)
  yp = np.concatenate([y, np.zeros((*lead, pad), y.dtype)], axis=k)
  counts = np.full(lead, n) if num_examples is None else np.asarray(
      num_examples)
  mask = (np.arange(m * batch_size) < counts[..., None]).astype(np.float32)
  return (jnp.asarray(xp.reshape(*lead, m, batch_size, *x.shape[k + 1:])),
          jnp.asarray(yp.reshape(*lead, m, batch_size)),
          jnp.asarray(mask.reshape(*lead, m, batch_size)))


def evaluate_sums(task: Classifier, params, batch_stats, xs, ys, masks,
                  per_class: bool = False):
  """Summed figures of one model over pre-batched data ``[M, B, ...]``.

  Returns:
    ``{"loss", "accuracy", "total"}``: the ``masks``-weighted sums of the
    batch losses and accuracies and the weight; with ``per_class`` also
    ``class_correct`` and ``class_count`` ``[C]``: the correctly classified
    and all test examples of each true class.
  """
  c = task.num_classes

  def body(carry, batch):
    xb, yb, mb = batch
    loss, (_, acc) = task.loss(params, batch_stats, xb, yb, train=False,
                               weights=mb)
    w = mb.sum()
    out = {"loss": carry["loss"] + loss * w, "accuracy": carry["accuracy"] +
           acc * w, "total": carry["total"] + w}
    if per_class:
      # The same forward pass as task.loss's; XLA computes it once.
      logits, _ = task.apply(params, batch_stats, task.preprocess(xb),
                             train=False)
      onehot = jax.nn.one_hot(yb, c, dtype=jnp.float32) * mb[:, None]
      hit = (jnp.argmax(logits, -1) == yb).astype(jnp.float32)
      out["class_correct"] = carry["class_correct"] + hit @ onehot
      out["class_count"] = carry["class_count"] + onehot.sum(0)
    return out, None

  zero = jnp.zeros((), jnp.float32)
  init = {"loss": zero, "accuracy": zero, "total": zero}
  if per_class:
    init["class_correct"] = init["class_count"] = jnp.zeros((c,), jnp.float32)
  sums, _ = jax.lax.scan(body, init, (xs, ys, masks))
  return sums


def _evaluate_one(task: Classifier, params, batch_stats, xs, ys, masks,
                  per_class: bool = False):
  """Accuracy and loss of one model over pre-batched data ``[M, B, ...]``
  (and the per-class counts of :func:`evaluate_sums`)."""
  sums = evaluate_sums(task, params, batch_stats, xs, ys, masks, per_class)
  out = {"accuracy": sums["accuracy"] / sums["total"],
         "loss": sums["loss"] / sums["total"]}
  if per_class:
    out["class_correct"] = sums["class_correct"]
    out["class_count"] = sums["class_count"]
  return out


def class_accuracy(class_correct: np.ndarray, class_count: np.ndarray
                   ) -> list[float | None]:
  """Accuracy on each class's examples; ``None`` for a class the split lacks."""
  return [float(h / n) if n > 0 else None
          for h, n in zip(np.asarray(class_correct), np.asarray(class_count))]


def make_evaluator(task: Classifier, x: np.ndarray, y: np.ndarray, *,
                   batch_size: int = 1000, per_class: bool = False
                   ) -> Callable[[PyTree, PyTree], dict[str, Any]]:
  """Returns ``evaluate(params, batch_stats) -> {"accuracy", "loss"}``.

  The split is padded to whole batches once (zero weight) and kept on the
  device.

  Args:
    task: the classifier.
    x, y: the split, ``[N, H, W, Ch]`` uint8 and ``[N]`` int labels.
    batch_size: examples per evaluated batch.
    per_class: also return ``"class_accuracy"``, a list of ``C`` accuracies
      on each true class's examples (``None`` for a class with none); shows
      non-IID rounds that swap whole classes at a steady mean.

  Raises:
    ValueError: ``x`` not uint8 images of ``task.input_shape``, or ``y``
      not ``x``'s ``[N]`` class indices in ``[0, task.num_classes)``.
  """
  validate.split(x, y, num_classes=task.num_classes,
                 input_shape=task.input_shape)
  xs, ys, masks = batched(x, y, batch_size)
  fn = engine_jit(lambda p, s: _evaluate_one(task, p, s, xs, ys, masks,
                                             per_class))

  def evaluate(params, batch_stats):
    out = jax.device_get(fn(params, batch_stats))
    result = {"accuracy": float(out["accuracy"]), "loss": float(out["loss"])}
    if per_class:
      result["class_accuracy"] = class_accuracy(out["class_correct"],
                                                out["class_count"])
    return result

  return evaluate


def make_run_evaluator(task: Classifier, x: np.ndarray, y: np.ndarray, *,
                       batch_size: int = 1000, per_class: bool = False,
                       run_chunk: int | None = None
                       ) -> Callable[[PyTree, PyTree], list[dict[str, Any]]]:
  """Evaluates R runs' global models ``[R, ...]`` on one split in one program.

  :func:`make_evaluator` over the run axis (:func:`fedjax_dd.fit_runs`):
  one vmap, or runs in chunks as the round program maps them.

  Args:
    task: the classifier.
    x, y: the split, ``[N, H, W, Ch]`` uint8 and ``[N]`` int labels.
    batch_size: examples per evaluated batch.
    per_class: as :func:`make_evaluator`'s.
    run_chunk: runs vectorised together, chunks in sequence
      (:func:`fedjax_dd.core.clients.map_leading_axis`); None: one vmap.

  Returns:
    ``evaluate(params [R, ...], batch_stats [R, ...]) -> [R dicts]``, as
    :func:`make_evaluator` gives them (up to the batched rounding; chunks
    of one run give its bits).

  Raises:
    ValueError: as :func:`make_evaluator`.
  """
  validate.split(x, y, num_classes=task.num_classes,
                 input_shape=task.input_shape)
  xs, ys, masks = batched(x, y, batch_size)
  fn = engine_jit(map_leading_axis(
      lambda p, s: _evaluate_one(task, p, s, xs, ys, masks, per_class),
      (0, 0), run_chunk))

  def evaluate(params, batch_stats):
    out = jax.device_get(fn(params, batch_stats))
    results = []
    for i in range(np.shape(out["accuracy"])[0]):
      result = {"accuracy": float(out["accuracy"][i]),
                "loss": float(out["loss"][i])}
      if per_class:
        result["class_accuracy"] = class_accuracy(out["class_correct"][i],
                                                  out["class_count"][i])
      results.append(result)
    return results

  return evaluate


def make_client_evaluator(task: Classifier, x: np.ndarray, y: np.ndarray, *,
                          mapper: ClientMapper = ClientMapper(),
                          batch_size: int = 1000) -> Callable[[PyTree, PyTree], dict[str, np.ndarray]]:
  """Evaluates stacked client models ``[C, ...]`` on one split in one program.

  Returns:
    ``evaluate(params [C, ...], batch_stats [C, ...]) -> {"accuracy" [C],
    "loss" [C]}`` as NumPy arrays.

  Raises:
    ValueError: as :func:`make_evaluator`.
  """
  validate.split(x, y, num_classes=task.num_classes,
                 input_shape=task.input_shape)
  xs, ys, masks = batched(x, y, batch_size)
  mapped = mapper.map(
      lambda p, s, xs, ys, ms: _evaluate_one(task, p, s, xs, ys, ms),
      in_axes=(0, 0, None, None, None))

  def evaluate(params, batch_stats):
    return jax.device_get(mapped(params, batch_stats, xs, ys, masks))

  return evaluate
