"""The client axis: the one module that turns per-client code into cohort code.

Every per-client function (local training, KIP, soft-label inference,
generator training) is written for ONE client; this module adds the leading
client axis ``[C, ...]`` with one of four backends:

* ``vmap``: the whole cohort as one jitted, vectorised program.
* ``chunked``: ``lax.map(..., batch_size=k)``; vectorised over chunks of ``k``
  clients and sequential over chunks, to bound peak memory and keep each
  chunk's activations in cache (``k = 1``: a plain ``lax.map``, no vmap).
* ``sharded``: the client axis laid over a 1-D device mesh (``jit`` of a
  ``shard_map``); each device runs its share of the clients in chunks of
  ``chunk_size`` (``None``: one vmap). For several hosts see
  :func:`initialize_multihost`.
* ``loop``: a Python loop over clients calling one jitted per-client function,
  for debugging and as the sequential reference.

The default backend and chunk size per platform and workload come from the
measured table :mod:`fedjax_dd.policy` (see :func:`default_backend` and
:func:`default_chunk_size`). On CPU, ``fedjax_dd.configure_cpu()`` exposes
one XLA host device per core, so that ``sharded`` runs one stream of small
programs per core.

A mapped function called *inside* another traced program (e.g. the teacher
ensemble inside a jitted generator step) is vectorised in place with
``vmap``: the enclosing program owns the device layout.

Arguments are split by ``in_axes`` (per positional argument: ``0`` for mapped,
``None`` for broadcast, e.g. the server model). Outputs are always mapped.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dd import _xla_setup
from fedjax_dd import policy


PyTree = Any


def _shard_map(f, mesh, in_specs, out_specs):
  """``shard_map`` without the replication check, on old and new jax.

  Per-client programs replicate nothing, so the check only costs tracing.
  """
  if hasattr(jax, "shard_map"):
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)
  from jax.experimental.shard_map import shard_map  # pylint: disable=g-import-not-at-top
  return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                   check_rep=False)


if TYPE_CHECKING:  # Annotations only: core.local and core.algorithm stay above.
  from fedjax_dd.core.algorithm import Cohort
  from fedjax_dd.core.local import LocalResult, LocalUpdate

Backend = Literal["vmap", "chunked", "sharded", "loop"]
BACKENDS: tuple[str, ...] = ("vmap", "chunked", "sharded", "loop")
CLIENT_AXIS = "clients"


# Defaults (backend, chunk size, compiler options) come from fedjax_dd.policy.
_CLASSIC_RUNTIME_OPTION = policy.CLASSIC_RUNTIME_OPTION
WORKLOADS: tuple[str, ...] = ("train", "kip", "stratify")


@functools.lru_cache(maxsize=None)
def option_supported(name: str, value: Any, platform: str) -> bool:
  """Whether the running XLA accepts compile option ``name`` on ``platform``.

  Options come and go between jax releases and an unknown one fails every
  compilation, so each is probed once by compiling a trivial program.
  """
  try:
    device = jax.local_devices(backend=platform)[0]
  except RuntimeError:
    return False
  try:
    jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(
        jax.device_put(jnp.zeros((), jnp.float32), device)).compile()
  except Exception as e:  # pylint: disable=broad-except
    # Only a rejected option is "unsupported"; anything else is a real error.
    if "compile option" in str(e) or "INVALID_ARGUMENT" in str(e):
      logging.warning("XLA does not accept compile option %s on %s; the "
                      "engine runs without it.", name, platform)
      return False
    raise
  return True


def hot_program_options(classic_runtime: bool = True,
                        per_core: bool = False,
                        platform: str | None = None) -> dict[str, Any]:
  """XLA compiler options for the engine's hot jitted programs.

  The policy row's ``compiler_options`` and ``per_core_options``
  (:mod:`fedjax_dd.policy`); only CPU programs get options.

  Args:
    classic_runtime: include the classic-runtime option (see
      :func:`engine_jit`).
    per_core: the program runs beside others, one per host device (the
      single-threaded options).
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; defaults to JAX's backend.
  """
  if _xla_setup.no_xla_flags():
    return {}
  platform = policy.platform_of(platform)
  row = policy.lookup(platform)
  options = {}
  if classic_runtime:
    options.update(row.compiler_options)
  if per_core:
    options.update(row.per_core_options)
  return {k: v for k, v in options.items()
          if option_supported(k, v, platform)}


def once_program_options(platform: str | None = None
                         ) -> dict[str, Any] | None:
  """XLA compiler options for programs that run once per run: the policy
  row's ``once_options`` (:mod:`fedjax_dd.policy`), each kept only where the
  running XLA accepts it. None where the row has none, and with
  ``FEDJAX_DD_NO_XLA_FLAGS=1`` (see :func:`once_jit`)."""
  if _xla_setup.no_xla_flags():
    return None
  platform = policy.platform_of(platform)
  options = policy.lookup(platform).once_options
  if options is None:
    return None
  return {k: v for k, v in options if option_supported(k, v, platform)}


def once_jit(fn: Callable[..., Any], *, op_by_op: bool = False,
             **kwargs: Any) -> Callable[..., Any]:
  """``jax.jit`` with :func:`once_program_options`, for programs whose
  compilation is most of their cost (initialisations, one-off draws).

  On XLA:CPU one program at LLVM's level 0 compiles faster than an
  initialisation op by op, with the same bits. With traced arguments, or
  where :func:`once_program_options` is None, a plain ``jax.jit`` (``fn``
  itself when ``op_by_op`` and None).

  Args:
    fn: the function.
    op_by_op: ``fn`` runs unjitted where there are no options (an
      initialisation).
    **kwargs: forwarded to ``jax.jit``.
  """
  options = once_program_options()
  if options is None:
    return fn if op_by_op else jax.jit(fn, **kwargs)
  plain = jax.jit(fn, **kwargs)
  if not options:
    return plain
  top = jax.jit(fn, compiler_options=options, **kwargs)

  @functools.wraps(fn)
  def call(*args, **kw):
    return (plain if _is_traced((args, kw)) else top)(*args, **kw)

  return call


def engine_jit(fn: Callable[..., Any], *, classic_runtime: bool = True,
               **kwargs: Any) -> Callable[..., Any]:
  """``jax.jit`` with :func:`hot_program_options` (for per-client hot loops).

  Args:
    fn: the function.
    classic_runtime: use the policy's CPU options; False for programs that
      XLA:CPU's classic runtime fails to compile (e.g. ResNet-18's gradient).
    **kwargs: forwarded to ``jax.jit``.
  """
  options = hot_program_options(classic_runtime)
  return jax.jit(fn, compiler_options=options or None, **kwargs)


def default_backend(platform: str | None = None,
                    workload: str = "train",
                    num_devices: int | None = None) -> str:
  """The policy's backend for a platform and workload
  (:func:`fedjax_dd.policy.lookup`).

  With more than one device, ``sharded``; with one, ``chunked`` on CPU and
  ``vmap`` on accelerators. The exceptions are KIP on CPU (``vmap``) and
  the stratification on one CPU device.

  Args:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; defaults to JAX's backend.
    workload: one of :data:`WORKLOADS`: ``"train"`` (the default), ``"kip"``
      or ``"stratify"`` (FedHydra's Alg. 2).
    num_devices: devices of ``platform``; defaults to JAX's device count.

  Returns:
    A backend name from :data:`BACKENDS`.
  """
  if workload not in WORKLOADS:
    raise ValueError(f"Unknown workload {workload!r}; expected one of "
                     f"{WORKLOADS}.")
  row = policy.lookup(platform)
  if workload == "kip" and row.kip_backend is not None:
    return row.kip_backend
  if (jax.device_count() if num_devices is None else num_devices) > 1:
    return row.backend_devices
  if workload == "stratify" and row.stratify_backend is not None:
    return row.stratify_backend
  return row.backend


def default_chunk_size(platform: str | None = None,
                       classic_runtime: bool = True) -> int | None:
  """Clients per vectorised chunk (per device) for a platform; None: all.

  The policy row's (:func:`fedjax_dd.policy.lookup`): on CPU
  ``chunk_size`` where the hot programs run on XLA's classic runtime,
  ``thunk_chunk_size`` where they run on the thunk runtime
  (``classic_runtime=False`` or ``FEDJAX_DD_NO_XLA_FLAGS=1``).

  Args:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; defaults to JAX's backend.
    classic_runtime: whether the programs ask for the classic runtime
      (:func:`engine_jit`).
  """
  platform = policy.platform_of(platform)
  row = policy.lookup(platform)
  if (row.thunk_chunk_size != row.chunk_size
      and platform == jax.default_backend()
      and not classic_runtime_in_effect(classic_runtime)):
    return row.thunk_chunk_size
  return row.chunk_size


def classic_runtime_in_effect(classic_runtime: bool = True) -> bool:
  """Whether hot programs compiled with ``classic_runtime`` get XLA:CPU's
  classic runtime here (jax 0.5.x on CPU, unless opted out)."""
  return _CLASSIC_RUNTIME_OPTION in hot_program_options(classic_runtime)


def initialize_multihost(**kwargs: Any) -> None:
  """Initialises multi-host JAX (``jax.distributed.initialize``).

  Launch one process per host with the same command; under SLURM or on
  Cloud TPU pods the arguments are discovered, elsewhere pass
  ``coordinator_address``, ``num_processes`` and ``process_id``. The
  ``sharded`` backend's mesh then covers every process's devices; on CPU
  they exchange results through Gloo collectives. Each process keeps its
  own server state and the ``sharded`` backend all-gathers the cohort's
  results, so every process takes the same server step.

  Args:
    **kwargs: forwarded to ``jax.distributed.initialize``.
  """
  try:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except (AttributeError, KeyError, ValueError):
    pass  # a jax without the option (it had no CPU collectives to choose)
  jax.distributed.initialize(**kwargs)


def client_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh whose single axis carries the clients."""
  devices = np.asarray(devices if devices is not None else jax.devices())
  return Mesh(devices.reshape(-1), (CLIENT_AXIS,))


def _normalise_in_axes(in_axes: int | None | Sequence[int | None],
                       num_args: int) -> tuple[int | None, ...]:
  if in_axes is None or isinstance(in_axes, int):
    in_axes = (in_axes,) * num_args
  in_axes = tuple(in_axes)
  if len(in_axes) != num_args:
    raise ValueError(
        f"in_axes has {len(in_axes)} entries for {num_args} arguments.")
  if any(a not in (0, None) for a in in_axes):
    raise ValueError(f"in_axes entries must be 0 or None, got {in_axes}.")
  if all(a is None for a in in_axes):
    raise ValueError("At least one argument must be mapped over clients.")
  return in_axes


def num_clients_of(args: Sequence[Any], in_axes: Sequence[int | None]) -> int:
  """The size of the client axis, checked to agree across mapped leaves."""
  sizes = {
      leaf.shape[0]
      for arg, ax in zip(args, in_axes) if ax == 0
      for leaf in jax.tree_util.tree_leaves(arg)
  }
  if len(sizes) != 1:
    raise ValueError(f"Mapped arguments disagree on the client axis: {sizes}.")
  return sizes.pop()


def _pad_clients(tree: Any, target: int) -> Any:
  """Pads the client axis to ``target`` by repeating the last client."""

  def pad(x):
    extra = target - x.shape[0]
    if extra == 0:
      return x
    return jnp.concatenate([x, jnp.repeat(x[-1:], extra, axis=0)], axis=0)

  return jax.tree_util.tree_map(pad, tree)


def map_leading_axis(fn: Callable[..., Any], axes: tuple[int | None, ...],
                     chunk: int | None) -> Callable[..., Any]:
  """``fn`` over the leading axis of the arguments whose ``axes`` entry is
  0 (clients, or runs in :mod:`fedjax_dd.core.run_axis`): one vmap, or
  ``lax.map`` in chunks; chunks of one run unbatched (faster on XLA:CPU's
  thunk runtime than a vmap of one).
  """
  if chunk is None:
    return jax.vmap(fn, in_axes=axes)

  def chunked(*args):
    mapped = [a for a, ax in zip(args, axes) if ax == 0]
    fixed = [a for a, ax in zip(args, axes) if ax is None]

    def one(mapped_args):
      it_m, it_f = iter(mapped_args), iter(fixed)
      return fn(*[next(it_m) if ax == 0 else next(it_f) for ax in axes])

    if chunk == 1:
      return jax.lax.map(one, mapped)
    # Pad a short last chunk instead of lax.map's remainder vmap: every
    # client then runs in the same program, so its bits do not depend on its
    # position (vmaps of 1 and 2 round differently).
    n = jax.tree_util.tree_leaves(mapped)[0].shape[0]
    padded = -(-n // chunk) * chunk
    out = jax.lax.map(one, _pad_clients(mapped, padded), batch_size=chunk)
    return jax.tree_util.tree_map(lambda x: x[:n], out)

  # Compile logs name the mapped function, as a vmap of it would.
  chunked.__name__ = chunked.__qualname__ = getattr(fn, "__name__", "chunked")
  return chunked


def _largest_array(jaxpr: Any) -> int:
  """Elements of the largest array in a jaxpr, nested jaxprs included."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  best = 0
  for var in list(jaxpr.invars) + list(jaxpr.outvars):
    best = max(best, int(np.prod(getattr(var.aval, "shape", ()) or (1,))))
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      best = max(best, int(np.prod(getattr(var.aval, "shape", ()) or (1,))))
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (tuple, list)) else (param,)):
        if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None),
                                           "eqns"):
          best = max(best, _largest_array(sub))
  return best


def vmap_chunk_limit(fn: Callable[..., Any], args: Sequence[Any],
                     axes: Sequence[int | None],
                     max_elements: int | None) -> int | None:
  """Clients per vectorised program so that no array exceeds
  ``max_elements``; None when one vmap over all of them stays within it.

  Traces ``fn`` abstractly for one client to find its largest intermediate,
  E elements; a vmap over C clients holds C x E. Past the cap the cohort
  runs in chunks of the largest power of two k with k x E <=
  ``max_elements`` (at least 1). XLA:GPU indexes some arrays with 32-bit
  integers, hence its policy row's cap (:data:`fedjax_dd.policy.TABLE`).

  Args:
    fn: the per-client function.
    args: the stacked arguments (arrays or tracers).
    axes: ``0`` (mapped) or ``None`` (broadcast) per argument.
    max_elements: the cap; None: no cap.

  Returns:
    The chunk size, or None for one vmap.
  """
  if max_elements is None:
    return None
  n = num_clients_of(args, axes)
  one = [jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), a)
         if ax == 0 else a for a, ax in zip(args, axes)]
  largest = _largest_array(jax.make_jaxpr(fn)(*one))
  if n * largest <= max_elements:
    return None
  k = max(1, max_elements // max(largest, 1))
  return min(n, 1 << (k.bit_length() - 1))


def _is_traced(args: Sequence[Any]) -> bool:
  return any(isinstance(leaf, jax.core.Tracer)
             for leaf in jax.tree_util.tree_leaves(args))


@dataclasses.dataclass(frozen=True)
class ClientMapper:
  """How to map a per-client function over the client axis.

  Attributes:
    backend: one of :data:`BACKENDS`, or ``"auto"`` for
      :func:`default_backend` of ``workload``.
    chunk_size: clients per vectorised chunk (per device for ``sharded``);
      ``None`` for :func:`default_chunk_size`.
    devices: devices of the ``sharded`` backend's mesh (default: all).
    classic_runtime: compile with :func:`hot_program_options` (see
      :func:`engine_jit`).
    workload: what is mapped (:data:`WORKLOADS`); only picks the ``"auto"``
      backend.
    bucket: order the clients by :meth:`map`'s ``work_argnum``
      (:func:`bucket_order`); results come back in the caller's order and
      are the same bits.
  """
  backend: str = "auto"
  chunk_size: int | None = None
  devices: tuple[Any, ...] | None = None
  classic_runtime: bool = True
  workload: str = "train"
  bucket: bool = True

  def __post_init__(self):
    if self.backend != "auto" and self.backend not in BACKENDS:
      raise ValueError(
          f"Unknown client backend {self.backend!r}; expected 'auto' or one "
          f"of {BACKENDS}.")
    if self.workload not in WORKLOADS:
      raise ValueError(f"Unknown workload {self.workload!r}; expected one of "
                       f"{WORKLOADS}.")
    if self.chunk_size is not None and self.chunk_size < 1:
      raise ValueError(
          f"chunk_size must be >= 1 or None, got {self.chunk_size}.")

  @property
  def resolved_backend(self) -> str:
    return (default_backend(workload=self.workload) if self.backend == "auto"
            else self.backend)

  @property
  def resolved_chunk_size(self) -> int | None:
    """Chunk of the ``chunked``/``sharded`` backends (``chunked`` never None)."""
    if self.chunk_size is not None:
      return self.chunk_size
    chunk = default_chunk_size(classic_runtime=self.classic_runtime)
    if chunk is None and self.resolved_backend == "chunked":
      return 16
    return chunk

  @property
  def lanes(self) -> int:
    """Programs that run side by side: the mesh's devices for ``sharded``,
    else 1."""
    if self.resolved_backend != "sharded":
      return 1
    return len(self.devices) if self.devices is not None else len(
        jax.devices())

  def map(self,
          fn: Callable[..., Any],
          in_axes: int | None | Sequence[int | None] = 0,
          *,
          static_argnames: Sequence[str] = (),
          work_argnum: int | None = None) -> Callable[..., Any]:
    """Returns ``fn`` mapped over the leading client axis of its arguments.

    The result takes stacked arguments and returns stacked outputs
    ``[C, ...]``; all backends but ``loop`` (which jits ``fn`` per client)
    compile the whole cohort as one program.

    Args:
      fn: a pure per-client function of positional arguments.
      in_axes: ``0`` (mapped) or ``None`` (broadcast) per positional argument.
      static_argnames: keyword arguments of ``fn`` treated as static.
      work_argnum: a mapped positional argument ``[C]`` holding each
        client's work (e.g. its local steps); with ``bucket``, ``chunked``
        (chunks > 1) and ``sharded`` run the clients in its
        :func:`bucket_order`.

    Returns:
      The batched function.
    """
    backend = self.resolved_backend
    builder = {
        "vmap": self._map_vmap,
        "chunked": self._map_chunked,
        "sharded": self._map_sharded,
        "loop": self._map_loop,
    }[backend]
    batched = builder(fn, in_axes, tuple(static_argnames))
    ordered = backend == "sharded" or (
        backend == "chunked" and self.resolved_chunk_size != 1)
    if work_argnum is None or not self.bucket or not ordered:
      return batched
    return _in_bucket_order(batched, in_axes, work_argnum, self.lanes)

  # Backends -----------------------------------------------------------------

  def _jit_vectorised(self, fn, in_axes, static_argnames, chunk):
    # "auto" resolved to one vmap keeps the cohort's largest array within
    # the policy's cap (decided at trace time, so once per compiled shape).
    cap = (policy.lookup().max_vmap_elements
           if chunk is None and self.backend == "auto" else None)

    def batched(*args, **kwargs):
      axes = _normalise_in_axes(in_axes, len(args))
      per_client = functools.partial(fn, **kwargs)
      k = chunk if cap is None else vmap_chunk_limit(per_client, args, axes,
                                                     cap)
      return map_leading_axis(per_client, axes, k)(*args)

    return engine_jit(batched, static_argnames=static_argnames,
                      classic_runtime=self.classic_runtime)

  def _map_vmap(self, fn, in_axes, static_argnames):
    return self._jit_vectorised(fn, in_axes, static_argnames, None)

  def _map_chunked(self, fn, in_axes, static_argnames):
    return self._jit_vectorised(fn, in_axes, static_argnames,
                                self.resolved_chunk_size)

  def _map_sharded(self, fn, in_axes, static_argnames):
    mesh = client_mesh(self.devices)
    num_devices = mesh.devices.size
    chunk = self.resolved_chunk_size
    options = hot_program_options(self.classic_runtime,
                                  per_core=num_devices > 1)
    over_clients = NamedSharding(mesh, P(CLIENT_AXIS))
    replicated = NamedSharding(mesh, P())
    jitted_cache: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def batched(*args, **kwargs):
      axes = _normalise_in_axes(in_axes, len(args))
      per_client = functools.partial(fn, **kwargs)
      if _is_traced(args):
        return map_leading_axis(per_client, axes, None)(*args)
      n = num_clients_of(args, axes)
      padded_n = -(-n // num_devices) * num_devices
      key = (axes, tuple(sorted(kwargs.items())))
      if key not in jitted_cache:
        specs = tuple(P(CLIENT_AXIS) if ax == 0 else P() for ax in axes)
        body = _shard_map(map_leading_axis(per_client, axes, chunk), mesh,
                          specs, P(CLIENT_AXIS))
        jitted_cache[key] = jax.jit(body, compiler_options=options or None,
                                    out_shardings=over_clients)
      # device_put reshards from any layout (e.g. arrays committed to one
      # device by a checkpoint restore); placed arrays are not copied.
      multi = jax.process_count() > 1
      if multi:
        # Every process holds the same host values; each places its shards.
        args = jax.device_get(args)
      args = [
          jax.device_put(_pad_clients(a, padded_n), over_clients) if ax == 0
          else jax.device_put(a, replicated) for a, ax in zip(args, axes)
      ]
      out = jitted_cache[key](*args)
      if multi:
        # Every process gets the whole cohort's results for its server step.
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
        out = multihost_utils.process_allgather(out, tiled=True)
      if padded_n != n:
        out = jax.tree_util.tree_map(lambda x: x[:n], out)
      # Results go to the first local device, where the server state lives:
      # mixing device sets fails in jit, and a changing layout would
      # recompile the aggregation every round.
      return jax.device_put(out, jax.local_devices()[0])

    return batched

  def _map_loop(self, fn, in_axes, static_argnames):
    jitted = engine_jit(fn, static_argnames=static_argnames,
                        classic_runtime=self.classic_runtime)

    def batched(*args, **kwargs):
      axes = _normalise_in_axes(in_axes, len(args))
      n = num_clients_of(args, axes)
      outs = []
      for i in range(n):
        client_args = [
            jax.tree_util.tree_map(lambda x, i=i: x[i], a) if ax == 0 else a
            for a, ax in zip(args, axes)
        ]
        outs.append(jitted(*client_args, **kwargs))
      return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *outs)

    return batched


def bucket_order(work: np.ndarray, *, lanes: int = 1) -> np.ndarray:
  """A client order for mapped programs that skip padded work.

  A vmapped chunk costs its largest member's work, and ``sharded`` gives
  device ``d`` the block ``[d·m, (d+1)·m)``, ``m = ceil(C / lanes)``.
  Longest-processing-time scheduling: clients in decreasing work, each to
  the open lane with the least work so far, kept in decreasing order.

  Args:
    work: ``[C]`` each client's work (e.g. local steps).
    lanes: devices the order is split over (1: one sequence).

  Returns:
    ``[C]`` int permutation: position ``i`` of the order runs client
    ``order[i]``.
  """
  work = np.asarray(work).reshape(-1)
  c = work.shape[0]
  if lanes < 1:
    raise ValueError(f"lanes must be >= 1, got {lanes}.")
  m = -(-c // lanes) if c else 0
  capacity = [max(0, min(m, c - d * m)) for d in range(lanes)]
  members: list[list[int]] = [[] for _ in range(lanes)]
  load = [0.0] * lanes
  for client in np.argsort(-work, kind="stable"):
    open_lanes = [d for d in range(lanes) if len(members[d]) < capacity[d]]
    d = min(open_lanes, key=lambda d: (load[d], d))
    members[d].append(int(client))
    load[d] += float(work[client])
  return np.asarray([i for lane in members for i in lane], np.int64)


def computed_steps(num_steps: np.ndarray, *, chunk: int | None,
                   lanes: int = 1, bucket: bool = True,
                   skip_padding: bool = True, max_steps: int | None = None,
                   pad_short_chunk: bool = True) -> int:
  """Client-steps a mapped local-training program computes, padding
  included.

  Args:
    num_steps: ``[C]`` each client's real steps.
    chunk: clients per vectorised chunk (``None``: one vmap per lane).
    lanes: devices the clients are split over; the cohort is padded to a
      multiple of it, by clients of zero steps with ``bucket`` and by
      repeating the last client without.
    bucket: the clients run in :func:`bucket_order` (else as given).
    skip_padding: the per-client loop stops at the client's own count (else
      every client computes ``max_steps``).
    max_steps: the scan length without ``skip_padding`` (default: the
      largest count).
    pad_short_chunk: a short last chunk computes a full chunk
      (:func:`map_leading_axis`); ``False`` counts only its clients.
  """
  steps = np.asarray(num_steps, np.int64).reshape(-1)
  c = steps.shape[0]
  if c == 0:
    return 0
  m = -(-c // lanes)
  if not skip_padding:
    size = m if chunk is None else chunk
    slots = -(-m // size) * size if pad_short_chunk else m
    return int(slots * lanes * (steps.max() if max_steps is None else
                                max_steps))
  if bucket:
    # Padded with zero-step clients, then ordered (``_in_bucket_order``).
    steps = np.concatenate([steps, np.zeros(m * lanes - c, np.int64)])
    steps = steps[bucket_order(steps, lanes=lanes)]
  else:
    steps = np.concatenate([steps, np.repeat(steps[-1:], m * lanes - c)])
  total = 0
  for lane in steps.reshape(lanes, m):
    size = m if chunk is None else chunk
    for i in range(0, m, size):
      # A vmapped chunk runs to its largest count.
      part = lane[i:i + size]
      total += int(part.max()) * (size if pad_short_chunk else part.size)
  return total


def _in_bucket_order(batched: Callable[..., Any],
                     in_axes: int | None | Sequence[int | None],
                     work_argnum: int, lanes: int) -> Callable[..., Any]:
  """``batched`` run with its clients in :func:`bucket_order` of argument
  ``work_argnum``; outputs are returned in the caller's order.

  Over several lanes the cohort is padded to a multiple of ``lanes`` with
  copies of a client whose work is set to 0, so no real client is computed
  twice.
  """

  def call(*args, **kwargs):
    axes = _normalise_in_axes(in_axes, len(args))
    if axes[work_argnum] != 0:
      raise ValueError(f"work_argnum {work_argnum} is not a mapped argument.")
    leaves = jax.tree_util.tree_leaves(args[work_argnum])
    if _is_traced(args) or not all(
        getattr(x, "is_fully_addressable", True) for x in leaves):
      # Inside a trace, or a multi-host global array: the given order.
      return batched(*args, **kwargs)
    # Only C integers go to the host; the data is permuted on the device.
    work = np.asarray(jax.device_get(args[work_argnum]))
    n = work.shape[0]
    slots = -(-n // lanes) * lanes
    padded_work = np.concatenate([work, np.zeros(slots - n, work.dtype)])
    order = bucket_order(padded_work, lanes=lanes)
    real = order < n
    # Permuted even in identity order, so these programs compile in round 1.
    mapped = [a for a, ax in zip(args, axes) if ax == 0]
    work_index = sum(1 for ax in axes[:work_argnum] if ax == 0)
    permuted = _permute_padded(mapped, jnp.asarray(np.where(real, order, 0),
                                                   jnp.int32),
                               jnp.asarray(real), work_index)
    it = iter(permuted)
    args = [next(it) if ax == 0 else a for a, ax in zip(args, axes)]
    out = batched(*args, **kwargs)
    position = np.empty(n, np.int64)
    position[order[real]] = np.nonzero(real)[0]
    return _permute(out, jnp.asarray(position, jnp.int32))

  return call


@jax.jit
def _permute(tree: Any, order: jax.Array) -> Any:
  """``tree``'s leaves reordered along the client axis."""
  return jax.tree_util.tree_map(lambda x: jnp.take(x, order, axis=0), tree)


@functools.partial(jax.jit, static_argnums=3)
def _permute_padded(mapped: list[Any], source: jax.Array, real: jax.Array,
                    work_index: int) -> list[Any]:
  """Rows ``source`` of every mapped argument; where ``real`` is False the
  row is a pad whose work (argument ``work_index``) is set to 0."""
  out = [jax.tree_util.tree_map(lambda x: jnp.take(x, source, axis=0), a)
         for a in mapped]
  out[work_index] = jax.tree_util.tree_map(
      lambda w: jnp.where(real.reshape((-1,) + (1,) * (w.ndim - 1)), w,
                          jnp.zeros_like(w)), out[work_index])
  return out


def map_clients(fn: Callable[..., Any],
                in_axes: int | None | Sequence[int | None] = 0,
                *,
                backend: str = "auto",
                chunk_size: int | None = None,
                static_argnames: Sequence[str] = ()) -> Callable[..., Any]:
  """Shorthand for ``ClientMapper(backend, chunk_size).map(fn, in_axes)``."""
  return ClientMapper(backend=backend, chunk_size=chunk_size).map(
      fn, in_axes, static_argnames=static_argnames)


@flax.struct.dataclass
class RoundContext:
  """What one client's local update sees of its round.

  Attributes:
    round: ``[]`` int32, the round's 0-based index
      (:attr:`fedjax_dd.core.algorithm.Cohort.round`).
    start_params: the parameters the client starts from (FedProx's
      proximal centre, MOON's global model).
    start_batch_stats: the BatchNorm statistics it starts from.
    shared: the algorithm's value broadcast to every client (SCAFFOLD's
      server variate ``c``; ``()`` when there is none).
    client: the algorithm's value for this client (SCAFFOLD's ``c_i``;
      ``()`` when there is none).
  """
  round: jax.Array
  start_params: PyTree
  start_batch_stats: PyTree
  shared: PyTree = ()
  client: PyTree = ()


def client_stage(local: LocalUpdate,
                 mapper: ClientMapper, *,
                 per_client_start: bool = False) -> Callable[..., LocalResult]:
  """Local training of a cohort from the broadcast server model.

  Each client starts a fresh local optimizer from the server parameters.

  Args:
    local: the per-client local update.
    mapper: the client-axis backend.
    per_client_start: ``params`` and ``batch_stats`` are stacked
      ``[S, ...]``, one start per client, not broadcast.

  Returns:
    ``train(params, batch_stats, shared_ctx, cohort, keys [S],
    client_ctx=())`` returning a :class:`~fedjax_dd.core.local.LocalResult`
    stacked ``[S, ...]``; ``shared_ctx`` is broadcast, ``client_ctx`` per
    client (leaves ``[S, ...]``), both handed to the hooks in a
    :class:`RoundContext`.
  """

  def one_client(params, batch_stats, round_index, shared_ctx, x, y, n,
                 num_steps, key, client_ctx):
    opt_state = local.optimizer.init(params)
    ctx = RoundContext(round=round_index, start_params=params,
                       start_batch_stats=batch_stats, shared=shared_ctx,
                       client=client_ctx)
    return local.run(params, batch_stats, opt_state, x, y, n, num_steps, key,
                     ctx)

  # Argument 7 is num_steps: bucketed chunks hold similar step counts.
  start_axis = 0 if per_client_start else None
  mapped = mapper.map(one_client,
                      in_axes=(start_axis, start_axis, None, None, 0, 0, 0, 0,
                               0, 0),
                      work_argnum=7)

  def train(params, batch_stats, shared_ctx, cohort: Cohort, keys,
            client_ctx=()):
    return mapped(params, batch_stats, _round_index(cohort), shared_ctx,
                  cohort.x, cohort.y, cohort.num_examples, cohort.num_steps,
                  keys, client_ctx)

  return train


def _round_index(cohort: Cohort) -> jax.Array:
  return jnp.asarray(cohort.round, jnp.int32)


def client_span_stage(local: LocalUpdate,
                      mapper: ClientMapper) -> Callable[..., LocalResult]:
  """Local training of a cohort in spans of steps, from per-client states.

  The resumable form of :func:`client_stage`: every client continues from
  its own ``(params, batch_stats, opt_state)`` and makes its steps
  ``[first, min(num_steps, stop))``. Consecutive spans compute the same
  bits as one span ``[0, max)`` (step ``t`` draws from ``fold_in(key, t)``
  and the bucket order uses the full ``num_steps``), so a long local
  training (FedHydra's 200 epochs) can be checkpointed between spans.

  Args:
    local: the per-client local update.
    mapper: the client-axis backend.

  Returns:
    ``train(params, batch_stats, opt_state, shared_ctx, cohort, keys [S],
    client_ctx, first, stop)``: states stacked ``[S, ...]``, ``first`` and
    ``stop`` traced scalar step indices (one compiled program for all
    spans); the :class:`RoundContext` start is the span's. Returns a
    :class:`~fedjax_dd.core.local.LocalResult` ``[S, ...]`` covering the
    span.
  """

  def one_client(params, batch_stats, opt_state, round_index, shared_ctx, x,
                 y, n, num_steps, key, client_ctx, first, stop):
    ctx = RoundContext(round=round_index, start_params=params,
                       start_batch_stats=batch_stats, shared=shared_ctx,
                       client=client_ctx)
    return local.run(params, batch_stats, opt_state, x, y, n, num_steps, key,
                     ctx, first_step=first, stop_step=stop)

  # Argument 8 is the whole num_steps: the bucket order of one call.
  mapped = mapper.map(one_client,
                      in_axes=(0, 0, 0, None, None, 0, 0, 0, 0, 0, 0, None,
                               None),
                      work_argnum=8)

  def train(params, batch_stats, opt_state, shared_ctx, cohort: Cohort, keys,
            client_ctx, first, stop):
    return mapped(params, batch_stats, opt_state, _round_index(cohort),
                  shared_ctx, cohort.x, cohort.y, cohort.num_examples,
                  cohort.num_steps, keys, client_ctx,
                  jnp.asarray(first, jnp.int32), jnp.asarray(stop, jnp.int32))

  return train
