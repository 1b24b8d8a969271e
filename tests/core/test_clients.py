"""The client axis: every backend gives the same result."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core import clients as clients_lib
from fedjax_dd.core.clients import BACKENDS, ClientMapper, map_clients
from fedjax_dd.core.local import LocalTraining


def per_client(w, x, scale):
  """One client's computation: a matmul, a reduction and a broadcast arg."""
  return {"y": jnp.tanh(x @ w) * scale, "s": jnp.sum(x)}


@pytest.mark.parametrize("backend", ["vmap", "chunked", "sharded", "loop"])
def test_backends_match_python_loop(backend):
  rng = np.random.default_rng(0)
  w = rng.normal(size=(7, 3, 2)).astype(np.float32)   # [C, 3, 2]
  x = rng.normal(size=(7, 5, 3)).astype(np.float32)   # [C, 5, 3]
  scale = np.float32(2.0)
  mapped = ClientMapper(backend=backend, chunk_size=3).map(
      per_client, in_axes=(0, 0, None))
  out = mapped(w, x, scale)
  assert out["y"].shape == (7, 5, 2) and out["s"].shape == (7,)
  for i in range(7):
    expect = per_client(w[i], x[i], scale)
    np.testing.assert_allclose(out["y"][i], expect["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["s"][i], expect["s"], rtol=1e-5)


def test_invalid_backend_and_axes():
  with pytest.raises(ValueError, match="Unknown client backend"):
    ClientMapper(backend="pmap")
  with pytest.raises(ValueError, match="chunk_size"):
    ClientMapper(chunk_size=0)
  with pytest.raises(ValueError, match="Unknown workload"):
    ClientMapper(workload="kpi")
  f = map_clients(per_client, in_axes=(None, None, None), backend="vmap")
  with pytest.raises(ValueError, match="At least one argument"):
    f(np.ones((3, 2)), np.ones((5, 3)), 1.0)
  f = map_clients(per_client, in_axes=(0, 0, None), backend="loop")
  with pytest.raises(ValueError, match="disagree"):
    f(np.ones((2, 3, 2)), np.ones((3, 5, 3)), 1.0)


def test_backends_list():
  assert set(BACKENDS) == {"vmap", "chunked", "sharded", "loop"}


@pytest.mark.multidevice
def test_sharded_on_four_cpu_devices():
  """The sharded backend lays the client axis over 4 forced host devices."""
  script = textwrap.dedent("""
      import numpy as np
      import fedjax_dd
      import jax, jax.numpy as jnp
      from fedjax_dd.core.clients import ClientMapper
      assert jax.device_count() == 4, jax.devices()
      def f(w, x):
          return jnp.tanh(x @ w)
      rng = np.random.default_rng(1)
      w = rng.normal(size=(10, 3, 2)).astype(np.float32)  # 10 clients: padded to 12
      x = rng.normal(size=(10, 6, 3)).astype(np.float32)
      out = ClientMapper(backend="sharded").map(f, in_axes=(0, 0))(w, x)
      ref = ClientMapper(backend="vmap").map(f, in_axes=(0, 0))(w, x)
      np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
      assert out.shape == (10, 6, 2)
      # Inside the shard_map each client sees the index of its device: 12
      # clients over 4 devices put clients 3d..3d+2 on device d.
      where = lambda w, x: jax.lax.axis_index("clients")
      w12 = np.concatenate([w, w[:2]])
      x12 = np.concatenate([x, x[:2]])
      dev = ClientMapper(backend="sharded", chunk_size=2).map(where, in_axes=(0, 0))(w12, x12)
      np.testing.assert_array_equal(dev, np.repeat(np.arange(4), 3))
      dev10 = ClientMapper(backend="sharded").map(where, in_axes=(0, 0))(w, x)
      np.testing.assert_array_equal(dev10, np.repeat(np.arange(4), 3)[:10])
      chunked = ClientMapper(backend="sharded", chunk_size=2).map(f, in_axes=(0, 0))(w, x)
      np.testing.assert_allclose(chunked, ref, rtol=1e-5, atol=1e-6)
      print("OK")
  """)
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      " --xla_force_host_platform_device_count=4").strip()
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run([sys.executable, "-c", script], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "OK" in proc.stdout


def test_engine_jit_options_are_per_program():
  """The classic-runtime option reaches only programs that ask for it."""
  from fedjax_dd.core.clients import engine_jit, hot_program_options
  import jax
  import jax.numpy as jnp
  if jax.default_backend() != "cpu":
    pytest.skip("the options are CPU-specific")
  assert hot_program_options(False) == {}
  x = jnp.ones((2, 8, 8, 3))
  w = jnp.ones((3, 3, 3, 4))

  def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))

  texts = {flag: engine_jit(conv, classic_runtime=flag).lower(x, w).compile().as_text()
           for flag in (True, False)}
  if hot_program_options(True):
    assert "onednn" in texts[True]
  assert "onednn" not in texts[False]
  np.testing.assert_allclose(engine_jit(conv)(x, w), conv(x, w), rtol=1e-5)


