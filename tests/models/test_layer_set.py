"""The models' layer set (``layers.LayerSet``): resolved as the policy says,
a value, and without effect on the parameters."""

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models
from fedjax_dd import policy
from fedjax_dd.core import definition
from fedjax_dd.models import layers
from fedjax_dd.models.cgenerator import CGeneratorA
from fedjax_dd.models.layers import LayerSet


def _version(row):
  """A jax version inside ``row``'s range: its first."""
  return ".".join(str(v) for v in (row.jax_min + (0, 0, 0))[:3])


_ROWS = [pytest.param(row, id=f"{row.platform}-{_version(row)}")
         for row in policy.TABLE]


@pytest.mark.parametrize("row", _ROWS)
@pytest.mark.parametrize("model", [None, "LeNet5", "ConvNet", "CNN2", "CNN3",
                                   "Generator", "CGeneratorA"])
def test_from_policy_takes_every_form_from_the_row(row, model):
  ls = LayerSet.from_policy(model=model, platform=row.platform,
                            jax_version=_version(row))
  assert ls == LayerSet(conv_impl=policy.conv_form(model, row),
                        dtype=row.compute_dtype,
                        phase_split=row.phase_split,
                        fuse_first_block=row.fuse_first_block,
                        fold_norm=row.fold_norm)
  assert ls.conv_impl in policy.CONV_FORMS


@pytest.mark.parametrize("row", _ROWS)
def test_explicit_names_override_the_row(row):
  kw = dict(platform=row.platform, jax_version=_version(row))
  ls = LayerSet.from_policy("forward", "float32", model="CNN3", **kw)
  assert (ls.conv_impl, ls.dtype) == ("forward", jnp.float32)
  ls = LayerSet.from_policy("lax", "bfloat16", **kw)
  assert (ls.conv_impl, ls.dtype) == ("lax", jnp.bfloat16)
  assert ls.phase_split is row.phase_split


def test_unknown_names_are_refused():
  with pytest.raises(ValueError, match="Unknown conv_impl 'im2col'"):
    LayerSet(conv_impl="im2col")
  with pytest.raises(ValueError, match="Unknown conv_impl 'im2col'"):
    LayerSet.from_policy("im2col")
  with pytest.raises(ValueError, match="compute_dtype 'half'"):
    LayerSet.from_policy(compute_dtype="half")


def test_a_layer_set_is_a_frozen_hashable_value():
  a, b = LayerSet(dtype=jnp.bfloat16), LayerSet(dtype="bfloat16")
  assert a == b and hash(a) == hash(b) and a.dtype == jnp.bfloat16
  assert LayerSet(dtype=None).dtype is None
  with pytest.raises(dataclasses.FrozenInstanceError):
    a.conv_impl = "lax"
  # Models holding equal sets are equal (they share compiled programs).
  assert models.LeNet5(10, layers=a) == models.LeNet5(10, layers=b)
  assert hash(models.LeNet5(10, layers=a)) == hash(models.LeNet5(10,
                                                                 layers=b))
  assert models.LeNet5(10, layers=a) != models.LeNet5(10)


def test_for_model_resolves_auto_for_the_class_only():
  assert LayerSet().for_model("CNN3").conv_impl == policy.conv_form("CNN3")
  assert LayerSet().for_model("Generator").conv_impl == "lax"
  explicit = LayerSet(conv_impl="patches", phase_split=True)
  assert explicit.for_model("Generator") is explicit


