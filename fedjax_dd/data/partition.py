"""Splitting a train set across federated clients (host-side NumPy).

Every partitioner takes the train labels ``[N]`` and an explicit
``np.random.Generator`` (separate from any JAX model key) and returns one
sorted, non-empty int64 index array per client. Invalid requests raise
``ValueError`` before any random draw (an empty client only afterwards); a
wrong ``rng`` type raises ``TypeError``. Classes are the distinct labels
present, indexed (``fedd3``) by their rank in sorted order.

Schemes:

* :func:`iid`: uniform shuffle, sizes differ by at most one.
* :func:`pathological`: each client holds ``C`` classes (balanced, random
  draw, or FedD3 assignment).
* :func:`dirichlet`: per-class proportions over clients drawn from
  ``Dir(alpha)`` (Hsu et al., 2019), with a minimum client size.
* :func:`dirichlet_client`: per-client class priors drawn from
  ``Dir(alpha)`` and equal client sizes (FedFTG's split, used by DisUE).
* :func:`disjoint_classes`: FedHydra's "2c/c": no class is shared.
* :func:`quantity_skew`: IID labels, lognormal client sizes.
"""

from __future__ import annotations

import numpy as np

_STYLES = ("balanced", "hfldd", "fedd3")


def _check_rng(rng) -> None:
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        "rng must be a np.random.Generator (e.g. np.random.default_rng(seed)),"
        f" got {type(rng).__name__}. Partitions use their own seed, separate "
        "from the JAX model key.")


def _check_common(labels, num_clients: int, rng) -> np.ndarray:
  """Checks the arguments shared by all partitioners; returns int64 labels."""
  _check_rng(rng)
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must have shape [N], got {labels.shape}.")
  if labels.size == 0:
    raise ValueError("labels is empty.")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
  if labels.min() < 0:
    raise ValueError(f"labels must be non-negative, got min {labels.min()}.")
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f"num_clients must be a positive int, got {num_clients}.")
  if num_clients > labels.size:
    raise ValueError(
        f"num_clients={num_clients} exceeds the {labels.size} samples; every "
        "client needs at least one.")
  return labels.astype(np.int64)


def _finish(parts: list[list[np.ndarray]], scheme: str) -> list[np.ndarray]:
  """Concatenates and sorts each client's pieces; rejects empty clients."""
  out = [np.sort(np.concatenate(p)).astype(np.int64) if p
         else np.zeros(0, np.int64) for p in parts]
  empty = [k for k, p in enumerate(out) if p.size == 0]
  if empty:
    raise ValueError(
        f"{scheme}: clients {empty[:10]} received no samples (some classes "
        "have fewer samples than clients holding them); use fewer clients.")
  return out


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
  """Integer counts proportional to ``weights`` that sum exactly to ``total``.

  Each count is ``floor(total * w)`` or one more; the leftover units go to the
  largest fractional parts (ties to the lower index).
  """
  exact = total * (weights / weights.sum())
  counts = np.floor(exact).astype(np.int64)
  short = total - int(counts.sum())
  order = np.argsort(-(exact - counts), kind="stable")
  counts[order[:short]] += 1
  return counts


def iid(labels, num_clients: int, rng: np.random.Generator
        ) -> list[np.ndarray]:
  """Uniformly random split; client sizes differ by at most one.

  Args:
    labels: Train labels ``[N]``.
    num_clients: Number of clients, at most N.
    rng: Source of randomness.

  Returns:
    ``num_clients`` sorted int64 index arrays that partition ``range(N)``.
  """
  labels = _check_common(labels, num_clients, rng)
  perm = rng.permutation(labels.size)
  return _finish([[p] for p in np.array_split(perm, num_clients)], "iid")


