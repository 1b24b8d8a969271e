r"""Engine benchmark: ms per client-step for every client backend.

  python -m fedjax_dd.experiments.bench.bench_engine --out bench_engine.json
  python -m fedjax_dd.experiments.bench.bench_engine --grid_only --out grid.json
  python -m fedjax_dd.experiments.bench.bench_engine --clients 10,100 \
      --models lenet5 --out b.json
  python -m fedjax_dd.experiments.bench.bench_engine \
      --other_python=OTHER/bin/python --conv_impl lax,patches --pairs 3 \
      --out ends.json
  python -m fedjax_dd.experiments.bench.bench_engine --forms
  python -m fedjax_dd.experiments.bench.bench_engine --public_round \
      --other_python=OTHER/bin/python --pairs 2 --out public.json
  python -m fedjax_dd.experiments.bench.bench_engine --layouts
  python -m fedjax_dd.experiments.bench.bench_engine --vs_torch 10,100 \
      --pairs 5 --out vs_torch.json
  python -m fedjax_dd.experiments.bench.bench_engine --scale 500,2000,10000 \
      --out scale.json
  python -m fedjax_dd.experiments.bench.bench_engine \
      --padding fedhydra.py:cifar10_a0.1 --pairs 2 --out padding.json

Every backend runs with the package's defaults: on CPU ``configure_cpu()``
exposes one host device per core, ``sharded`` splits the clients over them
and ``chunked``/``sharded`` use the default chunk size unless
``--chunk_size`` is given. The HFLDD CIFAR CNN and ConvNet-3 (``--models
convnet3``), slow on a CPU, run at ``--cifar_clients`` only.

Measures the engine's real cohort path (``stages.client_stage``: broadcast
model, fresh SGD state, ``lax.scan`` of ``--steps`` local steps with batch
``--batch`` drawn from padded uint8 client data) for each backend and client
count, next to:

* ``reference_loop``: the same computation as a sequential Python loop of
  per-client jitted programs (the ``loop`` backend);
* ``torch``: PyTorch's sequential client loop, as the papers' reference code
  runs it (a fresh model copy per client, SGD), when ``torch`` is installed
  (``pip install -e ".[bench]"``);
* ``matmul_gflops``: a jitted 2048×2048 float32 matmul, the machine's peak;
* achieved GFLOP/s of each variant (XLA's cost analysis of one client-step)
  and the peak resident memory of each measurement (run in a subprocess).

Writes a JSON report with ``results``, ``reference_loop``, ``matmul_gflops``,
``speedup_vs_loop`` per (model, num_clients) for the default backend, and
``speedup_vs_torch`` where the PyTorch reference ran. Unless ``--grid_only``,
the report also holds the three sections below with their defaults:
``vs_torch`` (LeNet-5 at 10 and 100 clients), ``padding``
(:data:`FULL_PADDING_PRESETS`, local epochs scaled by
:data:`FULL_PADDING_SCALE` for the wall times) and ``scale`` (500, 2,000 and
10,000 clients). Each section alone is its flag below.

Modes, each instead of the grid and with its own report:

* ``--vs_torch COUNTS``: the engine against PyTorch's reference and lean
  loops on ``--vs_torch_model``, the median ratio PyTorch / engine
  (:func:`measure_vs_torch`);
* ``--scale COUNTS``: FedAvg over that many MNIST-sized clients streamed
  from host memory, 1 % participation (:func:`measure_scale`);
* ``--padding PRESETS``: each ``CONFIG.py:ARG`` preset's local training,
  masked against bucketed (:func:`measure_padding`);
* ``--layouts``: one LeNet-5 client-step in NHWC and NCHW, with and without
  donated buffers (:func:`measure_layouts`);
* ``--forms`` and ``--profile``: one LeNet-5 client's update in four jitted
  forms (:func:`measure_forms`) and split into its parts
  (:func:`measure_profile`);
* ``--public_round``: a FedAvg round built through the public API's
  defaults against the entry point's (:func:`measure_public_round`);
* ``--other_python=PY``: one LeNet-5 round alternately on this interpreter
  and on ``PY`` (another virtualenv with this package importable) for each
  ``--conv_impl`` (:func:`measure_ends`).

Paired modes alternate their sides in fresh subprocesses ``--pairs`` times,
so a shared machine's load drifts stay out of the ratios. ``--conv_impl``
(``auto`` | ``lax`` | ``patches``, comma-separated) picks the models'
convolution formulation (``fedjax_dd.models.layers.resolve_conv_impl``);
every result records the resolved one and the jax version.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from typing import Callable

import fedjax_dd

MODELS = {
    # name: (registry name, input shape)
    "lenet5": ("lenet5", (28, 28, 1)),
    "hfldd_cifar_cnn": ("hfldd_cifar_cnn", (32, 32, 3)),
    "convnet3": ("convnet3", (32, 32, 3)),
    "cnn3": ("cnn3", (32, 32, 3)),  # FedHydra's CNN3 (DisUE's CIFAR presets)
    "cnn2": ("cnn2", (28, 28, 1)),  # FedHydra's CNN2 (MNIST, Fashion-MNIST)
    "digits_cnn": ("digits_cnn", (8, 8, 1)),  # the embedded default's
    "alexnet": ("alexnet", (32, 32, 3)),  # HFLDD's CIFAR AlexNet
    "alexcifarnet": ("alexcifarnet", (32, 32, 3)),  # FedD3's CIFAR net
    "resnet18": ("resnet18", (32, 32, 3)),
}


def _min_time(fn, reps: int) -> float:
  fn()  # warm-up / compile
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


# Compute precisions a measurement may ask for: ``auto`` (the policy's
# compute dtype at jax's default precision, TF32 on recent NVIDIA GPUs for
# float32 models), ``float32`` at full precision (TF32 off), ``tf32`` (a
# float32 model at TensorFloat-32) or ``bfloat16``.
PRECISIONS = ("auto", "float32", "tf32", "bfloat16")


def precision_context(precision: str):
  """The ``jax.default_matmul_precision`` scope of ``precision``
  (:data:`PRECISIONS`): TF32 for ``tf32``, full float32 for ``float32``,
  jax's default otherwise."""
  import contextlib

  import jax

  if precision not in PRECISIONS:
    raise ValueError(f"Unknown precision {precision!r}; expected one of "
                     f"{PRECISIONS}.")
  if precision == "tf32":
    return jax.default_matmul_precision("tensorfloat32")
  if precision == "float32":
    return jax.default_matmul_precision("float32")
  return contextlib.nullcontext()


def _task(model: str, conv_impl: str, precision: str = "auto"):
  """The benchmarked model as a 10-class task on uint8 images scaled to
  ``[0, 1]``; returns ``(task, conv_impl resolved)``. ``precision``
  (:data:`PRECISIONS`) sets the model's compute dtype (``tf32``: float32)."""
  import jax.numpy as jnp

  from fedjax_dd import models
  from fedjax_dd.core.task import Classifier

  name, shape = MODELS[model]
  dtype = ("float32" if precision in ("tf32", "float32") else precision)
  module = models.get_model(name).build(10, conv_impl=conv_impl,
                                        compute_dtype=dtype)
  # The builder resolves "auto" for the model's class (policy.conv_form).
  conv_impl = getattr(getattr(module, "layers", module), "conv_impl",
                      models.resolve_conv_impl(conv_impl))
  task = Classifier(module=module, input_shape=shape,
                    preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                    num_classes=10)
  return task, conv_impl


