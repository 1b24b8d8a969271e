"""Forward passes, BatchNorm behaviour and the registry."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models

NUM_CLASSES = 7  # Not 10, so a hard-coded head size would show.
# Parameter initialisation with the default threefry keys compiles one RNG
# kernel per parameter shape, which dominates these tests on a CPU; the
# models do not care which key implementation they get.
KEY = functools.partial(jax.random.key, impl="rbg")
# resnet18: 11M parameters, a small ResNet covers the code path;
# hfldd_cifar_cnn: its conv + BatchNorm path is the other BN models'.
_SLOW = ("resnet18", "hfldd_cifar_cnn")


def _names(only_bn=False):
  return [
      pytest.param(n, marks=pytest.mark.slow) if n in _SLOW else n
      for n, s in sorted(models.MODELS.items())
      if s.has_batch_stats or not only_bn
  ]


def _batch(shape, n=2, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.normal(size=(n, *shape)), jnp.float32)


@functools.lru_cache(maxsize=None)
def _registry_model(name):
  spec = models.get_model(name)
  module = spec.build(NUM_CLASSES)
  return spec, module, models.init_model(module, KEY(0), spec.input_shape)


def _jit_apply(module):
  # One compilation per model is cheaper than eager op-by-op dispatch.
  return jax.jit(module.apply, static_argnames=("train", "mutable"))


def _tree_allclose(a, b):
  return all(
      np.allclose(x, y) for x, y in zip(jax.tree_util.tree_leaves(a),
                                        jax.tree_util.tree_leaves(b)))


def test_registry_names():
  assert set(models.MODELS) >= {
      "lenet5", "convnet3", "hfldd_cifar_cnn", "alexnet", "resnet18", "cnn2",
      "cnn3", "fc", "digits_cnn"}
  assert {n for n, s in models.MODELS.items() if s.has_batch_stats} == {
      "hfldd_cifar_cnn", "resnet18", "cnn2", "cnn3"}
  for name, spec in models.MODELS.items():
    assert spec.name == name
    assert len(spec.input_shape) == 3
    assert spec.description


def test_get_model_unknown_lists_names():
  with pytest.raises(ValueError, match="lenet5") as e:
    models.get_model("lenet6")
  assert "resnet18" in str(e.value)


def test_registry_is_read_only_and_spec_frozen():
  with pytest.raises(TypeError):
    models.MODELS["x"] = models.MODELS["fc"]
  with pytest.raises(dataclasses.FrozenInstanceError):
    models.get_model("fc").name = "y"


def _check_forward(module, variables, input_shape, has_batch_stats):
  assert module.num_classes == NUM_CLASSES
  assert set(variables) == (
      {"params", "batch_stats"} if has_batch_stats else {"params"})
  logits = _jit_apply(module)(variables, _batch(input_shape), train=False)
  assert logits.shape == (2, NUM_CLASSES)
  assert logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))


def _check_batch_norm(module, variables, input_shape):
  apply = _jit_apply(module)
  x = _batch(input_shape, n=3, seed=1) + 0.5
  logits, updates = apply(variables, x, train=True, mutable=("batch_stats",))
  assert logits.shape == (3, NUM_CLASSES)
  assert np.all(np.isfinite(logits))
  old = jax.tree_util.tree_leaves(variables["batch_stats"])
  new = jax.tree_util.tree_leaves(updates["batch_stats"])
  assert len(old) == len(new) > 0
  for o, n in zip(old, new):
    assert not np.allclose(o, n), "every running mean/var must move"

  # Eval mode reads batch_stats: swapping in the updated ones changes logits.
  updated = {"params": variables["params"], **updates}
  eval_old = apply(variables, x, train=False)
  eval_new = apply(updated, x, train=False)
  assert not np.allclose(eval_old, eval_new)
  # Train mode normalises with batch statistics instead.
  assert not np.allclose(logits, eval_old)


@pytest.mark.parametrize("name", _names())
def test_registry_forward_shape_finite_and_collections(name):
  spec, module, variables = _registry_model(name)
  _check_forward(module, variables, spec.input_shape, spec.has_batch_stats)


@pytest.mark.parametrize("name", _names(only_bn=True))
def test_registry_batch_norm_train_updates_stats_and_eval_uses_them(name):
  spec, module, variables = _registry_model(name)
  _check_batch_norm(module, variables, spec.input_shape)


def test_small_resnet_forward_and_batch_norm():
  # Two stages so that the strided projection shortcut is exercised.
  module = models.ResNet(NUM_CLASSES, stage_sizes=(1, 2), width=4)
  variables = models.init_model(module, KEY(0), (8, 8, 3))
  assert "proj_conv" in variables["params"]["stage2_block1"]
  assert "proj_conv" not in variables["params"]["stage2_block2"]
  _check_forward(module, variables, (8, 8, 3), True)
  _check_batch_norm(module, variables, (8, 8, 3))


def test_no_batch_stats_models_do_not_need_mutable():
  spec, module, variables = _registry_model("lenet5")
  x = _batch(spec.input_shape)
  np.testing.assert_allclose(module.apply(variables, x, train=True),
                             module.apply(variables, x, train=False))


def test_models_reject_non_nhwc_input():
  _, module, variables = _registry_model("lenet5")
  with pytest.raises(ValueError, match="NHWC"):
    module.apply(variables, jnp.zeros((28, 28, 1)), train=False)


class _FlaxConvNet(nn.Module):
  """ConvNet-``depth`` from flax's own layers, the conv bias added."""

  depth: int = 2
  width: int = 8

  @nn.compact
  def __call__(self, x, *, train):
    del train
    for i in range(self.depth):
      x = nn.Conv(self.width, (3, 3), padding="SAME", name=f"conv{i + 1}")(x)
      x = nn.InstanceNorm(epsilon=1e-5, name=f"norm{i + 1}")(x)
      x = nn.avg_pool(nn.relu(x), (2, 2), strides=(2, 2))
    return nn.Dense(5, name="fc")(x.reshape(x.shape[0], -1))


