"""PyTorch's default initialisation (models/param_init.py)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models
from fedjax_dd.core.task import Classifier
from fedjax_dd.models import param_init


class _Net(nn.Module):

  @nn.compact
  def __call__(self, x, *, train):
    x = nn.Conv(6, (5, 5), padding="VALID", name="conv")(x)   # fan_in 25
    x = nn.BatchNorm(use_running_average=not train, name="bn")(x)
    x = x.reshape(x.shape[0], -1)
    x = nn.Dense(400, name="fc1")(x)                          # fan_in 96
    return nn.Dense(3, use_bias=False, name="fc2")(x)         # fan_in 400


def _params(key=0):
  v = _Net().init(jax.random.PRNGKey(key), jnp.zeros((1, 8, 8, 1)),
                  train=False)
  return v["params"]


def test_bounds_are_one_over_sqrt_fan_in():
  p = param_init.torch_default(_params(), jax.random.PRNGKey(1))
  for layer, fan_in in (("conv", 5 * 5 * 1), ("fc1", 4 * 4 * 6),
                        ("fc2", 400)):
    bound = 1 / np.sqrt(fan_in)
    w = np.asarray(p[layer]["kernel"])
    assert np.abs(w).max() <= bound
    # Uniform on [-b, b]: the largest draw of thousands is near b (not
    # LeCun-normal's sqrt(1/fan_in) spread, nor a zero bias).
    assert np.abs(w).max() > 0.9 * bound
    if "bias" in p[layer]:
      b = np.asarray(p[layer]["bias"])
      assert np.abs(b).max() <= bound and np.abs(b).max() > 0
  # fc1's 38,400 draws: the variance of U(-b, b) is b^2 / 3 = 1 / 288.
  np.testing.assert_allclose(np.var(np.asarray(p["fc1"]["kernel"])),
                             1 / (3 * 96), rtol=0.03)


def test_batchnorm_and_shapes_unchanged():
  before = _params()
  after = param_init.torch_default(before, jax.random.PRNGKey(1))
  assert (jax.tree_util.tree_structure(after)
          == jax.tree_util.tree_structure(before))
  for a, b in zip(jax.tree_util.tree_leaves(after),
                  jax.tree_util.tree_leaves(before)):
    assert a.shape == b.shape and a.dtype == b.dtype
  np.testing.assert_array_equal(after["bn"]["scale"], before["bn"]["scale"])
  np.testing.assert_array_equal(after["bn"]["bias"], before["bn"]["bias"])


def test_deterministic_and_per_layer_keys():
  a = param_init.torch_default(_params(0), jax.random.PRNGKey(1))
  b = param_init.torch_default(_params(5), jax.random.PRNGKey(1))
  # The draw depends on the key only, not on the values it replaces.
  np.testing.assert_array_equal(a["fc1"]["kernel"], b["fc1"]["kernel"])
  c = param_init.torch_default(_params(0), jax.random.PRNGKey(2))
  assert not np.array_equal(a["fc1"]["kernel"], c["fc1"]["kernel"])


def test_classifier_applies_it_after_its_own_init():
  spec = models.get_model("lenet5")
  module = spec.build(10)
  plain = Classifier(module, spec.input_shape, lambda x: x, 10)
  torch = Classifier(module, spec.input_shape, lambda x: x, 10,
                     param_init=param_init.torch_default)
  key = jax.random.PRNGKey(3)
  p0, _ = plain.init(key)
  p1, _ = torch.init(key)
  # Flax's: zero biases; PyTorch's: uniform biases within 1/sqrt(fan_in).
  assert not np.any(np.asarray(p0["fc3"]["bias"]))
  assert 0 < np.abs(np.asarray(p1["fc3"]["bias"])).max() <= 1 / np.sqrt(84)
  assert np.abs(np.asarray(p1["conv2"]["kernel"])).max() <= 1 / np.sqrt(150)


def test_unknown_scheme_is_refused():
  assert param_init.init_scheme("") is None
  assert param_init.init_scheme("torch") is param_init.torch_default
  with pytest.raises(ValueError, match="Unknown initialisation 'kaiming'"):
    param_init.init_scheme("kaiming")