def test_sharded_call_inside_a_traced_program_vectorises_in_place():
  """Under an enclosing jit the mapper adds no device layout of its own."""
  import jax
  rng = np.random.default_rng(2)
  w = rng.normal(size=(5, 3, 2)).astype(np.float32)
  x = rng.normal(size=(5, 4, 3)).astype(np.float32)
  mapped = ClientMapper(backend="sharded", chunk_size=2).map(
      per_client, in_axes=(0, 0, None))
  outer = jax.jit(lambda w, x: mapped(w, x, 3.0)["y"].sum(axis=(1, 2)))
  direct = mapped(w, x, 3.0)["y"].sum(axis=(1, 2))
  np.testing.assert_allclose(outer(w, x), direct, rtol=1e-5)
  assert outer(w, x).shape == (5,)


def test_auto_resolution_follows_the_devices():
  """auto is sharded over several devices, else chunked on CPU / vmap on accelerators."""
  import jax
  from fedjax_dd.core.clients import default_backend, default_chunk_size
  m = ClientMapper()
  if jax.device_count() > 1:
    assert m.resolved_backend == "sharded"
  else:
    assert default_backend("cpu") == "chunked"
  # CPU chunks: 2 on XLA's classic runtime (jax 0.5.x), 1 on the thunk
  # runtime (newer jax, or programs that opt out of the classic runtime).
  from fedjax_dd.core.clients import classic_runtime_in_effect
  if jax.default_backend() == "cpu":
    assert default_chunk_size("cpu") == (2 if classic_runtime_in_effect()
                                         else 1)
    assert not classic_runtime_in_effect(False)
    assert default_chunk_size("cpu", classic_runtime=False) == 1
    assert ClientMapper(classic_runtime=False).resolved_chunk_size == 1
  assert default_chunk_size("gpu") is None
  assert ClientMapper(backend="chunked", chunk_size=5).resolved_chunk_size == 5
  # The sharded backend hands results back on the default device.
  out = ClientMapper(backend="sharded").map(lambda a: a * 2)(np.ones((3, 2), np.float32))
  assert out.sharding.device_set == {jax.devices()[0]}


def test_workload_defaults():
  from fedjax_dd.core import clients
  # KIP on CPU was measured faster as one vmap; training keeps the per-device
  # default; an explicit backend always wins.
  assert clients.default_backend("cpu", "kip") == "vmap"
  assert clients.default_backend("cpu") == clients.default_backend(
      "cpu", "train")
  assert clients.default_backend("gpu", "kip") == clients.default_backend(
      "gpu")
  assert ClientMapper(backend="loop", workload="kip").resolved_backend == "loop"
  with pytest.raises(ValueError, match="Unknown workload"):
    clients.default_backend("cpu", "kernel")


def test_compile_options_the_running_xla_lacks_are_dropped(monkeypatch):
  from fedjax_dd.core import clients as clients_lib
  platform = jax.default_backend()
  assert not clients_lib.option_supported("xla_no_such_option_here", True,
                                          platform)
  assert clients_lib.option_supported("xla_cpu_multi_thread_eigen", False,
                                      platform)
  # An option a newer XLA removed (as jax 0.10 removed the thunk-runtime
  # switch) is left out instead of failing every engine compilation.
  import dataclasses
  from fedjax_dd import policy
  row = dataclasses.replace(
      policy.lookup(platform),
      compiler_options=(("xla_no_such_option_here", True),))
  monkeypatch.setattr(policy, "lookup", lambda *a, **k: row)
  assert clients_lib.hot_program_options(True) == {}
  f = clients_lib.engine_jit(lambda x: x * 2)
  assert float(f(jnp.float32(3.0))) == 6.0