def _hfldd_label_sets(num_classes: int, num_clients: int, per_client: int,
                      rng: np.random.Generator) -> list[np.ndarray]:
  """Draws ``per_client`` distinct class ranks per client, covering greedily.

  A random permutation of the classes is dealt round-robin (client k gets
  ``perm[k], perm[k + M], ...``) until every class is dealt or every slot is
  full; each client then fills its free slots with classes it lacks,
  uniformly at random. Every class is held when ``M * C >= num_classes``.
  """
  perm = rng.permutation(num_classes)
  dealt = perm[:min(num_classes, num_clients * per_client)]
  sets = []
  for k in range(num_clients):
    own = dealt[k::num_clients]
    rest = np.setdiff1d(np.arange(num_classes), own)
    extra = rng.choice(rest, size=per_client - own.size, replace=False)
    sets.append(np.concatenate([own, extra]))
  return sets


def _balanced_label_sets(num_classes: int, num_clients: int, per_client: int,
                         rng: np.random.Generator) -> list[np.ndarray]:
  """``per_client`` distinct class ranks per client, holders per class equal.

  Clients are visited in a random order; each takes the ``per_client``
  classes held by the fewest clients so far, ties broken at random, so
  holder counts never differ by more than one: every class ends with
  ``floor(M C / K)`` or ``ceil(M C / K)`` holders.
  """
  held = np.zeros(num_classes, np.int64)
  sets = [None] * num_clients
  for k in rng.permutation(num_clients):
    # Random tie-break: sort by (holders, random key).
    order = np.lexsort((rng.random(num_classes), held))
    own = np.sort(order[:per_client])
    held[own] += 1
    sets[k] = own
  return sets


def pathological(labels, num_clients: int, num_classes_per_client: int,
                 rng: np.random.Generator, *, style: str
                 ) -> list[np.ndarray]:
  """Label-skewed split where each client holds ``C`` classes.

  With ``K`` classes, ``M`` clients and ``C = num_classes_per_client``:

  * ``style="balanced"`` (HFLDD; Shi et al. 2024, Sec. V-A, "each client
    has 1, 2, or 10 of the ten classes", Fig. 4's equal clusters): each
    client holds ``C`` distinct classes and every class is held by
    ``M C / K`` clients (``floor`` or ``ceil`` of it when ``K`` does not
    divide ``M C``); which clients is random (see ``_balanced_label_sets``).
  * ``style="hfldd"`` (a looser reading of HFLDD): each client holds ``C``
    distinct classes drawn at random, so label sets may overlap and holders
    per class vary. The draw covers first (see ``_hfldd_label_sets``): every
    class is held when ``M * C >= K``; otherwise label sets are disjoint and
    ``K - M * C`` random classes belong to no client.
  * ``style="fedd3"`` (FedD3; Song et al. 2023): client ``i`` holds
    classes ``(i + j) mod K`` for ``j < C``; only the split of the samples
    is random. Classes no client reaches (``M * C < K``) are unused.

  Each class's samples are shuffled and split as evenly as possible among
  its holders (extras to random holders).

  Args:
    labels: Train labels ``[N]``.
    num_clients: Number of clients ``M``.
    num_classes_per_client: ``C``, in ``[1, K]``.
    rng: Source of randomness.
    style: ``"balanced"``, ``"hfldd"`` or ``"fedd3"``.

  Returns:
    ``M`` sorted int64 index arrays, pairwise disjoint.

  Raises:
    ValueError: Bad style, ``C`` outside ``[1, K]``, or a client would get no
      sample.
  """
  labels = _check_common(labels, num_clients, rng)
  if style not in _STYLES:
    raise ValueError(f"style must be one of {_STYLES}, got {style!r}.")
  classes = np.unique(labels)
  num_classes = classes.size
  per_client = num_classes_per_client
  if not isinstance(per_client, (int, np.integer)) or not (
      1 <= per_client <= num_classes):
    raise ValueError(
        f"num_classes_per_client must be an int in [1, {num_classes}] (the "
        f"number of classes present), got {per_client}.")
  if style == "fedd3":
    label_sets = [(i + np.arange(per_client)) % num_classes
                  for i in range(num_clients)]
  elif style == "balanced":
    label_sets = _balanced_label_sets(num_classes, num_clients, per_client,
                                      rng)
  else:
    label_sets = _hfldd_label_sets(num_classes, num_clients, per_client, rng)
  holders = [[] for _ in range(num_classes)]
  for k, owned in enumerate(label_sets):
    for c in owned:
      holders[c].append(k)
  parts = [[] for _ in range(num_clients)]
  for c in range(num_classes):
    if not holders[c]:
      continue
    members = rng.permutation(np.flatnonzero(labels == classes[c]))
    # array_split gives the extra samples to the first pieces; shuffling the
    # holders spreads them at random.
    order = rng.permutation(holders[c])
    for k, piece in zip(order, np.array_split(members, len(order))):
      parts[k].append(piece)
  return _finish(parts, f"pathological(style={style!r})")


