"""Which layer forms and client-mapper defaults run where: one table.

Every model builder, every layer with a per-platform form and the client
mapper read their defaults from :data:`TABLE`, keyed by platform and jax
version range; nothing else picks a form. A model takes its layer forms as
one :class:`fedjax_dd.models.layers.LayerSet`, which
``LayerSet.from_policy`` fills from a row. A row (:class:`Policy`) holds the
layer forms, the client mapper's defaults (:mod:`fedjax_dd.core.clients`),
the conv-kernel memory model's scale and the compute dtype.

A run records what the table makes it compute (:func:`forms`) in its
``environment.json``, so a resume under another table is named.

Every form computes the same function with the same parameters (equal to
float rounding), so the table changes only speed. Explicit arguments
(``build(n, conv_impl="lax")``, a layer's ``weight_grad``, a mapper's
``chunk_size``) override it.

The CPU rows work around XLA:CPU's slow paths; the comments give each
choice's reason, ``experiments/perf_notes.md`` its measurements. The GPU and
TPU rows hold XLA's plain forms (``lax`` convolutions and kernel gradients,
no phase split, fused block, folding or compiler options, one vmap per
device); each row's ``measured`` says where it was measured.

Example::

  from fedjax_dd import policy
  p = policy.current()            # this platform and jax
  p.conv, p.chunk_size
  policy.lookup("gpu", "0.12.0")  # another one
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from fedjax_dd import versions

NOT_MEASURED = "not measured"

CONV_FORMS = ("lax", "patches", "forward")
KERNEL_GRAD_FORMS = ("lax", "matmul")
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Policy:
  """One row of :data:`TABLE`: the forms of one platform and jax range.

  Attributes:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
    jax_min: First jax version of the range (inclusive), e.g. ``(0, 10)``.
    jax_below: First jax version past the range; None: no end.
    conv: :data:`CONV_FORMS` entry for ``conv_impl="auto"``, refined per
      model by :func:`conv_form`.
    kernel_grad: :data:`KERNEL_GRAD_FORMS` entry; ``"matmul"``: the models of
      :data:`MATMUL_KERNEL_GRADS` take matmul kernel gradients
      (:func:`kernel_grads`).
    phase_split: LeNet-5's first convolution and pool phase-split.
    fuse_first_block: ConvNet's first block as one function.
    fold_norm: Instance norm folds its affine map.
    backend: The client mapper's ``"auto"`` backend on one device.
    backend_devices: Its ``"auto"`` backend over several devices.
    kip_backend: KIP's ``"auto"`` backend (any device count); None: as
      training.
    stratify_backend: The ``"auto"`` backend of FedHydra's model
      stratification (Alg. 2, :mod:`fedjax_dd.algorithms.stratify`) on one
      device; None, and on several devices: as training.
    chunk_size: Clients per vectorised chunk per device (``chunked``,
      ``sharded``) on XLA:CPU's classic runtime; None: one vmap.
    thunk_chunk_size: The same on XLA:CPU's thunk runtime.
    run_chunk_size: Runs per vectorised chunk of the run axis' round
      (:func:`fedjax_dd.core.run_axis.fit_runs`, ``run_chunk_size="auto"``);
      1: the runs in sequence inside the one program, each run's clients
      mapped as a run alone; None: one vmap of all runs.
    compiler_options: ``(name, value)`` pairs for the engine's hot programs
      (:func:`fedjax_dd.core.clients.engine_jit`), each kept only where the
      running XLA accepts it.
    per_core_options: Further pairs for programs running side by side, one
      per device (the ``sharded`` backend over several devices).
    once_options: ``(name, value)`` pairs for programs that run once per
      run (model and generator initialisations,
      :func:`fedjax_dd.core.clients.once_jit`). Set only where they give
      the bits of the op-by-op initialisers (``tests/core/
      test_clients.py`` checks), so :func:`forms` leaves them out. None:
      initialisations run op by op.
    max_vmap_elements: With an ``"auto"`` ``vmap`` backend, the largest
      array (elements) the vectorised program may hold before the cohort
      runs in chunks (:func:`fedjax_dd.core.clients.vmap_chunk_limit`).
      None: no limit.
    ntk_grad_memory_factor: Scale of the conv-kernel memory model's
      gradient coefficients (:func:`fedjax_dd.kernels.blocking.
      estimate_kernel_bytes`).
    compute_dtype: :data:`COMPUTE_DTYPES` entry for ``compute_dtype="auto"``:
      the dtype of the models' convolutions and matmuls; parameters,
      optimizer state, normalisation statistics and losses stay float32.
    measured: Where these choices were measured, or :data:`NOT_MEASURED`.
  """

  platform: str
  jax_min: tuple[int, ...]
  jax_below: tuple[int, ...] | None
  conv: str
  kernel_grad: str
  phase_split: bool
  fuse_first_block: bool
  fold_norm: bool
  backend: str
  backend_devices: str
  kip_backend: str | None
  stratify_backend: str | None
  chunk_size: int | None
  thunk_chunk_size: int | None
  run_chunk_size: int | None
  compiler_options: tuple[tuple[str, Any], ...]
  per_core_options: tuple[tuple[str, Any], ...]
  once_options: tuple[tuple[str, Any], ...] | None
  ntk_grad_memory_factor: float
  max_vmap_elements: int | None
  compute_dtype: str
  measured: str

  def covers(self, platform: str, version: tuple[int, ...]) -> bool:
    """Whether this row applies to ``platform`` at jax ``version``."""
    return (self.platform == platform and version >= self.jax_min
            and (self.jax_below is None or version < self.jax_below))


# The classic runtime: per-client training much faster on jax 0.5.x; set per
# program, since its oneDNN rewrites fail to compile some other programs.
CLASSIC_RUNTIME_OPTION = "xla_cpu_use_thunk_runtime"
_CLASSIC_RUNTIME = ((CLASSIC_RUNTIME_OPTION, False),)
# Single-threaded programs per host device: without it they can deadlock.
_SINGLE_THREAD = (("xla_cpu_multi_thread_eigen", False),)
# Programs that run once per run, compiled without LLVM's optimisations.
_ONCE_UNOPTIMISED = (("xla_backend_optimization_level", 0),)

_CPU = dict(
    platform="cpu",
    kernel_grad="matmul",
    # Few input channels run far below XLA:CPU's convolution peak.
    phase_split=True,
    fuse_first_block=True,  # measured faster
    # A stream of small programs per core beats one vmap over the cohort.
    backend="chunked",
    backend_devices="sharded",
    kip_backend="vmap",  # KIP's small matmuls gain from intra-op threads
    # Alg. 2's (client, class) pairs as one program, not one at a time.
    stratify_backend="vmap",
    # Small chunks beat a full vmap (classic runtime); on the thunk runtime
    # a vmapped client step is slower than an unbatched one.
    chunk_size=2,
    thunk_chunk_size=1,
    # A vmap over runs x clients leaves the cache as one over the cohort
    # does; runs one after another keep each run's client chunks.
    run_chunk_size=1,
    compiler_options=_CLASSIC_RUNTIME,
    per_core_options=_SINGLE_THREAD,
    # LLVM's passes are most of XLA:CPU's compile time: level 0 compiles an
    # initialisation far faster and, from jax 0.12, gives the same bits.
    once_options=_ONCE_UNOPTIMISED,
    # The one-device default is chunked: no vmap over the whole cohort.
    max_vmap_elements=None,
    # XLA:CPU has no fast bfloat16 matmul or convolution.
    compute_dtype="float32",
)

# Rows for XLA's plain forms: nothing measured, nothing worked around.
_PLAIN = dict(
    conv="lax",
    kernel_grad="lax",
    phase_split=False,
    fuse_first_block=False,
    fold_norm=False,
    backend="vmap",
    backend_devices="sharded",
    kip_backend=None,
    stratify_backend=None,
    chunk_size=None,
    thunk_chunk_size=None,
    # Many small runs fill a card that one run leaves mostly idle.
    run_chunk_size=None,
    compiler_options=(),
    per_core_options=(),
    # Not measured: initialisations op by op, as XLA's plain form.
    once_options=None,
    max_vmap_elements=None,
    # Tensor cores and the MXU run bfloat16 at several times float32's rate.
    compute_dtype="bfloat16",
    measured=NOT_MEASURED,
)

# XLA:GPU indexes some kernels' arrays with 32-bit integers: a larger vmap
# crashed on an H100.
_INT32_ELEMENTS = 2**31 - 1
_GPU_MEASURED = ("H100, jax 0.11.2: the plain forms (engine round, KIP, "
                 "IGA; the CPU forms not compared; bfloat16 compute not "
                 "measured)")

# The conv-kernel memory model was fitted on jax 0.5.3; newer XLA keeps more
# residuals in the backward pass.
_OLD_XLA_MEMORY = 1.0
_NEW_XLA_MEMORY = 2.6

TABLE: tuple[Policy, ...] = (
    # jax 0.5.x: the classic runtime; lax convolutions and folded instance
    # norm measured faster.
    Policy(**{**_CPU, "once_options": None}, jax_min=(0,), jax_below=(0, 6),
           conv="lax", fold_norm=True, ntk_grad_memory_factor=_OLD_XLA_MEMORY,
           measured="2-core CPU, jax 0.5.3"),
    # jax 0.6 to 0.9: the thunk runtime; convolutions not measured, so lax.
    Policy(**{**_CPU, "once_options": None}, jax_min=(0, 6),
           jax_below=(0, 10), conv="lax",
           fold_norm=False, ntk_grad_memory_factor=_NEW_XLA_MEMORY,
           measured="2-core CPU, jax 0.10.2 and 0.12 (conv form: not "
                    "measured between 0.6 and 0.10)"),
    # jax 0.10 on: patches measured faster; XLA refuses the classic
    # runtime's option. Before 0.12 an initialisation compiled at level 0
    # rounds some weights differently, so it runs op by op.
    Policy(**{**_CPU, "compiler_options": (), "once_options": None},
           jax_min=(0, 10), jax_below=(0, 12), conv="patches",
           fold_norm=False, ntk_grad_memory_factor=_NEW_XLA_MEMORY,
           measured="2-core CPU, jax 0.10.2 and 0.12"),
    Policy(**{**_CPU, "compiler_options": ()}, jax_min=(0, 12),
           jax_below=None, conv="patches",
           fold_norm=False, ntk_grad_memory_factor=_NEW_XLA_MEMORY,
           measured="2-core CPU, jax 0.10.2 and 0.12"),
    Policy(**{**_PLAIN, "max_vmap_elements": _INT32_ELEMENTS},
           platform="gpu", jax_min=(0,), jax_below=(0, 6),
           ntk_grad_memory_factor=_OLD_XLA_MEMORY),
    Policy(**{**_PLAIN, "max_vmap_elements": _INT32_ELEMENTS,
              "measured": _GPU_MEASURED},
           platform="gpu", jax_min=(0, 6), jax_below=None,
           ntk_grad_memory_factor=_NEW_XLA_MEMORY),
    Policy(**_PLAIN, platform="tpu", jax_min=(0,), jax_below=(0, 6),
           ntk_grad_memory_factor=_OLD_XLA_MEMORY),
    Policy(**_PLAIN, platform="tpu", jax_min=(0, 6), jax_below=None,
           ntk_grad_memory_factor=_NEW_XLA_MEMORY),
)

# Per model (class name), where a row's ``kernel_grad`` is "matmul": its
# ``lax`` convolutions' kernel gradients (first convolution, the others)
# (models.layers.lax_conv_custom_weight_grad); measured faster for these.
MATMUL_KERNEL_GRADS: Mapping[str, tuple[str, str]] = {
    "ConvNet": ("gemm", "taps"),
    "HFLDDCifarCNN": ("gemm", "taps"),
    "CNN3": ("gemm", "taps"),
}

# Models (class names) whose convolutions are ``lax`` on every row, also
# where a row's ``conv`` is "patches": the generators' wide unbatched
# convolutions run faster on XLA:CPU's own.
LAX_CONV_MODELS: frozenset[str] = frozenset({"Generator", "CGeneratorA"})

# Models (class names) whose convolutions are ``"forward"`` (lax's value,
# both gradients as forward convolutions) where a row's ``conv`` is
# "patches": measured faster for these; slower for the other classifiers.
FORWARD_CONV_MODELS: frozenset[str] = frozenset({"CNN2", "CNN3"})

# Models whose training gradient XLA:CPU's classic runtime fails to compile
# (jax 0.5.3): their programs keep XLA's default runtime.
CLASSIC_RUNTIME_UNSAFE: frozenset[str] = frozenset({"resnet18"})


def platform_of(platform: str | None = None) -> str:
  """``platform``, or JAX's default backend when None."""
  return platform or jax.default_backend()


