"""Label-knowledge collection: pretrain every client, soft labels, similarity.

HFLDD's first stage (Shi et al., "Dataset Distillation-based Hybrid Federated
Learning on Non-IID Data", 2024, Sec. IV-A and Eq. 4). Every client trains a
local model from one common initialisation, predicts softmax soft labels on a
public auxiliary set ``D_g`` and uploads them; the server measures how
differently two clients label ``D_g`` with the KL divergence

    M_ij = KL(S_i || S_j) = 1/|D_g| sum_m sum_c S_i[m, c] log(S_i[m, c] / S_j[m, c]).

Clients with similar label distributions label ``D_g`` alike, so ``M``
feeds the homogeneous clustering (:mod:`fedjax_dd.cluster.sampling`).

Pretraining and labelling are each one batched program over the clients;
``M`` is one jitted einsum.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core.algorithm import Cohort
from fedjax_dd.core import keys
from fedjax_dd.core.clients import ClientMapper, client_stage
from fedjax_dd.core.local import LocalResult, LocalTraining, make_local_update
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import validate
from fedjax_dd.data.stacked import ClientData

PyTree = Any

DEFAULT_EPS = 1e-8
"""Soft labels are clamped to at least this before any logarithm."""


def pretrain_clients(training: LocalTraining, params: PyTree,
                     batch_stats: PyTree, data: ClientData,
                     num_steps: jax.Array, key: jax.Array) -> LocalResult:
  """Trains every client's local model from one common initialisation.

  Args:
    training: the clients' local training (HFLDD: plain SGD, lr 0.01, batch
      64). Its ``max_steps`` is replaced by the largest of ``num_steps`` (at
      least 1), known only here. Its ``augment`` applies; pretraining is
      round 0 of its schedule.
    params: the common initial parameters (broadcast).
    batch_stats: the common initial BatchNorm statistics.
    data: all clients' padded data ``x [N, N_max, H, W, Ch]``.
    num_steps: ``[N]`` local SGD steps per client (``E1``).
    key: PRNG key; client ``i`` uses ``fold_in(key, i)``.

  Returns:
    A :class:`LocalResult` stacked ``[N, ...]``.

  Raises:
    ValueError: before training, on ``data`` that is not a padded uint8
      client stack, or ``num_steps`` that is not ``[N]`` counts ``>= 0``.
  """
  validate.client_stack(data.x, data.y, data.num_examples, fetch=True)
  validate.step_counts("num_steps", num_steps, data.num_clients)
  num_steps = jnp.asarray(num_steps, jnp.int32)
  max_steps = max(int(jax.device_get(jnp.max(num_steps))), 1)
  training = dataclasses.replace(training, max_steps=max_steps)
  train = client_stage(make_local_update(training), training.mapper)
  n = data.num_clients
  ids = jnp.arange(n)
  cohort = Cohort(x=jnp.asarray(data.x), y=jnp.asarray(data.y),
                  num_examples=jnp.asarray(data.num_examples),
                  num_steps=num_steps, client_ids=ids)
  return train(params, batch_stats, (), cohort, keys.client_keys(key, ids))


def make_soft_labeler(task: Classifier, *, mapper: ClientMapper = ClientMapper(),
                      temperature: float = 1.0, aux_batch_size: int = 100):
  """Builds ``label(params [N], batch_stats [N], x_aux [M, H, W, Ch]) -> S``.

  ``S [N, M, K]`` softmax probabilities of every client's model on the
  broadcast ``D_g``, visited in batches of ``aux_batch_size`` so that peak
  activation memory is ``N * aux_batch_size`` images, not ``N * M``.

  Args:
    task: the classifier.
    mapper: client-axis backend.
    temperature: softmax temperature (1 in HFLDD).
    aux_batch_size: images of ``D_g`` per forward pass.

  Returns:
    The batched labelling function; it raises ``ValueError`` before any
    compute when ``x_aux`` is not ``[M, H, W, Ch]`` uint8 with ``M >= 1``.

  Raises:
    ValueError: ``temperature <= 0`` or ``aux_batch_size < 1``.
  """
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {temperature}.")
  if aux_batch_size < 1:
    raise ValueError(f"aux_batch_size must be >= 1, got {aux_batch_size}.")

  def one_client(params, batch_stats, x_batches):
    def one_batch(xb):
      logits, _ = task.apply(params, batch_stats, task.preprocess(xb),
                             train=False)
      return jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)

    probs = jax.lax.map(one_batch, x_batches)          # [M / b, b, K]
    return probs.reshape(-1, probs.shape[-1])

  mapped = mapper.map(one_client, in_axes=(0, 0, None))

  def label(params, batch_stats, x_aux):
    validate.images("x_aux", x_aux, rank=4, layout="[M, H, W, Ch]")
    if np.shape(x_aux)[0] == 0:
      raise ValueError("x_aux must hold at least one image [M >= 1, H, W, "
                       f"Ch], got shape {validate.shape_str(np.shape(x_aux))}.")
    x_aux = jnp.asarray(x_aux)
    m = x_aux.shape[0]
    b = min(aux_batch_size, m)
    pad = -m % b
    if pad:
      x_aux = jnp.concatenate(
          [x_aux, jnp.zeros((pad, *x_aux.shape[1:]), x_aux.dtype)])
    batches = x_aux.reshape(-1, b, *x_aux.shape[1:])
    return mapped(params, batch_stats, batches)[:, :m]

  return label


@jax.jit
def _pairwise_kl(s: jax.Array, eps: jax.Array) -> jax.Array:
  s = jnp.clip(s.astype(jnp.float32), eps, 1.0)
  log_s = jnp.log(s)
  m = s.shape[1]
  self_term = jnp.einsum("imc,imc->i", s, log_s) / m         # [N]
  cross = jnp.einsum("imc,jmc->ij", s, log_s) / m            # [N, N]
  kl = self_term[:, None] - cross
  # Rounding can make the diagonal a tiny non-zero; KL(S || S) is 0 exactly.
  kl = kl * (1.0 - jnp.eye(kl.shape[0], dtype=kl.dtype))
  return jnp.maximum(kl, 0.0)


def pairwise_kl(soft_labels: jax.Array, *, eps: float = DEFAULT_EPS) -> jax.Array:
  """HFLDD Eq. 4: ``M_ij = KL(S_i || S_j)`` averaged over the auxiliary set.

  Probabilities are clamped to ``[eps, 1]`` before the logarithm, so clients
  that give a class zero probability produce a large but finite divergence.

  Args:
    soft_labels: ``S [N, M, K]`` probabilities.
    eps: clamp floor.

  Returns:
    ``[N, N]`` float32, zero on the diagonal, non-negative.
  """
  s = jnp.asarray(soft_labels)
  if s.ndim != 3:
    raise ValueError(f"soft_labels must be [N, M, K], got shape {s.shape}.")
  return _pairwise_kl(s, jnp.asarray(eps, jnp.float32))


def collect_label_knowledge(training: LocalTraining, params: PyTree,
                            batch_stats: PyTree, data: ClientData,
                            x_aux: np.ndarray | jax.Array,
                            num_steps: jax.Array, key: jax.Array, *,
                            eps: float = DEFAULT_EPS,
                            aux_batch_size: int = 100
                            ) -> tuple[jax.Array, jax.Array, LocalResult]:
  """Pretrains every client, labels ``D_g`` and computes ``M`` (Eq. 4).

  Args:
    training: the clients' pretraining (:func:`pretrain_clients`); its task
      and mapper also label ``D_g``.
    params: common initial parameters.
    batch_stats: common initial BatchNorm statistics.
    data: all clients' data ``[N, N_max, ...]``.
    x_aux: ``D_g`` images ``[M, H, W, Ch]`` uint8, in the task's input shape.
    num_steps: ``[N]`` pretraining steps per client.
    key: PRNG key for pretraining.
    eps: clamp floor of :func:`pairwise_kl`.
    aux_batch_size: see :func:`make_soft_labeler`.

  Returns:
    ``(S [N, M, K], M [N, N], pretrain_result)``.

  Raises:
    ValueError: before any compute, as :func:`pretrain_clients` for
      ``data`` and ``num_steps``, or ``x_aux`` not ``[M, H, W, Ch]`` uint8
      with ``M >= 1``.
  """
  validate.images("x_aux", x_aux, rank=4, layout="[M, H, W, Ch]")
  if np.shape(x_aux)[0] == 0:
    raise ValueError("x_aux must hold at least one image [M >= 1, H, W, Ch], "
                     f"got shape {validate.shape_str(np.shape(x_aux))}.")
  result = pretrain_clients(training, params, batch_stats, data, num_steps,
                            key)
  labeler = make_soft_labeler(training.task, mapper=training.mapper,
                              aux_batch_size=aux_batch_size)
  s = labeler(result.params, result.batch_stats, jnp.asarray(x_aux))
  return s, pairwise_kl(s, eps=eps), result