def dirichlet(labels, num_clients: int, alpha: float,
              rng: np.random.Generator, *, min_size: int = 10,
              max_tries: int = 1000) -> list[np.ndarray]:
  """Label-skewed split with per-class client shares drawn from ``Dir(alpha)``.

  For each class, proportions ``p ~ Dir(alpha * 1_M)`` are drawn and the
  class's shuffled samples are cut into counts proportional to ``p`` (largest
  remainder, so counts sum to the class size). If some client gets fewer than
  ``min_size`` samples, all proportions are redrawn, up to ``max_tries``
  times; samples are shuffled only once a try succeeds, so tries are cheap.
  A non-finite draw (tiny ``alpha``) is replaced by its ``alpha -> 0``
  limit, one-hot on a random client, so no NaN reaches the counts.

  Args:
    labels: Train labels ``[N]``.
    num_clients: Number of clients ``M``.
    alpha: Dirichlet concentration, > 0. Large -> near IID.
    rng: Source of randomness.
    min_size: Minimum samples per client, >= 1.
    max_tries: Maximum number of draws.

  Returns:
    ``M`` sorted int64 index arrays that partition ``range(N)``.

  Raises:
    ValueError: ``alpha <= 0``, ``min_size < 1``, ``max_tries < 1``,
      ``M * min_size > N``, or ``min_size`` still unmet after ``max_tries``.
  """
  labels = _check_common(labels, num_clients, rng)
  if not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f"alpha must be a positive finite number, got {alpha}.")
  if min_size < 1:
    raise ValueError(f"min_size must be >= 1, got {min_size}.")
  if max_tries < 1:
    raise ValueError(f"max_tries must be >= 1, got {max_tries}.")
  if num_clients * min_size > labels.size:
    raise ValueError(
        f"Cannot give {num_clients} clients at least {min_size} samples each "
        f"from {labels.size} samples.")
  classes, sizes = np.unique(labels, return_counts=True)
  for _ in range(max_tries):
    counts = np.empty((classes.size, num_clients), np.int64)
    for c, n in enumerate(sizes):
      p = rng.dirichlet(np.full(num_clients, float(alpha)))
      if not (np.all(np.isfinite(p)) and p.sum() > 0):
        p = np.zeros(num_clients)
        p[rng.integers(num_clients)] = 1.0
      counts[c] = _largest_remainder(int(n), p)
    if counts.sum(axis=0).min() >= min_size:
      break
  else:
    raise ValueError(
        f"dirichlet: could not give every one of {num_clients} clients at "
        f"least min_size={min_size} samples in max_tries={max_tries} draws "
        f"with alpha={alpha}. Lower min_size, raise alpha, use fewer clients "
        "or allow more tries.")
  parts = [[] for _ in range(num_clients)]
  for c, cls in enumerate(classes):
    members = rng.permutation(np.flatnonzero(labels == cls))
    for k, piece in enumerate(np.split(members, np.cumsum(counts[c])[:-1])):
      parts[k].append(piece)
  return _finish(parts, "dirichlet")