def lookup(platform: str | None = None,
           jax_version: str | None = None) -> Policy:
  """The row of :data:`TABLE` for a platform and jax version.

  Args:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default JAX's default
      backend. Another name (a plugin's) gets the GPU row's plain forms.
    jax_version: e.g. ``"0.10.2"``; default the running ``jax.__version__``.

  Returns:
    The :class:`Policy` row.
  """
  platform = platform_of(platform)
  version = versions.version_tuple(jax_version)
  for row in TABLE:
    if row.covers(platform, version):
      return row
  for row in TABLE:
    if row.covers("gpu", version):
      return dataclasses.replace(row, platform=platform,
                                 measured=NOT_MEASURED)
  raise ValueError(f"No policy row for {platform!r}, jax {version}.")


def current() -> Policy:
  """The row for JAX's default backend and the running jax."""
  return lookup()


def conv_form(model: str | None = None, row: Policy | None = None) -> str:
  """The convolution form ``conv_impl="auto"`` resolves to for ``model``.

  Args:
    model: The model's class name, or None for the row's form.
    row: The policy row; default :func:`current`.

  Returns:
    ``"lax"`` for the models of :data:`LAX_CONV_MODELS`; ``"forward"`` for
    those of :data:`FORWARD_CONV_MODELS` where the row's ``conv`` is
    ``"patches"``; else the row's ``conv``.
  """
  row = row or current()
  if model in LAX_CONV_MODELS:
    return "lax"
  if model in FORWARD_CONV_MODELS and row.conv == "patches":
    return "forward"
  return row.conv