def _local_problem(model: str, conv_impl: str, num_clients: int, *,
                   steps: int, batch: int, precision: str = "auto"):
  """The benchmarked model's local update and random uint8 client data.

  Returns:
    ``(task, local, conv_impl, x, y, n_max)``: ``conv_impl`` resolved,
    ``x [C, n_max, H, W, Ch]`` uint8 and ``y [C, n_max]`` for
    ``C = num_clients`` and ``n_max = 10 * batch``.
  """
  import jax.numpy as jnp
  import numpy as np
  import optax

  from fedjax_dd.core.local import LocalTraining, make_local_update

  task, conv_impl = _task(model, conv_impl, precision)
  shape = task.input_shape
  local = make_local_update(LocalTraining(task, optax.sgd(0.01),
                                          batch_size=batch, max_steps=steps))
  rng = np.random.default_rng(0)
  n_max = 10 * batch
  x = jnp.asarray(rng.integers(0, 255, (num_clients, n_max, *shape), np.uint8))
  y = jnp.asarray(rng.integers(0, 10, (num_clients, n_max), np.int32))
  return task, local, conv_impl, x, y, n_max


def measure_jax(model: str, num_clients: int, backend: str, *, steps: int,
                batch: int, reps: int, chunk_size: int,
                conv_impl: str = "auto", flops: bool = True,
                precision: str = "auto") -> dict:
  """One measurement in this process (called in a fresh subprocess).

  ``conv_impl`` is the models' convolution formulation (``auto`` resolved
  here); ``flops=False`` skips compiling the extra single-client program for
  XLA's FLOP count; ``precision`` is one of :data:`PRECISIONS`.
  """
  with precision_context(precision):
    return _measure_jax(model, num_clients, backend, steps=steps, batch=batch,
                        reps=reps, chunk_size=chunk_size, conv_impl=conv_impl,
                        flops=flops, precision=precision)


def _measure_jax(model, num_clients, backend, *, steps, batch, reps,
                 chunk_size, conv_impl, flops, precision):

  import flax
  import jax
  import jax.numpy as jnp
  import numpy as np

  from fedjax_dd.algorithms import stages
  from fedjax_dd.core import keys as keys_lib
  from fedjax_dd.core.algorithm import Cohort
  from fedjax_dd.core.clients import ClientMapper

  task, local, conv_impl, x, y, n_max = _local_problem(
      model, conv_impl, num_clients, steps=steps, batch=batch,
      precision=precision)
  mapper = ClientMapper(backend=backend, chunk_size=chunk_size or None)
  train = stages.client_stage(local, mapper)
  cohort = Cohort(
      x=x, y=y,
      num_examples=jnp.full((num_clients,), n_max, jnp.int32),
      num_steps=jnp.full((num_clients,), steps, jnp.int32),
      client_ids=jnp.arange(num_clients))
  params, stats = task.init(jax.random.PRNGKey(0))
  keys = keys_lib.client_keys(jax.random.PRNGKey(1), cohort.client_ids)
  ctx = jnp.zeros((num_clients,), jnp.float32)

  def run():
    out = train(params, stats, params, cohort, keys, ctx)
    jax.block_until_ready(out.params)

  seconds = _min_time(run, reps)
  client_steps = num_clients * steps
  cost = None
  if flops:
    # FLOPs of one client's local update from XLA's cost analysis.
    one = jax.jit(lambda p, s, x, y, n, k: local.run(
        p, s, local.optimizer.init(p), x, y, n, steps, k, ()))
    cost = one.lower(params, stats, cohort.x[0], cohort.y[0],
                     cohort.num_examples[0], keys[0]).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get("flops", 0.0)) if cost else 0.0
  ms = 1e3 * seconds / client_steps
  auto_chunk = None
  if backend == "auto" and mapper.resolved_backend == "vmap":
    # The chunks an "auto" vmap runs in under the policy's array cap.
    from fedjax_dd import policy
    from fedjax_dd.core import clients
    auto_chunk = clients.vmap_chunk_limit(
        lambda p, s, x, y, n, k: local.run(p, s, local.optimizer.init(p), x,
                                           y, n, steps, k, ()),
        (params, stats, cohort.x, cohort.y, cohort.num_examples, keys),
        (None, None, 0, 0, 0, 0), policy.lookup().max_vmap_elements)
  return {
      "model": model, "backend": backend, "num_clients": num_clients,
      "resolved_backend": mapper.resolved_backend,
      "conv_impl": conv_impl, "jax_version": jax.__version__,
      "flax_version": flax.__version__,
      "python": sys.version.split()[0],
      "steps": steps, "batch": batch, "ms_per_client_step": ms,
      "precision": precision,
      "compute_dtype": np.dtype(
          getattr(getattr(task.module, "layers", task.module), "dtype", None)
          or "float32").name,
      "flops_per_client_step": flops / steps if flops else None,
      "gflops_achieved": flops / steps / (ms * 1e-3) / 1e9 if flops else None,
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "devices": jax.device_count(),
      "platform": jax.default_backend(),
      "chunk_size": (mapper.resolved_chunk_size
                     if mapper.resolved_backend in ("chunked", "sharded")
                     else auto_chunk),
  }


