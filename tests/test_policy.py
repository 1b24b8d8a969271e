"""The one table of layer forms and client-mapper defaults (fedjax_dd.policy)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models
from fedjax_dd import policy
from fedjax_dd.core import clients
from fedjax_dd.models import fused_block
from fedjax_dd.models import layers

_VERSIONS = ("0.4.30", "0.5.3", "0.5.9", "0.6.0", "0.7.2", "0.9.9", "0.10.0",
             "0.10.2", "0.12.0.1", "1.0")


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("version", _VERSIONS)
def test_exactly_one_row_covers_each_platform_and_version(platform, version):
  v = policy.versions.version_tuple(version)
  rows = [r for r in policy.TABLE if r.covers(platform, v)]
  assert len(rows) == 1
  assert policy.lookup(platform, version) is rows[0]


# (version, conv, fold_norm, memory factor): the CPU choices the layers and
# the kernel memory model made before the table held them.
@pytest.mark.parametrize("version, conv, fold, memory", [
    ("0.4.30", "lax", True, 1.0), ("0.5.3", "lax", True, 1.0),
    ("0.6.0", "lax", False, 2.6), ("0.9.9", "lax", False, 2.6),
    ("0.10.0", "patches", False, 2.6), ("0.10.2rc1", "patches", False, 2.6),
    ("0.12.0.1", "patches", False, 2.6)])
def test_cpu_rows_keep_the_measured_forms(version, conv, fold, memory):
  row = policy.lookup("cpu", version)
  assert (row.conv, row.fold_norm, row.ntk_grad_memory_factor) == (
      conv, fold, memory)
  assert row.kernel_grad == "matmul"
  assert row.phase_split and row.fuse_first_block
  assert (row.backend, row.backend_devices, row.kip_backend) == (
      "chunked", "sharded", "vmap")
  # FedHydra's stratification as one vmap on one device (several: sharded).
  assert row.stratify_backend == "vmap"
  assert (row.chunk_size, row.thunk_chunk_size) == (2, 1)
  # jax 0.10 removed the classic runtime's option: those rows do not ask.
  classic = {"xla_cpu_use_thunk_runtime": False}
  assert dict(row.compiler_options) == (
      {} if conv == "patches" else classic)
  assert dict(row.per_core_options) == {"xla_cpu_multi_thread_eigen": False}
  assert row.measured != policy.NOT_MEASURED
  assert row.max_vmap_elements is None  # auto is chunked on one CPU device
  assert row.compute_dtype == "float32"  # no fast bfloat16 on XLA:CPU
  assert policy.resolve_compute_dtype("auto", "cpu", version) == "float32"
  # The layer helpers read the same row.
  assert layers.resolve_conv_impl("auto", "cpu", version) == conv
  assert layers.instance_norm_folds("cpu", version) is fold


@pytest.mark.parametrize("platform", ["gpu", "tpu", "metal"])
@pytest.mark.parametrize("version", ["0.5.3", "0.12.0.1"])
def test_accelerator_rows_are_plain_xla(platform, version):
  row = policy.lookup(platform, version)
  assert row.platform == platform
  # Only the GPU row of newer jax was run (an H100 with jax 0.11.2).
  assert (row.measured == policy.NOT_MEASURED) is not (
      platform == "gpu" and version == "0.12.0.1")
  # XLA:GPU's 32-bit indexing caps an auto vmap's arrays (another plugin
  # gets the GPU row's forms); TPU: no cap measured.
  assert row.max_vmap_elements == (None if platform == "tpu" else 2**31 - 1)
  assert (row.conv, row.kernel_grad) == ("lax", "lax")
  assert not (row.phase_split or row.fuse_first_block or row.fold_norm)
  assert (row.backend, row.backend_devices, row.kip_backend,
          row.stratify_backend) == ("vmap", "sharded", None, None)
  assert row.chunk_size is None and row.thunk_chunk_size is None
  assert row.compiler_options == () and row.per_core_options == ()
  assert layers.resolve_conv_impl("auto", platform, version) == "lax"
  assert not layers.instance_norm_folds(platform, version)
  assert policy.kernel_grads("ConvNet", 3, row) == ("lax",) * 3
  # Tensor cores and the MXU: bfloat16 convolutions and matmuls.
  assert row.compute_dtype == "bfloat16"
  assert policy.resolve_compute_dtype("auto", platform, version) == (
      "bfloat16")
  # The memory model keeps the version's figure (an over-estimate is safe).
  assert row.ntk_grad_memory_factor == policy.lookup(
      "cpu", version).ntk_grad_memory_factor


def test_kernel_grads_per_model_on_cpu():
  row = policy.lookup("cpu", "0.5.3")
  assert policy.kernel_grads("ConvNet", 3, row) == ("gemm", "taps", "taps")
  assert policy.kernel_grads("CNN3", 3, row) == ("gemm", "taps", "taps")
  assert policy.kernel_grads("HFLDDCifarCNN", 8, row) == (
      ("gemm",) + ("taps",) * 7)
  # CNN2's taps ran slower; unlisted models keep lax's.
  assert policy.kernel_grads("CNN2", 2, row) == ("lax", "lax")
  assert policy.kernel_grads("DigitsCNN", 2, row) == ("lax", "lax")


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("version", _VERSIONS)
def test_generators_keep_lax_convolutions_on_every_row(platform, version):
  row = policy.lookup(platform, version)
  for name in ("Generator", "CGeneratorA"):
    assert name in policy.LAX_CONV_MODELS
    assert policy.conv_form(name, row) == "lax"
    assert layers.resolve_conv_impl("auto", platform, version, name) == "lax"
    # An explicit form is kept.
    assert layers.resolve_conv_impl("patches", platform, version,
                                    name) == "patches"
  # Any other model, or none named, takes the row's form.
  assert policy.conv_form("LeNet5", row) == policy.conv_form(None, row) == (
      row.conv) == layers.resolve_conv_impl("auto", platform, version)


def test_the_generators_exception_differs_from_newer_cpu_rows():
  # Where the exception matters: the classifiers' CPU form is patches.
  assert policy.lookup("cpu", "0.12.0.1").conv == "patches"
  assert policy.conv_form("CGeneratorA", policy.lookup("cpu", "0.12.0.1")) == (
      "lax")


def _record_conv_forms(monkeypatch):
  """The list each ``layers.conv`` call's form is appended to."""
  seen = []
  conv = layers.conv

  def recording(impl, *args, **kwargs):
    seen.append(impl)
    return conv(impl, *args, **kwargs)

  monkeypatch.setattr(layers, "conv", recording)
  return seen