def dirichlet_client(labels, num_clients: int, alpha: float,
                     rng: np.random.Generator, *, client_size: int = 0
                     ) -> list[np.ndarray]:
  """Equal-size clients whose class mix is a prior drawn from ``Dir(alpha)``.

  The split of FedFTG (Zhang et al., CVPR 2022; ``utils/util_dataset.py``,
  rule ``Dirichlet``), which DisUE (Leng et al., Sec. 5.1, ``Dir(epsilon)``)
  follows. Unlike
  :func:`dirichlet`, which splits each *class* over clients, every *client*
  ``i`` draws a class prior ``q_i ~ Dir(alpha * 1_K)`` and receives exactly
  ``n`` samples, dealt one at a time as in FedFTG: a uniformly picked
  client not yet full draws a class from its prior re-normalised over the
  classes with samples left (the distribution of FedFTG's redraw loop) and
  gets one random undealt sample of it.

  Departures from FedFTG's code:

  * ``N mod M`` samples are left unused so every client has exactly
    ``n = N // M`` (FedFTG gives the remainder to the first client).
  * When every class of a client's prior is exhausted (tiny ``alpha``, where
    FedFTG's loop never ends), the class is drawn in proportion to the
    samples left.
  * A non-finite prior (tiny ``alpha``) is replaced by its ``alpha -> 0``
    limit, as in :func:`dirichlet`.

  Args:
    labels: Train labels ``[N]``.
    num_clients: Number of clients ``M``.
    alpha: Dirichlet concentration ``epsilon``, > 0. Large -> near IID.
    rng: Source of randomness.
    client_size: Samples per client ``n``; ``0``: ``N // M``.

  Returns:
    ``M`` sorted, pairwise disjoint int64 index arrays of ``n`` indices each.

  Raises:
    ValueError: ``alpha <= 0`` or not finite, ``client_size < 0``, or
      ``M * n > N``.
  """
  labels = _check_common(labels, num_clients, rng)
  if not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f"alpha must be a positive finite number, got {alpha}.")
  if (isinstance(client_size, bool)
      or not isinstance(client_size, (int, np.integer)) or client_size < 0):
    raise ValueError(
        f"client_size must be an int >= 0 (0: N // num_clients), got "
        f"{client_size!r}.")
  size = int(client_size) or labels.size // num_clients
  if num_clients * size > labels.size:
    raise ValueError(
        f"dirichlet_client: {num_clients} clients x {size} samples each "
        f"needs {num_clients * size} samples, but there are only "
        f"{labels.size}; use fewer clients or a smaller client_size.")
  classes = np.unique(labels)
  num_classes = classes.size
  priors = rng.dirichlet(np.full(num_classes, float(alpha)),
                         size=num_clients)
  for k in range(num_clients):
    if not (np.all(np.isfinite(priors[k])) and priors[k].sum() > 0):
      priors[k] = 0.0
      priors[k, rng.integers(num_classes)] = 1.0
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  left = np.array([p.size for p in pools], np.int64)
  need = np.full(num_clients, size, np.int64)
  dealt = [[] for _ in range(num_clients)]
  open_clients = list(range(num_clients))
  for _ in range(num_clients * size):
    slot = int(rng.integers(len(open_clients)))
    k = open_clients[slot]
    weights = priors[k] * (left > 0)
    if not weights.sum() > 0:
      weights = left.astype(np.float64)
    # Only classes of positive weight, so round-off never picks an empty one.
    pos = np.flatnonzero(weights > 0)
    cum = np.cumsum(weights[pos])
    j = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    c = pos[min(j, pos.size - 1)]
    left[c] -= 1
    dealt[k].append(pools[c][left[c]])
    need[k] -= 1
    if need[k] == 0:
      open_clients.pop(slot)
  return _finish([[np.asarray(d, np.int64)] for d in dealt],
                 "dirichlet_client")


