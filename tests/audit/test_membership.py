"""AUC and TPR at low FPR of hand-built score arrays."""

import numpy as np
import pytest

from fedjax_dd.audit import membership
from fedjax_dd.core.checks import SettingError


def test_hand_checked_auc_and_tpr_at_fpr():
  # Member > non-member in 8 of the 9 pairs (0.3 loses to 0.7 only). At FPR
  # 0 the threshold sits above 0.7: TPR 2/3; at FPR 1/3 (<= 0.5) all three.
  r = membership.mia_metrics([0.9, 0.8, 0.3], [0.7, 0.2, 0.1],
                             fprs=(0.01, 0.5))
  assert r.auc == pytest.approx(8 / 9)
  assert r.tpr_at_fpr == {0.01: pytest.approx(2 / 3), 0.5: 1.0}
  assert (r.num_members, r.num_nonmembers) == (3, 3)


def test_separated_and_infinite_scores():
  r = membership.mia_metrics([3.0, 4.0, np.inf], [-np.inf, 1.0, 2.0])
  assert r.auc == 1.0 and r.tpr_at_fpr == {0.01: 1.0, 0.001: 1.0}
  # All tied: a coin.
  assert membership.mia_metrics([1.0] * 4, [1.0] * 4).auc == 0.5


def test_batched_reads_only_the_valid_rows():
  ms = np.array([[0.9, 0.8, 0.3], [5.0, -9.0, -9.0]])
  ns = np.array([[0.7, 0.2, 0.1], [1.0, 9.0, 9.0]])
  r = membership.mia_metrics_batched(ms, [3, 1], ns, [3, 1])
  assert r[0] == membership.mia_metrics(ms[0], ns[0])
  assert r[1].auc == 1.0 and r[1].num_members == 1


@pytest.mark.parametrize("fpr", [0.0, 1.0, 1.5, -0.1, float("nan")])
def test_an_fpr_outside_the_open_unit_interval_is_refused(fpr):
  with pytest.raises(SettingError, match=r"^fpr must be a finite number > 0 "
                     r"and < 1, got"):
    membership.mia_metrics([1.0], [0.0], fprs=(fpr,))


def test_empty_sets_nan_and_bad_counts_are_refused():
  with pytest.raises(SettingError, match="member_scores must be a non-empty"):
    membership.mia_metrics([], [0.0])
  with pytest.raises(SettingError, match="nonmember_scores must be numbers"):
    membership.mia_metrics([1.0], [np.nan])
  with pytest.raises(SettingError, match=r"num_members must be in \[1, 3\]"):
    membership.mia_metrics_batched(np.zeros((2, 3)), [3, 0],
                                   np.zeros((2, 3)), [3, 3])
  with pytest.raises(SettingError, match="with the members' C = 2"):
    membership.mia_metrics_batched(np.zeros((2, 3)), [3, 3],
                                   np.zeros((1, 3)), [3])