def test_chunks_of_one_run_unbatched():
  """A chunk of one client runs the per-client function with no vmap."""
  import re
  import jax
  import jax.numpy as jnp
  from fedjax_dd.core import clients
  w = np.arange(3, dtype=np.float32)
  x = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
  per_client = lambda w, x: jnp.dot(x, w)  # x [5, 3] for one client.
  outs, contracted = {}, {}
  for chunk in (None, 1, 2):
    fn = clients.map_leading_axis(per_client, (None, 0), chunk)
    outs[chunk] = np.asarray(jax.jit(fn)(w, x))
    contracted[chunk] = re.findall(
        r"dimension_numbers=\(\(\[(\d)\]", str(jax.make_jaxpr(fn)(w, x)))
  # Unbatched, x is [5, 3] and the dot contracts its dimension 1; batched
  # (a vmap of 2 inside lax.map, or of all 4), x is [B, 5, 3]: dimension 2.
  assert {k: set(v) for k, v in contracted.items()} == {
      None: {"2"}, 1: {"1"}, 2: {"2"}}
  for chunk in (1, 2):
    np.testing.assert_allclose(outs[chunk], outs[None], rtol=1e-6)
  assert outs[1].shape == (4, 5)


def test_bucket_order_hand_examples():
  from fedjax_dd.core.clients import bucket_order
  work = np.asarray([3, 9, 1, 9, 5])
  # One lane: decreasing work, ties in the given order.
  np.testing.assert_array_equal(bucket_order(work), [1, 3, 4, 0, 2])
  # Two lanes of 3 and 2 slots. 9 -> lane 0, 9 -> lane 1, 5 -> lane 0
  # (tie at 9, lower index), 3 -> lane 1 (9 < 14), 1 -> lane 0 (lane 1 full).
  np.testing.assert_array_equal(bucket_order(work, lanes=2), [1, 4, 2, 3, 0])
  # More lanes than clients: the last lanes get nothing.
  np.testing.assert_array_equal(bucket_order(np.asarray([1, 2]), lanes=4),
                                [1, 0])
  assert bucket_order(np.zeros((0,), np.int32)).shape == (0,)
  with pytest.raises(ValueError, match="lanes"):
    bucket_order(work, lanes=0)


def test_computed_steps_hand_examples():
  from fedjax_dd.core.clients import computed_steps
  steps = np.asarray([10, 1, 9, 2])
  # The masked scan: every client computes the largest count.
  assert computed_steps(steps, chunk=2, skip_padding=False) == 40
  assert computed_steps(steps, chunk=1, skip_padding=False,
                        max_steps=12) == 48
  # Chunks of 2 in the given order: max(10, 1) * 2 + max(9, 2) * 2.
  assert computed_steps(steps, chunk=2, bucket=False) == 38
  # Bucketed: (10, 9) and (2, 1) -> 20 + 4.
  assert computed_steps(steps, chunk=2) == 24
  # Unbatched clients compute exactly their own steps.
  assert computed_steps(steps, chunk=1) == 22
  # Three clients over two lanes. Bucketed, the cohort is padded with a
  # zero-step client: lane 0 = (10, 0), lane 1 = (9, 1), only real steps.
  assert computed_steps(steps[:3], chunk=1, lanes=2) == 20
  # Without bucketing the sharded backend repeats the last client:
  # (10, 1), (9, 9').
  assert computed_steps(steps[:3], chunk=1, lanes=2, bucket=False) == 29
  # A short last chunk is padded with a copy of its client: (10, 9) + (2, 2).
  assert computed_steps(steps[[0, 2, 3]], chunk=2) == 24
  # The masked scan pads it too: (10, 9), (2, 2') at 10 steps each; the
  # engine before bucketing ran the remainder as a vmap of one.
  assert computed_steps(steps[[0, 2, 3]], chunk=2, skip_padding=False) == 40
  assert computed_steps(steps[[0, 2, 3]], chunk=2, skip_padding=False,
                        pad_short_chunk=False) == 30
  assert computed_steps(steps[[0, 2, 3]], chunk=2,
                        pad_short_chunk=False) == 22


@pytest.mark.parametrize("backend,chunk", [("chunked", 2), ("chunked", 1),
                                           ("chunked", 3), ("sharded", 1),
                                           ("sharded", 2), ("vmap", None)])
