"""The audit of a run, as the runners call it (``--config.audit.enabled``).

Glue between a config and :mod:`fedjax_dd.audit.workdir`: the attacker's
holdout (:func:`attacker_data`), one audit per runner (:data:`AUDITS`),
written to ``WORKDIR/audit.json``, and the headline for
``summary.json["audit"]`` (:func:`audit_run`). The runners import this
module and the audit command (``python -m fedjax_dd.experiments.audit``)
imports both, so the imports have no cycle.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections
import numpy as np

from fedjax_dd.audit import workdir as audit_lib
from fedjax_dd.core import checks
from fedjax_dd.core import keys
from fedjax_dd.experiments import common
from fedjax_dd.experiments.configs import base as base_config


def attacker_data(config: ml_collections.ConfigDict,
                  prepared: common.Prepared
                  ) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
  """``(holdout_x, holdout_y, rng)``: ``audit.holdout`` test examples drawn
  from ``data.seed``'s audit stream, and that stream for the non-members.

  Raises:
    common.InputError: ``audit.holdout`` above the test split's size.
  """
  ds = prepared.dataset
  idx, rng = _holdout(config, prepared)
  return ds.x_test[idx], ds.y_test[idx], rng


def _holdout(config, prepared) -> tuple[np.ndarray, np.random.Generator]:
  """The holdout's test indices, and ``data.seed``'s audit stream after
  drawing them (the non-members' draws follow).

  Raises:
    common.InputError: ``audit.holdout`` above the test split's size.
  """
  rng = keys.numpy_stream(config.data.seed, keys.Stream.AUDIT)
  num_test = int(np.shape(prepared.dataset.y_test)[0])
  try:
    idx = audit_lib.holdout_indices(
        num_test, config.audit.holdout, rng, name="config.audit.holdout",
        fix=f"the test split of {config.data.dataset} holds {num_test} "
        "examples; set --config.audit.holdout (0: all of them)")
  except checks.SettingError as e:
    raise common.InputError(str(e)) from None
  return idx, rng


def _nonmembers(config, prepared, data, *, with_holdout: bool = False):
  """``(nonmembers, holdout size)``, and the holdout images last with
  ``with_holdout`` (a model audit's probe set)."""
  hx, hy, rng = attacker_data(config, prepared)
  try:
    out = audit_lib.nonmembers(hx, hy, data, rng), int(hy.shape[0])
    return (*out, hx) if with_holdout else out
  except checks.SettingError as e:
    raise common.InputError(
        f"config.audit.{e}".replace("; raise it", "; raise "
                                    "--config.audit.holdout")) from None


def audit_fedd3(config: ml_collections.ConfigDict, workdir: str, *,
                prepared: common.Prepared | None = None,
                data=None) -> dict[str, Any]:
  """The audit of a FedD3 run's uploads (its stage cache), written to
  ``workdir/audit.json``; ``prepared`` and ``data`` are rebuilt as
  ``run_fedd3.run`` builds them when not given."""
  if prepared is None:
    prepared = common.load_and_prepare(config)
  if data is None:
    data = common.client_data(
        prepared.dataset, common.partition(config, prepared.dataset.y_train))
  nonmembers, size = _nonmembers(config, prepared, data)
  uploads = audit_lib.load_uploads(
      config.fedd3.distilled_from or workdir,
      common.distill_fingerprint(config), data.num_clients)
  summary = audit_lib.audit_image_uploads(
      data, nonmembers, uploads, num_classes=prepared.dataset.num_classes,
      psnr_threshold=float(config.audit.psnr_threshold),
      fprs=tuple(config.audit.fprs),
      projection_key=_projection_key(config), mapper=common.mapper(config))
  return _finish(config, workdir, summary, size)


def audit_federated(config: ml_collections.ConfigDict, workdir: str, *,
                    prepared: common.Prepared, data,
                    algorithm) -> dict[str, Any]:
  """The audit of a rounds run, written to ``workdir/audit.json``: its
  final global model (its checkpoint) against every client's data, and
  with ``audit.client_uploads`` each client's upload
  (:func:`fedjax_dd.audit.workdir.client_uploads`: local training from the
  final global model, or the initial one in a one-round run); with
  ``audit.lira_shadows`` both also by offline LiRA (:func:`lira_shadows`).
  ``prepared``, ``data`` and ``algorithm`` as ``runners.run_federated``
  built them.
  """
  from fedjax_dd.core import fit as fit_lib  # pylint: disable=g-import-not-at-top
  nonmembers, size, probe_x = _nonmembers(config, prepared, data,
                                          with_holdout=True)
  template = fit_lib.initial_state(algorithm, prepared.task, data.num_clients,
                                   seed=config.seed)
  params, batch_stats, rounds = audit_lib.load_global_model(workdir,
                                                            template)
  mapper = common.mapper(config)
  fprs = tuple(config.audit.fprs)
  task = prepared.task
  summary = audit_lib.audit_global_model(
      task, params, batch_stats, data, nonmembers, fprs=fprs, mapper=mapper)
  a = config.audit
  shadows = lira_shadows(config, prepared, data) if a.lira_shadows else None
  if shadows is not None:
    init = (template.server.params, template.server.batch_stats)
    summary["model_mia_lira"] = audit_lib.audit_global_lira(
        task, params, batch_stats, shadows.train(init, 0, rounds), data,
        nonmembers, fprs=fprs, mapper=mapper)
  if a.client_uploads:
    start, round_index = ((template.server.params,
                           template.server.batch_stats), 0)
    if rounds > 1:
      start, round_index = (params, batch_stats), rounds
    num_steps = common.local_steps(config, data.num_examples)
    training = common.local_training(config, task, int(np.max(num_steps)))
    uploads = audit_lib.client_uploads(
        training, *start, data, num_steps, _audit_key(config, 0),
        round_index=round_index)
    summary["client_uploads"] = audit_lib.audit_client_uploads(
        task, *uploads, data, nonmembers, probe_x, fprs=fprs, mapper=mapper,
        shadows=None if shadows is None else shadows.train(
            start, round_index, 1))
    summary["client_uploads"]["start"] = (
        "final global model" if rounds > 1 else "initial model")
  summary["rounds"] = rounds
  return _finish(config, workdir, summary, size)


class _Shadows:
  """LiRA's OUT shadows of a rounds run (:func:`lira_shadows`)."""

  def __init__(self, config, task, pool_x, pool_y, size):
    self.config, self.task = config, task
    self.pool_x, self.pool_y, self.size = pool_x, pool_y, size
    self.steps = int(np.asarray(common.local_steps(config, [size]))[0])

  def train(self, start, round_index: int, rounds: int, task=None):
    """``audit.lira_shadows`` shadows of ``task`` (default: the run's)
    from ``start`` (``None``: each its own initialisation), each making
    ``rounds`` times a median client's local steps on ``size`` pool
    examples."""
    from fedjax_dd.audit import model_mia  # pylint: disable=g-import-not-at-top
    steps = max(1, self.steps * max(1, int(rounds)))
    training = common.local_training(self.config, task or self.task, steps)
    return model_mia.train_shadows(
        training, _audit_key(self.config, 1), self.pool_x, self.pool_y,
        num_shadows=int(self.config.audit.lira_shadows),
        shadow_size=self.size, num_steps=steps, start=start,
        round_index=round_index)


def lira_shadows(config: ml_collections.ConfigDict, prepared: common.Prepared,
                 data) -> _Shadows:
  """Offline LiRA's shadow pool (Carlini et al. 2022): ``audit.lira_pool``
  (0: all) test examples outside the attacker's holdout, disjoint from
  every member and non-member (data.seed's ``AUDIT_SHADOWS`` stream); each
  shadow trains on a median client's number of them.

  Raises:
    common.InputError: the holdout leaves no test example for the pool, or
      fewer than ``audit.lira_pool``.
  """
  ds = prepared.dataset
  num_test = int(np.shape(ds.y_test)[0])
  held, _ = _holdout(config, prepared)
  try:
    idx = audit_lib.shadow_pool_indices(
        num_test, held, config.audit.lira_pool,
        keys.numpy_stream(config.data.seed, keys.Stream.AUDIT_SHADOWS))
  except checks.SettingError:
    rest = num_test - held.size
    raise common.InputError(
        f"config.audit.lira_shadows={config.audit.lira_shadows}: the shadow "
        f"pool holds {rest} test examples outside the holdout of "
        f"{held.size}, not {max(2, config.audit.lira_pool or rest)}; lower "
        "--config.audit.holdout or --config.audit.lira_pool.") from None
  n = np.asarray(data.num_examples)
  size = int(min(idx.size, max(1, np.median(n[n > 0]))))
  return _Shadows(config, prepared.task, ds.x_test[idx], ds.y_test[idx],
                  size)


def _audit_key(config, index: int):
  """The key of the audit's own training (0: retrained uploads, 1:
  shadows), off ``data.seed``'s ``AUDIT_SHADOWS`` stream."""
  import jax  # pylint: disable=g-import-not-at-top
  root = jax.random.fold_in(jax.random.key(int(config.data.seed)),
                            int(keys.Stream.AUDIT_SHADOWS))
  return jax.random.fold_in(root, index)


def _projection_key(config):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.random.fold_in(jax.random.key(int(config.data.seed)),
                            int(keys.Stream.AUDIT))


def _finish(config, workdir, summary, size):
  summary = {
      "method": config.method, "dataset": config.data.dataset,
      "holdout": {"source": "test split",
                  "requested": int(config.audit.holdout), "size": size},
      "psnr_threshold": float(config.audit.psnr_threshold),
      "fprs": list(config.audit.fprs), **summary}
  audit_lib.write_audit(workdir, summary)
  return summary


def hfldd_uploads(sent, num_clients: int):
  """HFLDD's member uploads (:class:`fedjax_dd.algorithms.hfldd.SentData`,
  ``[M, S, ...]`` over senders, with a row mask) as FedD3's padded
  :class:`~fedjax_dd.algorithms.fedd3.Uploads` over all ``num_clients``:
  client ``i``'s rows are what it sent its head; those that sent nothing
  get ``count`` 0, which the image audits leave out. The target rows count
  as ``learned_labels`` (probability rows for the label leakage)."""
  from fedjax_dd.algorithms import fedd3 as fedd3_lib  # pylint: disable=g-import-not-at-top
  x = np.asarray(sent.x)
  y = np.asarray(sent.y, np.float32)
  mask = np.asarray(sent.mask, bool)
  ux = np.zeros((num_clients, *x.shape[1:]), x.dtype)
  uy = np.zeros((num_clients, *y.shape[1:]), np.float32)
  count = np.zeros((num_clients,), np.int32)
  for j, c in enumerate(np.asarray(sent.senders, np.int64)):
    rows = np.flatnonzero(mask[j])
    ux[c, :rows.size] = x[j, rows]
    uy[c, :rows.size] = y[j, rows]
    count[c] = rows.size
  return fedd3_lib.Uploads(x=ux, y_soft=uy, count=count,
                           learned_labels=True, centered_labels=False)


def audit_hfldd(config: ml_collections.ConfigDict, workdir: str, *,
                prepared: common.Prepared | None = None, data=None,
                stages=None, algorithm=None) -> dict[str, Any]:
  """The audit of an HFLDD run, written to ``workdir/audit.json``: what
  each member sent its head (image MIA in pixels and random features,
  reconstruction, label leakage of the sent rows), the label leakage of
  every client's soft labels on ``D_g`` (what the server clusters), and the
  heads' final global model against every client's data (loss threshold).

  ``prepared``, ``data`` (all clients'), ``stages`` and ``algorithm`` as
  ``run_hfldd.run`` built them; not given, they are rebuilt from the config
  and the workdir's stage cache (loaded, never computed).
  """
  from fedjax_dd.algorithms import hfldd as hfldd_lib  # pylint: disable=g-import-not-at-top
  from fedjax_dd.algorithms import hfldd_stages  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import fit as fit_lib  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.stage_cache import StageCache  # pylint: disable=g-import-not-at-top
  if prepared is None or data is None:
    prepared, data, _, _, _ = common.initialised_clients(config)
  num_classes = prepared.dataset.num_classes
  if stages is None:
    def not_cached():
      raise common.InputError(
          f"{workdir} holds no HFLDD stages under this config; audit the "
          "workdir of a finished HFLDD run.")
    stages = hfldd_stages.stages_or_load(
        StageCache.for_workdir(workdir),
        common.fingerprint(config, "hfldd_stages"), not_cached, data=data,
        num_classes=num_classes)
  nonmembers, size = _nonmembers(config, prepared, data)
  mapper = common.mapper(config)
  fprs = tuple(config.audit.fprs)
  summary = audit_lib.audit_image_uploads(
      data, nonmembers, hfldd_uploads(stages.sent, data.num_clients),
      num_classes=num_classes,
      psnr_threshold=float(config.audit.psnr_threshold), fprs=fprs,
      projection_key=_projection_key(config), mapper=mapper)
  summary["kind"] = "hfldd"
  summary["senders"] = np.asarray(stages.sent.senders).tolist()
  if stages.soft_labels is not None:
    summary["soft_labels"] = audit_lib.audit_soft_labels(
        stages.soft_labels, data, num_classes=num_classes, mapper=mapper)
  if algorithm is None:
    head_steps = common.local_steps(config, stages.hybrid.num_examples)
    algorithm = hfldd_lib.head_training(common.local_training(
        config, prepared.task, int(np.max(np.asarray(head_steps)))))
  template = fit_lib.initial_state(algorithm, prepared.task,
                                   stages.hybrid.num_clients,
                                   seed=config.seed)
  params, batch_stats, rounds = audit_lib.load_global_model(workdir,
                                                            template)
  model = audit_lib.audit_global_model(
      prepared.task, params, batch_stats, data, nonmembers, fprs=fprs,
      mapper=mapper)
  summary["model_mia_loss"] = model["model_mia_loss"]
  summary["rounds"] = rounds
  return _finish(config, workdir, summary, size)


def audit_one_shot(config: ml_collections.ConfigDict, workdir: str, *,
                   prepared: common.Prepared | None = None, data=None,
                   groups=None, result=None) -> dict[str, Any]:
  """The audit of a one-shot run, written to ``workdir/audit.json``: each
  client's uploaded model against its own training data (loss threshold,
  label leakage; :func:`fedjax_dd.audit.workdir.audit_client_models`) and
  the final global model against every client's (``global_model_mia_loss``);
  with ``audit.lira_shadows`` also offline LiRA on both (``model_mia_lira``,
  ``global_model_mia_lira``).

  ``prepared``, ``data``, ``groups`` and ``result`` (the
  :class:`fedjax_dd.core.server.ServerResult`) as ``run_fedhydra.run`` built
  them. Not given, the run is resumed with the audit on: every stage
  restores from its checkpoints and the resumed run writes this audit.
  """
  if result is None:
    from fedjax_dd.experiments import run_fedhydra  # pylint: disable=g-import-not-at-top
    config = ml_collections.ConfigDict(config.to_dict())
    config.audit.enabled = True
    run_fedhydra.run(config, workdir)
    with open(os.path.join(workdir, audit_lib.AUDIT_FILE),
              encoding="utf-8") as f:
      return json.load(f)
  nonmembers, size, probe_x = _nonmembers(config, prepared, data,
                                          with_holdout=True)
  mapper = common.mapper(config)
  fprs = tuple(config.audit.fprs)
  shadows = None
  if config.audit.lira_shadows:
    # Shadows train as each group's clients did: from the group's shared
    # start, or from their own initialisations.
    pool = lira_shadows(config, prepared, data)
    init_key, _ = keys.init_and_run(keys.model_root(config.seed))
    shadows = [pool.train(None if config.client.independent_init
                          else g.task.init(init_key), 0, 1, task=g.task)
               for g in groups]
  summary = audit_lib.audit_client_models(
      groups, result.teachers, data, nonmembers, probe_x, fprs=fprs,
      mapper=mapper, shadows=shadows)
  summary["global_model_mia_loss"] = audit_lib.audit_global_model(
      prepared.task, result.params, result.batch_stats, data, nonmembers,
      fprs=fprs, mapper=mapper)["model_mia_loss"]
  if shadows is not None:
    # The global model is the server's student, which never saw client data:
    # its OUT shadows (its architecture, own inits) train as a client does.
    summary["global_model_mia_lira"] = audit_lib.audit_global_lira(
        prepared.task, result.params, result.batch_stats,
        pool.train(None, 0, 1), data, nonmembers, fprs=fprs,
        mapper=mapper)
  summary["rounds"] = int(result.rounds)
  return _finish(config, workdir, summary, size)


AUDITS = {"fedd3": audit_fedd3, "federated": audit_federated,
          "hfldd": audit_hfldd, "fedhydra": audit_one_shot}
"""The audit of each runner: ``--config.audit.enabled`` is refused on the
others (``common.check_audit``)."""


def audit_run(config: ml_collections.ConfigDict, workdir: str,
              **built) -> dict[str, Any]:
  """The runner's audit (:data:`AUDITS`); returns the headline figures
  for ``summary.json["audit"]``."""
  return audit_lib.headline(AUDITS[config.runner](config, workdir, **built))


def finished_config(workdir: str) -> ml_collections.ConfigDict:
  """The config of a finished run, from ``workdir/summary.json``, with the
  ``audit`` group's defaults where the run predates it.

  Raises:
    common.InputError: no readable ``summary.json``, or a runner without an
      audit.
  """
  path = os.path.join(workdir, "summary.json")
  try:
    with open(path, encoding="utf-8") as f:
      recorded = json.load(f)["config"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise common.InputError(
        f"{path} cannot be read as a finished run's summary ({type(e).__name__}"
        f": {e}); audit a workdir whose run finished.") from None
  config = ml_collections.ConfigDict(recorded)
  defaults = base_config.base(method="", dataset="", model="").audit
  if "audit" not in config:
    config.audit = defaults
  for k, v in defaults.items():
    if k not in config.audit:
      config.audit[k] = v
  if config.get("runner") not in AUDITS:
    raise common.InputError(
        f"{workdir} holds a run of runner {config.get('runner')!r}, which "
        f"has no audit yet (runners {', '.join(AUDITS)}).")
  return config
