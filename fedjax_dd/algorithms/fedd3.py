"""FedD3: one-shot federated learning via decentralized dataset distillation.

Every client distills its local data (KIP on an infinite-width kernel, or a
Gaussian-mixture coreset), uploads the distilled set once, and the server
trains a model on the union. The multi-shot hybrid (paper App. F) instead runs
FedAvg where each client trains on its own data plus everyone else's distilled
data, received once in round 1.

Reference: Song et al., "Federated Learning via Decentralized Dataset
Distillation in Resource-Constrained Edge Environments", IJCNN 2023 (FedD3).

Stages, each a function over explicit arrays:

* a *distiller* ``(key, ClientData) -> DistilledSet`` (:func:`kip_distiller`
  runs all clients in one batched program; :func:`gmm_distiller` is the
  host-side scikit-learn coreset);
* :func:`upload_bits`, the single upload the ledger counts;
* :func:`server_dataset`, the union as one-client :class:`ClientData` on which
  the server trains with the engine's centralized algorithm;
* :func:`hybrid_client_data` for the multi-shot variant.
"""

from __future__ import annotations

from typing import Callable

import flax
import jax
import numpy as np

from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import gmm as gmm_lib
from fedjax_dd.distill import kip as kip_lib


@flax.struct.dataclass
class DistilledSet:
  """What the server receives from all clients (host arrays).

  Attributes:
    x: ``[M, H, W, Ch]`` uint8 images, as transmitted.
    y: ``[M]`` int32 hard labels.
    y_soft: ``[M, K]`` float32 support labels (learned labels when KIP learns
      them, else one-hot).
    owner: ``[M]`` index of the client that sent each image.
    learned_labels: whether ``y_soft`` was optimised (then it is transmitted).
    x_float: ``[M, H, W, Ch]`` float32 pixels before quantisation (KIP only),
      to measure what quantisation costs.
  """
  x: np.ndarray
  y: np.ndarray
  y_soft: np.ndarray
  owner: np.ndarray
  learned_labels: bool = flax.struct.field(pytree_node=False, default=False)
  x_float: np.ndarray | None = None

  @property
  def size(self) -> int:
    return int(self.x.shape[0])


Distiller = Callable[[jax.Array, ClientData], DistilledSet]


def kip_distiller(kernel_fn, *, num_classes: int, mean, std,
                  images_per_class: int, lr: float = 0.004,
                  max_iterations: int = 3000, target_batch_size: int = 10,
                  reg: float = 1e-6, learn_labels: bool = False,
                  centered_labels: bool = False, stop_accuracy: float = 0.999,
                  min_iterations: int = 0, segment_iterations: int = 100,
                  mapper: ClientMapper = ClientMapper(workload="kip"),
                  allow_raw_upload: bool = False,
                  progress: Callable[[int, int], None] | None = None
                  ) -> Distiller:
  """KIP on every client at once (FedD3 Sec. 3.2, Eq. 4).

  See :func:`fedjax_dd.distill.kip.distill_clients` for the arguments. The
  privacy guard (paper App. G) runs first on the host.
  """

  def distill(key, data: ClientData) -> DistilledSet:
    y, n = np.asarray(data.y), np.asarray(data.num_examples)
    kip_lib.check_privacy(y, n, num_classes, allow_raw_upload=allow_raw_upload)
    res = kip_lib.distill_clients(
        key, data.x, data.y, data.num_examples, num_classes=num_classes,
        kernel_fn=kernel_fn, mean=mean, std=std,
        images_per_class=images_per_class, lr=lr,
        max_iterations=max_iterations, target_batch_size=target_batch_size,
        reg=reg, learn_labels=learn_labels, centered_labels=centered_labels,
        stop_accuracy=stop_accuracy, min_iterations=min_iterations,
        segment_iterations=segment_iterations, mapper=mapper,
        progress=progress)
    x_float, y_soft, owner = kip_lib.flatten_support(res, quantized=False)
    x = np.asarray(kip_lib.quantize(x_float))
    return DistilledSet(x=x, y=np.argmax(y_soft, -1).astype(np.int32),
                        y_soft=y_soft.astype(np.float32), owner=owner,
                        learned_labels=learn_labels, x_float=x_float)

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


def upload_bits(distilled: DistilledSet, *,
                bits_per_pixel_channel: int = ledger_lib.BITS_PER_PIXEL_CHANNEL,
                bits_per_label: int = 8) -> int:
  """Bits of the one-shot upload.

  Images count ``bits_per_pixel_channel`` per pixel channel (uint8). Hard
  labels count ``bits_per_label`` each (a class index fits a byte); learned
  labels are soft vectors at 32 bits per entry.
  """
  image_bits = int(np.prod(distilled.x.shape)) * bits_per_pixel_channel
  if distilled.learned_labels:
    label_bits = int(np.prod(distilled.y_soft.shape)) * ledger_lib.BITS_PER_SOFT_LABEL
  else:
    label_bits = distilled.size * bits_per_label
  return image_bits + label_bits


def server_dataset(distilled: DistilledSet) -> ClientData:
  """The union of distilled sets as a one-client stack for server training."""
  return ClientData(x=distilled.x[None], y=distilled.y[None],
                    num_examples=np.asarray([distilled.size], np.int32))


def hybrid_client_data(data: ClientData, distilled: DistilledSet) -> ClientData:
  """Multi-shot hybrid FedD3 (App. F): local data plus others' distilled data.

  Client ``i`` keeps its ``n_i`` local examples and appends every distilled
  example it did not send itself, so its count is ``n_i + M − M_i``.
  """
  host = jax.device_get(data)
  x, y, n = np.asarray(host.x), np.asarray(host.y), np.asarray(host.num_examples)
  c = x.shape[0]
  own = np.bincount(distilled.owner, minlength=c)
  n_new = n + distilled.size - own
  n_max = int(n_new.max())
  xo = np.zeros((c, n_max, *x.shape[2:]), x.dtype)
  yo = np.zeros((c, n_max), y.dtype)
  for i in range(c):  # host-side data assembly, once per run
    others = distilled.owner != i
    xo[i, :n[i]], yo[i, :n[i]] = x[i, :n[i]], y[i, :n[i]]
    xo[i, n[i]:n_new[i]] = distilled.x[others]
    yo[i, n[i]:n_new[i]] = distilled.y[others]
  return ClientData(x=xo, y=yo, num_examples=n_new.astype(np.int32))


def hybrid_download_bits(distilled: DistilledSet, num_clients: int, **kwargs) -> int:
  """Round-1 download of the hybrid: each client receives the others' sets."""
  # Every image (with its label) has the same size, so the upload divides.
  per_image = upload_bits(distilled, **kwargs) // max(distilled.size, 1)
  own = np.bincount(distilled.owner, minlength=num_clients)
  return int(per_image * (num_clients * distilled.size - own.sum()))
