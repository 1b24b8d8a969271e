"""The registry's digits model must train to >= 90% test accuracy centrally."""

import jax
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

from fedjax_dd import models


@pytest.mark.slow  # a few seconds of real training
def test_digits_cnn_reaches_90_percent():
  digits = load_digits()  # bundled with scikit-learn, no download
  x = (digits.images.astype(np.float32) / 16.0)[..., None]  # [N, 8, 8, 1]
  y = digits.target.astype(np.int32)
  rng = np.random.default_rng(0)
  perm = rng.permutation(len(x))
  train, test = perm[:1437], perm[1437:]  # 80/20 split
  x = (x - x[train].mean()) / x[train].std()

  spec = models.get_model("digits_cnn")
  module = spec.build(10)
  params = models.init_model(module, jax.random.key(0, impl="rbg"),
                             spec.input_shape)["params"]
  opt = optax.adam(1e-3)
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, xb, yb):
    def loss_fn(p):
      logits = module.apply({"params": p}, xb, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    grads = jax.grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  batch = 64
  for _ in range(4):
    order = rng.permutation(train)
    for i in range(0, len(order) - batch + 1, batch):
      b = order[i:i + batch]
      params, opt_state = step(params, opt_state, x[b], y[b])

  logits = module.apply({"params": params}, x[test], train=False)
  accuracy = float(np.mean(np.argmax(logits, -1) == y[test]))
  assert accuracy >= 0.9, accuracy