def test_the_default_forms_are_the_policys():
  row = policy.current()
  ls = LayerSet()
  assert ls.fuses_first_block() is row.fuse_first_block
  assert LayerSet(fuse_first_block=not row.fuse_first_block
                  ).fuses_first_block() is not row.fuse_first_block
  # The layers it builds carry its fields.
  plain = LayerSet(conv_impl="lax", dtype="bfloat16", phase_split=False,
                   fold_norm=True)
  conv = plain.conv(4, (3, 3), padding="SAME", name="c")
  assert conv.dtype == jnp.bfloat16 and conv.features == 4
  assert conv.conv_general_dilated is jax.lax.conv_general_dilated
  assert plain.dense(3).dtype == jnp.bfloat16
  pool = plain.conv_relu_max_pool(6, (5, 5))
  assert (pool.conv_impl, pool.phase_split, pool.dtype) == (
      "lax", False, jnp.bfloat16)
  assert plain.hot_conv(4, (3, 3)).conv_impl == "lax"
  assert plain.instance_norm(epsilon=1e-5).fold is True
  x = jnp.ones((2,), jnp.float32)
  assert plain.promote(x)[0].dtype == jnp.bfloat16


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_the_registry_builds_the_policys_set(name):
  spec = models.get_model(name)
  module = spec.build(10)
  assert module.layers == LayerSet.from_policy(
      model=type(module).__name__)
  assert spec.build(10, "lax", "float32").layers == LayerSet.from_policy(
      "lax", "float32")


# sha256 (first 16 hex digits) of the sorted "path:shape:dtype" lines of
# each model's variables at its canonical input shape, 10 classes: taken
# from the models as they were before the layer set, whose fields each
# model carried itself. Checkpoints stay loadable as long as these hold.
_VARIABLE_SPECS = {
    "alexcifarnet": "e51ad50538865ad7",
    "alexcifarnet_proj": "b73dd01a0d2975ad",
    "alexnet": "2a325af976e33ab3",
    "alexnet_proj": "5192734c1b264b21",
    "cnn2": "23195ca274fbc68c",
    "cnn2_proj": "46536c4c9e671445",
    "cnn3": "32b6c5438e1c2484",
    "cnn3_proj": "8dcbe2d93f7a774d",
    "convnet3": "c7b22c61d3c829a4",
    "convnet3_proj": "1814fb51d5d6b5df",
    "digits_cnn": "268ec59f9cbe58d9",
    "digits_cnn_proj": "1b34bd8e345309eb",
    "fc": "a4757d69cd1896d9",
    "fc_proj": "0325d65b87a383f3",
    "hfldd_cifar_cnn": "ec40239dbf5892c8",
    "hfldd_cifar_cnn_proj": "0e4dc1b60efb8127",
    "lenet5": "1f03e7cc42d9cb48",
    "lenet5_proj": "31a1132431997344",
    "resnet18": "c43cb2a970dbe9d4",
    "resnet18_proj": "d0db73dd8820f72e",
    "generator": "01220a37a28289e1",
    "generator_cond": "949eeea027a3080b",
    "cgenerator": "0ef4f6db713bb2ee",
}


def _spec_digest(module, shape, **kw):
  x = jnp.zeros((1, *shape), jnp.float32)
  v = jax.eval_shape(lambda k: module.init(k, x, train=False, **kw),
                     jax.random.PRNGKey(0))
  rows = sorted(f"{jax.tree_util.keystr(p)}:{tuple(a.shape)}:{a.dtype}"
                for p, a in jax.tree_util.tree_flatten_with_path(v)[0])
  return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


_GENERATORS = {
    "generator": (lambda ls: models.Generator(out_shape=(32, 32, 3),
                                              layers=ls), (100,), {}),
    "generator_cond": (lambda ls: models.Generator(
        out_shape=(28, 28, 1), conditional=True, layers=ls), (100,),
                       {"y": jnp.zeros((1,), jnp.int32)}),
    "cgenerator": (lambda ls: CGeneratorA(out_shape=(32, 32, 3), layers=ls),
                   (100,), {"y": jnp.zeros((1,), jnp.int32)}),
}