def disjoint_classes(labels, num_clients: int, rng: np.random.Generator, *,
                     classes_per_client: int = 2) -> list[np.ndarray]:
  """FedHydra's "2c/c" split: each client owns classes no other client has.

  A random permutation of the classes is cut into consecutive groups of
  ``classes_per_client``; client ``k`` gets every sample of group ``k``.
  Classes beyond ``M * classes_per_client`` are unused.

  Args:
    labels: Train labels ``[N]``.
    num_clients: Number of clients ``M``.
    rng: Source of randomness (which classes go where).
    classes_per_client: Classes per client, >= 1.

  Returns:
    ``M`` sorted int64 index arrays with pairwise disjoint label sets.

  Raises:
    ValueError: ``classes_per_client < 1`` or
      ``M * classes_per_client > K``.
  """
  labels = _check_common(labels, num_clients, rng)
  classes = np.unique(labels)
  if not isinstance(classes_per_client, (int, np.integer)) or (
      classes_per_client < 1):
    raise ValueError(
        f"classes_per_client must be a positive int, got {classes_per_client}.")
  if num_clients * classes_per_client > classes.size:
    raise ValueError(
        f"{num_clients} clients x {classes_per_client} classes each needs "
        f"{num_clients * classes_per_client} distinct classes, but only "
        f"{classes.size} are present.")
  perm = rng.permutation(classes)
  parts = []
  for k in range(num_clients):
    own = perm[k * classes_per_client:(k + 1) * classes_per_client]
    parts.append([np.flatnonzero(np.isin(labels, own))])
  return _finish(parts, "disjoint_classes")


def quantity_skew(labels, num_clients: int, rng: np.random.Generator, *,
                  sigma: float = 1.0, min_size: int = 1) -> list[np.ndarray]:
  """IID labels with lognormal client sizes.

  Each client gets ``min_size`` samples plus a share of the other
  ``N - M * min_size`` proportional to ``w_k ~ LogNormal(0, sigma)``
  (largest remainder), cut from one uniform shuffle.

  Args:
    labels: Train labels ``[N]`` (only N is used).
    num_clients: Number of clients ``M``.
    rng: Source of randomness.
    sigma: Lognormal shape, >= 0. Larger -> more unequal sizes.
    min_size: Minimum samples per client, >= 1.

  Returns:
    ``M`` sorted int64 index arrays that partition ``range(N)``.

  Raises:
    ValueError: ``sigma < 0``, ``min_size < 1`` or ``M * min_size > N``.
  """
  labels = _check_common(labels, num_clients, rng)
  if not np.isfinite(sigma) or sigma < 0:
    raise ValueError(f"sigma must be finite and >= 0, got {sigma}.")
  if min_size < 1:
    raise ValueError(f"min_size must be >= 1, got {min_size}.")
  if num_clients * min_size > labels.size:
    raise ValueError(
        f"Cannot give {num_clients} clients at least {min_size} samples each "
        f"from {labels.size} samples.")
  weights = rng.lognormal(0.0, sigma, size=num_clients)
  sizes = min_size + _largest_remainder(
      labels.size - num_clients * min_size, weights)
  perm = rng.permutation(labels.size)
  pieces = np.split(perm, np.cumsum(sizes)[:-1])
  return _finish([[p] for p in pieces], "quantity_skew")


def class_counts(labels, partition: list[np.ndarray], num_classes: int
                 ) -> np.ndarray:
  """Per-client class histogram.

  Args:
    labels: Train labels ``[N]``.
    partition: One index array per client, as returned by the partitioners.
    num_classes: Number of classes; every label must be below it.

  Returns:
    Counts ``[M, num_classes]`` int64; row ``k`` counts client ``k``'s labels.

  Raises:
    ValueError: A label is outside ``[0, num_classes)``.
  """
  labels = np.asarray(labels)
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(
        f"labels must lie in [0, {num_classes}), got range "
        f"[{labels.min()}, {labels.max()}].")
  counts = np.zeros((len(partition), num_classes), np.int64)
  for k, idx in enumerate(partition):
    counts[k] = np.bincount(labels[np.asarray(idx, np.int64)],
                            minlength=num_classes)
  return counts