def kernel_grads(model: str, num_convs: int,
                 row: Policy | None = None) -> tuple[str, ...]:
  """Each ``lax`` convolution's kernel gradient for ``model``.

  Args:
    model: The model's class name (a key of :data:`MATMUL_KERNEL_GRADS`).
    num_convs: Its number of convolutions, in order.
    row: The policy row; default :func:`current`.

  Returns:
    ``num_convs`` names of :data:`fedjax_dd.models.layers.WEIGHT_GRADS`:
    all ``"lax"`` unless the row's ``kernel_grad`` is ``"matmul"`` and the
    model is listed.
  """
  row = row or current()
  forms = MATMUL_KERNEL_GRADS.get(model)
  if row.kernel_grad != "matmul" or forms is None:
    return ("lax",) * num_convs
  return tuple(forms[0] if i == 0 else forms[1] for i in range(num_convs))


def resolve_compute_dtype(compute_dtype: str = "auto",
                          platform: str | None = None,
                          jax_version: str | None = None) -> str:
  """The dtype a model's convolutions and matmuls run in.

  Args:
    compute_dtype: ``"auto"`` or one of :data:`COMPUTE_DTYPES`; all but
      ``"auto"`` are returned unchanged.
    platform: For ``"auto"``: the row's platform (:func:`lookup`).
    jax_version: For ``"auto"``: the row's jax version.

  Returns:
    ``"float32"`` or ``"bfloat16"``.

  Raises:
    ValueError: If ``compute_dtype`` is not ``"auto"`` or one of
      :data:`COMPUTE_DTYPES`.
  """
  if compute_dtype != "auto" and compute_dtype not in COMPUTE_DTYPES:
    raise ValueError(f"Unknown compute_dtype {compute_dtype!r}; expected "
                     f"one of {('auto',) + COMPUTE_DTYPES}.")
  if compute_dtype != "auto":
    return compute_dtype
  return lookup(platform, jax_version).compute_dtype