@pytest.mark.parametrize("name", sorted(_VARIABLE_SPECS))
def test_variables_are_those_of_the_models_before_the_layer_set(name):
  plain = dict(conv_impl="lax", compute_dtype="float32")
  if name in _GENERATORS:
    make, shape, kw = _GENERATORS[name]
    built = [make(LayerSet()), make(LayerSet.from_policy(**plain)),
             make(LayerSet.from_policy(compute_dtype="bfloat16"))]
  else:
    spec = models.get_model(name)
    shape, kw = spec.input_shape, {}
    built = [spec.build(10), spec.build(10, **plain),
             spec.build(10, compute_dtype="bfloat16")]
  for module in built:
    assert _spec_digest(module, shape, **kw) == _VARIABLE_SPECS[name]


# Small stand-ins of every class (the code paths of the registered sizes).
_SMALL = {
    "lenet5": (lambda ls: models.LeNet5(5, layers=ls), (28, 28, 1)),
    "digits_cnn": (lambda ls: models.DigitsCNN(5, layers=ls), (8, 8, 1)),
    "convnet": (lambda ls: models.ConvNet(5, width=8, depth=2, layers=ls),
                (8, 8, 3)),
    "hfldd_cifar_cnn": (lambda ls: models.HFLDDCifarCNN(
        5, features=(4, 4), layers=ls), (8, 8, 3)),
    "alexnet": (lambda ls: models.AlexNet(5, hidden=(8,), layers=ls),
                (8, 8, 3)),
    "alexcifarnet": (lambda ls: models.AlexCifarNet(5, layers=ls),
                     (8, 8, 3)),
    "resnet": (lambda ls: models.ResNet(5, stage_sizes=(1, 1), width=4,
                                        layers=ls), (8, 8, 3)),
    "cnn3": (lambda ls: models.CNN3(5, features=(4, 4, 8), layers=ls),
             (8, 8, 3)),
    "fc": (lambda ls: models.FC(5, width=8, layers=ls), (4, 4, 1)),
}


@pytest.mark.parametrize("name", sorted(_SMALL))
def test_initial_values_do_not_depend_on_the_set(name):
  make, shape = _SMALL[name]
  key = jax.random.PRNGKey(3)
  ref = models.init_model(make(LayerSet()), key, shape)
  for ls in (LayerSet(conv_impl="lax", dtype="float32", phase_split=False,
                      fuse_first_block=False, fold_norm=False),
             LayerSet(conv_impl="patches", dtype="bfloat16",
                      phase_split=True, fuse_first_block=True,
                      fold_norm=True)):
    jax.tree.map(np.testing.assert_array_equal, ref,
                 models.init_model(make(ls), key, shape))


def test_a_run_records_the_set_as_forms_not_as_its_definition():
  a = models.get_model("lenet5").build(10, "lax", "bfloat16")
  b = models.get_model("lenet5").build(10, "patches", "float32")
  forms = definition.forms_of(a)
  assert forms["task.conv_impl"] == "lax"
  assert forms["task.dtype"] == "bfloat16"
  assert forms["task.phase_split"] is a.layers.phase_split
  assert {"task.fuse_first_block", "task.fold_norm"} <= set(forms)
  assert definition.describe(a) == definition.describe(b)
  # MOON's network takes its base's set.
  proj = models.get_model("lenet5_proj").build(10, compute_dtype="bfloat16")
  assert proj.layers == proj.base.layers
  assert definition.forms_of(proj)["task.dtype"] == "bfloat16"


def test_cgenerator_builds_its_convolutions_through_its_set(monkeypatch):
  seen = []
  conv = layers.conv

  def recording(impl, *args, **kwargs):
    seen.append((impl, kwargs.get("dtype")))
    return conv(impl, *args, **kwargs)

  monkeypatch.setattr(layers, "conv", recording)
  z, y = jnp.zeros((2, 4)), jnp.array([0, 1])
  gen = CGeneratorA(out_shape=(8, 8, 1), nz=4, ngf=2, num_classes=2,
                    layers=layers.LayerSet(conv_impl="patches",
                                           dtype=jnp.bfloat16))
  gen.init(jax.random.PRNGKey(0), z, y, train=False)
  assert seen == [("patches", jnp.bfloat16)] * 3