def personal_test_split(test_labels, train_counts, rng: np.random.Generator
                        ) -> list[np.ndarray]:
  """Each client's test set, drawn like its training data.

  The test examples of class ``k`` are dealt to the clients in proportion
  to their training examples of class ``k`` (largest remainder; which ones
  is drawn by ``rng``), so client ``i`` gets ``T_k n_ik / N_k`` of class
  ``k``. This is the protocol of FL-bench, PFLlib, IFCA and PACFL: every
  client is tested on its own distribution. Test examples of a class no
  client trains on are left out.

  Args:
    test_labels: test labels ``[T]``.
    train_counts: ``[M, K]`` training examples per client and class
      (:func:`class_counts`).
    rng: source of randomness (the run's partition seed).

  Returns:
    ``M`` sorted int64 index arrays into the test split, disjoint; a client
    may get none (it then has no test figure).

  Raises:
    ValueError: labels not ``[T]`` integers in ``[0, K)``, or counts not
      ``[M, K]`` non-negative.
  """
  _check_rng(rng)
  labels = np.asarray(test_labels)
  counts = np.asarray(train_counts)
  if counts.ndim != 2 or counts.shape[0] < 1 or (counts < 0).any():
    raise ValueError(f"train_counts must be [M, K] non-negative counts, got "
                     f"shape {counts.shape}.")
  num_classes = counts.shape[1]
  if (labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer)
      or (labels.size and (labels.min() < 0
                           or labels.max() >= num_classes))):
    raise ValueError(f"test_labels must be [T] integers in [0, {num_classes})"
                     f", got shape {labels.shape} dtype {labels.dtype}.")
  parts: list[list[np.ndarray]] = [[] for _ in range(counts.shape[0])]
  for k in range(num_classes):
    holders = counts[:, k]
    if holders.sum() == 0:
      continue
    idx = rng.permutation(np.flatnonzero(labels == k))
    sizes = _largest_remainder(idx.size, holders.astype(np.float64))
    for client, piece in enumerate(np.split(idx, np.cumsum(sizes)[:-1])):
      if piece.size:
        parts[client].append(piece)
  return [np.sort(np.concatenate(p)).astype(np.int64) if p
          else np.zeros(0, np.int64) for p in parts]


def stratified_split(labels, partition: list[np.ndarray],
                     test_fraction: float, rng: np.random.Generator
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Splits every client's own examples into train and test, per class.

  Of client ``i``'s ``n_ik`` examples of class ``k``, ``round(f n_ik)``
  (halves up, at most ``n_ik - 1`` so a class keeps a training example)
  become test examples: FL-bench's and PFLlib's per-client split.

  Args:
    labels: the labels ``[N]`` the partition indexes.
    partition: one index array per client.
    test_fraction: ``f`` in ``(0, 1)``.
    rng: source of randomness.

  Returns:
    ``(train, test)``: per client, sorted int64 index arrays; ``train[i]``
    and ``test[i]`` partition ``partition[i]``.

  Raises:
    ValueError: ``test_fraction`` outside ``(0, 1)``.
  """
  _check_rng(rng)
  if not 0.0 < float(test_fraction) < 1.0:
    raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}.")
  labels = np.asarray(labels)
  train, test = [], []
  for idx in partition:
    idx = np.asarray(idx, np.int64)
    keep, held = [], []
    for k in np.unique(labels[idx]):
      members = rng.permutation(idx[labels[idx] == k])
      t = min(int(np.floor(test_fraction * members.size + 0.5)),
              members.size - 1)
      held.append(members[:t])
      keep.append(members[t:])
    train.append(np.sort(np.concatenate(keep)) if keep
                 else np.zeros(0, np.int64))
    test.append(np.sort(np.concatenate(held)) if held
                else np.zeros(0, np.int64))
  return train, test