@pytest.mark.parametrize("make", ["generator", "cgenerator"])
def test_generators_build_auto_as_lax(make, monkeypatch):
  from fedjax_dd.models.cgenerator import CGeneratorA
  seen = _record_conv_forms(monkeypatch)
  z, y = jnp.zeros((2, 4)), jnp.array([0, 1])
  if make == "generator":
    g, args = models.Generator(out_shape=(8, 8, 1), nz=4, ngf=4), (z,)
  else:
    g = CGeneratorA(out_shape=(8, 8, 1), nz=4, ngf=4, num_classes=2)
    args = (z, y)
  g.init(jax.random.PRNGKey(0), *args, train=False)
  assert seen == ["lax"] * 3
  seen.clear()
  g.clone(layers=layers.LayerSet(conv_impl="patches")).init(
      jax.random.PRNGKey(0), *args, train=False)
  assert seen == ["patches"] * 3


def test_entry_point_resolves_the_generators_form():
  from fedjax_dd.experiments import common
  config = _entry_config("lenet5")
  assert common.conv_impl(config, "CGeneratorA") == "lax"
  assert common.conv_impl(config, "Generator") == "lax"
  # A registry model's "auto" is left to its builder, which resolves it for
  # the model's class.
  assert common.conv_impl(config) == "auto"
  assert common.conv_impl(config, "CNN2") == policy.conv_form("CNN2")
  config.model.conv_impl = "patches"
  assert common.conv_impl(config, "Generator") == "patches"
  assert common.conv_impl(config) == "patches"
  config.model.conv_impl = "im2col"
  with pytest.raises(ValueError, match="Unknown conv_impl 'im2col'"):
    common.conv_impl(config)


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("version", _VERSIONS)
def test_forward_models_take_forward_where_the_row_says_patches(platform,
                                                                version):
  row = policy.lookup(platform, version)
  for name in ("CNN2", "CNN3"):
    assert name in policy.FORWARD_CONV_MODELS
    expected = "forward" if row.conv == "patches" else row.conv
    assert policy.conv_form(name, row) == expected
    assert layers.resolve_conv_impl("auto", platform, version,
                                    name) == expected
    # An explicit form is kept.
    assert layers.resolve_conv_impl("patches", platform, version,
                                    name) == "patches"
  # Where it applies: the CPU rows of jax >= 0.10; accelerators keep lax.
  assert policy.conv_form("CNN2", policy.lookup("cpu", "0.12.0.1")) == (
      "forward")
  assert policy.conv_form("CNN2", policy.lookup("cpu", "0.5.3")) == "lax"
  assert policy.conv_form("CNN2", policy.lookup("gpu", "0.12.0.1")) == "lax"
  assert policy.conv_form("LeNet5", policy.lookup("cpu", "0.12.0.1")) == (
      "patches")


