"""HFLDD: dataset-distillation-based hybrid federated learning.

Reference: Shi et al., "Dataset Distillation-based Hybrid Federated Learning
on Non-IID Data", 2024 (Alg. 2). The pipeline is a chain of separate stages:

1. label-knowledge collection and similarity ``M`` (Eq. 4):
   :mod:`fedjax_dd.distill.soft_labels`;
2. homogeneous KMeans clustering and ClusterSampling (Alg. 1):
   :mod:`fedjax_dd.cluster.sampling`;
3. IID dataset generation (this module): every non-head member sends KIP
   distilled data (:func:`distill_members`), its raw data (Fig. 5 ablation,
   :func:`raw_members`) or random raw samples (:func:`random_members`); each
   head's hybrid dataset is its raw data plus what it received
   (:func:`build_hybrid_data`);
4. model training: FedAvg between the server and the ``H`` heads only,
   weighted by ``|D_h|`` (:func:`head_training`).

Distilled labels may be centred or learned, so the heads train on target
vectors ``[N_max, K]``, which :meth:`fedjax_dd.core.task.Classifier.loss`
takes directly; the rest of the engine is used unchanged.

Communication follows Eq. 18 (:func:`eq18_bits`, :func:`setup_ledger`); the
rounds loop records the model exchange. Eq. 18 does not charge the labels of
the sent data; :func:`setup_ledger` can (``bits_per_sent_label``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import flax
import jax
import numpy as np
import optax

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.algorithm import FederatedAlgorithm
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import kip
from fedjax_dd.distill.kip import labels_to_targets
from fedjax_dd.distill import privacy

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
  # Host-side (scikit-learn); only its Topology type is used here.
  from fedjax_dd.cluster.sampling import Topology

PyTree = Any


# ----------------------------------------------------------------------------
# Stage 5: IID dataset generation.
# ----------------------------------------------------------------------------


@flax.struct.dataclass
class SentData:
  """What the members send to their heads, stacked over senders ``[M, ...]``.

  Attributes:
    x: ``[M, S, H, W, Ch]`` uint8 images (quantised for transmission).
    y: ``[M, S, K]`` float32 target vectors (simplex rows).
    mask: ``[M, S]`` bool, True on rows actually sent.
    senders: ``[M]`` client ids.
  """
  x: np.ndarray
  y: np.ndarray
  mask: np.ndarray
  senders: np.ndarray

  @property
  def counts(self) -> np.ndarray:
    """``[M]`` rows sent by each member (``|D~_i|``)."""
    return np.asarray(self.mask).sum(axis=1).astype(np.int64)


def _member_rows(data: ClientData, topology: Topology):
  members = topology.members
  return (members, np.asarray(data.x)[members], np.asarray(data.y)[members],
          np.asarray(data.num_examples)[members])


HFLDD_KIP = kip.KipOptions(stop_accuracy=None)
"""HFLDD's KIP (Sec. V-A): lr 0.004, at most 3,000 iterations, target batches
of 10, ``lambda = 1e-6`` and a fixed budget (no accuracy stop)."""


def distill_members(key: jax.Array, data: ClientData, topology: Topology, *,
                    kernel_fn: kip.KernelFn, mean: np.ndarray, std: np.ndarray,
                    num_classes: int, support_size: int = 400,
                    options: kip.KipOptions = HFLDD_KIP,
                    mapper: ClientMapper = ClientMapper(workload="kip"),
                    progress: Callable[[int, int], None] | None = None,
                    allow_raw_upload: bool = False,
                    segment_store: kip.SegmentStore | None = None
                    ) -> tuple[SentData, kip.KipResult]:
  """Every non-head member distills ``|D~_i|`` images with the batched KIP.

  Members holding fewer than ``support_size`` examples send their local
  count (KIP warns); the images are quantised to uint8 for transmission.

  Args:
    key: PRNG key; member ``j`` (in member order) uses ``fold_in(key, j)``.
    data: all clients' data ``[N, N_max, ...]``.
    topology: clusters and heads.
    kernel_fn: KIP kernel, e.g. ``fedjax_dd.kernels.native.fc_kernel()``.
    mean: per-channel mean on the ``[0, 1]`` scale.
    std: per-channel standard deviation.
    num_classes: ``N_c``.
    support_size: ``|D~_i|`` per member (HFLDD: 400).
    options: KIP's settings; :data:`HFLDD_KIP` by default (a fixed budget;
      with FedD3's ``stop_accuracy`` a one-class member never stops).
    mapper: client-axis backend.
    progress: optional KIP progress callback.
    allow_raw_upload: send, with a warning, quantised images byte-identical
      to a raw image of their member; False (default, as FedD3): refused.
    segment_store: optional :class:`fedjax_dd.distill.kip.SegmentStore`.

  Returns:
    ``(sent, kip_result)``; ``sent.y`` holds target distributions.

  Raises:
    fedjax_dd.distill.privacy.RawUploadError: an upload is a raw image and
      ``allow_raw_upload`` is False.
  """
  members, x, y, n = _member_rows(data, topology)
  if members.size == 0:
    raise ValueError("The topology has no members (every client is a head).")
  support = min(int(support_size), x.shape[1])
  res = kip.distill_clients(
      key, x, y, n, num_classes=num_classes, kernel_fn=kernel_fn, mean=mean,
      std=std, support_size=support, options=options, mapper=mapper,
      progress=progress, segment_store=segment_store)
  res = jax.device_get(res)
  sent = SentData(x=np.asarray(kip.quantize(res.x)),
                  y=labels_to_targets(res.y, centered=options.centered_labels),
                  mask=np.asarray(res.mask, bool), senders=members)
  # What is sent, not what was planned: the guard FedD3's uploads pass.
  mask = sent.mask
  owner = np.broadcast_to(members[:, None], mask.shape)[mask]
  host = jax.device_get(data)
  if not allow_raw_upload:
    privacy.check_no_raw_upload(
        sent.x[mask], owner, np.asarray(host.x),
        np.asarray(host.num_examples), what="HFLDD KIP",
        more_iterations="a higher kip.max_iterations")
  else:
    raw = privacy.identical_to_raw(sent.x[mask], owner, np.asarray(host.x),
                                   np.asarray(host.num_examples))
    if raw.any():
      _log.warning(
          "HFLDD: %d of %d KIP images sent are byte-identical to a raw image "
          "of their member (allow_raw_upload=True).", int(raw.sum()),
          raw.size)
  return sent, res


def raw_members(data: ClientData, topology: Topology, *, num_classes: int
                ) -> SentData:
  """The "w/o DD" ablation (Fig. 5): members send all their raw data."""
  members, x, y, n = _member_rows(data, topology)
  mask = np.arange(x.shape[1])[None, :] < n[:, None]
  targets = np.eye(num_classes, dtype=np.float32)[y] * mask[..., None]
  return SentData(x=x, y=targets, mask=mask, senders=members)


def random_members(data: ClientData, topology: Topology, *, num_classes: int,
                   sample_size: int, rng: np.random.Generator) -> SentData:
  """Control for the distillation: members send random raw samples.

  Each member sends ``min(sample_size, n_i)`` of its raw examples drawn
  without replacement: :func:`distill_members`'s upload budget, so only
  distillation differs.

  Args:
    data: all clients' data ``[N, N_max, ...]``.
    topology: clusters and heads.
    num_classes: ``N_c``.
    sample_size: ``|D~_i|`` per member.
    rng: chooses the samples (host side).

  Returns:
    ``SentData`` with ``x [M, S, H, W, Ch]`` uint8 and one-hot ``y
    [M, S, K]``, ``S = min(sample_size, N_max)``.
  """
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"rng must be a np.random.Generator, got {type(rng).__name__}.")
  if sample_size < 1:
    raise ValueError(f"sample_size must be >= 1, got {sample_size}.")
  members, x, y, n = _member_rows(data, topology)
  s = min(int(sample_size), x.shape[1])
  idx = np.zeros((members.size, s), np.int64)
  counts = np.minimum(n, s)
  for j in range(members.size):  # host-side, once per run
    idx[j, :counts[j]] = np.sort(rng.choice(int(n[j]), size=int(counts[j]),
                                            replace=False))
  mask = np.arange(s)[None, :] < counts[:, None]
  rows = np.arange(members.size)[:, None]
  sx = x[rows, idx] * mask.reshape(*mask.shape, *([1] * (x.ndim - 2))
                                   ).astype(x.dtype)
  sy = np.eye(num_classes, dtype=np.float32)[y[rows, idx]] * mask[..., None]
  return SentData(x=sx, y=sy, mask=mask, senders=members)


def sent_privacy(data: ClientData, sent: SentData) -> dict[str, Any]:
  """How close each member's upload is to its own raw images.

  :func:`fedjax_dd.distill.privacy.upload_privacy` over the rows actually
  sent (uint8).
  """
  mask = np.asarray(sent.mask, bool)
  owner = np.broadcast_to(np.asarray(sent.senders)[:, None], mask.shape)
  return privacy.upload_privacy(np.asarray(sent.x)[mask], owner[mask],
                                np.asarray(data.x),
                                np.asarray(data.num_examples))


def build_hybrid_data(data: ClientData, topology: Topology, sent: SentData, *,
                      num_classes: int) -> ClientData:
  """Each head's ``D_h``: its raw data plus all data its members sent.

  Args:
    data: all clients' data ``[N, N_max, ...]`` with integer labels.
    topology: clusters and heads.
    sent: the members' transmissions.
    num_classes: ``N_c``.

  Returns:
    ``ClientData`` over the heads: ``x [H, D_max, H, W, Ch]`` uint8,
    ``y [H, D_max, K]`` float32 target vectors (one-hot for raw rows) and
    ``num_examples [H] = |D_h|``, zero-padded.
  """
  x_all, y_all = np.asarray(data.x), np.asarray(data.y)
  n_all = np.asarray(data.num_examples)
  eye = np.eye(num_classes, dtype=np.float32)
  sender_row = {int(c): j for j, c in enumerate(np.asarray(sent.senders))}
  xs, ys = [], []
  for h, head in enumerate(topology.heads):
    parts_x = [x_all[head, :n_all[head]]]
    parts_y = [eye[y_all[head, :n_all[head]]]]
    for c in topology.cluster(h):
      if c == head:
        continue
      j = sender_row[int(c)]
      m = np.asarray(sent.mask[j], bool)
      parts_x.append(np.asarray(sent.x[j])[m])
      parts_y.append(np.asarray(sent.y[j], np.float32)[m])
    xs.append(np.concatenate(parts_x))
    ys.append(np.concatenate(parts_y))
  sizes = np.array([len(v) for v in xs], np.int32)
  d_max = int(sizes.max())
  x = np.zeros((len(xs), d_max, *x_all.shape[2:]), np.uint8)
  y = np.zeros((len(xs), d_max, num_classes), np.float32)
  for h, (xh, yh) in enumerate(zip(xs, ys)):
    x[h, :len(xh)] = xh
    y[h, :len(yh)] = yh
  return ClientData(x=x, y=y, num_examples=sizes)


# ----------------------------------------------------------------------------
# Stage 6: model training among the heads.
# ----------------------------------------------------------------------------


def head_training(training: LocalTraining, *,
                  server_optimizer: optax.GradientTransformation = optax.sgd(1.0)
                  ) -> FederatedAlgorithm:
  """FedAvg between the server and the heads, weighted by ``|D_h|``.

  Args:
    training: the heads' local training (``training.task``'s loss takes
      the heads' ``[B, K]`` targets; HFLDD: SGD, lr 0.01, batch 32;
      ``max_steps`` the largest head's ``E2`` epochs; ``mapper`` over the
      heads).
    server_optimizer: ``sgd(1.0)`` is plain averaging.

  Returns:
    A :class:`FederatedAlgorithm` for the rounds loop.
  """
  return fedavg(training, server_optimizer=server_optimizer)


# ----------------------------------------------------------------------------
# Communication (Eq. 18).
# ----------------------------------------------------------------------------


def eq18_bits(*, num_clients: int, aux_size: int, num_classes: int,
              distilled_samples: int, pixels_per_sample: int, num_heads: int,
              num_params: int, rounds: int,
              bits_per_param: int = ledger_lib.BITS_PER_PARAM,
              bits_per_soft_label: int = ledger_lib.BITS_PER_SOFT_LABEL,
              bits_per_pixel_channel: int = ledger_lib.BITS_PER_PIXEL_CHANNEL
              ) -> int:
  """HFLDD Eq. 18 in bits.

  ``N |D_g| N_c B1 + sum_i |D~_i| B2 + H |w| (2T - 1) B1`` with ``|D~_i|`` in
  pixel channels. ``B1`` is both ``bits_per_soft_label`` and
  ``bits_per_param``; ``B2`` is ``bits_per_pixel_channel``.
  """
  soft = num_clients * aux_size * num_classes * bits_per_soft_label
  data = distilled_samples * pixels_per_sample * bits_per_pixel_channel
  model = num_heads * num_params * (2 * rounds - 1) * bits_per_param if rounds else 0
  return int(soft + data + model)


def sent_label_bits(override: int = -1, *, learned_labels: bool) -> int:
  """Bits charged per label entry of the members' uploads.

  ``override >= 0`` is used as given (``0``: Eq. 18 to the letter); ``-1``
  counts what is transmitted: learned labels at
  :data:`~fedjax_dd.core.ledger.BITS_PER_SOFT_LABEL` bits, fixed labels 0.
  """
  if int(override) >= 0:
    return int(override)
  return ledger_lib.BITS_PER_SOFT_LABEL if learned_labels else 0


def setup_ledger(topology: Topology, sent_counts: np.ndarray, *, aux_size: int,
                 num_classes: int, pixels_per_sample: int,
                 bits_per_soft_label: int = ledger_lib.BITS_PER_SOFT_LABEL,
                 bits_per_pixel_channel: int = ledger_lib.BITS_PER_PIXEL_CHANNEL,
                 bits_per_sent_label: int = 0,
                 ledger: ledger_lib.Ledger | None = None) -> ledger_lib.Ledger:
  """Records the one-shot traffic before training, at round 0.

  * every client uploads ``|D_g| x N_c`` soft labels (tag ``soft_labels``);
  * every member sends its ``|D~_i|`` images to its head as peer traffic,
    ``bits_per_pixel_channel`` per pixel channel (tag ``distilled_data``).

  Eq. 18 does not charge the labels of the sent data; ``bits_per_sent_label``
  (default 0) charges each of the ``|D~_i| x N_c`` label entries (tag
  ``distilled_labels``): pass 32 for learned KIP labels
  (:func:`sent_label_bits`).

  Args:
    topology: clusters and heads (``N`` clients upload soft labels).
    sent_counts: ``[M]`` samples each member sent (``SentData.counts``).
    aux_size: ``|D_g|``.
    num_classes: ``N_c``.
    pixels_per_sample: ``H * W * Ch``.
    bits_per_soft_label: ``B1``.
    bits_per_pixel_channel: ``B2``.
    bits_per_sent_label: bits per sent label entry (see above).
    ledger: ledger to extend (new if None).

  Returns:
    The ledger with these entries added.
  """
  ledger = ledger if ledger is not None else ledger_lib.Ledger()
  ledger = ledger.record(
      0, kind="upload", bits=aux_size * num_classes * bits_per_soft_label,
      count=topology.num_clients, tag="soft_labels")
  for count in np.asarray(sent_counts):
    ledger = ledger.record(
        0, kind="peer", bits=int(count) * pixels_per_sample * bits_per_pixel_channel,
        tag="distilled_data")
    if bits_per_sent_label:
      ledger = ledger.record(
          0, kind="peer", bits=int(count) * num_classes * bits_per_sent_label,
          tag="distilled_labels")
  return ledger