def _assert_grads_close(g, g_ref):
  # Within 1e-5 of the largest gradient entry of the whole model (some
  # leaves are zero up to rounding).
  scale = max(float(np.abs(a).max()) for a in jax.tree.leaves(g_ref))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=0, atol=1e-5 * scale), g, g_ref)


@pytest.mark.slow
def test_convnet_is_flax_convnet_with_its_conv_biases_cancelled():
  # ConvNet does not add its conv biases: instance norm subtracts each
  # channel's spatial mean, so with non-zero biases it still computes flax's
  # ConvNet, and the biases' gradients are zero.
  ours, theirs = models.ConvNet(5, width=8, depth=2), _FlaxConvNet()
  x = 2 * jax.random.normal(KEY(0), (3, 8, 8, 2)) + 1
  v = ours.init(KEY(1), x, train=False)
  assert (jax.tree.map(jnp.shape, v)
          == jax.tree.map(jnp.shape, theirs.init(KEY(1), x, train=False)))
  v = jax.tree.map(lambda a: a + 0.3, v)  # biases 0.3 everywhere
  loss = lambda m, v: jnp.sum(jnp.sin(m.apply(v, x, train=True)))
  np.testing.assert_allclose(ours.apply(v, x, train=False),
                             theirs.apply(v, x, train=False),
                             rtol=1e-5, atol=1e-5)
  g, g_ref = (jax.grad(loss, 1)(m, v) for m in (ours, theirs))
  for name in ("conv1", "conv2"):
    np.testing.assert_array_equal(g["params"][name]["bias"], np.zeros(8))
    # flax's bias gradient is zero up to rounding.
    np.testing.assert_allclose(g_ref["params"][name]["bias"], 0.0, atol=1e-5)
  _assert_grads_close(g, g_ref)


def test_cnn3_kernel_gradients_per_layer_equal_lax_and_are_checked():
  # CNN3's per-layer kernel gradients on CPU ("gemm", "taps", "taps") give
  # the gradients of all-lax ones to float rounding; a count that does not
  # match the convolutions is refused before any compute.
  x = jax.random.normal(KEY(0), (4, 8, 8, 3))
  ours = models.CNN3(5, features=(4, 8, 8),
                     weight_grads=("gemm", "taps", "taps"))
  ref = models.CNN3(5, features=(4, 8, 8), weight_grads=())
  v = ours.init(KEY(1), x, train=False)
  loss = lambda m, p: jnp.sum(jnp.sin(m.apply(
      {**v, "params": p}, x, train=True, mutable=["batch_stats"])[0]))
  g, g_ref = (jax.grad(loss, 1)(m, v["params"]) for m in (ours, ref))
  _assert_grads_close(g, g_ref)
  with pytest.raises(ValueError, match="3 convolutions but 2 weight_grads"):
    models.CNN3(5, weight_grads=("gemm", "taps")).init(
        KEY(0), jnp.zeros((1, 32, 32, 3)), train=False)


@pytest.mark.parametrize("module,shape", [
    (models.ConvNet(10, depth=3), (4, 4, 1)),
    (models.CNN3(10), (4, 4, 3)),
    (models.HFLDDCifarCNN(10), (8, 8, 3)),
])
def test_too_small_input_raises(module, shape):
  with pytest.raises(ValueError, match="needs H, W"):
    module.init(KEY(0), jnp.zeros((1, *shape)), train=False)


def test_fc_forward_by_hand():
  # One hidden ReLU layer: logits = relu(x_flat @ W1 + b1) @ W2 + b2.
  module = models.FC(3, width=4, depth=1)
  variables = models.init_model(module, KEY(0), (2, 3, 1))
  x = _batch((2, 3, 1))
  p = variables["params"]
  h = np.maximum(np.asarray(x).reshape(2, 6) @ p["fc1"]["kernel"]
                 + p["fc1"]["bias"], 0.0)
  expected = h @ p["head"]["kernel"] + p["head"]["bias"]
  np.testing.assert_allclose(module.apply(variables, x, train=False),
                             expected, rtol=1e-5, atol=1e-6)


def test_init_model_is_deterministic_in_key():
  spec = models.get_model("digits_cnn")
  module = spec.build(10)
  a = models.init_model(module, KEY(3), spec.input_shape)
  b = models.init_model(module, KEY(3), spec.input_shape)
  c = models.init_model(module, KEY(4), spec.input_shape)
  assert _tree_allclose(a, b)
  assert not _tree_allclose(a, c)


def test_lenet_gradients_finite_and_nonzero():
  spec, module, variables = _registry_model("lenet5")
  x = _batch(spec.input_shape)

  def loss(params):
    return jnp.sum(module.apply({"params": params}, x, train=True) ** 2)

  grads = jax.jit(jax.grad(loss))(variables["params"])
  for g in jax.tree_util.tree_leaves(grads):
    assert np.all(np.isfinite(g))
    assert np.any(g != 0)