@pytest.mark.parametrize("name, cls", [("cnn2", "CNN2"), ("cnn3", "CNN3")])
def test_forward_models_build_and_run_their_own_form(name, cls, monkeypatch):
  expected = policy.conv_form(cls)
  spec = models.get_model(name)
  assert spec.build(10).layers.conv_impl == expected
  assert spec.build(10, conv_impl="patches").layers.conv_impl == "patches"
  seen = _record_conv_forms(monkeypatch)
  # Built directly with "auto", the class resolves its own form too.
  module = getattr(models, cls)(num_classes=10)
  assert module.layers.conv_impl == "auto"
  module.init(jax.random.PRNGKey(0), jnp.zeros((2, *spec.input_shape)),
              train=False)
  assert seen == [expected] * len(module.features)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_an_explicit_compute_dtype_overrides_the_row(platform):
  for dtype in policy.COMPUTE_DTYPES:
    assert policy.resolve_compute_dtype(dtype, platform) == dtype
  assert models.get_model("lenet5").build(
      10, compute_dtype="bfloat16").layers.dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="compute_dtype 'float16'"):
    policy.resolve_compute_dtype("float16")
  with pytest.raises(ValueError, match="compute_dtype 'half'"):
    models.get_model("fc").build(10, compute_dtype="half")


def test_as_dict_is_json_ready():
  import json
  d = policy.as_dict(policy.lookup("cpu", "0.5.3"))
  assert d["compiler_options"] == {"xla_cpu_use_thunk_runtime": False}
  assert json.loads(json.dumps(d))["conv"] == "lax"


def test_forms_hold_what_a_run_computes_not_where_the_row_applies():
  import json
  new, old = policy.lookup("cpu", "0.12.0"), policy.lookup("cpu", "0.5.3")
  f = policy.forms(new)
  assert json.loads(json.dumps(f)) == f
  assert not {"platform", "jax_min", "jax_below", "measured"} & set(f)
  assert (f["conv"], f["fold_norm"]) == ("patches", False)
  assert f["forward_conv_models"] == sorted(policy.FORWARD_CONV_MODELS)
  assert f["matmul_kernel_grads"]["CNN3"] == ["gemm", "taps"]
  # Rows that apply elsewhere but compute alike have equal forms; the two
  # CPU ends differ where their rows do.
  moved = dataclasses.replace(new, jax_min=(0, 20), measured="elsewhere")
  assert policy.forms(moved) == f
  differ = {k for k in f if policy.forms(old)[k] != f[k]}
  assert differ == {"conv", "fold_norm", "compiler_options",
                    "ntk_grad_memory_factor"}


# --- the entry point and the public builders get the same forms -------------


def _entry_config(name):
  """The entry point's FedAvg config (``fedavg.py:mnist_iid``) on ``name``."""
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  c = fedavg_config.get_config("mnist_iid")
  c.model.name = name
  return c


@pytest.mark.parametrize("platform", [None, "gpu"])
@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_build_defaults_equal_the_entry_points_model(name, platform,
                                                     monkeypatch):
  from fedjax_dd.experiments import common
  if platform:
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
  spec = models.get_model(name)
  config = _entry_config(name)
  entry = spec.build(10, conv_impl=common.conv_impl(config),
                     compute_dtype=common.compute_dtype(config))
  public = spec.build(10)
  assert public == entry
  assert public.layers.dtype == jnp.dtype(policy.current().compute_dtype)
  # The row's form, or the model class's own (policy.conv_form).
  assert public.layers.conv_impl == policy.conv_form(type(public).__name__)


def test_public_mapper_equals_the_entry_points_for_lenet5():
  from fedjax_dd.experiments import common
  assert common.mapper(_entry_config("lenet5")) == clients.ClientMapper()
  # ResNet-18 is the exception the policy lists: its gradient does not
  # compile on XLA:CPU's classic runtime.
  assert "resnet18" in policy.CLASSIC_RUNTIME_UNSAFE
  assert not common.mapper(_entry_config("resnet18")).classic_runtime


