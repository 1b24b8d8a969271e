"""OT fusion: align the client models' neurons by optimal transport, average.

Two networks that compute the same function may order their hidden units
differently, which coordinate-wise averaging ignores. OT fusion (Singh and
Jaggi) first aligns every client model to an anchor model, layer by layer
from the input, and averages the aligned models. For a layer ``ℓ`` with
weights ``W_k^{(ℓ)}`` (neurons on the output axis) and the previous layer's
transport ``T^{(ℓ−1)}``:

1. **input alignment** (the incoming edges):
   ``Ŵ_k^{(ℓ)} = W_k^{(ℓ)} T^{(ℓ−1)} diag(1/β^{(ℓ−1)})``, so that ``Ŵ_k``'s
   inputs are ordered as the anchor's;
2. **neuron transport**: the ground cost ``C_ij = ‖a_i − b_j‖₂`` between
   neuron ``i`` of client ``k`` and neuron ``j`` of the anchor, ``a, b``
   their incoming weights (bias included; "weight-based") or
   pre-activations on samples ("activation-based"); the exact OT plan
   ``T^{(ℓ)} = argmin ⟨T, C⟩`` with uniform marginals ``α = β = 1/n``;
3. **aligned weights**: ``W̃_k^{(ℓ)} = diag(1/β^{(ℓ)}) T^{(ℓ)ᵀ} Ŵ_k^{(ℓ)}``
   (a permutation for models of equal width); biases and BatchNorm
   parameters and statistics move with their neuron;
4. **fusion**: ``W_F = Σ_k ω_k W̃_k``.

The output layer is not transported (its neurons are the classes).

Choices the paper leaves open follow the authors' code (``sidak/otfusion``
README commands): exact OT, unnormalised unsquared Euclidean cost, the
``diag(1/β)`` and past corrections, 200 activation samples. Departures:
``ω_k`` are the clients' example shares, as one-shot FedAvg's (the code:
equal); the activation samples are an unlabeled server-held public set (a
federated server holds no training data); BatchNorm layers move with their
preceding kernel layer. No fine-tuning after fusion (one-shot, data-free).

``setup`` solves the transports on the host with POT (the optional ``ot``
extra) and caches them as ``transport_<ℓ>`` ``[m, n_ℓ, n_ℓ]`` (the matrices
``diag(1/β) Tᵀ``); ``init`` applies them to the stacked client models and
averages (traceable, so the server state restores like any other).

Only sequential networks are supported (:func:`layer_chain`); a dense layer
after a flatten takes the previous transport on its channel axis (NHWC).

The steps follow Sec. 4 of the paper as written in the authors' code, so no
equation numbers are cited.

Reference: Singh and Jaggi, "Model Fusion via Optimal Transport", NeurIPS
2020; the "OT" baseline of FedHydra (Bai et al.), Tabs. 1, 2, 4 and 5.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms import stages
from fedjax_dd.core import checks
from fedjax_dd.core.algorithm import ServerDistillation, Teachers
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import ensemble

PyTree = Any

MODES = ("weights", "activations")


@dataclasses.dataclass(frozen=True)
class OTFusionHyperParams:
  """OT fusion's settings, the ``ot_fusion`` config group.

  Attributes:
    mode: ``"weights"`` (transport by incoming weights) or
      ``"activations"`` (by pre-activations on server-held images).
    anchor: the client every model is aligned to.
    num_samples: activation mode's images of the public set
      (``--act-num-samples``).
  """
  mode: str = "weights"
  anchor: int = 0
  num_samples: int = 200

  def __post_init__(self):
    checks.check_choice("mode", self.mode, MODES)
    checks.check_int("anchor", self.anchor, 0)
    checks.check_int("num_samples", self.num_samples, 1)


@dataclasses.dataclass(frozen=True)
class Layer:
  """One layer of a sequential network, as :func:`layer_chain` finds it.

  Attributes:
    path: module path of the kernel (``params[path]["kernel"]``).
    in_features: the kernel's input axis (``kernel.shape[-2]``).
    out_features: its neurons (``kernel.shape[-1]``).
    norms: module paths of the BatchNorm layers on this layer's neurons.
  """
  path: tuple[str, ...]
  in_features: int
  out_features: int
  norms: tuple[tuple[str, ...], ...] = ()


def _get(tree: PyTree, path: Sequence[str]) -> PyTree:
  for p in path:
    tree = tree[p]
  return tree


def _set(tree: PyTree, path: Sequence[str], value: PyTree) -> PyTree:
  if not path:
    return value
  out = dict(tree)
  out[path[0]] = _set(tree[path[0]], path[1:], value)
  return out


def _record_calls(task: Classifier, params: PyTree, batch_stats: PyTree,
                  x: jax.Array) -> list[tuple[str, tuple[str, ...], Any]]:
  """``(kind, module path, output)`` of every kernel / BatchNorm call."""
  calls = []

  def capture(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    module = context.module
    if context.method_name == "__call__":
      own = module.variables.get("params", {})
      if isinstance(module, nn.BatchNorm):
        calls.append(("norm", tuple(module.path), out))
      elif "kernel" in own and not isinstance(own["kernel"], dict):
        calls.append(("kernel", tuple(module.path), out))
    return out

  with nn.intercept_methods(capture):
    task.apply(params, batch_stats, x, train=False)
  return calls


def layer_chain(task: Classifier, params: PyTree, batch_stats: PyTree
                ) -> tuple[Layer, ...]:
  """The kernel layers of a sequential model in call order.

  Found by running the model once and recording every module holding a
  ``kernel`` (neurons on the last axis) and every ``nn.BatchNorm``.

  Args:
    task: the model.
    params: one model's parameters (unstacked).
    batch_stats: its BatchNorm statistics.

  Returns:
    The layers, input first.

  Raises:
    ValueError: a module called twice, a BatchNorm before any kernel layer or
      of another width, or a layer whose inputs are not the previous layer's
      neurons (possibly times a flattened spatial size): not sequential.
  """
  x = jnp.zeros((1, *task.input_shape), jnp.float32)
  calls = []

  def trace(p, s):
    calls.extend(_record_calls(task, p, s, x))
    return 0

  jax.eval_shape(trace, params, batch_stats)
  paths = [path for _, path, _ in calls]
  if len(set(paths)) != len(paths):
    raise ValueError(f"OT fusion needs each layer called once; got {paths}.")
  layers: list[Layer] = []
  for kind, path, _ in calls:
    if kind == "kernel":
      k = _get(params, path)["kernel"]
      n_in, n_out = int(k.shape[-2]), int(k.shape[-1])
      if layers and n_in % layers[-1].out_features:
        raise ValueError(
            f"Layer {'/'.join(path)} takes {n_in} inputs, not a multiple of "
            f"the previous layer's {layers[-1].out_features} neurons: OT "
            "fusion supports sequential networks only.")
      layers.append(Layer(path, n_in, n_out))
    else:
      scale = _get(params, path).get("scale", _get(batch_stats, path)["mean"])
      if not layers or scale.shape[-1] != layers[-1].out_features:
        raise ValueError(f"BatchNorm {'/'.join(path)} does not follow a "
                         "kernel layer of its width.")
      layers[-1] = dataclasses.replace(layers[-1],
                                       norms=layers[-1].norms + (path,))
  if not layers:
    raise ValueError("The model has no kernel layers to fuse.")
  return tuple(layers)


def _align_inputs(kernel, m_prev):
  """``kernel [..., in, out]`` with its inputs mapped by ``m_prev [n, n]``
  (``in = s·n``, channel fastest, for a dense layer after a flatten)."""
  n = m_prev.shape[0]
  shape = kernel.shape
  k = kernel.reshape((-1, shape[-2] // n, n, shape[-1]))
  k = jnp.einsum("asio,ji->asjo", k, m_prev.astype(k.dtype))
  return k.reshape(shape)


def _align_outputs(x, m):
  """``x [..., n]`` with its last axis mapped by ``m [n, n]``."""
  return jnp.einsum("...i,ji->...j", x, m.astype(x.dtype))


def apply_transports(layers: Sequence[Layer], params: PyTree,
                     batch_stats: PyTree, transports: Sequence[jax.Array]
                     ) -> tuple[PyTree, PyTree]:
  """One model's parameters moved onto the anchor's neurons (step 3).

  Args:
    layers: :func:`layer_chain`.
    params: the model's parameters.
    batch_stats: its BatchNorm statistics.
    transports: per layer but the last, ``diag(1/β) Tᵀ`` ``[n_ℓ, n_ℓ]``.

  Returns:
    The aligned ``(params, batch_stats)``; traceable.
  """
  for i, layer in enumerate(layers):
    mod = dict(_get(params, layer.path))
    if i > 0:
      mod["kernel"] = _align_inputs(mod["kernel"], transports[i - 1])
    if i < len(layers) - 1:
      m = transports[i]
      mod = {k: _align_outputs(v, m) for k, v in mod.items()}
      for norm in layer.norms:
        params = _set(params, norm, {k: _align_outputs(v, m) for k, v in
                                     _get(params, norm).items()})
        stats = _get(batch_stats, norm)
        batch_stats = _set(batch_stats, norm,
                           {k: _align_outputs(v, m) for k, v in stats.items()})
    params = _set(params, layer.path, mod)
  return params, batch_stats


def _neuron_features(layer: Layer, mod: dict, m_prev) -> np.ndarray:
  """``[n_out, d]``: each neuron's incoming weights (bias last), inputs
  aligned by ``m_prev``."""
  k = mod["kernel"] if m_prev is None else _align_inputs(mod["kernel"], m_prev)
  k = np.asarray(k)
  feats = k.reshape(-1, k.shape[-1]).T
  if "bias" in mod:
    feats = np.concatenate([feats, np.asarray(mod["bias"])[:, None]], 1)
  return feats


def transport(cost: np.ndarray) -> np.ndarray:
  """``diag(1/β) Tᵀ`` ``[n_b, n_a]`` of the exact uniform-marginal OT plan.

  Args:
    cost: ``[n_a, n_b]`` ground cost between the neurons of the model to
      align (rows) and of the anchor (columns).
  """
  import ot  # pylint: disable=import-outside-toplevel  (the optional extra)
  cost = np.asarray(cost, np.float64)
  n_a, n_b = cost.shape
  plan = ot.emd(np.full(n_a, 1.0 / n_a), np.full(n_b, 1.0 / n_b), cost)
  return (plan / plan.sum(0, keepdims=True)).T.astype(np.float32)


def _pairwise_euclidean(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  d2 = (np.sum(a * a, 1)[:, None] + np.sum(b * b, 1)[None, :] - 2.0 * a @ b.T)
  return np.sqrt(np.maximum(d2, 0.0))


def align(layers: Sequence[Layer], params: PyTree, anchor: PyTree,
          acts: Sequence[np.ndarray] | None = None,
          anchor_acts: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
  """The transports aligning one model to the anchor, input layer first.

  Args:
    layers: :func:`layer_chain`.
    params: the model to align (host arrays).
    anchor: the anchor's parameters.
    acts: activation-based: per layer ``[N, ..., n_ℓ]`` the model's kernel
      outputs on the samples; ``None`` for weight-based.
    anchor_acts: the anchor's, on the same samples.

  Returns:
    Per layer but the last, ``diag(1/β) Tᵀ`` ``[n_ℓ, n_ℓ]``.
  """
  out, m_prev = [], None
  for i, layer in enumerate(layers[:-1]):
    if acts is None:
      a = _neuron_features(layer, _get(params, layer.path), m_prev)
      b = _neuron_features(layer, _get(anchor, layer.path), None)
    else:
      a = np.asarray(acts[i]).reshape(-1, layer.out_features).T
      b = np.asarray(anchor_acts[i]).reshape(-1, layer.out_features).T
    m_prev = transport(_pairwise_euclidean(a, b))
    out.append(m_prev)
  return out


def kernel_outputs(task: Classifier, params: PyTree, batch_stats: PyTree,
                   x: jax.Array) -> list[np.ndarray]:
  """Each kernel layer's output on model inputs ``x`` (pre-activations)."""
  return [np.asarray(o) for kind, _, o in
          _record_calls(task, params, batch_stats, x) if kind == "kernel"]


