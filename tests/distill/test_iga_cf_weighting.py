"""IGA's L_cf weighting: Eq. 10's per-sample form and FedFTG's batch-mean form."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.distill import iga


def _ce(logits, y):
  logits = np.asarray(logits, np.float64)
  return np.log(np.sum(np.exp(logits))) - logits[y]


def test_batch_mean_is_fedftgs_form_hand_computed():
  # Teacher 0 holds class 0 only, teacher 1 class 1 only; sample 1 (label 1)
  # is one teacher 0 gets badly wrong.
  logits = jnp.array([[[0.0, 0.0], [10.0, -10.0]],
                      [[0.0, 0.0], [0.0, 0.0]]])
  y = jnp.array([0, 1])
  w = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  ce00, ce01 = _ce([0, 0], 0), _ce([10, -10], 1)
  ce1 = _ce([0, 0], 0)
  per_sample = iga.cluster_fidelity_loss(logits, y, w)
  np.testing.assert_allclose(per_sample, (ce00 + ce1) / 2, rtol=1e-6)
  # FedFTG: Σ_k mean_i(w_ki) · mean_i CE_ki, teacher 0's wrong sample in.
  batch_mean = iga.cluster_fidelity_loss(logits, y, w, "batch_mean")
  np.testing.assert_allclose(batch_mean,
                             0.5 * (ce00 + ce01) / 2 + 0.5 * ce1, rtol=1e-6)


def test_batch_mean_selects_away_padded_teachers():
  logits = jnp.array([[[1.0, 0.0], [0.0, 2.0]],
                      [[jnp.nan, jnp.inf], [jnp.nan, jnp.nan]]])
  y = jnp.array([0, 1])
  w = jnp.array([[1.0, 1.0], [0.0, 0.0]])
  got = iga.cluster_fidelity_loss(logits, y, w, "batch_mean")
  want = (_ce([1, 0], 0) + _ce([0, 2], 1)) / 2
  np.testing.assert_allclose(got, want, rtol=1e-6)
  with pytest.raises(ValueError, match="weighting"):
    iga.cluster_fidelity_loss(logits, y, w, "sum")


def test_hparams_check_cf_weighting():
  hp = iga.IGAHyperParams(cf_weighting="batch_mean")
  assert hp.cf_weighting == "batch_mean"
  assert iga.IGAHyperParams().cf_weighting == "per_sample"
  with pytest.raises(ValueError, match="cf_weighting"):
    dataclasses.replace(hp, cf_weighting="mean")