# --- a GPU or TPU, mocked: plain forms, no CPU settings ----------------------


def _has_custom_vjp(fn, *args):
  return "custom_vjp_call" in str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_models_take_plain_forms_on_an_accelerator(platform, monkeypatch):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 16, 3))
  cpu_model = models.ConvNet(5, width=8, depth=2)
  v = cpu_model.init(jax.random.PRNGKey(1), x, train=False)
  forward = lambda m: (lambda p: m.apply(p, x, train=True))
  cpu_out = cpu_model.apply(v, x, train=False)
  if jax.default_backend() == "cpu":
    # The fused first block and the matmul kernel gradients: custom VJPs.
    assert _has_custom_vjp(forward(cpu_model), v)
  monkeypatch.setattr(jax, "default_backend", lambda: platform)
  # bfloat16 by default there; float32 computes the CPU's function.
  assert models.get_model("convnet3").build(5).layers.dtype == jnp.bfloat16
  model = models.get_model("convnet3").build(5, compute_dtype="float32")
  assert model.layers.conv_impl == "lax"
  model = model.clone(width=8, depth=2)
  # Flax's layers' forms: no custom gradient anywhere, the same function.
  assert not _has_custom_vjp(forward(model), v)
  np.testing.assert_allclose(model.apply(v, x, train=False), cpu_out,
                             rtol=1e-5, atol=1e-5)
  assert not fused_block.fuses_first_block()
  # LeNet-5: lax convolutions, no phase split.
  lenet = models.get_model("lenet5").build(10, compute_dtype="float32")
  xl = jax.random.normal(jax.random.PRNGKey(2), (2, 28, 28, 1))
  vl = lenet.init(jax.random.PRNGKey(3), xl, train=False)
  plain = models.LeNet5(10, layers=layers.LayerSet(conv_impl="lax",
                                                   phase_split=False))
  np.testing.assert_array_equal(lenet.apply(vl, xl, train=False),
                                plain.apply(vl, xl, train=False))
  assert "conv_general_dilated" in str(jax.make_jaxpr(
      lambda v: lenet.apply(v, xl, train=False))(vl))


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_client_mapper_sets_nothing_cpu_specific_on_an_accelerator(
    platform, chunk_size, monkeypatch):
  # Issue: chunk sizes, host devices and the per-device single-thread option
  # must do nothing wrong off CPU. With the platform mocked the programs
  # still run on this machine's devices, so the results are checked too.
  seen = []
  real = clients.hot_program_options

  def spy(*args, **kwargs):
    seen.append(real(*args, **kwargs))
    return seen[-1]

  monkeypatch.setattr(clients, "hot_program_options", spy)
  monkeypatch.setattr(jax, "default_backend", lambda: platform)
  assert clients.default_chunk_size() is None
  assert clients.hot_program_options(True, per_core=True) == {}
  assert not clients.classic_runtime_in_effect()
  mapper = clients.ClientMapper(chunk_size=chunk_size)
  assert mapper.resolved_backend == (
      "sharded" if jax.device_count() > 1 else "vmap")
  assert mapper.resolved_chunk_size == chunk_size  # None: one vmap per device
  assert clients.ClientMapper(backend="chunked").resolved_chunk_size == 16
  rng = np.random.default_rng(0)
  w = rng.normal(size=(5, 3, 2)).astype(np.float32)
  x = rng.normal(size=(5, 4, 3)).astype(np.float32)
  f = lambda w, x: jnp.tanh(x @ w)
  out = mapper.map(f)(w, x)
  for i in range(5):
    np.testing.assert_allclose(out[i], f(w[i], x[i]), rtol=1e-5, atol=1e-6)
  assert seen and all(options == {} for options in seen)


def test_an_accelerator_row_is_read_even_where_cpu_devices_run(monkeypatch):
  # The tables are looked up by platform name only; a row replaced in the
  # table reaches the mapper (nothing else holds a copy).
  row = dataclasses.replace(policy.lookup("gpu"), chunk_size=4,
                            thunk_chunk_size=4)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(policy, "lookup", lambda *a, **k: row)
  assert clients.default_chunk_size() == 4
  assert clients.ClientMapper().resolved_chunk_size == 4
