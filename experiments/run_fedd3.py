"""FedD3 runner: distill on every client, upload once, train on the server.

``config.method`` is ``"fedd3"`` (one-shot:
:func:`fedjax_dd.algorithms.fedd3.fedd3` on
:func:`fedjax_dd.core.server.run_server_rounds`, the server training on the
union for ``rounds`` epochs) or ``"fedd3_hybrid"`` (App. F: ``rounds`` FedAvg
rounds on local plus received distilled data). :class:`FedD3Options` picks
the distiller and the upload's form; learned KIP labels are trained on as
sent.

The distilled set is the stage ``"distilled"`` of the run's stage cache
(:func:`fedjax_dd.algorithms.fedd3_stages.distill_or_load`), so a resumed
run does not distill again; ``config.fedd3.distilled_from`` trains on
another run's set instead. Either is used only if its
:func:`distill_fingerprint` matches, else refused naming the differing
fields. KIP's state is saved after each segment (stage ``"distilled_kip"``),
so a run stopped there continues from its last segment.

Each client's upload is its own ledger message, so ``summary.json["gce"]``
is FedD3's Table 2 GCE (``gce_cohort``: the cohort total); the summary adds
:func:`fedjax_dd.algorithms.fedd3_stages.upload_fields` and, for DP-KIP,
:func:`fedjax_dd.experiments.common.dp_kip_fields`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_dd.algorithms import fedd3
from fedjax_dd.algorithms import fedd3_stages
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import checks as core_checks
from fedjax_dd.core import keys
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.stage_cache import StageCache
from fedjax_dd.distill import privacy as privacy_lib
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import runners
from fedjax_dd.experiments import stage_builders
from fedjax_dd.utils.image_grid import save_image_grid

STAGE = fedd3_stages.STAGE


distill_fingerprint = common.distill_fingerprint


def _distill_or_load(config, workdir, prepared, data):
  """:func:`fedjax_dd.algorithms.fedd3_stages.distill_or_load` of the config."""
  source = config.fedd3.distilled_from
  key = keys.stage_key(keys.model_root(config.seed), keys.FEDD3_DISTILL)
  cache, fingerprint = StageCache.for_workdir(workdir), distill_fingerprint(
      config)
  # KIP's state after each segment, removed once the set is cached.
  in_progress = None if source else fedd3_stages.kip_checkpoint(cache,
                                                                fingerprint)
  try:
    return fedd3_stages.distill_or_load(
        lambda: stage_builders.distiller(
            config, prepared, prepared.dataset.num_classes,
            in_progress)(key, data),
        cache=cache, fingerprint=fingerprint, in_progress=in_progress,
        source=StageCache.for_workdir(source) if source else None,
        source_name=f"fedd3.distilled_from: {source!r}",
        diverged_advice=f"Lower --config.kip.lr (now {config.kip.lr:g}).",
        allow_rise=common.kip_options(config).dp)
  except privacy_lib.RawUploadError as e:
    raise common.InputError("fedd3: " + str(e).replace(
        "set allow_raw_upload=True",
        "set --config.fedd3.allow_raw_upload=True")) from None


def _audit(config, workdir, prepared, data):
  """With ``config.audit.enabled``: ``summary`` -> ``summary`` with the
  audit of the uploads (``experiments/auditing.py``) under ``audit``."""
  if "audit" not in config or not config.audit.enabled:
    return None
  from fedjax_dd.experiments import auditing as audit  # pylint: disable=g-import-not-at-top
  return lambda summary: {**summary, "audit": audit.audit_run(
      config, workdir, prepared=prepared, data=data)}


def _hybrid(config, workdir, prepared, data, distilled, extra, start):
  """App. F: FedAvg rounds on local plus received distilled data."""
  hybrid = jax.device_put(fedd3.hybrid_client_data(data, distilled))
  num_steps = common.local_steps(config, hybrid.num_examples)
  algorithm = fedavg(common.local_training(config, prepared.task,
                                           int(jnp.max(num_steps))))
  return runners.fit_and_summarize(
      config, workdir, prepared=prepared, algorithm=algorithm,
      data=hybrid, num_steps=num_steps,
      ledger=fedd3.hybrid_ledger(distilled, data.num_clients),
      start_time=start, extra_summary=extra,
      finalize=_audit(config, workdir, prepared, data))


def _uploads(config, workdir):
  """The client stage both FedD3 methods share: the data, the distilled
  uploads (cached in the workdir) and their summary fields."""
  start = time.time()
  prepared = common.load_and_prepare(config)
  parts = common.partition(config, prepared.dataset.y_train)
  data = common.client_data(prepared.dataset, parts)
  if "audit" in config and config.audit.enabled:
    # A holdout the test split cannot give is refused now, before KIP.
    from fedjax_dd.experiments import auditing as audit  # pylint: disable=g-import-not-at-top
    audit.attacker_data(config, prepared)
  distilled, distill_seconds, cached = _distill_or_load(config, workdir,
                                                        prepared, data)
  ds = prepared.dataset
  save_image_grid(common.workdir_path(workdir, "distilled_grid.png"),
                  distilled.x, distilled.y, distilled.owner,
                  title=f"{config.fedd3.distiller} distilled data")
  extra = fedd3_stages.upload_fields(
      distilled, data, distiller=config.fedd3.distiller,
      distill_seconds=distill_seconds, cached=cached,
      distilled_from=config.fedd3.distilled_from,
      distilled_grid="distilled_grid.png",
      quantisation=fedd3_stages.quantisation_cost(
          distilled, kernel_fn=common.kip_kernel(config, batched=True),
          mean=prepared.mean, std=prepared.std, x_test=ds.x_test[:2000],
          y_test=ds.y_test[:2000], reg=config.kip.reg))
  extra.update(common.dp_kip_fields(config, data.num_examples,
                                    distilled.iterations))  # DP-KIP's
  return start, prepared, data, distilled, extra


def run_hybrid(config: ml_collections.ConfigDict, workdir: str
               ) -> dict[str, Any]:
  """``fedd3_hybrid``: App. F, FedAvg rounds on local plus received
  distilled data."""
  if config.fedd3.float_upload:
    raise common.InputError(
        "fedd3_hybrid: its clients train on their uint8 data and the "
        "received images together; config.fedd3.float_upload is for the "
        "one-shot method. Set --config.fedd3.float_upload=False.")
  start, prepared, data, distilled, extra = _uploads(config, workdir)
  return _hybrid(config, workdir, prepared, data, distilled, extra, start)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """``fedd3``: the server trains on the union of the uploads."""
  start, prepared, data, distilled, extra = _uploads(config, workdir)
  ds = prepared.dataset
  # The client stage hands over the set distilled above (keyed by
  # keys.FEDD3_DISTILL, so both variants of a seed share one upload).
  task = prepared.task
  float_upload = bool(config.fedd3.float_upload)
  # A float upload is read as pixels by the same preprocessing.
  server_task = (fedd3.float_pixel_task(task, prepared.mean, prepared.std)
                 if float_upload else task)
  algorithm = fedd3.fedd3(
      lambda key, data: distilled, server_task, common.make_optimizer(config),
      num_classes=task.num_classes,
      images_per_class=config.fedd3.images_per_class,
      batch_size=config.client.batch_size,
      local_epochs=float(config.client.local_epochs),
      local_steps=config.client.local_steps or None,
      learned_labels=distilled.learned_labels,
      centered_labels=distilled.centered_labels,
      float_upload=float_upload,
      mapper=common.mapper(config))
  init_key, run_key = keys.init_and_run(keys.model_root(config.seed))
  global_model = task.init(init_key)
  result, rows, wall, work = runners.run_server(
      config, workdir, algorithm, data, start=start, run_key=run_key,
      evaluate=make_evaluator(task, ds.x_test, ds.y_test,
                              per_class=config.run.class_accuracy),
      initial_models=[global_model], global_model=global_model,
      group_sizes=[data.num_clients], num_rounds=1, num_epochs=config.rounds,
      tensorboard=config.run.tensorboard,
      setup_fingerprint={"distill": distill_fingerprint(config)})
  # FedD3's `rounds` are server epochs: report them as its rounds.
  summary = runners.summarize(
      config, rows=[{**row, "round": row["epoch"]} for row in rows],
      ledger=result.ledger, params=result.params,
      rounds=int(result.state.epoch), wall=wall,
      extra={**extra, "stage_seconds": {
          "server_training_seconds": result.seconds["server"]}})
  finalize = _audit(config, workdir, prepared, data)
  if finalize is not None:
    summary = finalize(summary)
  work.write_summary(summary)
  return summary


@dataclasses.dataclass(frozen=True)
class FedD3Options:
  """What each FedD3 client uploads: the ``fedd3`` group.

  Attributes:
    distiller: ``"kip"`` (FedD3's KIP), ``"gmm"`` (its GMM coreset) or
      ``"random"`` (random real images, the control).
    images_per_class: the upload budget of every distiller, images per
      class per client.
    allow_raw_upload: send images byte-identical to a raw image (a short
      KIP budget); False refuses them before any round.
    distilled_from: another run's workdir: train on its cached distilled set
      instead of distilling (refused if its distillation settings differ).
    float_upload: send KIP's support as float32 pixels (FedD3's code)
      instead of uint8 (the paper's count); the one-shot method only.
  """
  distiller: str = "kip"
  images_per_class: int = 1
  allow_raw_upload: bool = False
  distilled_from: str = ""
  float_upload: bool = False

  def __post_init__(self):
    if self.distiller not in stage_builders.DISTILLERS:
      raise ValueError(f"distiller must be one of "
                       f"{list(stage_builders.DISTILLERS)}, got "
                       f"{self.distiller!r}.")
    core_checks.check_int("images_per_class", self.images_per_class, 1)
    if self.float_upload and self.distiller != "kip":
      # KIP's unquantised support is the only float image; the others
      # send uint8 images.
      raise ValueError(f"float_upload must be False for the "
                       f"{self.distiller!r} distiller, which sends uint8 "
                       "images (only KIP's support goes as float32).")


registry.declare(registry.Method("fedd3", pipeline=run,
                                 hparams=FedD3Options))
registry.declare(registry.Method("fedd3_hybrid", pipeline=run_hybrid,
                                 runner="fedd3", hparams=FedD3Options,
                                 group="fedd3"))
