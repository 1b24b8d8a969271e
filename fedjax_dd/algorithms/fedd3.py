"""FedD3: one-shot federated learning via decentralized dataset distillation.

Every client distills its local data (KIP on an infinite-width kernel, or a
Gaussian-mixture coreset), uploads the distilled set once, and the server
trains a model on the union. The multi-shot hybrid (paper App. F) instead
runs FedAvg where each client trains on its own data plus everyone else's
distilled data, received once in round 1.

Reference: Song et al., "Federated Learning via Decentralized Dataset
Distillation in Resource-Constrained Edge Environments", IJCNN 2023 (FedD3).

A *distiller* ``(key, ClientData) -> DistilledSet`` (:func:`kip_distiller`,
:func:`gmm_distiller`, or the random-real control :func:`random_distiller`)
feeds :func:`fedd3`, a :class:`~fedjax_dd.core.algorithm.ServerDistillation`;
:func:`client_upload_bits` counts the single upload and
:func:`hybrid_client_data` builds the multi-shot variant's data.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.algorithms.centralized import centralized
from fedjax_dd.core import keys
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.algorithm import Cohort, ServerDistillation, ServerState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.core.task import Classifier
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import gmm as gmm_lib
from fedjax_dd.distill import kip as kip_lib
from fedjax_dd.distill import privacy as privacy_lib


@flax.struct.dataclass
class DistilledSet:
  """What the server receives from all clients (host arrays).

  Attributes:
    x: ``[M, H, W, Ch]`` images as transmitted: uint8, or unquantised
      float32 pixels for a float upload.
    y: ``[M]`` int32 hard labels (argmax of ``y_soft``).
    y_soft: ``[M, K]`` float32 support labels in KIP's label space (learned
      or one-hot); :meth:`targets` maps them to distributions.
    owner: ``[M]`` index of the client that sent each image.
    learned_labels: whether ``y_soft`` was optimised (then it is transmitted
      and the server trains on it).
    centered_labels: whether ``y_soft`` is centred (one-hot minus ``1/K``).
    x_float: ``[M, H, W, Ch]`` float32 pixels before quantisation (KIP only).
    iterations: ``[C]`` KIP iterations each client ran (KIP only).
    converged: ``[C]`` whether each client met the early stop (KIP only).
    first_loss: ``[C]`` KIP loss at each client's first iteration (KIP only).
    last_loss: ``[C]`` KIP loss at each client's last iteration (KIP only).
  """
  x: np.ndarray
  y: np.ndarray
  y_soft: np.ndarray
  owner: np.ndarray
  learned_labels: bool = flax.struct.field(pytree_node=False, default=False)
  centered_labels: bool = flax.struct.field(pytree_node=False, default=False)
  x_float: np.ndarray | None = None
  iterations: np.ndarray | None = None
  converged: np.ndarray | None = None
  first_loss: np.ndarray | None = None
  last_loss: np.ndarray | None = None

  @property
  def size(self) -> int:
    return int(self.x.shape[0])

  def targets(self) -> np.ndarray:
    """``[M, K]`` float32 training targets on the simplex.

    Learned labels (FedD3 Sec. 3.2) are mapped by
    :func:`~fedjax_dd.distill.kip.labels_to_targets`; fixed labels give
    their one-hot rows.
    """
    return kip_lib.labels_to_targets(self.y_soft, centered=self.centered_labels)

  def train_labels(self) -> np.ndarray:
    """Server targets: ``targets() [M, K]`` if learned, else ``y [M]``."""
    return self.targets() if self.learned_labels else self.y

  def arrays(self) -> dict[str, np.ndarray]:
    """The array fields as ``{name: host array}`` (absent ones left out),
    e.g. for :class:`fedjax_dd.core.stage_cache.StageCache`."""
    return {f: np.asarray(getattr(self, f)) for f in _ARRAY_FIELDS
            if getattr(self, f) is not None}

  @classmethod
  def from_arrays(cls, arrays, *, learned_labels: bool,
                  centered_labels: bool) -> DistilledSet:
    """Inverse of :meth:`arrays` (fields it lacks are None)."""
    return cls(**{f: arrays.get(f) for f in _ARRAY_FIELDS},
               learned_labels=bool(learned_labels),
               centered_labels=bool(centered_labels))


_ARRAY_FIELDS = ("x", "y", "y_soft", "owner", "x_float", "iterations",
                 "converged", "first_loss", "last_loss")


@flax.struct.dataclass
class Uploads:
  """Every client's one-shot message, padded: FedD3's client-stage output.

  Attributes:
    x: ``[C, S, H, W, Ch]`` uint8 images (float32 pixels for a float
      upload); client ``i`` sent ``x[i, :count[i]]``, ``S = K ·
      images_per_class``; the rest is padding.
    y_soft: ``[C, S, K]`` float32 labels in KIP's label space, as in
      :class:`DistilledSet`.
    count: ``[C]`` int32 images each client sent.
    learned_labels: whether ``y_soft`` was learned (and transmitted).
    centered_labels: whether ``y_soft`` is centred (one-hot minus ``1/K``).
  """
  x: jax.Array
  y_soft: jax.Array
  count: jax.Array
  learned_labels: bool = flax.struct.field(pytree_node=False, default=False)
  centered_labels: bool = flax.struct.field(pytree_node=False, default=False)

  def distilled(self) -> DistilledSet:
    """The union as a host :class:`DistilledSet` (client order; no KIP
    statistics)."""
    x, y_soft, count = (np.asarray(a) for a in jax.device_get(
        (self.x, self.y_soft, self.count)))
    mask = np.arange(x.shape[1])[None, :] < count[:, None]
    owner = np.broadcast_to(np.arange(x.shape[0])[:, None], mask.shape)
    ys = y_soft[mask]
    return DistilledSet(x=x[mask], y=np.argmax(ys, -1).astype(np.int32),
                        y_soft=ys, owner=owner[mask].astype(np.int32),
                        learned_labels=self.learned_labels,
                        centered_labels=self.centered_labels)


def pad_uploads(distilled: DistilledSet, num_clients: int,
                size: int) -> Uploads:
  """``distilled`` as :class:`Uploads` ``[num_clients, size, ...]``.

  Raises:
    ValueError: a client sent more than ``size`` images, or ``owner`` names
      a client outside ``[0, num_clients)``.
  """
  owner = np.asarray(distilled.owner, np.int64)
  if owner.size and (owner.min() < 0 or owner.max() >= num_clients):
    raise ValueError(f"distilled.owner must lie in [0, {num_clients}), got "
                     f"[{owner.min()}, {owner.max()}].")
  count = np.bincount(owner, minlength=num_clients)
  if count.size and count.max() > size:
    raise ValueError(f"Client {int(count.argmax())} sent {int(count.max())} "
                     f"images, more than the padded size {size}.")
  # Row of each image inside its client's block.
  order = np.argsort(owner, kind="stable")
  starts = np.concatenate([[0], np.cumsum(count)[:-1]])
  slot = np.empty_like(owner)
  slot[order] = np.arange(owner.size) - starts[owner[order]]
  x = np.zeros((num_clients, size, *distilled.x.shape[1:]),
               distilled.x.dtype)
  k = distilled.y_soft.shape[-1]
  y = np.zeros((num_clients, size, k), np.float32)
  x[owner, slot] = distilled.x
  y[owner, slot] = distilled.y_soft
  return Uploads(x=x, y_soft=y, count=count.astype(np.int32),
                 learned_labels=distilled.learned_labels,
                 centered_labels=distilled.centered_labels)


@flax.struct.dataclass
class ServerTrainState:
  """The FedD3 server's state: the model trained on the union.

  Attributes:
    server: the model and its optimiser state.
    key: the epochs' key; epoch ``e`` shuffles with ``fold_in(key, e)``.
    epoch: epochs done.
    index: ``[M]`` int32 rows of the flattened ``[C · S]`` uploads that
      hold an image (static, so one compiled epoch serves the run).
    y: ``[M]`` int32 hard labels, or ``[M, K]`` float32 targets when the
      labels were learned (:meth:`DistilledSet.train_labels`).
  """
  server: ServerState
  key: jax.Array
  epoch: jax.Array
  index: jax.Array
  y: jax.Array


def fedd3(distiller: Distiller, task: Classifier,
          optimizer: optax.GradientTransformation, *,
          num_classes: int, images_per_class: int, batch_size: int,
          local_epochs: float = 1.0, local_steps: int | None = None,
          learned_labels: bool = False, centered_labels: bool = False,
          float_upload: bool = False,
          mapper: ClientMapper = ClientMapper()) -> ServerDistillation:
  """FedD3 (Song et al., Alg. 1) as a server-side method.

  Every client distils with ``distiller`` and sends its set once
  (:class:`Uploads`); the server trains ``task`` on the union, ``local_epochs``
  passes (or ``local_steps`` steps) per ``epoch`` call.

  Args:
    distiller: ``(key, ClientData) -> DistilledSet`` (:func:`kip_distiller`,
      :func:`gmm_distiller`, :func:`random_distiller`).
    task: the server model.
    optimizer: the server's optimiser.
    num_classes: ``K``.
    images_per_class: the distiller's images per class per client
      (``S = K · images_per_class``).
    batch_size: server batch size.
    local_epochs: passes over the union per ``epoch`` call.
    local_steps: fixed steps per ``epoch`` call instead (overrides
      ``local_epochs``).
    learned_labels, centered_labels: how the distiller's labels are sent
      (:class:`DistilledSet`); they fix the upload's checkpoint layout.
    float_upload: the images arrive as unquantised float32 pixels (FedD3's
      code), not uint8; ``task`` must take them (:func:`float_pixel_task`).
    mapper: the engine's compile settings.

  Returns:
    A :class:`~fedjax_dd.core.algorithm.ServerDistillation` whose
    ``client_stage`` returns :class:`Uploads`.

  Raises:
    ValueError: ``num_classes``, ``images_per_class`` or ``batch_size`` is
      below 1.
  """
  for name, v in (("num_classes", num_classes),
                  ("images_per_class", images_per_class),
                  ("batch_size", batch_size)):
    if int(v) < 1:
      raise ValueError(f"{name} must be >= 1, got {v}.")
  size = num_classes * images_per_class

  def client_stage(starts, data: ClientData, key) -> Uploads:
    del starts  # FedD3's clients send data, not models.
    return jax.device_put(pad_uploads(distiller(key, data),
                                      int(data.x.shape[0]), size))

  def upload_template(starts, group_sizes, data: ClientData) -> Uploads:
    del starts, group_sizes
    c, shape = int(data.x.shape[0]), tuple(data.x.shape[2:])
    spec = jax.ShapeDtypeStruct
    return Uploads(x=spec((c, size, *shape),
                          jnp.float32 if float_upload else jnp.uint8),
                   y_soft=spec((c, size, num_classes), jnp.float32),
                   count=spec((c,), jnp.int32),
                   learned_labels=learned_labels,
                   centered_labels=centered_labels)

  def upload_bits(uploads: Uploads) -> tuple[str, np.ndarray]:
    distilled = uploads.distilled()
    return "distilled_data", client_upload_bits(distilled,
                                                int(uploads.x.shape[0]))

  def setup(uploads: Uploads, key) -> dict[str, jax.Array]:
    # Found once on the host, so the union's size M is a static shape.
    del key
    count = np.asarray(jax.device_get(uploads.count))
    s = int(uploads.x.shape[1])
    index = np.concatenate([i * s + np.arange(n) for i, n in enumerate(count)]
                           + [np.zeros(0, np.int64)]).astype(np.int32)
    return {"index": jnp.asarray(index),
            "y": jnp.asarray(uploads.distilled().train_labels())}

  def init(key, setup_out, uploads, params, batch_stats) -> ServerTrainState:
    del uploads
    return ServerTrainState(
        server=ServerState(params, batch_stats, optimizer.init(params)),
        key=key, epoch=jnp.zeros((), jnp.int32),
        index=jnp.asarray(setup_out["index"], jnp.int32),
        y=jnp.asarray(setup_out["y"]))

  @functools.lru_cache(maxsize=None)
  def trainer(m: int):
    # One centralized program per union size (one per run).
    steps = (int(local_steps) if local_steps is not None
             else math.ceil(math.ceil(m / batch_size) * local_epochs))
    return centralized(LocalTraining(
        task, optimizer, batch_size=batch_size, max_steps=max(steps, 1),
        mapper=mapper)), steps

  def epoch(state: ServerTrainState, uploads: Uploads):
    m = int(state.index.shape[0])
    if m == 0:
      raise ValueError("No client sent any image: the server has nothing "
                       "to train on.")
    algorithm, steps = trainer(m)
    flat = uploads.x.reshape(-1, *uploads.x.shape[2:])
    cohort = Cohort(x=flat[state.index][None], y=state.y[None],
                    num_examples=jnp.asarray([m], jnp.int32),
                    num_steps=jnp.asarray([steps], jnp.int32),
                    client_ids=jnp.zeros((1,), jnp.int32))
    server, _, metrics = algorithm.apply(
        state.server, {}, cohort, jax.random.fold_in(state.key, state.epoch))
    return state.replace(server=server, epoch=state.epoch + 1), metrics

  return ServerDistillation(
      client_stage=client_stage, setup=setup, init=init, epoch=epoch,
      model=lambda state: (state.server.params, state.server.batch_stats),
      upload_template=upload_template, upload_bits=upload_bits)


Distiller = Callable[[jax.Array, ClientData], DistilledSet]


def float_pixel_task(task: Classifier, mean, std) -> Classifier:
  """``task`` reading float32 pixels: ``(x / 255 - mean) / std``.

  The server's model for a float upload. ``mean`` and ``std`` are the
  channel statistics of ``task``'s own preprocessing, so the same
  parameters score uint8 test images through ``task``.

  Args:
    task: the server model (its preprocessing takes uint8).
    mean: ``[Ch]`` channel mean on the ``[0, 1]`` scale.
    std: ``[Ch]`` channel std.
  """
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)

  def preprocess(x):
    return (jnp.asarray(x, jnp.float32) / 255.0 - mean) / std

  return dataclasses.replace(task, preprocess=preprocess)


def kip_distiller(kernel_fn, *, num_classes: int, mean, std,
                  images_per_class: int,
                  options: kip_lib.KipOptions = kip_lib.KipOptions(),
                  mapper: ClientMapper = ClientMapper(workload="kip"),
                  allow_raw_upload: bool = False,
                  float_upload: bool = False,
                  progress: Callable[[int, int], None] | None = None,
                  segment_store: kip_lib.SegmentStore | None = None
                  ) -> Distiller:
  """KIP on every client at once (FedD3 Sec. 3.2, Eq. 4).

  See :func:`fedjax_dd.distill.kip.distill_clients` for the arguments
  (``options.stop_accuracy=None``: every client runs
  ``options.max_iterations``). The privacy guard (paper App. G) refuses,
  unless ``allow_raw_upload``, a client class with at most
  ``images_per_class`` examples (it would be uploaded raw) and, after
  distillation, any quantised image byte-identical to a raw image of its
  sender (:func:`fedjax_dd.distill.privacy.check_no_raw_upload`). With
  ``float_upload`` the support is sent as unquantised float32 pixels
  (FedD3's code); the guard then checks its rounding. ``segment_store``
  keeps KIP's state between segments
  (:class:`fedjax_dd.distill.kip.SegmentStore`).
  """

  def distill(key, data: ClientData) -> DistilledSet:
    # distill_clients runs the privacy guard on the host before compute.
    res = kip_lib.distill_clients(
        key, data.x, data.y, data.num_examples, num_classes=num_classes,
        kernel_fn=kernel_fn, mean=mean, std=std,
        images_per_class=images_per_class, options=options, mapper=mapper,
        allow_raw_upload=allow_raw_upload, progress=progress,
        segment_store=segment_store)
    x_float, y_soft, owner = kip_lib.flatten_support(res, quantized=False)
    x = np.asarray(kip_lib.quantize(x_float))
    if not allow_raw_upload:
      # What is sent, not what was planned: an early-stopped KIP can
      # quantise an image back to its raw bytes (App. C's rule, App. G).
      host = jax.device_get(data)
      privacy_lib.check_no_raw_upload(x, owner, np.asarray(host.x),
                                      np.asarray(host.num_examples))
    if float_upload:
      x = np.asarray(x_float, np.float32)
    res = jax.device_get(res)
    return DistilledSet(x=x, y=np.argmax(y_soft, -1).astype(np.int32),
                        y_soft=y_soft.astype(np.float32), owner=owner,
                        learned_labels=options.learn_labels,
                        centered_labels=options.centered_labels,
                        x_float=x_float,
                        iterations=np.asarray(res.iterations, np.int32),
                        converged=np.asarray(res.converged, bool),
                        first_loss=np.asarray(res.first_loss, np.float32),
                        last_loss=np.asarray(res.loss, np.float32))

  return distill


def gmm_distiller(*, num_classes: int, images_per_class: int,
                  covariance_type: str = "diag", max_iter: int = 100,
                  allow_raw_upload: bool = False) -> Distiller:
  """The GMM coreset of FedD3 Sec. 3.1 (host side, scikit-learn).

  The JAX key seeds the NumPy generator, so runs are reproducible.
  """

  def distill(key, data: ClientData) -> DistilledSet:
    host = jax.device_get(data)
    seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
    xs, ys, counts = gmm_lib.gmm_coreset_clients(
        np.asarray(host.x), np.asarray(host.y), np.asarray(host.num_examples),
        images_per_class=images_per_class, rng=np.random.default_rng(seed),
        covariance_type=covariance_type, max_iter=max_iter,
        allow_raw_upload=allow_raw_upload)
    mask = np.arange(xs.shape[1])[None, :] < counts[:, None]
    owner = np.broadcast_to(np.arange(xs.shape[0])[:, None], mask.shape)
    y = ys[mask].astype(np.int32)
    return DistilledSet(x=xs[mask], y=y,
                        y_soft=np.eye(num_classes, dtype=np.float32)[y],
                        owner=owner[mask], learned_labels=False)

  return distill


def random_distiller(*, num_classes: int, images_per_class: int
                     ) -> Distiller:
  """Random real images at KIP's upload budget: the distillation control.

  Each client sends, for every class it holds, ``min(images_per_class,
  n_class)`` of its own images of that class drawn without replacement, as
  uint8 with hard labels, so only distillation differs from
  :func:`kip_distiller`. The privacy guard (App. G) does not apply. The NumPy
  generator is seeded by :func:`fedjax_dd.core.keys.numpy_from_key`; images
  come out client by client, classes in increasing order, as KIP's.
  """

  def distill(key, data: ClientData) -> DistilledSet:
    host = jax.device_get(data)
    x, y = np.asarray(host.x), np.asarray(host.y)
    n = np.asarray(host.num_examples)
    rng = keys.numpy_from_key(key)
    c, n_max = y.shape
    valid = np.arange(n_max)[None, :] < n[:, None]
    u = rng.random((c, n_max))
    picks, masks = [], []
    for k in range(num_classes):  # a loop over classes; clients vectorised
      score = np.where(valid & (y == k), u, np.inf)
      order = np.argsort(score, axis=1, kind="stable")[:, :images_per_class]
      picks.append(order)
      masks.append(np.isfinite(np.take_along_axis(score, order, axis=1)))
    idx = np.stack(picks, 1).reshape(c, -1)       # [C, K * ipc]
    mask = np.stack(masks, 1).reshape(c, -1)      # [C, K * ipc]
    owner = np.broadcast_to(np.arange(c)[:, None], mask.shape)[mask]
    chosen = idx[mask]
    labels = y[owner, chosen].astype(np.int32)
    return DistilledSet(x=x[owner, chosen], y=labels,
                        y_soft=np.eye(num_classes, dtype=np.float32)[labels],
                        owner=owner.astype(np.int32), learned_labels=False)

  return distill


def client_upload_bits(
    distilled: DistilledSet, num_clients: int, *,
    bits_per_pixel_channel: int | None = None,
    bits_per_hard_label: int = ledger_lib.BITS_PER_HARD_LABEL,
    bits_per_soft_label: int = ledger_lib.BITS_PER_SOFT_LABEL) -> np.ndarray:
  """``[C]`` bits of each client's one-shot message (0: sent nothing).

  An image counts ``bits_per_pixel_channel`` per pixel channel (None: 8 for
  uint8, 32 for float32 pixels) plus its label: ``bits_per_hard_label``, or
  ``K · bits_per_soft_label`` for a learned label.
  """
  if bits_per_pixel_channel is None:
    bits_per_pixel_channel = (
        8 * distilled.x.dtype.itemsize
        if np.issubdtype(distilled.x.dtype, np.floating)
        else ledger_lib.BITS_PER_PIXEL_CHANNEL)
  image_bits = int(np.prod(distilled.x.shape[1:])) * bits_per_pixel_channel
  if distilled.learned_labels:
    label_bits = int(distilled.y_soft.shape[-1]) * bits_per_soft_label
  else:
    label_bits = bits_per_hard_label
  images = np.bincount(np.asarray(distilled.owner, np.int64),
                       minlength=num_clients)
  return images.astype(np.int64) * (image_bits + label_bits)


def upload_bits(distilled: DistilledSet, **widths) -> int:
  """Bits of the whole one-shot upload: :func:`client_upload_bits` summed
  (``widths``: its bit widths)."""
  num_clients = int(np.max(distilled.owner, initial=-1)) + 1
  return int(client_upload_bits(distilled, num_clients, **widths).sum())


def hybrid_client_data(data: ClientData, distilled: DistilledSet) -> ClientData:
  """Multi-shot hybrid FedD3 (App. F): local data plus others' distilled data.

  Client ``i`` keeps its ``n_i`` local examples and appends every distilled
  example it did not send itself, so its count is ``n_i + M − M_i``. With
  learned labels ``y`` becomes ``[C, N_max, K]`` float32: one-hot rows for
  the local data, the received soft targets for the distilled rows.
  """
  host = jax.device_get(data)
  x, y, n = np.asarray(host.x), np.asarray(host.y), np.asarray(host.num_examples)
  c = x.shape[0]
  own = np.bincount(distilled.owner, minlength=c)
  n_new = n + distilled.size - own
  n_max = int(n_new.max())
  received = distilled.train_labels()
  soft = distilled.learned_labels
  if soft:
    k = received.shape[-1]
    local_y = np.eye(k, dtype=np.float32)[y]  # [C, N_max, K]
    yo = np.zeros((c, n_max, k), np.float32)
  else:
    local_y = y
    yo = np.zeros((c, n_max), y.dtype)
  xo = np.zeros((c, n_max, *x.shape[2:]), x.dtype)
  for i in range(c):  # host-side data assembly, once per run
    others = distilled.owner != i
    xo[i, :n[i]], yo[i, :n[i]] = x[i, :n[i]], local_y[i, :n[i]]
    xo[i, n[i]:n_new[i]] = distilled.x[others]
    yo[i, n[i]:n_new[i]] = received[others]
  return ClientData(x=xo, y=yo, num_examples=n_new.astype(np.int32))


def hybrid_client_download_bits(distilled: DistilledSet, num_clients: int,
                                **widths) -> np.ndarray:
  """``[C]`` hybrid round-1 download: client ``i`` receives ``M − M_i`` images.

  Every image (with its label) has the size it had on upload
  (:func:`client_upload_bits`; ``widths`` are its bit widths).
  """
  per_client = client_upload_bits(distilled, num_clients, **widths)
  own = np.bincount(distilled.owner, minlength=num_clients)
  per_image = int(per_client.sum()) // max(distilled.size, 1)
  return (distilled.size - own).astype(np.int64) * per_image


def hybrid_download_bits(distilled: DistilledSet, num_clients: int, **widths) -> int:
  """Round-1 download of the hybrid, summed over clients."""
  return int(hybrid_client_download_bits(distilled, num_clients, **widths).sum())


def hybrid_ledger(distilled: DistilledSet, num_clients: int,
                  **widths) -> ledger_lib.Ledger:
  """The hybrid's round-1 traffic before its FedAvg rounds (App. F).

  Each client uploads its distilled set once (one message per client, so
  the ledger's GCE sees each) and receives everyone else's; ``widths`` are
  :func:`client_upload_bits`'s bit widths.
  """
  return ledger_lib.Ledger().record_messages(
      1, kind="upload", tag="distilled_data",
      bits=client_upload_bits(distilled, num_clients, **widths)
  ).record_messages(
      1, kind="download", tag="distilled_data",
      bits=hybrid_client_download_bits(distilled, num_clients, **widths))