def as_dict(row: Policy) -> dict[str, Any]:
  """``row`` as plain JSON-ready values (options as dicts)."""
  out = dataclasses.asdict(row)
  out["compiler_options"] = dict(row.compiler_options)
  out["per_core_options"] = dict(row.per_core_options)
  out["once_options"] = (None if row.once_options is None
                         else dict(row.once_options))
  return out


# Fields of a row that are not what a run computes; once_options only
# changes compile speed (the same bits, a test checks).
_NOT_FORMS = frozenset({"platform", "jax_min", "jax_below", "measured",
                        "once_options"})


def forms(row: Policy | None = None) -> dict[str, Any]:
  """What the table makes a run compute on ``row``, as JSON-ready values.

  The row's choices (less where it applies and how it was measured) and the
  per-model sets that refine them (:data:`LAX_CONV_MODELS`,
  :data:`FORWARD_CONV_MODELS`, :data:`MATMUL_KERNEL_GRADS`,
  :data:`CLASSIC_RUNTIME_UNSAFE`). Forms differ in float rounding, so a run
  records these (:func:`fedjax_dd.core.workdir.current_environment`) and a
  resume under another table is named as another environment.

  Args:
    row: The policy row; default :func:`current`.

  Returns:
    A dict of :func:`as_dict`'s keys less ``platform``, ``jax_min``,
    ``jax_below``, ``measured`` and ``once_options``, plus ``lax_conv_models``,
    ``forward_conv_models`` and ``classic_runtime_unsafe`` (sorted lists)
    and ``matmul_kernel_grads`` (model -> two forms).
  """
  out = {k: v for k, v in as_dict(row or current()).items()
         if k not in _NOT_FORMS}
  out["lax_conv_models"] = sorted(LAX_CONV_MODELS)
  out["forward_conv_models"] = sorted(FORWARD_CONV_MODELS)
  out["matmul_kernel_grads"] = {k: list(v)
                                for k, v in MATMUL_KERNEL_GRADS.items()}
  out["classic_runtime_unsafe"] = sorted(CLASSIC_RUNTIME_UNSAFE)
  return out
