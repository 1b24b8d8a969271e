"""Membership-inference metrics: AUC and TPR at a low FPR (host side).

Every attack in :mod:`fedjax_dd.audit` gives each candidate a score, higher
meaning "more likely a member". Following Carlini et al. 2022 ("Membership
Inference Attacks From First Principles"), an attack is judged above all
by its true-positive rate at a low false-positive rate (1 % and 0.1 %), the
largest TPR among the ROC points with FPR at most the target, with the AUC
beside it (scikit-learn's ``roc_curve``, ``roc_auc_score``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
from sklearn import metrics

from fedjax_dd.audit import _inputs
from fedjax_dd.core import checks

FPRS = (0.01, 0.001)
"""The false-positive rates at which TPR is reported (Carlini et al. 2022)."""


@dataclasses.dataclass(frozen=True)
class MIAResult:
  """One client's membership-inference figures.

  Attributes:
    auc: area under the ROC curve (0.5: no better than a coin).
    tpr_at_fpr: ``{fpr: tpr}``, the largest TPR whose FPR is ``<= fpr``.
    num_members: members scored.
    num_nonmembers: non-members scored.
  """
  auc: float
  tpr_at_fpr: dict[float, float]
  num_members: int
  num_nonmembers: int


def _finite(scores: np.ndarray) -> np.ndarray:
  """``scores`` with ``+-inf`` moved just past the finite ones (same ranks:
  scikit-learn refuses infinities), e.g. a candidate with no upload of its
  class."""
  finite = scores[np.isfinite(scores)]
  lo, hi = (finite.min() - 1.0, finite.max() + 1.0) if finite.size else (
      -1.0, 1.0)
  return np.where(scores == np.inf, hi, np.where(scores == -np.inf, lo,
                                                  scores))


def mia_metrics(member_scores: Any, nonmember_scores: Any, *,
                fprs: Sequence[float] = FPRS) -> MIAResult:
  """AUC and TPR at low FPR of scores for members and non-members.

  Args:
    member_scores: ``[N]`` scores of members (higher: more likely member);
      ``+-inf`` allowed, NaN refused.
    nonmember_scores: ``[M]`` scores of non-members.
    fprs: the target false-positive rates, each in ``(0, 1)``.

  Returns:
    A :class:`MIAResult`.

  Raises:
    fedjax_dd.core.checks.SettingError: an empty member or non-member set,
      scores not 1-D or holding NaN, an FPR outside ``(0, 1)``.
  """
  fprs = _inputs.fprs(fprs)
  parts = []
  for name, s in (("member_scores", member_scores),
                  ("nonmember_scores", nonmember_scores)):
    s = np.asarray(jax.device_get(s), np.float64)
    if s.ndim != 1 or s.size == 0:
      checks.refuse(name, "a non-empty 1-D array (one score per candidate)",
                    s.shape)
    if np.isnan(s).any():
      checks.refuse(name, "numbers (no NaN)", f"{int(np.isnan(s).sum())} NaN")
    parts.append(s)
  labels = np.concatenate([np.ones(parts[0].size), np.zeros(parts[1].size)])
  scores = _finite(np.concatenate(parts))
  fpr, tpr, _ = metrics.roc_curve(labels, scores, drop_intermediate=False)
  return MIAResult(
      auc=float(metrics.roc_auc_score(labels, scores)),
      tpr_at_fpr={f: float(tpr[fpr <= f].max()) for f in fprs},
      num_members=int(parts[0].size), num_nonmembers=int(parts[1].size))


def mia_metrics_batched(member_scores: Any, num_members: Any,
                        nonmember_scores: Any, num_nonmembers: Any, *,
                        fprs: Sequence[float] = FPRS) -> list[MIAResult]:
  """:func:`mia_metrics` of each client of padded score stacks (host-side
  curves, one per client).

  Args:
    member_scores: ``[C, N_max]`` members' scores; rows past
      ``num_members[c]`` are padding.
    num_members: ``[C]`` valid member rows, each ``>= 1``.
    nonmember_scores: ``[C, M_max]`` non-members' scores.
    num_nonmembers: ``[C]`` valid non-member rows, each ``>= 1``.
    fprs: as :func:`mia_metrics`.

  Returns:
    ``C`` :class:`MIAResult`, in client order.

  Raises:
    fedjax_dd.core.checks.SettingError: mismatched shapes, a count outside
      ``[1, N_max]``, or as :func:`mia_metrics`.
  """
  fprs = _inputs.fprs(fprs)
  ms, ns = jax.device_get((member_scores, nonmember_scores))
  c, n_max = _inputs.shape("member_scores", ms, 2, "scores [C, N_max]")
  _, m_max = _inputs.shape("nonmember_scores", ns, 2, "scores [C, M_max]")
  if np.shape(ns)[0] != c:
    checks.refuse("nonmember_scores", f"[C, M_max] with the members' C = {c}",
                  np.shape(ns))
  nm = _inputs.counts("num_members", num_members, c, n_max)
  nn = _inputs.counts("num_nonmembers", num_nonmembers, c, m_max)
  return [mia_metrics(ms[i, :nm[i]], ns[i, :nn[i]], fprs=fprs)
          for i in range(c)]  # host-side curves, one per client