def test_client_stage_bucketing_and_skipped_padding_change_no_bits(backend,
                                                                   chunk):
  import optax
  from fedjax_dd.core.algorithm import Cohort
  from fedjax_dd.core.clients import client_stage
  from fedjax_dd.core.local import make_local_update
  from tests.conftest import synthetic_clients, tiny_task
  task = tiny_task(bn=True)
  x, y, n = synthetic_clients(num_clients=5, sizes=(5, 9, 12, 7, 3), n_max=12)
  steps = np.asarray([1, 6, 2, 6, 4], np.int32)
  cohort = Cohort(x=x, y=y, num_examples=n, num_steps=steps,
                  client_ids=np.arange(5, dtype=np.int32))
  params, stats = task.init(jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(2), 5)
  outs = []
  for bucket, skip in ((False, False), (True, True), (True, False)):
    local = make_local_update(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                                            max_steps=6, skip_padding=skip))
    mapper = ClientMapper(backend=backend, chunk_size=chunk, bucket=bucket)
    train = client_stage(local, mapper)
    outs.append(train(params, stats, (), cohort, keys, jnp.zeros((5,))))
  for other in outs[1:]:
    for a, b in zip(jax.tree_util.tree_leaves(outs[0]),
                    jax.tree_util.tree_leaves(other)):
      np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(outs[1].steps, steps.astype(np.float32))