def measure_profile(*, steps: int, batch: int, reps: int,
                    conv_impl: str = "auto") -> dict:
  """Where one LeNet-5 client-step spends its time, by subtraction.

  One chunk of the default chunk size, one host device, single-threaded
  (as each core runs it under the default backend), ``steps`` training
  steps of batch ``batch`` in a ``lax.scan`` that carries the parameters;
  each program adds one part to the previous one:

  * ``sample``: draw the batch and add a function of it to the carry;
  * ``forward``: + the forward pass and the loss;
  * ``sgd_dense``: + the backward pass and an SGD step of the dense layers
    only (the convolutions' kernels held constant: nothing flows into them);
  * ``sgd``: + the convolutions' backward pass and SGD step, i.e. plain SGD
    on every parameter (``p − lr·g``, written as the engine writes it);
  * ``update``: the engine's local update (``make_local_update``: optax SGD,
    the per-client step loop and its bookkeeping).

  Returns:
    ms per client-step of each program (best of ``reps``) and each part's
    share of ``update`` (``sample``, ``forward − sample``, ...).
  """
  import jax
  import jax.numpy as jnp

  from fedjax_dd.core import clients
  from fedjax_dd.core.local import apply_updates
  from fedjax_dd.data.stacked import sample_batch

  task, local, conv_impl, x, y, n_max = _local_problem(
      "lenet5", conv_impl, 1, steps=steps, batch=batch)
  x, y = x[0], y[0]
  params, stats = task.init(jax.random.PRNGKey(0))
  key = jax.random.PRNGKey(1)
  options = clients.hot_program_options(per_core=True)
  lr = 0.01
  is_conv = lambda path: any("conv" in str(getattr(k, "key", k))
                             for k in path)

  def loss(p, xb, yb):
    return task.loss(p, stats, xb, yb, train=True)[0]

  def sgd(p, g):
    return apply_updates(p, jax.tree_util.tree_map(lambda u: -lr * u, g))

  # The sample and forward programs accumulate into a scalar beside the
  # parameters, not into them: adding to a convolution's kernel invites
  # XLA:CPU's slow fused-sum rewrite (``local.apply_updates``).
  def sample_step(p, xb, yb):
    return p, jnp.mean(xb.astype(jnp.float32)) + yb[0]

  def forward_step(p, xb, yb):
    return p, loss(p, xb, yb)

  def dense_step(p, xb, yb):
    split = lambda path, a: (a, None) if is_conv(path) else (None, a)
    conv = jax.tree_util.tree_map_with_path(lambda q, a: split(q, a)[0], p)
    dense = jax.tree_util.tree_map_with_path(lambda q, a: split(q, a)[1], p)
    merge = lambda c, d: jax.tree_util.tree_map(
        lambda a, b: a if b is None else b, c, d,
        is_leaf=lambda v: v is None)
    g = jax.grad(lambda d: loss(merge(conv, d), xb, yb))(dense)
    return merge(conv, sgd(dense, g)), jnp.zeros((), jnp.float32)

  def full_step(p, xb, yb):
    return sgd(p, jax.grad(loss)(p, xb, yb)), jnp.zeros((), jnp.float32)

  def scan(body):
    def run(p):
      def step(carry, t):
        q, acc = carry
        xb, yb = sample_batch(jax.random.fold_in(key, t), x, y, n_max, batch)
        q, add = body(q, xb, yb)
        return (q, acc + add), None
      return jax.lax.scan(step, (p, jnp.zeros((), jnp.float32)),
                          jnp.arange(steps))[0]
    return run

  programs = {
      "sample": scan(sample_step), "forward": scan(forward_step),
      "sgd_dense": scan(dense_step), "sgd": scan(full_step),
      "update": lambda p: local.run(p, stats, local.optimizer.init(p), x, y,
                                    n_max, steps, key, ()).params,
  }
  # Each core runs its clients in vmapped chunks of ``chunk`` (unbatched
  # when 1), so the programs are timed in that layout, which is not the
  # same cost as an unbatched scan (perf_notes.md, "a convolutional scan
  # that is not vmapped").
  chunk = clients.default_chunk_size() or 1
  if chunk > 1:
    params = jax.tree_util.tree_map(lambda a: jnp.stack([a] * chunk), params)
    programs = {name: jax.vmap(fn) for name, fn in programs.items()}
  p_dev = jax.device_put(params, jax.devices()[0])
  ms = {}
  for name, fn in programs.items():
    jitted = jax.jit(fn, compiler_options=options or None)
    ms[name] = 1e3 * _min_time(
        lambda: jax.block_until_ready(jitted(p_dev)), reps) / (steps * chunk)
  order = list(programs)
  parts = {order[0]: ms[order[0]]}
  for prev, name in zip(order, order[1:]):
    parts[name] = ms[name] - ms[prev]
  return {"ms_per_client_step": ms,
          "share_of_update": {k: v / ms["update"] for k, v in parts.items()},
          "conv_impl": conv_impl, "jax_version": jax.__version__,
          "steps": steps, "batch": batch, "chunk": chunk}