def ot_fusion(client_stage: Callable[..., Teachers],
              groups: Sequence[ensemble.TeacherGroup],
              *,
              mode: str = "weights",
              samples: jax.Array | None = None,
              anchor: int = 0) -> ServerDistillation:
  """Builds OT fusion (one-shot, no server epochs).

  Args:
    client_stage: the one-shot client stage
      (:func:`fedjax_dd.algorithms.one_shot.client_stage`).
    groups: the uploaded client models; one architecture (fusion is
      parameter averaging after alignment).
    mode: ``"weights"`` (transport by incoming weights) or
      ``"activations"`` (by pre-activations on ``samples``).
    samples: ``[N, H, W, Ch]`` uint8 unlabeled server-held images
      (activation-based only; the paper's 200).
    anchor: the client every model is aligned to.

  Returns:
    A :class:`~fedjax_dd.core.algorithm.ServerDistillation`; ``setup`` is
    ``{"transport_<ℓ>": [m, n_ℓ, n_ℓ]}`` and the state the fused model.

  Raises:
    ValueError: several architectures, an unknown mode, activations without
      samples, or an anchor out of range.
  """
  groups = tuple(groups)
  if len(groups) != 1:
    raise ValueError("OT fusion averages aligned parameters and needs one "
                     f"client architecture; got {len(groups)} groups.")
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  if mode == "activations" and samples is None:
    raise ValueError("Activation-based OT fusion needs samples.")
  try:
    import ot  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise ImportError("OT fusion solves its transports with POT, the optional "
                      "extra: pip install 'fedjax-dd[ot]'.") from e
  group = groups[0]
  m = len(group.client_ids)
  if not 0 <= anchor < m:
    raise ValueError(f"anchor must be a client in [0, {m}), got {anchor}.")
  task = group.task
  # The stacked models are in the order of the group's client ids.
  anchor_pos = list(group.client_ids).index(anchor)

  def setup(teachers: Teachers, key: jax.Array) -> dict[str, jax.Array]:
    del key
    params, stats = jax.device_get(teachers.vars[0])
    one = lambda tree, k: jax.tree_util.tree_map(lambda v: v[k], tree)
    layers = layer_chain(task, one(params, 0), one(stats, 0))
    acts = [None] * m
    if mode == "activations":
      x = group.input_fn(jnp.asarray(samples, jnp.float32) / 255.0)
      acts = [kernel_outputs(task, one(params, k), one(stats, k), x)
              for k in range(m)]
    ref = one(params, anchor_pos)
    per_client = []
    for k in range(m):
      if k == anchor_pos:  # The anchor maps onto itself.
        per_client.append([np.eye(l.out_features, dtype=np.float32)
                           for l in layers[:-1]])
      else:
        per_client.append(align(layers, one(params, k), ref, acts[k],
                                acts[anchor_pos]))
    return {f"transport_{i}": jnp.asarray(np.stack([c[i] for c in per_client]))
            for i in range(len(layers) - 1)}

  def init(key, setup, teachers: Teachers, params, batch_stats):
    del key, params, batch_stats
    p, s = teachers.vars[0]
    one = lambda tree: jax.tree_util.tree_map(lambda v: v[0], tree)
    layers = layer_chain(task, one(p), one(s))
    ts = [setup[f"transport_{i}"] for i in range(len(layers) - 1)]
    aligned_p, aligned_s = jax.vmap(
        lambda pp, ss, *tt: apply_transports(layers, pp, ss, tt))(p, s, *ts)
    return {"params": stages.weighted_mean(aligned_p, teachers.num_examples),
            "batch_stats": stages.weighted_mean(aligned_s,
                                                teachers.num_examples)}

  def epoch(state, teachers):
    del teachers
    return state, {}

  def report(state, setup) -> dict[str, Any]:
    del state
    # Per layer: the share of mass off each row's largest entry (distance
    # from a permutation), and, over the non-anchor clients, the share that
    # moves to another neuron (0: fusion is plain averaging).
    ts = [np.asarray(setup[f"transport_{i}"]) for i in range(len(setup))]
    others = [k for k in range(m) if k != anchor_pos]
    return {
        "transport_off_permutation": [
            float(1.0 - np.mean(np.max(t, -1))) for t in ts],
        "transport_off_identity": [
            float(1.0 - np.mean(np.diagonal(t[others], axis1=-2, axis2=-1)))
            if others else 0.0 for t in ts]}

  return ServerDistillation(
      client_stage=client_stage, setup=setup, init=init, epoch=epoch,
      model=lambda state: (state["params"], state["batch_stats"]),
      report=report)
