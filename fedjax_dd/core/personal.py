"""Personalized evaluation: every client scored with the model it deploys.

As the clustered methods' papers (IFCA, CFL, PACFL) and the pFL benchmarks
(FL-bench, PFLlib, pfl-research) do, each client is scored with the model it
would use, on test data drawn like its own training data, and the
example-weighted mean over clients is reported:

* the test data: :func:`fedjax_dd.data.partition.personal_test_split` or
  :func:`fedjax_dd.data.partition.stratified_split`, stacked
  ``[C, T_max, ...]`` with counts; padding never reaches a figure;
* the model: the algorithm's ``deploy`` (:func:`fedjax_dd.core.algorithm.
  deployed`): the global model for the FedAvg family, DisUE and FedFTG; the
  client's cluster model for CFL, CFL-GP and PACFL, and for IFCA the model
  of lowest loss on the client's training data;
* optionally ``k`` local fine-tuning steps on the client's training data
  first (the "fine-tuned" column of FL-bench and pfl-research), with keys
  of their own (:func:`fedjax_dd.core.keys.finetune_key`).

All ``C`` clients are scored in one program: the ``[K, ...]`` models are
broadcast and each client gathers its own by its ``[C]`` pick.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import (ExperimentState, FederatedAlgorithm,
                                      deployed)
from fedjax_dd.core.clients import ClientMapper, RoundContext
from fedjax_dd.core.evaluate import batched, evaluate_sums
from fedjax_dd.core.local import LocalTraining, make_local_update
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import validate
from fedjax_dd.data.stacked import ClientData

PyTree = Any
tree_map = jax.tree_util.tree_map

# Row keys; the loop writes them as they are (core.loop.ROW_PREFIXES).
PREFIX = "personal_"


@dataclasses.dataclass(frozen=True)
class PersonalScores:
  """Every client's figures (host arrays).

  Attributes:
    correct: ``[C]`` correctly classified test examples.
    loss_sum: ``[C]`` summed test loss.
    num_examples: ``[C]`` test examples (0: the client has no figure).
  """
  correct: np.ndarray
  loss_sum: np.ndarray
  num_examples: np.ndarray

  @property
  def accuracy(self) -> np.ndarray:
    """``[C]`` accuracy of each client; NaN for a client without test data."""
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where(self.num_examples > 0,
                      self.correct / np.maximum(self.num_examples, 1), np.nan)

  def figures(self) -> dict[str, float]:
    """The row's figures: ``personal_accuracy`` and ``personal_loss``
    (example-weighted over clients: every test example counts once), and
    the spread of the clients' accuracies (``_sd``, ``_min``, ``_max``,
    unweighted over the clients with test data)."""
    n = self.num_examples
    total = float(n.sum())
    acc = self.accuracy[n > 0]
    return {f"{PREFIX}accuracy": float(self.correct.sum() / total),
            f"{PREFIX}loss": float(self.loss_sum.sum() / total),
            f"{PREFIX}accuracy_sd": float(np.std(acc)),
            f"{PREFIX}accuracy_min": float(np.min(acc)),
            f"{PREFIX}accuracy_max": float(np.max(acc))}


def make_personal_evaluator(
    task: Classifier, test: ClientData, *,
    mapper: ClientMapper = ClientMapper(), batch_size: int = 500,
    train: ClientData | None = None,
    finetune_optimizer: optax.GradientTransformation | None = None,
    finetune_steps: int = 0, finetune_batch_size: int = 32,
) -> Callable[..., PersonalScores]:
  """Scores ``C`` clients, each with its pick of ``K`` models, in one program.

  Args:
    task: the classifier.
    test: every client's test data ``[C, T_max, ...]`` with counts (a count
      may be 0).
    mapper: the client-axis backend.
    batch_size: test examples per evaluated batch of a client.
    train: every client's training data ``[C, N_max, ...]`` (fine-tuning).
    finetune_optimizer: the optimizer of the fine-tuning steps (fresh per
      client and evaluation).
    finetune_steps: ``k`` local steps on the client's training data from its
      model before it is scored; 0: none.
    finetune_batch_size: the fine-tuning batch.

  Returns:
    ``evaluate(params [K, ...], batch_stats [K, ...], picks [C], key=None)
    -> PersonalScores``; ``key`` (fine-tuning only) gives client ``i`` the
    key ``fold_in(key, i)``.

  Raises:
    ValueError: ``test`` not a client stack of the task's images, no test
      example, ``finetune_steps < 0``, or fine-tuning without a matching
      ``train`` and a ``finetune_optimizer``.
  """
  validate.image_shape("test.x", test.x, task.input_shape, leading=2)
  validate.client_stack(test.x, test.y, test.num_examples,
                        num_classes=task.num_classes, fetch=True)
  if int(np.sum(jax.device_get(test.num_examples))) == 0:
    raise ValueError("personal evaluation: no client has a test example.")
  if not isinstance(finetune_steps, (int, np.integer)) or finetune_steps < 0:
    raise ValueError(f"finetune_steps must be an int >= 0, got "
                     f"{finetune_steps!r}.")
  steps = int(finetune_steps)
  if steps and (train is None or finetune_optimizer is None):
    raise ValueError("personal evaluation: finetune_steps > 0 needs train= "
                     "(the clients' training data) and finetune_optimizer=.")
  if steps and train.num_clients != test.num_clients:
    raise ValueError(f"personal evaluation: train holds {train.num_clients} "
                     f"clients, test {test.num_clients}.")
  counts = np.asarray(jax.device_get(test.num_examples))
  xs, ys, masks = batched(
      test.x, test.y, max(1, min(int(batch_size), test.y.shape[1])), counts)
  local = (make_local_update(LocalTraining(
      task, finetune_optimizer, batch_size=finetune_batch_size,
      max_steps=steps)) if steps else None)

  def one_client(models, stats, pick, xs, ys, ms, x, y, n, key):
    params = tree_map(lambda m: m[pick], models)
    batch_stats = tree_map(lambda s: s[pick], stats)
    if local is not None:
      # A client without training data keeps its model.
      k = jnp.where(n > 0, steps, 0)
      ctx = RoundContext(round=jnp.zeros((), jnp.int32), start_params=params,
                         start_batch_stats=batch_stats)
      result = local.run(params, batch_stats, local.optimizer.init(params),
                         x, y, n, k, key, ctx)
      params, batch_stats = result.params, result.batch_stats
    sums = evaluate_sums(task, params, batch_stats, xs, ys, ms)
    return sums["accuracy"], sums["loss"]

  mapped = mapper.map(one_client,
                      in_axes=(None, None, 0, 0, 0, 0, 0, 0, 0, 0))
  c = test.num_clients
  if steps:
    tx, ty, tn = (jnp.asarray(train.x), jnp.asarray(train.y),
                  jnp.asarray(train.num_examples))
  else:
    # Placeholders of one example: the mapped function ignores them.
    tx = jnp.zeros((c, 1, *task.input_shape), jnp.uint8)
    ty = jnp.zeros((c, 1), jnp.int32)
    tn = jnp.zeros((c,), jnp.int32)

  def evaluate(params, batch_stats, picks, key=None):
    if key is None:
      key = jax.random.PRNGKey(0)
    client_keys = keys_lib.client_keys(key, jnp.arange(c))
    correct, loss = jax.device_get(mapped(
        params, batch_stats, jnp.asarray(picks, jnp.int32), xs, ys, masks,
        tx, ty, tn, client_keys))
    # The sums are weighted by the mask: correct counts, summed losses.
    return PersonalScores(correct=np.asarray(correct, np.float64),
                          loss_sum=np.asarray(loss, np.float64),
                          num_examples=counts.astype(np.int64))

  return evaluate


def personal_evaluation(
    algorithm: FederatedAlgorithm, task: Classifier, train: ClientData,
    test: ClientData, **options: Any
) -> Callable[[ExperimentState], dict[str, float]]:
  """The rounds loop's personalized evaluation of ``algorithm``.

  Args:
    algorithm: the method; its ``deploy`` picks each client's model.
    task: the classifier.
    train: the run's clients' training data (IFCA picks by it; fine-tuning
      trains on it).
    test: their test data, in the same client order.
    **options: :func:`make_personal_evaluator`'s keyword arguments.

  Returns:
    ``evaluate(state) -> {"personal_accuracy", ...}``
    (:meth:`PersonalScores.figures`); fine-tuning keys come from
    ``state.round``, so a resume repeats the figures.
  """
  if train.num_clients != test.num_clients:
    raise ValueError(f"personal evaluation: train holds {train.num_clients} "
                     f"clients, test {test.num_clients}.")
  evaluator = make_personal_evaluator(task, test, train=train, **options)

  def evaluate(state: ExperimentState) -> dict[str, float]:
    params, batch_stats, picks = deployed(algorithm, state.server, train)
    key = keys_lib.finetune_key(keys_lib.round_key(state.key, state.round))
    return evaluator(params, batch_stats, picks, key).figures()

  return evaluate
