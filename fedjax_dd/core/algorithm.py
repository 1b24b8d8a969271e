"""The federated-algorithm protocol and the experiment state.

An algorithm is a pair of pure-ish functions, as in fedjax's
``FederatedAlgorithm(init, apply)`` and optax's
``GradientTransformation(init, update)``:

* ``init(params, batch_stats, num_clients) -> (ServerState, client_states)``
  where ``client_states`` is a pytree stacked on the client axis ``[N, ...]``
  (SCAFFOLD's control variates) or ``{}``;
* ``apply(server, client_states[S], cohort, key) -> (server, client_states[S],
  metrics)`` runs one round on the sampled cohort of ``S`` clients. Model
  traffic follows from ``comm``; other traffic is returned as metrics named
  ``"traffic/<kind>/<tag>"`` (:data:`fedjax_dd.core.rounds.TRAFFIC_PREFIX`).

``apply`` is called from the host; inside it the per-client work is one
batched program built through :mod:`fedjax_dd.core.clients`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax
import jax

PyTree = Any


@flax.struct.dataclass
class ServerState:
  """Server-side state.

  Attributes:
    params: global model parameters.
    batch_stats: global BatchNorm statistics (``{}`` without BN).
    opt_state: server optimizer state.
    extra: algorithm-specific server state (e.g. SCAFFOLD's ``c``).
  """
  params: PyTree
  batch_stats: PyTree
  opt_state: PyTree
  extra: PyTree = flax.struct.field(default_factory=dict)


@flax.struct.dataclass
class Cohort:
  """The sampled clients' data for one round, stacked ``[S, ...]``.

  Attributes:
    x: ``[S, N_max, H, W, Ch]`` uint8 images.
    y: ``[S, N_max]`` int32 labels.
    num_examples: ``[S]`` valid examples per client.
    num_steps: ``[S]`` active local steps per client.
    client_ids: ``[S]`` indices of the sampled clients.
    round: ``[]`` int32, the round's 0-based index (rows number it
      ``round + 1``), set by :func:`fedjax_dd.core.rounds.round_cohort` and
      handed to every local update
      (:class:`fedjax_dd.core.clients.RoundContext`); ``0`` for a cohort
      built by hand.
  """
  x: jax.Array
  y: jax.Array
  num_examples: jax.Array
  num_steps: jax.Array
  client_ids: jax.Array
  round: jax.Array | int = 0


@flax.struct.dataclass
class ExperimentState:
  """Everything a multi-round run needs to resume, checkpointed as one unit.

  Attributes:
    server: the :class:`ServerState`.
    clients: per-client state stacked on the client axis ``[N, ...]``.
    key: the root PRNG key; round ``r`` uses ``fold_in(key, r)``.
    round: the number of completed rounds.
  """
  server: ServerState
  clients: PyTree
  key: jax.Array
  round: jax.Array


class CommSpec(NamedTuple):
  """How many model-sized tensors move per sampled client per round."""
  download: int = 1
  upload: int = 1


# (server, data) -> (params [K, ...], batch_stats [K, ...], picks [C]): the
# K models a method keeps and the one each of the C clients of ``data``
# (a ClientData of their training examples) would deploy.
Deploy = Callable[[ServerState, Any], tuple[PyTree, PyTree, jax.Array]]


class FederatedAlgorithm(NamedTuple):
  """A federated algorithm: ``init`` and ``apply`` plus its message sizes.

  ``deploy`` (a :data:`Deploy`) says which model each client would use, for
  personalized evaluation (:mod:`fedjax_dd.core.personal`): ``None`` is the
  global model for every client; the clustered methods give their cluster
  models and each client's cluster (:func:`deployed`).
  """
  init: Callable[..., tuple[ServerState, PyTree]]
  apply: Callable[..., tuple[ServerState, PyTree, dict[str, jax.Array]]]
  comm: CommSpec = CommSpec()
  deploy: Deploy | None = None


def deployed(algorithm: FederatedAlgorithm, server: ServerState, data: Any
             ) -> tuple[PyTree, PyTree, jax.Array]:
  """``(params [K, ...], batch_stats [K, ...], picks [C])``: the models
  ``algorithm`` keeps and the one each client of ``data`` would deploy
  (``algorithm.deploy``; without one, ``K = 1``: the global model for all).
  """
  if algorithm.deploy is not None:
    return algorithm.deploy(server, data)
  one = lambda tree: jax.tree_util.tree_map(lambda a: a[None], tree)
  picks = jax.numpy.zeros((data.num_clients,), jax.numpy.int32)
  return one(server.params), one(server.batch_stats), picks


# ----------------------------------------------------------------------------
# The second shape: methods whose server does more than average.
# ----------------------------------------------------------------------------


@flax.struct.dataclass
class Teachers:
  """The client models a server-side method receives, one group per
  architecture.

  Attributes:
    vars: per group ``(params, batch_stats)``, each stacked ``[m_g, ...]`` in
      the order of the group's client ids.
    num_examples: ``[m]`` training examples per client (client order), the
      weights of parameter averaging.
  """
  vars: tuple[tuple[PyTree, PyTree], ...]
  num_examples: jax.Array


@flax.struct.dataclass
class ClientProgress:
  """A client stage trained part of the way (:class:`SpannedClientStage`).

  Attributes:
    vars: per group ``(params, batch_stats, opt_state)``, each stacked
      ``[m_g, ...]`` in the order of the group's client ids.
  """
  vars: tuple[tuple[PyTree, PyTree, PyTree], ...]


class SpannedClientStage(NamedTuple):
  """A client stage that can run in spans of local steps.

  Called as ``stage(starts, data, key) -> Teachers`` it runs as one span.
  :func:`fedjax_dd.core.server.run_server_rounds` (with
  ``ServerOptions.client_span_steps``) instead checkpoints the
  :class:`ClientProgress` between spans; the models are the same.

  Attributes:
    begin: ``(starts, data) -> ClientProgress`` at step 0 (validates
      ``data``).
    advance: ``(progress, data, key, first, stop) -> ClientProgress``: every
      client's steps ``[first, min(stop, its own count))``.
    finish: ``(progress, data) -> Teachers``.
    total_steps: the largest client's step count (the stage is done there).
  """
  begin: Callable[..., ClientProgress]
  advance: Callable[..., ClientProgress]
  finish: Callable[..., "Teachers"]
  total_steps: int

  def __call__(self, starts, data, key) -> "Teachers":
    progress = self.advance(self.begin(starts, data), data, key, 0,
                            self.total_steps)
    return self.finish(progress, data)


class ServerDistillation(NamedTuple):
  """A one-shot or server-side-distillation method as pure functions.

  :func:`fedjax_dd.core.server.run_server_rounds` runs, per round,
  ``client_stage → setup → init → epoch × E`` and owns checkpoints, metrics,
  the ledger and the budget; a notebook can call the functions itself.

  Attributes:
    client_stage: ``(starts, cohort, key) -> Teachers``: every client trains
      once from ``starts`` (per group ``(params, batch_stats)``), keyed by
      its id; may be a :class:`SpannedClientStage`.
    setup: ``(teachers, key) -> dict[str, Array]``: a one-off, cached server
      computation before the epochs (FedHydra's stratification, Alg. 2);
      ``{}`` when there is none. May run host loops.
    init: ``(key, setup, teachers, params, batch_stats) -> state``: the
      server state, a pytree; cheap and traceable (its shapes are read with
      ``jax.eval_shape`` to restore a checkpoint).
    epoch: ``(state, teachers) -> (state, metrics)``: one server epoch
      (DENSE, FedHydra's HASA, FedDF).
    model: ``state -> (params, batch_stats)``: the global model.
    report: ``(state, setup) -> dict`` of host values for the summary and
      figures (e.g. ``U_r``, sample images); ``None`` for nothing.
    upload_template: ``(starts, group_sizes, data) -> pytree`` of
      ``jax.ShapeDtypeStruct``: the shapes of what ``client_stage``
      returns, to restore its checkpoint. ``None``: client models
      (:class:`Teachers` of the ``starts``' shapes).
    upload_bits: ``uploads -> (tag, [m] bits)``: each client's upload as
      the ledger records it. ``None``: one model per client.

  A method whose clients upload something other than models (FedD3's
  distilled data) sets ``upload_template`` and ``upload_bits``; its
  ``client_stage`` returns that upload, which ``setup``, ``init`` and
  ``epoch`` then receive in place of :class:`Teachers`.
  """
  client_stage: Callable[..., Any]
  setup: Callable[..., dict[str, jax.Array]]
  init: Callable[..., PyTree]
  epoch: Callable[..., tuple[PyTree, dict[str, jax.Array]]]
  model: Callable[[PyTree], tuple[PyTree, PyTree]]
  report: Callable[..., dict[str, Any]] | None = None
  upload_template: Callable[..., PyTree] | None = None
  upload_bits: Callable[[Any], tuple[str, Any]] | None = None


def no_setup(teachers: Teachers, key: jax.Array) -> dict[str, jax.Array]:
  """The ``setup`` of a method without one."""
  del teachers, key
  return {}
