"""Communication ledger: what is actually sent between server and clients.

Every message is recorded by its size, under FedD3's and HFLDD's conventions:

* model parameters count :data:`BITS_PER_PARAM` (32) bits each;
* images sent as data count :data:`BITS_PER_PIXEL_CHANNEL` (8, uint8) bits
  per pixel channel;
* soft labels count :data:`BITS_PER_SOFT_LABEL` (32) bits each;
* hard labels (class indices) count :data:`BITS_PER_HARD_LABEL` (8) bits each.

Every size function here and in the algorithm modules (FedD3's upload,
HFLDD's Eq. 18, FedSeq's Eq. 19) takes these widths as keyword arguments,
defaulting to the constants.

Traffic kinds: ``"upload"`` (client -> server), ``"download"`` (server ->
client) and ``"peer"`` (client -> client, e.g. HFLDD members -> cluster
heads). Peer traffic counts as uploaded by its sender and is also reported
alone as ``bytes_peer``; every message is counted once, so
``bytes_total == bytes_uploaded + bytes_downloaded``.

:class:`Ledger` is an immutable host-side value that round-trips through
plain JSON (:meth:`Ledger.to_dict`, :meth:`Ledger.from_dict`) as checkpoint
metadata.

The module also holds the closed-form FedAvg/SCAFFOLD exchange sizes
(:func:`fedavg_round_bits`, HFLDD Eq. 3), FedD3's gamma communication
efficiency (:func:`gce`, :func:`gce_summary`, Eq. 6, charged per client
message: :meth:`Ledger.message_bits`) and :func:`traffic_to_target`, the
bytes a run's ``metrics.jsonl`` rows need to reach a target accuracy.

References:
  FedD3: Song et al., "Federated Learning via Decentralized Dataset
  Distillation in Resource-Constrained Edge Environments", 2023.
  HFLDD: Shi et al., "Dataset Distillation-based Hybrid Federated Learning on
  Non-IID Data", 2024.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import numpy as np

__all__ = [
    "BITS_PER_PARAM",
    "BITS_PER_PIXEL_CHANNEL",
    "BITS_PER_SOFT_LABEL",
    "BITS_PER_HARD_LABEL",
    "KINDS",
    "LedgerEntry",
    "Ledger",
    "bits_to_bytes",
    "num_params",
    "model_bits",
    "fedavg_round_bits",
    "gce",
    "gce_table",
    "gce_summary",
    "traffic_to_target",
    "load_metrics",
]

_log = logging.getLogger(__name__)

BITS_PER_PARAM = 32
"""Bits per model parameter sent (float32)."""

BITS_PER_PIXEL_CHANNEL = 8
"""Bits per pixel channel of images sent as data (uint8 quantisation)."""

BITS_PER_SOFT_LABEL = 32
"""Bits per soft-label entry sent (float32)."""

BITS_PER_HARD_LABEL = 8
"""Bits per hard label sent (a class index fits a byte)."""

Kind = Literal["upload", "download", "peer"]
KINDS: tuple[str, ...] = ("upload", "download", "peer")

_FORMAT_VERSION = 1


# ----------------------------------------------------------------------------
# Validation helpers.
# ----------------------------------------------------------------------------


def _as_int(value: Any, name: str, *, minimum: int | None = 0) -> int:
  """Returns ``value`` as a Python int, rejecting bools, floats and negatives."""
  if isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be an integer, got bool {value!r}.")
  try:
    result = operator.index(value)
  except TypeError:
    raise ValueError(
        f"{name} must be an integer, got {type(value).__name__} {value!r}."
    ) from None
  if minimum is not None and result < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {result}.")
  return result


def bits_to_bytes(bits: int) -> int | float:
  """Bits -> bytes: an int when exact, a float otherwise."""
  bits = _as_int(bits, "bits")
  return bits // 8 if bits % 8 == 0 else bits / 8


# ----------------------------------------------------------------------------
# Payload sizes.
# ----------------------------------------------------------------------------


def num_params(tree: Any) -> int:
  """Number of scalar entries in a pytree of arrays (``|w|``).

  Leaves are arrays or ``jax.ShapeDtypeStruct`` (only shapes are read);
  ``None`` subtrees are empty.

  Raises:
    ValueError: if a leaf has no shape (e.g. a Python number).
  """
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    shape = getattr(leaf, "shape", None)
    if shape is None or getattr(leaf, "dtype", None) is None:
      raise ValueError(
          "num_params expects array leaves (jax/numpy arrays or "
          f"jax.ShapeDtypeStruct); got {type(leaf).__name__} {leaf!r}.")
    total += math.prod(shape)
  return total


def model_bits(tree: Any, *, bits_per_param: int = BITS_PER_PARAM) -> int:
  """Bits to send a model: ``num_params(tree) * bits_per_param``."""
  return num_params(tree) * _as_int(bits_per_param, "bits_per_param")


# ----------------------------------------------------------------------------
# The ledger.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
  """One recorded exchange.

  Attributes:
    round: round index the traffic belongs to.
    kind: ``"upload"``, ``"download"`` or ``"peer"``.
    bits: bits of one message.
    count: number of identical messages (e.g. number of sampled clients).
    tag: free-form label, e.g. ``"model"``, ``"control_variate"``,
      ``"distilled_data"``.
  """

  round: int
  kind: str
  bits: int
  count: int = 1
  tag: str = ""

  @property
  def total_bits(self) -> int:
    """``bits * count``."""
    return self.bits * self.count


def _zero_bits() -> dict[str, int]:
  return {kind: 0 for kind in KINDS}


def _summary(bits_by_kind: Mapping[str, int]) -> dict[str, int | float]:
  """Totals in bits and bytes; peer traffic counts as uploaded by its sender."""
  up = bits_by_kind["upload"] + bits_by_kind["peer"]
  down = bits_by_kind["download"]
  peer = bits_by_kind["peer"]
  out: dict[str, int | float] = {
      "bits_uploaded": up,
      "bits_downloaded": down,
      "bits_peer": peer,
      "bits_total": up + down,
  }
  for name in ("uploaded", "downloaded", "peer", "total"):
    out[f"bytes_{name}"] = bits_to_bytes(out[f"bits_{name}"])
  return out


@dataclasses.dataclass(frozen=True)
class Ledger:
  """Immutable record of all traffic of a run.

  Methods that change the record return a new ``Ledger``::

      ledger = Ledger()
      down, up = fedavg_round_bits(num_params(params), 10, round_index=r)
      ledger = ledger.record(r, kind="download", bits=down, tag="model")
      ledger = ledger.record(r, kind="upload", bits=up, tag="model")
      ledger.cumulative()["bytes_total"]

  Totals are reported with the keys ``bits_uploaded``, ``bits_downloaded``,
  ``bits_peer``, ``bits_total`` (ints) and the same with ``bytes_``
  (:func:`bits_to_bytes`); peer traffic counts as in the module docstring.

  Attributes:
    entries: the recorded exchanges in recording order.
  """

  entries: tuple[LedgerEntry, ...] = ()

  def record(
      self,
      round: int,  # pylint: disable=redefined-builtin
      *,
      kind: Kind,
      bits: int,
      count: int = 1,
      tag: str = "",
  ) -> Ledger:
    """Returns a new ledger with ``count`` messages of ``bits`` bits added.

    Args:
      round: round index (>= 0) the traffic belongs to.
      kind: ``"upload"`` (client -> server), ``"download"`` (server ->
        client) or ``"peer"`` (client -> client, counted as uploaded by the
        sender).
      bits: bits of one message (>= 0).
      count: number of such messages, e.g. 100 clients each sending ``|w|``.
      tag: label for :meth:`tag_totals`.

    Raises:
      ValueError: on a negative or non-integer round/bits/count, an unknown
        kind or a non-string tag.
    """
    entry = LedgerEntry(
        round=_as_int(round, "round"),
        kind=_check_kind(kind),
        bits=_as_int(bits, "bits"),
        count=_as_int(count, "count"),
        tag=_check_tag(tag),
    )
    return Ledger(self.entries + (entry,))

  def record_messages(
      self,
      round: int,  # pylint: disable=redefined-builtin
      *,
      kind: Kind,
      bits: Sequence[int] | np.ndarray,
      tag: str = "",
  ) -> Ledger:
    """Records one message per sender, e.g. each client's distilled upload.

    Senders with equal sizes share one entry (``count`` = how many); a
    zero size means that sender sent nothing and is not recorded. Entries
    come in increasing size, so the ledger does not depend on client order.

    Args:
      round: round index (>= 0).
      kind: as in :meth:`record`.
      bits: ``[C]`` bits of each sender's message.
      tag: label for :meth:`tag_totals`.

    Returns:
      A new ledger; its totals grow by ``sum(bits)``.

    Raises:
      ValueError: ``bits`` not a 1-D ``[C]`` array of integers, a negative
        size (naming the sender), or as :meth:`record`.
    """
    arr = np.asarray(bits)
    if arr.ndim != 1:
      raise ValueError(f"bits must be [C] (one size per sender, 1-D), got "
                       f"shape {arr.shape}.")
    if arr.size and (arr.dtype == bool
                     or not np.issubdtype(arr.dtype, np.integer)):
      raise ValueError(f"bits must be [C] integer bit counts, got dtype "
                       f"{arr.dtype}.")
    negative = np.flatnonzero(arr < 0)
    if negative.size:
      i = int(negative[0])
      raise ValueError(f"bits must be >= 0 for every sender, got "
                       f"{negative.size} negative (bits[{i}] = {int(arr[i])}).")
    sizes = [_as_int(b, "bits") for b in arr.tolist()]
    ledger = self
    for size in sorted(set(sizes) - {0}):
      ledger = ledger.record(round, kind=kind, bits=size,
                             count=sizes.count(size), tag=tag)
    return ledger

  @property
  def rounds(self) -> list[int]:
    """Sorted round indices that have at least one entry."""
    return sorted({e.round for e in self.entries})

  def _bits_by_kind(self, predicate) -> dict[str, int]:
    totals = _zero_bits()
    for e in self.entries:
      if predicate(e):
        totals[e.kind] += e.total_bits
    return totals

  def round_totals(self, round: int) -> dict[str, int | float]:  # pylint: disable=redefined-builtin
    """Traffic of one round (all zeros if nothing was recorded in it).

    Returns:
      ``{"round", "bits_uploaded", "bits_downloaded", "bits_peer",
      "bits_total", "bytes_uploaded", "bytes_downloaded", "bytes_peer",
      "bytes_total"}``.
    """
    r = _as_int(round, "round")
    return {"round": r, **_summary(self._bits_by_kind(lambda e: e.round == r))}

  def cumulative(self, through_round: int | None = None) -> dict[str, int | float]:
    """Traffic summed over rounds ``<= through_round`` (all rounds if None).

    Returns:
      The totals keys of :meth:`round_totals`, without ``"round"``.
    """
    if through_round is None:
      return _summary(self._bits_by_kind(lambda e: True))
    t = _as_int(through_round, "through_round")
    return _summary(self._bits_by_kind(lambda e: e.round <= t))

  def tag_totals(self) -> dict[str, dict[str, int | float]]:
    """Totals per tag over all rounds, ``{tag: totals}``, tags sorted."""
    tags = sorted({e.tag for e in self.entries})
    return {
        t: _summary(self._bits_by_kind(lambda e, t=t: e.tag == t)) for t in tags
    }

  def message_bits(
      self,
      round: int,  # pylint: disable=redefined-builtin
      *,
      kinds: Sequence[str] = ("upload", "peer"),
      reduce: Literal["mean", "max"] = "mean",
  ) -> float:
    """Bits one client sends in ``round``: FedD3's ``V_t`` (Eq. 6).

    Each ``(kind, tag)`` group of the round (e.g. SCAFFOLD's ``"model"``
    and ``"control_variate"``) adds the mean size of its messages, or the
    largest (``reduce="max"``); zero-bit messages count as nothing sent.

    Args:
      round: the round.
      kinds: traffic that counts; by default what a client sends (uploads
        and peer messages; FedD3 Sec. 4.2 counts uploads only).
      reduce: ``"mean"`` or ``"max"`` over a group's messages.

    Returns:
      ``V_t`` in bits (a float under ``"mean"``); 0 for a silent round.
    """
    r = _as_int(round, "round")
    kinds = tuple(_check_kind(k) for k in kinds)
    if reduce not in ("mean", "max"):
      raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}.")
    groups: dict[tuple[str, str], list[LedgerEntry]] = {}
    for e in self.entries:
      if e.round == r and e.kind in kinds and e.bits > 0 and e.count > 0:
        groups.setdefault((e.kind, e.tag), []).append(e)
    total = 0.0
    for entries in groups.values():
      if reduce == "max":
        total += max(e.bits for e in entries)
      else:
        total += (sum(e.total_bits for e in entries)
                  / sum(e.count for e in entries))
    return total

  def message_bits_per_round(
      self,
      *,
      kinds: Sequence[str] = ("upload", "peer"),
      reduce: Literal["mean", "max"] = "mean",
  ) -> list[tuple[int, float]]:
    """``[(round, V_t)]`` of :meth:`message_bits` for rounds with traffic.

    Rounds where no client sends anything are left out: ``V_t = 0`` adds
    nothing to the GCE denominator.
    """
    out = []
    for r in self.rounds:
      v = self.message_bits(r, kinds=kinds, reduce=reduce)
      if v > 0:
        out.append((r, v))
    return out

  def to_dict(self) -> dict[str, Any]:
    """Plain JSON-able form: ``{"version": 1, "entries": [{...}, ...]}``."""
    return {
        "version": _FORMAT_VERSION,
        "entries": [dataclasses.asdict(e) for e in self.entries],
    }

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> Ledger:
    """Inverse of :meth:`to_dict`; validates every entry.

    Raises:
      ValueError: on an unknown version or a malformed entry.
    """
    if not isinstance(data, Mapping):
      raise ValueError(f"Ledger.from_dict expects a mapping, got {type(data).__name__}.")
    version = data.get("version")
    if version != _FORMAT_VERSION:
      raise ValueError(
          f"Unsupported ledger format version {version!r}; expected {_FORMAT_VERSION}."
      )
    entries = data.get("entries")
    if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)):
      raise ValueError("Ledger dict must hold a list under 'entries'.")
    ledger = cls()
    fields = {"round", "kind", "bits", "count", "tag"}
    for i, e in enumerate(entries):
      if not isinstance(e, Mapping) or set(e) != fields:
        raise ValueError(
            f"Ledger entry {i} must be a mapping with keys {sorted(fields)}, got {e!r}."
        )
      ledger = ledger.record(
          e["round"], kind=e["kind"], bits=e["bits"], count=e["count"], tag=e["tag"]
      )
    return ledger


def _check_kind(kind: Any) -> str:
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
  return str(kind)


def _check_tag(tag: Any) -> str:
  if not isinstance(tag, str):
    raise ValueError(f"tag must be a str, got {type(tag).__name__} {tag!r}.")
  return tag


# ----------------------------------------------------------------------------
# Standard exchanges.
# ----------------------------------------------------------------------------


def fedavg_round_bits(
    num_params: int,  # pylint: disable=redefined-outer-name
    num_sampled: int,
    round_index: int,
    *,
    bits_per_param: int = BITS_PER_PARAM,
    initial_model_as_seed: bool = True,
    upload_multiplier: int = 1,
    download_multiplier: int = 1,
) -> tuple[int, int]:
  """Download and upload bits of one FedAvg-style round.

  Summed over ``T`` rounds with all ``N`` clients sampled this gives HFLDD
  Eq. 3: ``N (2T - 1) |w| B1`` bits (``N 2T |w| B1`` without
  ``initial_model_as_seed``).

  Args:
    num_params: ``|w|``, scalar parameters per model.
    num_sampled: clients taking part in the round.
    round_index: 1-based round number.
    bits_per_param: ``B1``, bits per parameter.
    initial_model_as_seed: round 1 has no download (clients rebuild the
      model from a shared seed).
    upload_multiplier: model-sized payloads each client uploads (SCAFFOLD: 2,
      model delta and control-variate delta).
    download_multiplier: model-sized payloads each client downloads (SCAFFOLD
      as published: 2, with the server control variate; HFLDD Eq. 3: 1).

  Returns:
    ``(down_bits, up_bits)``, totals over all sampled clients.

  Raises:
    ValueError: on negative sizes, a round index below 1, or non-integers.
  """
  p = _as_int(num_params, "num_params")
  n = _as_int(num_sampled, "num_sampled")
  r = _as_int(round_index, "round_index", minimum=1)
  b = _as_int(bits_per_param, "bits_per_param")
  up_mult = _as_int(upload_multiplier, "upload_multiplier")
  down_mult = _as_int(download_multiplier, "download_multiplier")
  model = p * b
  if r == 1 and initial_model_as_seed:
    down = 0
  else:
    down = n * down_mult * model
  up = n * up_mult * model
  return down, up


# ----------------------------------------------------------------------------
# Efficiency summaries.
# ----------------------------------------------------------------------------


def gce(accuracy: float, bits_per_round: Sequence[int], gamma: float) -> float:
  """FedD3's gamma communication efficiency (Song et al., Eq. 6).

  ``GCE = ACC / ((1 - ACC)^gamma * sum_t log2(V_t + 1))``, where ``V_t`` is
  the bits of one client's message in round ``t`` (Table 2,
  :meth:`Ledger.message_bits`; e.g. FedD3's two 28x28 uint8 MNIST images,
  ``V_1 = 12,544``). The cohort's total per round gives the cohort variant.
  Higher is better; ``gamma`` sets how strongly accuracy is rewarded.

  Args:
    accuracy: final accuracy in ``[0, 1)``.
    bits_per_round: ``V_t`` for every round, each ``>= 0``, at least one > 0.
    gamma: exponent ``>= 0``.

  Returns:
    The GCE as a float.

  Raises:
    ValueError: on accuracy outside ``[0, 1)``, empty or all-zero traffic,
      negative traffic, or negative/non-finite gamma.
  """
  acc = float(accuracy)
  if not 0.0 <= acc < 1.0:
    raise ValueError(f"accuracy must be in [0, 1), got {accuracy!r}.")
  g = float(gamma)
  if not math.isfinite(g) or g < 0:
    raise ValueError(f"gamma must be finite and >= 0, got {gamma!r}.")
  volumes = [float(v) for v in bits_per_round]
  if not volumes:
    raise ValueError("bits_per_round must not be empty.")
  if any(not math.isfinite(v) or v < 0 for v in volumes):
    raise ValueError(f"bits_per_round must be finite and >= 0, got {volumes}.")
  denom_traffic = sum(math.log2(v + 1.0) for v in volumes)
  if denom_traffic == 0.0:
    raise ValueError("bits_per_round must contain at least one positive value.")
  return acc / ((1.0 - acc) ** g * denom_traffic)


def gce_table(accuracy: float | None, bits_per_round: Sequence[float],
              gammas: Sequence[float]) -> dict[str, float | None]:
  """:func:`gce` for several gammas, keyed ``str(gamma)``, for summaries.

  A value is ``None`` where Eq. 6 is undefined: no accuracy (never
  evaluated), accuracy 1 (``(1 - ACC)^gamma = 0``) or no traffic at all.
  """
  volumes = [float(v) for v in bits_per_round]
  out: dict[str, float | None] = {}
  for g in gammas:
    defined = (accuracy is not None and 0.0 <= float(accuracy) < 1.0
               and any(v > 0 for v in volumes))
    out[str(g)] = gce(accuracy, volumes, g) if defined else None
  return out


def gce_summary(ledger: Ledger, *, final_accuracy: float | None,
                best_accuracy: float | None, gammas
                ) -> dict[str, Any]:
  """FedD3's GCE (Eq. 6) of a run, from its in-memory ledger.

  ``V_t`` is as in Table 2: the bits ONE client sends in round ``t``
  (:meth:`Ledger.message_bits`, the mean message where sizes differ).

  Returns:
    ``{"gce", "gce_best", "gce_cohort", "gce_message_bits"}``: ``gce`` with
    the final accuracy; ``gce_best`` with the best one (Table 2's
    multi-shot footnote); ``gce_cohort`` with ``V_t`` = all traffic of
    round ``t``; ``gce_message_bits`` the ``[[round, V_t]]`` used. Values
    are ``None`` where Eq. 6 is undefined (:func:`gce_table`).
  """
  volumes = ledger.message_bits_per_round(kinds=("upload", "peer"))
  v = [bits for _, bits in volumes]
  cohort = [ledger.round_totals(r)["bits_total"] for r in ledger.rounds]
  return {
      "gce": gce_table(final_accuracy, v, gammas),
      "gce_best": gce_table(best_accuracy, v, gammas),
      "gce_cohort": gce_table(final_accuracy, cohort, gammas),
      "gce_message_bits": [[r, bits] for r, bits in volumes],
  }


def traffic_to_target(
    metrics: Sequence[Mapping[str, Any]],
    target_accuracy: float,
    *,
    accuracy_key: str = "test_accuracy",
    bytes_key: str = "bytes_total_cumulative",
    round_key: str = "round",
) -> dict[str, Any] | None:
  """Round and cumulative traffic at which a run first reaches an accuracy.

  Rows are scanned in order; rows without an accuracy (``None``/NaN, not
  evaluated) are skipped.

  Args:
    metrics: metric rows, e.g. from :func:`load_metrics`.
    target_accuracy: accuracy to reach (``>=`` counts as reached).
    accuracy_key: row key holding the accuracy.
    bytes_key: row key holding the cumulative traffic.
    round_key: row key holding the round index.

  Returns:
    ``{"round": row[round_key], "bytes": row[bytes_key]}`` for the first row
    whose accuracy is ``>= target_accuracy``, or ``None`` if no row is.

  Raises:
    ValueError: if the target is not a finite number, a row is not a mapping,
      or the first reaching row lacks ``round_key`` or ``bytes_key``.
  """
  target = float(target_accuracy)
  if not math.isfinite(target):
    raise ValueError(f"target_accuracy must be finite, got {target_accuracy!r}.")
  for i, row in enumerate(metrics):
    if not isinstance(row, Mapping):
      raise ValueError(f"metrics row {i} is not a mapping: {row!r}.")
    acc = row.get(accuracy_key)
    if acc is None or (isinstance(acc, float) and math.isnan(acc)):
      continue
    if float(acc) >= target:
      missing = [k for k in (round_key, bytes_key) if k not in row]
      if missing:
        raise ValueError(
            f"metrics row {i} reaches the target but lacks {missing}: {dict(row)!r}."
        )
      return {"round": row[round_key], "bytes": row[bytes_key]}
  return None


def load_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Reads a JSONL metrics file into a list of dicts.

  Blank lines are ignored. A malformed final line without its newline (a
  write cut short) is skipped with a warning; any other is an error.

  Args:
    path: path of the ``.jsonl`` file.

  Returns:
    One dict per line, in file order.

  Raises:
    ValueError: on a malformed line (with its line number) or a line that is
      not a JSON object.
  """
  with open(path, encoding="utf-8") as f:
    text = f.read()
  lines = text.split("\n")
  # The last element is "" when the file ends with a newline.
  last_unterminated = len(lines) - 1 if lines and lines[-1] != "" else None
  rows: list[dict[str, Any]] = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      if i == last_unterminated:
        _log.warning(
            "%s: skipping truncated last line %d (%s).", os.fspath(path), i + 1, e
        )
        continue
      raise ValueError(f"{os.fspath(path)}:{i + 1}: invalid JSON: {e}") from e
    if not isinstance(row, dict):
      raise ValueError(
          f"{os.fspath(path)}:{i + 1}: expected a JSON object, got {type(row).__name__}."
      )
    rows.append(row)
  return rows