def test_bucketed_stage_compiles_once_whatever_the_order(caplog):
  """The order changes with the cohort; nothing recompiles after the first
  call."""
  import logging
  import optax
  from fedjax_dd.core.algorithm import Cohort
  from fedjax_dd.core.clients import client_stage
  from fedjax_dd.core.local import make_local_update
  from tests.conftest import synthetic_clients, tiny_task
  task = tiny_task()
  x, y, n = synthetic_clients()
  local = make_local_update(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                                          max_steps=5))
  train = client_stage(local, ClientMapper(backend="chunked", chunk_size=2))
  params, stats = task.init(jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(2), 4)

  def call(steps):
    cohort = Cohort(x=x, y=y, num_examples=n,
                    num_steps=np.asarray(steps, np.int32),
                    client_ids=np.arange(4, dtype=np.int32))
    return jax.block_until_ready(
        train(params, stats, (), cohort, keys, jnp.zeros((4,))))

  call([1, 2, 3, 4])  # the identity order
  caplog.set_level(logging.WARNING)
  with jax.log_compiles():
    call([5, 1, 4, 2])
    call([2, 5, 1, 3])
  compiled = [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert not compiled, [r.getMessage()[:120] for r in compiled]


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_accelerator_defaults_resolve_with_the_platform_injected(platform):
  """On accelerators: one vmap per device (no chunks), sharded over several
  devices, vmap on one, KIP like training, and no CPU compile options."""
  from fedjax_dd.core import clients
  assert clients.default_backend(platform, num_devices=1) == "vmap"
  assert clients.default_backend(platform, num_devices=8) == "sharded"
  assert clients.default_backend(platform, "kip", num_devices=1) == "vmap"
  assert clients.default_backend(platform, "kip", num_devices=4) == "sharded"
  assert clients.default_chunk_size(platform) is None
  assert clients.default_chunk_size(platform, classic_runtime=False) is None
  assert clients.hot_program_options(True, per_core=True,
                                     platform=platform) == {}
  # CPU for contrast: chunked on one device; KIP one vmap.
  assert clients.default_backend("cpu", num_devices=1) == "chunked"
  assert clients.default_backend("cpu", "kip", num_devices=2) == "vmap"


def test_vmap_chunk_limit_hand_example():
  """Per client: x [4] @ w [4, 8] -> [8]; the broadcast w (32 elements) is
  the largest array. Ten clients hold 10 x 32 = 320 elements."""
  from fedjax_dd.core import clients
  w = np.ones((4, 8), np.float32)
  x = np.ones((10, 4), np.float32)
  fn = lambda w, x: x @ w
  axes = (None, 0)
  assert clients.vmap_chunk_limit(fn, (w, x), axes, None) is None
  assert clients.vmap_chunk_limit(fn, (w, x), axes, 320) is None
  # 100 // 32 = 3 clients fit: the power of two below, 2.
  assert clients.vmap_chunk_limit(fn, (w, x), axes, 100) == 2
  assert clients.vmap_chunk_limit(fn, (w, x), axes, 64) == 2
  assert clients.vmap_chunk_limit(fn, (w, x), axes, 63) == 1
  assert clients.vmap_chunk_limit(fn, (w, x), axes, 1) == 1
  # Arrays inside a nested program count: a scan whose body makes [16, 16].
  def scanned(w, x):
    def body(c, _):
      return c + jnp.sum(jnp.outer(jnp.tile(x, 4), jnp.tile(x, 4))), None
    return jax.lax.scan(body, jnp.zeros(()), None, length=3)[0]
  assert clients.vmap_chunk_limit(scanned, (w, x), axes, 10 * 256) is None
  assert clients.vmap_chunk_limit(scanned, (w, x), axes, 10 * 256 - 1) == 8


def test_auto_vmap_chunks_past_the_policy_cap(monkeypatch):
  """An "auto" mapper resolved to vmap splits the cohort once C x (largest
  per-client array) passes the row's cap, with the same results as one
  vmap; an explicit vmap is left as asked."""
  import dataclasses
  from fedjax_dd import policy
  from fedjax_dd.core import clients
  row = dataclasses.replace(policy.lookup(), backend="vmap",
                            backend_devices="vmap", max_vmap_elements=100)
  monkeypatch.setattr(policy, "lookup", lambda *a, **k: row)
  seen = []
  real = clients.map_leading_axis
  monkeypatch.setattr(clients, "map_leading_axis",
                      lambda fn, axes, chunk: seen.append(chunk) or real(
                          fn, axes, chunk))
  w = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8)), jnp.float32)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(10, 4)), jnp.float32)
  fn = lambda w, x: jnp.tanh(x @ w)
  auto = clients.ClientMapper().map(fn, (None, 0))(w, x)
  plain = clients.ClientMapper(backend="vmap").map(fn, (None, 0))(w, x)
  assert seen == [2, None]
  # Equal to float rounding (a vmap of 2 and of 10 may round apart).
  np.testing.assert_allclose(auto, plain, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(auto, jnp.tanh(x @ w), rtol=1e-5, atol=1e-6)


# The policy's once_options change how fast XLA compiles a run-once program,
# not its bits: each model's and generator's initialisation through
# once_jit equals the initialisers run op by op (the plain form), alone and
# vmapped over keys.
@pytest.mark.parametrize("name", [
    "digits_cnn", "fc",
    # The same initialisers over more layers; each op-by-op call compiles.
    pytest.param("lenet5", marks=pytest.mark.slow),
    pytest.param("convnet3", marks=pytest.mark.slow)])
def test_once_jit_initialisation_equals_the_op_by_op_one(name):
  from fedjax_dd import models  # pylint: disable=g-import-not-at-top
  from fedjax_dd import policy  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.task import Classifier  # pylint: disable=g-import-not-at-top
  spec = models.get_model(name)
  task = Classifier(spec.build(10), tuple(spec.input_shape), lambda x: x, 10)
  key = jax.random.key(7)
  keys = jax.random.split(key, 3)
  # The plain form: the initialisers run op by op (each jax.random and
  # initializer call its own program, as before once_jit).
  plain = task._init(key)  # pylint: disable=protected-access
  plain_many = jax.vmap(task._init)(keys)  # pylint: disable=protected-access
  cases = [(task.init(key), plain),
           (clients_lib.once_jit(jax.vmap(task.init), op_by_op=True)(keys),
            plain_many)]
  if policy.current().once_options is not None:  # the CPU row asks for them
    assert clients_lib.once_program_options()
    # Under an outer jit it is traced in, options dropped.
    cases.append((jax.jit(task.init)(key), plain))
  for got, want in cases:
    for a, b in zip(jax.tree_util.tree_leaves(got),
                    jax.tree_util.tree_leaves(want), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_once_jit_generator_initialisation_equals_the_op_by_op_one():
  from fedjax_dd import models  # pylint: disable=g-import-not-at-top
  from fedjax_dd.distill import ensemble  # pylint: disable=g-import-not-at-top
  generator = models.Generator(out_shape=(8, 8, 1), nz=16, ngf=8)
  key = jax.random.key(3)
  want = ensemble._init_generator(generator, key)  # pylint: disable=protected-access
  got = ensemble.init_generator(generator, key)
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_once_options_come_from_the_policy_row():
  from fedjax_dd import policy  # pylint: disable=g-import-not-at-top
  assert dict(policy.lookup("cpu", "0.12.1").once_options) == {
      "xla_backend_optimization_level": 0}
  # XLA's plain forms elsewhere; and not a form a run records.
  assert policy.lookup("gpu", "0.12.0").once_options is None
  # Below jax 0.12 one program rounded some weights differently (0.5.3,
  # 0.10.2).
  assert policy.lookup("cpu", "0.5.3").once_options is None
  assert policy.lookup("cpu", "0.10.2").once_options is None
  assert "once_options" not in policy.forms()