def measure_layouts(*, steps: int, batch: int, reps: int) -> dict:
  """One LeNet-5 client-step in two memory layouts, with and without
  buffer donation.

  A plain-``lax`` LeNet-5 (the library model's layers) trained by plain SGD
  for ``steps`` steps of batch ``batch`` in a ``lax.scan``, one client,
  unbatched, on one host device with the per-core compiler options:

  * ``nhwc``: images ``[N, H, W, Ch]``, kernels ``[kh, kw, in, out]`` (the
    library's layout, flax's);
  * ``nchw``: images ``[N, Ch, H, W]``, kernels ``[out, in, kh, kw]``
    (PyTorch's);
  * ``*_donate``: the same, with the parameters' buffers donated to each
    call (``donate_argnums``), as a rounds loop that does not keep the old
    model would.

  Returns:
    ms per client-step of each variant (best of ``reps`` chained calls).
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  from fedjax_dd.core import clients
  from fedjax_dd.data.stacked import sample_batch

  options = clients.hot_program_options(per_core=True)
  rng = np.random.default_rng(0)
  n_max = 10 * batch
  x_nhwc = rng.integers(0, 255, (n_max, 28, 28, 1), np.uint8)
  y = jnp.asarray(rng.integers(0, 10, (n_max,), np.int32))
  shapes = {"c1": (5, 5, 1, 6), "c2": (5, 5, 6, 16), "d1": (256, 120),
            "d2": (120, 84), "d3": (84, 10)}
  base = {k: (rng.normal(size=v) / np.sqrt(np.prod(v[:-1]))).astype(
      np.float32) for k, v in shapes.items()}
  key = jax.random.PRNGKey(1)
  ms = {}
  for layout in ("nhwc", "nchw"):
    dn = (("NHWC", "HWIO", "NHWC") if layout == "nhwc" else
          ("NCHW", "OIHW", "NCHW"))
    x = jnp.asarray(x_nhwc if layout == "nhwc" else
                    x_nhwc.transpose(0, 3, 1, 2))
    params = {k: jnp.asarray(v if layout == "nhwc" or k[0] == "d" else
                             v.transpose(3, 2, 0, 1))
              for k, v in base.items()}
    window = (1, 2, 2, 1) if layout == "nhwc" else (1, 1, 2, 2)

    def net(p, xb, dn=dn, window=window):
      h = xb.astype(jnp.float32) / 255.0
      for k in ("c1", "c2"):
        h = jax.nn.relu(jax.lax.conv_general_dilated(
            h, p[k], (1, 1), "VALID", dimension_numbers=dn))
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, window, window,
                                  "VALID")
      h = h.reshape(h.shape[0], -1)
      h = jax.nn.relu(h @ p["d1"])
      h = jax.nn.relu(h @ p["d2"])
      return h @ p["d3"]

    def run(p, x=x, net=net):
      def step(q, t):
        xb, yb = sample_batch(jax.random.fold_in(key, t), x, y, n_max, batch)
        loss = lambda r: -jnp.mean(jnp.take_along_axis(
            jax.nn.log_softmax(net(r, xb)), yb[:, None], axis=1))
        g = jax.grad(loss)(q)
        return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, q, g), None
      return jax.lax.scan(step, p, jnp.arange(steps))[0]

    for donate in (False, True):
      jitted = jax.jit(run, donate_argnums=(0,) if donate else (),
                       compiler_options=options or None)
      state = [jax.device_put(params, jax.devices()[0])]

      def call(jitted=jitted, state=state):
        state[0] = jax.block_until_ready(jitted(state[0]))

      name = layout + ("_donate" if donate else "")
      ms[name] = 1e3 * _min_time(call, reps) / steps
  return {"ms_per_client_step": ms, "jax_version": jax.__version__,
          "steps": steps, "batch": batch}


def measure_forms(*, steps: int, batch: int, reps: int,
                  conv_impl: str = "auto") -> dict:
  """One LeNet-5 client's local update jitted four ways, single-threaded.

  ``unbatched`` (one client), ``vmap1`` and ``vmap2`` (a vmap over one and
  two clients) and ``map2`` (``lax.map`` over two clients, no vmap), each on
  one host device with XLA's intra-op threads off (as each core runs them
  under the ``sharded`` backend) and, where the running XLA has it, the
  classic runtime (as the engine compiles them).

  Returns:
    ms per client-step for each form, best of ``reps`` after a warm-up.
  """
  import jax

  from fedjax_dd.core import clients

  task, local, conv_impl, x, y, n_max = _local_problem(
      "lenet5", conv_impl, 2, steps=steps, batch=batch)
  params, stats = task.init(jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(1), 2)
  options = clients.hot_program_options(per_core=True)

  def one(xc, yc, k):
    return local.run(params, stats, local.optimizer.init(params), xc, yc,
                     n_max, steps, k, ()).params

  forms = {
      "unbatched": (one, (x[0], y[0], keys[0]), 1),
      "vmap1": (jax.vmap(one), (x[:1], y[:1], keys[:1]), 1),
      "vmap2": (jax.vmap(one), (x, y, keys), 2),
      "map2": (lambda a, b, c: jax.lax.map(lambda t: one(*t), (a, b, c)),
               (x, y, keys), 2),
  }
  out = {"jax_version": jax.__version__, "conv_impl": conv_impl,
         "compiler_options": options, "steps": steps, "batch": batch}
  for name, (fn, args, num) in forms.items():
    f = jax.jit(fn, compiler_options=options or None)
    seconds = _min_time(lambda: jax.block_until_ready(f(*args)), reps)
    out[name] = 1e3 * seconds / (num * steps)
  return out


ROUND_BUILDS = ("public", "entry")


def measure_round(build: str, *, num_clients: int, steps: int, batch: int,
                  reps: int) -> dict:
  """One FedAvg round of LeNet-5 clients built as ``build`` says (called in
  a fresh subprocess; see ``--public_round``).

  Args:
    build: ``"public"`` (the public API's defaults) or ``"entry"`` (the
      entry point's choices for ``fedavg.py:mnist_iid``).
    num_clients: Clients of the cohort (each with ``10 * batch`` examples).
    steps: Local steps.
    batch: Local batch size.
    reps: Timed rounds after the compiling one (the best is kept).
  """
  import flax
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  from fedjax_dd import models
  from fedjax_dd import policy
  from fedjax_dd.algorithms.fedavg import fedavg
  from fedjax_dd.core.algorithm import Cohort
  from fedjax_dd.core.local import LocalTraining
  from fedjax_dd.core.task import Classifier

  if build not in ROUND_BUILDS:
    raise ValueError(f"build must be one of {ROUND_BUILDS}, got {build!r}.")
  spec = models.get_model("lenet5")
  preprocess = lambda x: x.astype(jnp.float32) / 255.0
  if build == "public":
    task = Classifier(module=spec.build(10), input_shape=spec.input_shape,
                      preprocess=preprocess, num_classes=10)
    algorithm = fedavg(LocalTraining(task, optax.sgd(0.01), batch_size=batch,
                                     max_steps=steps))
  else:
    from fedjax_dd.experiments import common
    from fedjax_dd.experiments import registry
    from fedjax_dd.experiments.configs import fedavg as fedavg_config
    config = fedavg_config.get_config("mnist_iid")
    config.client.batch_size = batch
    config.client.optimizer = "sgd"
    config.client.lr = 0.01
    config.client.momentum = 0.0
    module = spec.build(10, conv_impl=common.conv_impl(config))
    task = Classifier(module=module, input_shape=spec.input_shape,
                      preprocess=preprocess, num_classes=10)
    algorithm = registry.get("fedavg").rounds(
        config, common.local_training(config, task, steps))
  rng = np.random.default_rng(0)
  n_max = 10 * batch
  cohort = Cohort(
      x=jnp.asarray(rng.integers(0, 255, (num_clients, n_max,
                                          *spec.input_shape), np.uint8)),
      y=jnp.asarray(rng.integers(0, 10, (num_clients, n_max), np.int32)),
      num_examples=jnp.full((num_clients,), n_max, jnp.int32),
      num_steps=jnp.full((num_clients,), steps, jnp.int32),
      client_ids=jnp.arange(num_clients))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, client_states = algorithm.init(params, stats, num_clients)
  key = jax.random.PRNGKey(1)

  def run():
    out, _, _ = algorithm.apply(server, client_states, cohort, key)
    jax.block_until_ready(out.params)

  seconds = _min_time(run, reps)
  return {
      "build": build, "model": "lenet5", "num_clients": num_clients,
      "steps": steps, "batch": batch,
      "ms_per_client_step": 1e3 * seconds / (num_clients * steps),
      "conv_impl": task.module.layers.conv_impl,
      "policy": policy.as_dict(policy.current()),
      "jax_version": jax.__version__, "flax_version": flax.__version__,
      "python": sys.version.split()[0], "devices": jax.device_count(),
      "platform": jax.default_backend(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def measure_public_round(*, pairs: int, num_clients: int, steps: int,
                         batch: int, reps: int,
                         other_python: str = "") -> dict:
  """The public-API default round against the entry point's, alternating.

  Each pair runs, on this interpreter (and ``other_python`` if given), the
  two builds of :func:`measure_round` back to back in fresh subprocesses,
  the order flipped every pair.

  Returns:
    ``{"pairs": [...], "summary": {interpreter: {"jax_version",
    "public_ms", "entry_ms", "ratio_public_over_entry": {"median", "min",
    "max"}}}}``: medians over pairs; a ratio <= 1.1 meets the bar.
  """
  ends = {"this": sys.executable}
  if other_python:
    ends["other"] = other_python
  common = dict(num_clients=num_clients, steps=steps, batch=batch, reps=reps)
  rows = []
  for pair in range(pairs):
    order = ROUND_BUILDS if pair % 2 == 0 else ROUND_BUILDS[::-1]
    for end, python in ends.items():
      row = {"pair": pair, "interpreter": end}
      for build in order:
        r = _subprocess("round", python=python, build=build, **common)
        row[build] = r
        row[f"{build}_ms"] = _ms(r)
        print(json.dumps({"pair": pair, "interpreter": end,
                          **(r if isinstance(r, dict) else {})}),
              file=sys.stderr)
      p, e = row["public_ms"], row["entry_ms"]
      row["ratio_public_over_entry"] = p / e if p and e else None
      rows.append(row)
  summary = {}
  for end in ends:
    mine = [r for r in rows if r["interpreter"] == end]
    ratios = [r["ratio_public_over_entry"] for r in mine
              if r["ratio_public_over_entry"]]
    first = next((r["public"] for r in mine
                  if isinstance(r["public"], dict)
                  and "jax_version" in r["public"]), {})
    summary[end] = {
        "jax_version": first.get("jax_version"),
        "conv_impl": {b: next((r[b].get("conv_impl") for r in mine
                               if isinstance(r[b], dict)), None)
                      for b in ROUND_BUILDS},
        "public_ms": _median([r["public_ms"] for r in mine]),
        "entry_ms": _median([r["entry_ms"] for r in mine]),
        "ratio_public_over_entry": {
            "median": _median(ratios),
            "min": min(ratios) if ratios else None,
            "max": max(ratios) if ratios else None},
    }
  return {"model": "lenet5", **common, "pairs": rows, "summary": summary}


def measure_matmul(reps: int) -> float:

  import jax
  import jax.numpy as jnp
  a = jnp.ones((2048, 2048), jnp.float32)
  f = jax.jit(lambda a: a @ a)
  seconds = _min_time(lambda: f(a).block_until_ready(), reps)
  return 2 * 2048**3 / seconds / 1e9


def measure_torch(model: str, num_clients: int, *, steps: int, batch: int,
                  reps: int, lean: bool = False,
                  device: str = "cpu", autocast: bool = False) -> dict | None:
  """PyTorch's sequential client loop (LeNet-5 or ConvNet-3), or None
  without torch (or for another model).

  ``device`` is the torch device of the models and data (e.g. ``cuda``;
  each timed run then ends with a synchronisation). ``lean=False`` converts
  every batch from uint8 inside the loop (as the papers' reference code's
  data loaders do); ``lean=True`` is the loop a PyTorch user would write
  for speed: the data converted once, outside the timing, and the mean of
  the client models at the end (FedAvg's server step). The PyTorch models
  mirror ``models.LeNet5`` and ``models.ConvNet`` (width 128, depth 3).
  ``autocast=True`` runs the lean loop's forward pass and loss under
  ``torch.autocast(dtype=torch.bfloat16)``, the counterpart of the engine's
  ``compute_dtype="bfloat16"``.
  """
  try:
    import torch
    from torch import nn
  except ImportError:
    return None
  if model not in ("lenet5", "convnet3"):
    return None
  torch.set_num_threads(os.cpu_count() or 1)

  def lenet5():
    return nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(256, 120), nn.ReLU(),
                         nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

  def convnet3(width=128):
    blocks, ch = [], 3
    for _ in range(3):
      blocks += [nn.Conv2d(ch, width, 3, padding=1),
                 nn.InstanceNorm2d(width, affine=True), nn.ReLU(),
                 nn.AvgPool2d(2)]
      ch = width
    return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(width * 16, 10))

  build = {"lenet5": lenet5, "convnet3": convnet3}[model]
  h, w, ch = MODELS[model][1]
  g = torch.Generator().manual_seed(0)
  n_max = 10 * batch
  data = torch.randint(0, 255, (num_clients, n_max, ch, h, w),
                       dtype=torch.uint8, generator=g).to(device)
  labels = torch.randint(0, 10, (num_clients, n_max), generator=g).to(device)
  global_model = build().to(device)
  loss_fn = nn.CrossEntropyLoss()

  def run():
    for c in range(num_clients):
      net = build().to(device)
      net.load_state_dict(global_model.state_dict())
      opt = torch.optim.SGD(net.parameters(), lr=0.01)
      for _ in range(steps):
        idx = torch.randint(0, n_max, (batch,), generator=g).to(device)
        x = data[c, idx].float() / 255.0
        opt.zero_grad()
        loss_fn(net(x), labels[c, idx]).backward()
        opt.step()

  data_f = data.float() / 255.0  # lean: converted once, outside the timing
  if autocast and not lean:
    raise ValueError("autocast=True times the lean loop; pass lean=True")
  device_type = torch.device(device).type

  def mixed():
    if autocast:
      return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()

  def run_lean():
    total = None
    for c in range(num_clients):
      net = build().to(device)
      net.load_state_dict(global_model.state_dict())
      opt = torch.optim.SGD(net.parameters(), lr=0.01)
      xc, yc = data_f[c], labels[c]
      for _ in range(steps):
        idx = torch.randint(0, n_max, (batch,), generator=g).to(device)
        opt.zero_grad()
        with mixed():
          loss = loss_fn(net(xc[idx]), yc[idx])
        loss.backward()
        opt.step()
      with torch.no_grad():
        sd = net.state_dict()
        total = ({k: v.clone() for k, v in sd.items()} if total is None else
                 {k: total[k] + sd[k] for k in total})
    global_model.load_state_dict({k: v / num_clients for k, v in total.items()})

  sync = (torch.cuda.synchronize if torch.device(device).type == "cuda"
          else lambda: None)
  seconds = _min_time(lambda: ((run_lean if lean else run)(), sync()), reps)
  return {"model": model, "num_clients": num_clients, "lean": lean,
          "autocast": "bfloat16" if autocast else None,
          "ms_per_client_step": 1e3 * seconds / (num_clients * steps),
          "param_count": sum(p.numel() for p in global_model.parameters()),
          "torch_version": torch.__version__,
          "threads": torch.get_num_threads(), "device": str(device)}


def measure_vs_torch(*, pairs: int, client_counts: list[int], steps: int,
                     batch: int, reps: int, chunk_size: int,
                     model: str = "lenet5") -> dict:
  """The engine against both PyTorch loops, alternating, on ``model``
  (``lenet5`` or ``convnet3``).

  Each pair runs, for every client count, the engine (default backend and
  conv formulation) and both loops of :func:`measure_torch`, each in a
  fresh subprocess, in an order rotated every pair.

  Returns:
    ``{"pairs": [...], "summary": {clients: {"engine_ms", "torch_ms",
    "torch_lean_ms", "ratio_torch", "ratio_torch_lean"}}}``: medians over
    pairs, and each ratio (PyTorch ms / engine ms, > 1: the engine is
    faster) with its min and max over pairs.
  """
  kinds = ("engine", "torch", "torch_lean")
  rows = []
  for pair in range(pairs):
    for c in client_counts:
      row = {"pair": pair, "num_clients": c}
      shift = pair % len(kinds)
      for kind in kinds[shift:] + kinds[:shift]:
        common = dict(model=model, num_clients=c, steps=steps, batch=batch,
                      reps=reps)
        if kind == "engine":
          r = _subprocess("jax", backend="auto", chunk_size=chunk_size,
                          conv_impl="auto", flops=False, **common)
        else:
          r = _subprocess("torch", lean=kind == "torch_lean", **common)
        row[kind] = r
        row[f"{kind}_ms"] = _ms(r)
        print(json.dumps({"pair": pair, "kind": kind, **(r or {})}),
              file=sys.stderr)
      for ref in ("torch", "torch_lean"):
        e, t = row["engine_ms"], row[f"{ref}_ms"]
        row[f"ratio_{ref}"] = t / e if e and t else None
      rows.append(row)
  summary = {}
  for c in client_counts:
    mine = [r for r in rows if r["num_clients"] == c]
    out = {f"{k}_ms": _median([r[f"{k}_ms"] for r in mine]) for k in kinds}
    for ref in ("torch", "torch_lean"):
      ratios = [r[f"ratio_{ref}"] for r in mine if r[f"ratio_{ref}"]]
      out[f"ratio_{ref}"] = {"median": _median(ratios),
                             "min": min(ratios) if ratios else None,
                             "max": max(ratios) if ratios else None}
    summary[str(c)] = out
  return {"model": model, "steps": steps, "batch": batch, "reps": reps,
          "pairs": rows, "summary": summary}


# The full report's padding workloads and the scale of their local epochs
# for the wall times (the full workloads are long on a CPU).
FULL_PADDING_PRESETS = ("fedhydra.py:cifar10_a0.1", "hfldd_random.py:cifar10_c1")
FULL_PADDING_SCALE = 0.1

# The platform measurement subprocesses run on (``--platform``; None: JAX's
# default). Set once by ``main``.
_PLATFORM: list[str | None] = [None]


def worker_env(platform: str | None) -> dict[str, str]:
  """The environment of a measurement subprocess: ``JAX_PLATFORMS`` set to
  ``platform`` (e.g. ``cuda``) when given."""
  env = dict(os.environ)
  if platform:
    env["JAX_PLATFORMS"] = platform
  return env


def _subprocess(kind: str, python: str | None = None,
                **kwargs) -> dict | float | None:
  cmd = [python or sys.executable, "-m",
         "fedjax_dd.experiments.bench.bench_engine",
         "--_worker", json.dumps({"kind": kind, **kwargs})]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        env=worker_env(_PLATFORM[0]))
  if proc.returncode != 0:
    return {"error": proc.stderr[-2000:], **kwargs}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float | None:
  values = sorted(v for v in values if v is not None)
  if not values:
    return None
  mid = len(values) // 2
  return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] +
                                                    values[mid])


def _ms(row) -> float | None:
  return row.get("ms_per_client_step") if isinstance(row, dict) else None


def measure_ends(other_python: str, *, conv_impls: list[str], pairs: int,
                 num_clients: int, backend: str, steps: int, batch: int,
                 reps: int, chunk_size: int) -> dict:
  """LeNet-5 rounds alternately on this interpreter and ``other_python``.

  Each pair measures, for every conv_impl, this interpreter and the other
  one back to back (the order flips every pair, so neither side always runs
  first), each in a fresh subprocess.

  Returns:
    ``{"interpreters", "pairs", "median", "conv_impl_ratio"}``: both
    interpreters' versions, every pair's ms per client-step, per conv_impl
    the medians and the median ratio other / this, and per interpreter the
    median patches / lax.
  """
  ends = {"this": sys.executable, "other": other_python}
  common = dict(model="lenet5", num_clients=num_clients, backend=backend,
                steps=steps, batch=batch, reps=reps, chunk_size=chunk_size,
                flops=False)
  rows = []
  for pair in range(pairs):
    for impl in conv_impls:
      order = ("this", "other") if pair % 2 == 0 else ("other", "this")
      row = {"pair": pair, "conv_impl": impl}
      for end in order:
        r = _subprocess("jax", python=ends[end], conv_impl=impl, **common)
        row[end] = r
        print(json.dumps({"pair": pair, "end": end, **r}), file=sys.stderr)
      this_ms, other_ms = _ms(row["this"]), _ms(row["other"])
      row["this_ms"], row["other_ms"] = this_ms, other_ms
      row["ratio_other_over_this"] = (other_ms / this_ms
                                      if this_ms and other_ms else None)
      rows.append(row)

  def version(end):
    for r in rows:
      if isinstance(r[end], dict) and "jax_version" in r[end]:
        return {"python": r[end]["python"], "jax_version": r[end]["jax_version"],
                "flax_version": r[end]["flax_version"],
                "backend": r[end]["resolved_backend"],
                "devices": r[end]["devices"]}
    return {}

  median = {}
  for impl in conv_impls:
    mine = [r for r in rows if r["conv_impl"] == impl]
    median[impl] = {
        # The impl each end resolved to (differs for "auto").
        "resolved": {end: (mine[0][end].get("conv_impl")
                           if isinstance(mine[0][end], dict) else None)
                     for end in ends},
        "this_ms": _median([r["this_ms"] for r in mine]),
        "other_ms": _median([r["other_ms"] for r in mine]),
        "ratio_other_over_this": _median(
            [r["ratio_other_over_this"] for r in mine]),
    }
  conv_impl_ratio = {}
  if "lax" in conv_impls and "patches" in conv_impls:
    for end in ends:
      by_pair = {}
      for r in rows:
        by_pair.setdefault(r["pair"], {})[r["conv_impl"]] = r[f"{end}_ms"]
      ratios = [p["patches"] / p["lax"] for p in by_pair.values()
                if p.get("patches") and p.get("lax")]
      conv_impl_ratio[end] = {"patches_over_lax": _median(ratios)}
  return {"interpreters": {end: version(end) for end in ends},
          "model": "lenet5", "num_clients": num_clients, "steps": steps,
          "batch": batch, "reps": reps, "pairs": rows, "median": median,
          "conv_impl_ratio": conv_impl_ratio}


def measure_padding(preset: str, *, pairs: int,
                    epochs_scale: float = 1.0) -> dict:
  """Padded local steps of a real workload, before and after bucketing.

  ``preset`` is ``CONFIG.py:ARG`` of ``experiments/configs`` (e.g.
  ``fedhydra.py:cifar10_a0.1``); for an HFLDD preset the workload is its
  heads' FedAvg round (``run_hfldd.heads_data``). Every client trains once
  from the initial model through ``clients.client_stage`` with the preset's
  mapper, alternately in the masked form (``bucket=False``,
  ``skip_padding=False``: every client computes the cohort's largest step
  count) and the default; ``pairs`` times. ``epochs_scale`` multiplies the
  preset's local epochs for the timed runs only; the ``full`` counts are
  the preset's own.

  Returns:
    ``{"preset", "clients", "real_steps", "computed_before",
    "computed_after", "seconds": [[before, after], ...], "median_ratio",
    "full": {...}}`` (ratio = before / after wall time; the counts are of
    the timed runs, ``full`` of the unscaled preset) and the mapper's chunk
    and lanes.
  """
  import dataclasses
  import importlib

  import jax
  import numpy as np

  from fedjax_dd.core import clients as clients_lib
  from fedjax_dd.core.algorithm import Cohort
  from fedjax_dd.core.local import LocalTraining, make_local_update
  from fedjax_dd.experiments import common

  module, _, arg = preset.partition(":")
  module = module.removesuffix(".py")
  config = importlib.import_module(
      "fedjax_dd.experiments.configs." + module).get_config(arg)
  if module.startswith("hfldd"):
    from fedjax_dd.experiments import run_hfldd
    prepared, data = run_hfldd.heads_data(config)
  else:
    prepared = common.load_and_prepare(config)
    parts = common.partition(config, prepared.dataset.y_train)
    data = common.client_data(prepared.dataset, parts)
  full_steps = np.asarray(jax.device_get(common.local_steps(
      config, data.num_examples)))
  config.client.local_epochs = config.client.local_epochs * epochs_scale
  num_steps = common.local_steps(config, data.num_examples)
  steps_np = np.asarray(jax.device_get(num_steps))
  max_steps = int(steps_np.max())
  mapper = common.mapper(config)
  cohort = Cohort(x=data.x, y=data.y, num_examples=data.num_examples,
                  num_steps=num_steps,
                  client_ids=np.arange(data.num_clients, dtype=np.int32))
  params, stats = prepared.task.init(jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(1), data.num_clients)
  ctx = np.zeros((data.num_clients,), np.float32)
  stages = {}
  for name, on in (("before", False), ("after", True)):
    local = make_local_update(LocalTraining(
        prepared.task, common.make_optimizer(config),
        batch_size=config.client.batch_size, max_steps=max_steps,
        skip_padding=on))
    stages[name] = clients_lib.client_stage(
        local, dataclasses.replace(mapper, bucket=on))

  def timed(name):
    t = time.perf_counter()
    out = stages[name](params, stats, (), cohort, keys, ctx)
    jax.block_until_ready(out)
    return time.perf_counter() - t, out

  outs = {name: timed(name)[1] for name in stages}  # compile
  same = all(bool(np.array_equal(a, b)) for a, b in zip(
      jax.tree_util.tree_leaves(outs["before"]),
      jax.tree_util.tree_leaves(outs["after"])))
  seconds = []
  for _ in range(pairs):
    seconds.append([timed("before")[0], timed("after")[0]])
  chunk, lanes = mapper.resolved_chunk_size, mapper.lanes

  def counts(steps):
    return {"steps": steps.tolist(), "real_steps": int(steps.sum()),
            # The masked form as timed here, and with its short last chunk
            # a smaller vmap.
            "computed_before": clients_lib.computed_steps(
                steps, chunk=chunk, lanes=lanes, bucket=False,
                skip_padding=False),
            "computed_before_original": clients_lib.computed_steps(
                steps, chunk=chunk, lanes=lanes, bucket=False,
                skip_padding=False, pad_short_chunk=False),
            "computed_after": clients_lib.computed_steps(steps, chunk=chunk,
                                                         lanes=lanes)}

  return {
      "preset": preset, "clients": int(data.num_clients),
      "backend": mapper.resolved_backend, "chunk": chunk, "lanes": lanes,
      "epochs_scale": epochs_scale, "max_steps": max_steps,
      **counts(steps_np), "full": counts(full_steps),
      "bit_identical": same, "seconds": seconds,
      "median_ratio": _median([b / a for b, a in seconds]),
      "jax_version": jax.__version__,
  }


def measure_scale(num_clients: int, *, participation: float, examples: int,
                  rounds: int, batch: int) -> dict:
  """FedAvg over a large population whose data stays in host memory.

  ``num_clients`` MNIST-sized clients (``examples`` random uint8 images
  each, in host memory), LeNet-5, one local epoch of batch ``batch``,
  ``participation`` of the clients per round, each cohort streamed to the
  device. One round compiles; the next ``rounds`` are timed. Run in a fresh
  subprocess so that the peak RSS is this measurement's.

  Returns:
    ``{"num_clients", "clients_per_round", "data_mb", "seconds_per_round",
    "peak_rss_mb"}``.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  from fedjax_dd.algorithms.fedavg import fedavg
  from fedjax_dd.core import rounds as rounds_lib
  from fedjax_dd.core.algorithm import ExperimentState
  from fedjax_dd.core.local import LocalTraining, steps_for
  from fedjax_dd.data.stacked import ClientData

  rng = np.random.default_rng(0)
  data = ClientData(
      x=rng.integers(0, 255, (num_clients, examples, 28, 28, 1), np.uint8),
      y=rng.integers(0, 10, (num_clients, examples)).astype(np.int32),
      num_examples=np.full((num_clients,), examples, np.int32))
  task, _ = _task("lenet5", "lax")
  num_steps = steps_for(data.num_examples, batch, epochs=1)
  alg = fedavg(LocalTraining(task, optax.sgd(0.01), batch_size=batch,
                             max_steps=int(np.max(num_steps))))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, client_states = alg.init(params, stats, num_clients)
  state = ExperimentState(server, client_states, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  per_round = max(1, round(participation * num_clients))
  options = lambda n: rounds_lib.RoundsOptions(
      num_rounds=n, clients_per_round=per_round, progress=False,
      eval_every=0)
  state, ledger, _ = rounds_lib.run_rounds(alg, state, data, num_steps,
                                           options(1))
  jax.block_until_ready(state.server.params)
  t = time.perf_counter()
  state, _, _ = rounds_lib.run_rounds(alg, state, data, num_steps,
                                      options(1 + rounds), ledger=ledger)
  jax.block_until_ready(state.server.params)
  seconds = (time.perf_counter() - t) / rounds
  return {"num_clients": num_clients, "clients_per_round": per_round,
          "examples_per_client": examples,
          "data_mb": (data.x.nbytes + data.y.nbytes) / 2**20,
          "seconds_per_round": seconds,
          "peak_rss_mb": resource.getrusage(
              resource.RUSAGE_SELF).ru_maxrss / 1024,
          "jax_version": jax.__version__}


def _worker(spec: str) -> None:
  args = json.loads(spec)
  kind = args.pop("kind")
  fns = {"jax": measure_jax, "matmul": measure_matmul, "torch": measure_torch,
         "scale": measure_scale, "round": measure_round}
  print(json.dumps(fns[kind](**args)))


def _rows_report(path: str, key: str, items: list[str],
                 measure: Callable[[str], dict]) -> dict:
  """``{key: [measure(item), ...]}``, each row echoed to stderr, written to
  ``path``."""
  report = {key: []}
  for item in items:
    row = measure(item)
    report[key].append(row)
    print(json.dumps(row), file=sys.stderr)
  with open(path, "w") as f:
    json.dump(report, f, indent=2)
  return report


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="bench_engine.json")
  p.add_argument("--clients", default="10,100,500")
  p.add_argument("--models", default="lenet5,hfldd_cifar_cnn")
  p.add_argument("--backends", default="sharded,chunked,vmap,loop")
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--chunk_size", type=int, default=0,
                 help="clients per chunk; 0: the engine's measured default")
  p.add_argument("--chunk_sizes", default="",
                 help="comma-separated chunk sizes to sweep in the grid "
                      "(0: the default), e.g. 0,16,64 on a GPU; overrides "
                      "--chunk_size there")
  p.add_argument("--platform", default="",
                 help="JAX platform of the measurements, e.g. cuda or tpu "
                      "(default: JAX's default); see the README's GPU "
                      "section")
  p.add_argument("--cifar_clients", default="10",
                 help="client counts for hfldd_cifar_cnn and convnet3")
  p.add_argument("--conv_impl", default="auto",
                 help="comma-separated conv formulations: auto | lax | "
                      "patches (auto: the platform's measured default); the "
                      "speedups use the first")
  p.add_argument("--other_python", default="",
                 help="another Python (e.g. a virtualenv with another jax) "
                      "to compare with this one; runs only the LeNet-5 "
                      "round of both side by side")
  p.add_argument("--pairs", type=int, default=3,
                 help="with --other_python: alternating pairs per conv_impl")
  p.add_argument("--ends_clients", type=int, default=100,
                 help="with --other_python: clients of the LeNet-5 round")
  p.add_argument("--ends_backend", default="auto",
                 help="with --other_python: the client backend of both")
  p.add_argument("--forms", action="store_true",
                 help="only time one LeNet-5 client's local update as "
                      "unbatched / vmap of 1 / vmap of 2 / lax.map of 2 in "
                      "this interpreter (best of --reps, at least 15)")
  p.add_argument("--vs_torch", default="",
                 help="comma-separated client counts: only the engine against "
                      "both PyTorch loops, LeNet-5, --pairs alternations")
  p.add_argument("--scale", default="",
                 help="comma-separated population sizes: only FedAvg rounds "
                      "over that many MNIST-sized clients streamed from host "
                      "memory (1%% participation, --scale_rounds timed)")
  p.add_argument("--scale_rounds", type=int, default=3)
  p.add_argument("--scale_examples", type=int, default=60)
  p.add_argument("--profile", action="store_true",
                 help="only split one LeNet-5 client-step into sampling, "
                      "forward, dense backward, conv backward and update "
                      "(best of --reps, at least 15)")
  p.add_argument("--padding", default="",
                 help="comma-separated presets CONFIG.py:ARG: only measure "
                      "each one's padded local steps and wall time before "
                      "and after bucketing (--pairs alternations)")
  p.add_argument("--layouts", action="store_true",
                 help="only time one LeNet-5 client-step in NHWC and NCHW, "
                      "with and without donated parameters (best of "
                      "--reps, at least 15)")
  p.add_argument("--public_round", action="store_true",
                 help="only the FedAvg round built through the public API's "
                      "defaults against the entry point's, LeNet-5 at "
                      "--ends_clients, --pairs alternations (with "
                      "--other_python: on both interpreters)")
  p.add_argument("--vs_torch_model", default="lenet5",
                 help="the model of --vs_torch: lenet5 or convnet3")
  p.add_argument("--padding_epochs_scale", type=float, default=1.0,
                 help="with --padding: multiply the presets' local epochs "
                      "for the timed runs (the report keeps the full "
                      "preset's step counts too)")
  p.add_argument("--grid_only", action="store_true",
                 help="without a mode flag: only the backend grid, not the "
                      "full report's vs_torch, padding and scale sections")
  p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  _PLATFORM[0] = args.platform or None
  if args._worker:
    _worker(args._worker)
    return {}
  if args.vs_torch:
    report = {"vs_torch": measure_vs_torch(
        pairs=args.pairs, client_counts=[int(v) for v in
                                         args.vs_torch.split(",")],
        steps=args.steps, batch=args.batch, reps=args.reps,
        chunk_size=args.chunk_size, model=args.vs_torch_model),
              "xla_flags": os.environ.get("XLA_FLAGS", "")}
    with open(args.out, "w") as f:
      json.dump(report, f, indent=2)
    print(json.dumps(report["vs_torch"]["summary"], indent=2))
    return report
  if args.public_round:
    report = {"public_round": measure_public_round(
        pairs=args.pairs, num_clients=args.ends_clients, steps=args.steps,
        batch=args.batch, reps=args.reps, other_python=args.other_python)}
    with open(args.out, "w") as f:
      json.dump(report, f, indent=2)
    print(json.dumps(report["public_round"]["summary"], indent=2))
    return report
  if args.scale:
    return _rows_report(args.out, "scale", args.scale.split(","),
                        lambda c: _subprocess(
                            "scale", num_clients=int(c), participation=0.01,
                            examples=args.scale_examples,
                            rounds=args.scale_rounds, batch=10))
  if args.padding:
    return _rows_report(args.out, "padding", args.padding.split(","),
                        lambda preset: measure_padding(
                            preset, pairs=args.pairs,
                            epochs_scale=args.padding_epochs_scale))
  if args.profile or args.layouts:
    # One-process measurements: printed, and written where --out is given.
    if args.profile:
      report = measure_profile(steps=args.steps, batch=args.batch,
                               reps=max(args.reps, 15),
                               conv_impl=args.conv_impl.split(",")[0])
    else:
      report = measure_layouts(steps=args.steps, batch=args.batch,
                               reps=max(args.reps, 15))
    print(json.dumps(report, indent=2))
    if args.out != p.get_default("out"):
      with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return report
  if args.forms:
    report = measure_forms(steps=args.steps, batch=args.batch,
                           reps=max(args.reps, 15),
                           conv_impl=args.conv_impl.split(",")[0])
    print(json.dumps(report, indent=2))
    return report


  conv_impls = [v for v in args.conv_impl.split(",") if v]
  if args.other_python:
    report = {"ends": measure_ends(
        args.other_python, conv_impls=conv_impls, pairs=args.pairs,
        num_clients=args.ends_clients, backend=args.ends_backend,
        steps=args.steps, batch=args.batch, reps=args.reps,
        chunk_size=args.chunk_size),
              "xla_flags": os.environ.get("XLA_FLAGS", "")}
    with open(args.out, "w") as f:
      json.dump(report, f, indent=2)
    e = report["ends"]
    print(json.dumps({"interpreters": e["interpreters"],
                      "median": e["median"],
                      "conv_impl_ratio": e["conv_impl_ratio"]}, indent=2))
    return report

  from fedjax_dd.core.clients import ClientMapper, default_backend
  default = default_backend()
  report: dict = {"results": [], "reference_loop": [], "torch": [],
                  "default_backend": default,
                  "default_chunk_size": ClientMapper().resolved_chunk_size,
                  "matmul_gflops": _subprocess("matmul", reps=args.reps),
                  "xla_flags": os.environ.get("XLA_FLAGS", "")}
  common = dict(steps=args.steps, batch=args.batch, reps=args.reps)
  chunk_sizes = ([int(v) for v in args.chunk_sizes.split(",")]
                 if args.chunk_sizes else [args.chunk_size])

  def clients_for(model):
    spec = (args.cifar_clients if model in ("hfldd_cifar_cnn", "convnet3")
            else args.clients)
    return [int(v) for v in spec.split(",")]

  for model in args.models.split(","):
    for c in clients_for(model):
      grid = [(b, impl, chunk) for b in args.backends.split(",")
              for impl in conv_impls for chunk in chunk_sizes
              if not (chunk and b in ("vmap", "loop"))]  # no chunks there
      for backend, impl, chunk in grid:
        r = _subprocess("jax", model=model, num_clients=c, backend=backend,
                        chunk_size=chunk, conv_impl=impl, **common)
        (report["reference_loop"] if backend == "loop"
         else report["results"]).append(r)
        print(json.dumps(r), file=sys.stderr)
      t = _subprocess("torch", model=model, num_clients=c, **common)
      if t:
        report["torch"].append(t)
        print(json.dumps(t), file=sys.stderr)

  def ms(rows, model, c, backend=None):
    for r in rows:
      if (r.get("model") == model and r.get("num_clients") == c and
          (backend is None or r.get("backend") == backend) and
          "ms_per_client_step" in r):
        return r["ms_per_client_step"]
    return None

  report["speedup_vs_loop"] = {}
  report["speedup_vs_torch"] = {}
  for model in args.models.split(","):
    for c in clients_for(model):
      mine = ms(report["results"], model, c, default)
      loop = ms(report["reference_loop"], model, c)
      torch_ms = ms(report["torch"], model, c)
      if mine and loop:
        report["speedup_vs_loop"][f"{model}/{c}"] = loop / mine
      if mine and torch_ms:
        report["speedup_vs_torch"][f"{model}/{c}"] = torch_ms / mine
  if not args.grid_only:
    # The full report: the alternating PyTorch ratios, the padding
    # before/after (local epochs scaled by FULL_PADDING_SCALE) and the
    # streamed-population rows.
    report["vs_torch"] = measure_vs_torch(
        pairs=args.pairs, client_counts=[10, 100], steps=args.steps,
        batch=args.batch, reps=args.reps, chunk_size=args.chunk_size)
    report["padding"] = [measure_padding(p, pairs=args.pairs,
                                         epochs_scale=FULL_PADDING_SCALE)
                         for p in FULL_PADDING_PRESETS]
    report["scale"] = [_subprocess("scale", num_clients=c, participation=0.01,
                                   examples=args.scale_examples,
                                   rounds=args.scale_rounds, batch=10)
                       for c in (500, 2000, 10000)]
  with open(args.out, "w") as f:
    json.dump(report, f, indent=2)
  print(json.dumps({k: report[k] for k in ("matmul_gflops", "speedup_vs_loop",
                                           "speedup_vs_torch")}, indent=2))
  if "vs_torch" in report:
    print(json.dumps(report["vs_torch"]["summary"], indent=2))
  return report


if __name__ == "__main__":
  fedjax_dd.configure_cpu()  # one host device per core, before JAX starts
  main()
