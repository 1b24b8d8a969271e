"""LeNet-5's phase-split first layer trains real MNIST as the plain one does."""

import jax
import numpy as np
import optax
import pytest

from fedjax_dd.models.layers import LayerSet
from fedjax_dd.models.lenet import LeNet5
from tests.conftest import shared_dataset


def _train_and_test(phase_split: bool, seed: int, x, y, xt, yt) -> float:
  module = LeNet5(layers=LayerSet(phase_split=phase_split))
  params = module.init(jax.random.PRNGKey(seed), x[:2], train=True)
  opt = optax.sgd(0.05, momentum=0.9)
  state = opt.init(params)

  @jax.jit
  def step(params, state, xb, yb):
    def loss(p):
      logits = module.apply(p, xb, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
    updates, state = opt.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  rng = np.random.default_rng(seed)
  for _ in range(2):  # two epochs, batch 64
    order = rng.permutation(len(x))
    for i in range(0, len(order) - 63, 64):
      b = order[i:i + 64]
      params, state = step(params, state, x[b], y[b])
  predict = jax.jit(lambda p, xb: module.apply(p, xb, train=False).argmax(-1))
  pred = np.concatenate([predict(params, xt[i:i + 1000])
                         for i in range(0, len(xt), 1000)])
  return float(np.mean(pred == yt))


@pytest.mark.slow  # about a minute: eight epochs of LeNet-5 on MNIST
def test_phase_split_lenet5_matches_plain_on_mnist():
  data = np.load(shared_dataset("mnist.npz"))
  # [N, 28, 28] or [N, 28, 28, 1] uint8, as sources.load_dataset accepts.
  x = data["x_train"].reshape(-1, 28, 28, 1).astype(np.float32) / 255.0
  xt = data["x_test"].reshape(-1, 28, 28, 1).astype(np.float32) / 255.0
  y, yt = data["y_train"].astype(np.int32), data["y_test"].astype(np.int32)
  for seed in (0, 1):
    plain = _train_and_test(False, seed, x, y, xt, yt)
    split = _train_and_test(True, seed, x, y, xt, yt)
    # Same function to rounding: both train to LeNet-5's usual accuracy and
    # land within seed-to-seed noise of each other.
    assert plain > 0.97 and split > 0.97, (plain, split)
    assert abs(plain - split) < 0.01, (plain, split)
