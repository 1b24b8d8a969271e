"""Config -> library builders of the one-shot runners' stages.

* :func:`distiller`: FedD3's client stage (``run_fedd3``), KIP, the GMM
  coreset or the random-real control;
* the server methods of the ``fedhydra`` runner (``run_fedhydra``),
  declared here (:mod:`fedjax_dd.experiments.registry`): FedHydra, DENSE,
  FedDF, one-shot FedAvg (with its rounds form), Co-Boosting and OT fusion,
  each built over the shared one-shot client stage.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax

from fedjax_dd import models
from fedjax_dd.algorithms import coboosting as coboosting_lib
from fedjax_dd.algorithms import fedd3
from fedjax_dd.algorithms import fedd3_stages
from fedjax_dd.algorithms import one_shot
from fedjax_dd.algorithms import ot_fusion as ot_fusion_lib
from fedjax_dd.algorithms import stratify as stratify_lib
from fedjax_dd.algorithms.dense import dense
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.algorithms.feddf import feddf, public_set
from fedjax_dd.algorithms.fedhydra import fedhydra
from fedjax_dd.core import keys
from fedjax_dd.core.algorithm import CommSpec
from fedjax_dd.data import sources
from fedjax_dd.distill import ensemble
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import sections


# FedD3's distillers, by the name ``config.fedd3.distiller`` gives
# (run_fedd3.FedD3Options refuses any other before the data loads).
DISTILLERS = ("kip", "gmm", "random")


def distiller(config: ml_collections.ConfigDict, prepared: common.Prepared,
              num_classes: int, segment_store=None) -> fedd3.Distiller:
  """FedD3's distiller named by ``config.fedd3.distiller`` (one of
  :data:`DISTILLERS`), with the config's KIP settings and upload budget
  (KIP keeps its state between segments in ``segment_store`` when given).
  The names and the float upload are checked by
  :class:`~fedjax_dd.experiments.run_fedd3.FedD3Options`."""
  options = common.kip_options(config)
  progress = (fedd3_stages.progress_bar(options.max_iterations)
              if config.run.progress else None)
  f = config.fedd3
  builders = {
      "kip": lambda: fedd3.kip_distiller(
          common.kip_kernel(config), num_classes=num_classes,
          mean=prepared.mean, std=prepared.std,
          images_per_class=f.images_per_class, options=options,
          mapper=common.mapper(config, workload="kip"),
          allow_raw_upload=f.allow_raw_upload, float_upload=f.float_upload,
          progress=progress, segment_store=segment_store),
      "gmm": lambda: fedd3.gmm_distiller(
          num_classes=num_classes, images_per_class=f.images_per_class,
          allow_raw_upload=f.allow_raw_upload),
      "random": lambda: fedd3.random_distiller(
          num_classes=num_classes, images_per_class=f.images_per_class),
  }
  return builders[f.distiller]()


def _synthesis(config, task) -> dict[str, Any]:
  """The generator and optimisers shared by FedHydra and DENSE."""
  d = config.dfkd
  return dict(
      generator=models.Generator(out_shape=tuple(task.input_shape),
                                 nz=d.nz, ngf=d.ngf,
                                 layers=models.LayerSet.from_policy(
                                     common.conv_impl(config),
                                     common.compute_dtype(config),
                                     model=models.Generator.__name__)),
      generator_optimizer=optax.adam(d.generator_lr, b1=d.generator_b1),
      student_optimizer=optax.sgd(d.student_lr,
                                  momentum=student_momentum(config) or None),
      mapper=common.mapper(config))


def student_momentum(config) -> float:
  """The student SGD's momentum: ``dfkd.student_momentum``, or none under
  ``dfkd.protocol="paper"`` (FedHydra Sec. 4.1.5: SGD, lr 0.01)."""
  d = config.dfkd
  return 0.0 if d.protocol == "paper" else float(d.student_momentum)


AGGREGATIONS: dict[str, ensemble.CombineFn] = {
    "sa": stratify_lib.stratified_ensemble,
    "ae": ensemble.average_ensemble,
    "sa_predicted": stratify_lib.stratified_ensemble_predicted,
}


def _fedhydra(config, stage, groups, task, input_fn):
  syn = _synthesis(config, task)
  return fedhydra(stage, groups, syn.pop("generator"), task, input_fn,
                  sections.dfkd(config.dfkd),
                  stratify_steps=config.dfkd.stratify_steps,
                  stratify_batch_size=config.dfkd.stratify_batch_size,
                  combine=AGGREGATIONS[config.dfkd.aggregation],
                  sa_average_scale=config.dfkd.sa_average_scale,
                  stratify_mapper=common.mapper(config, workload="stratify"),
                  **syn)


def _dense(config, stage, groups, task, input_fn):
  syn = _synthesis(config, task)
  return dense(stage, groups, syn.pop("generator"), task, input_fn,
               sections.dfkd(config.dfkd), **syn)


def _feddf(config, stage, groups, task, input_fn):
  public = sources.load_unlabeled(
      config.data.public_data, num=config.data.public_size,
      rng=keys.numpy_stream(config.data.seed, keys.Stream.PUBLIC_DATA))
  d = config.dfkd
  return feddf(stage, groups, task, input_fn,
               jax.device_put(public_set(public, task.input_shape)),
               optimizer=optax.adam(d.feddf_lr),
               batch_size=d.synthetic_batch_size,
               steps_per_epoch=d.feddf_steps,
               temperature=d.temperature, mapper=common.mapper(config))


def _os_fedavg(config, stage, groups, task, input_fn):
  del config, groups, task, input_fn
  return one_shot.os_fedavg(stage)


def _public(config, task, num=None):
  """FedDF's unlabeled public set (``data.public_data``), first ``num``."""
  public = sources.load_unlabeled(
      config.data.public_data, num=num or config.data.public_size,
      rng=keys.numpy_stream(config.data.seed, keys.Stream.PUBLIC_DATA))
  return public_set(public, task.input_shape)


def _coboosting(config, stage, groups, task, input_fn):
  d, cb = config.dfkd, config.coboosting
  syn = _synthesis(config, task)
  syn["student_optimizer"] = optax.chain(
      optax.clip_by_global_norm(cb.student_clip),
      optax.add_decayed_weights(cb.student_weight_decay),
      optax.sgd(d.student_lr, momentum=student_momentum(config) or None))
  hparams = sections.coboosting(cb, d)
  return coboosting_lib.coboosting(stage, groups, syn.pop("generator"), task,
                                   input_fn, hparams, **syn)


def _ot_fusion(config, stage, groups, task, input_fn, hparams):
  del input_fn
  o = hparams
  samples = (_public(config, task, o.num_samples)
             if o.mode == "activations" else None)
  return ot_fusion_lib.ot_fusion(stage, groups, mode=o.mode, samples=samples,
                                 anchor=o.anchor)


def _one_aggregation(config) -> None:
  if int(config.rounds) != 1:
    raise ValueError(
        f"os_fedavg is one-shot: one aggregation, so config.rounds must be "
        f"1, got {config.rounds}; for several rounds use "
        "experiments/configs/fedavg.py.")


def _os_fedavg_rounds(config, training):
  """One-shot FedAvg in the rounds loop (the federated runner): one FedAvg
  round (validate refuses rounds != 1) whose round-1 model travels as a
  seed, so the upload is its only traffic."""
  del config
  return fedavg(training, comm=CommSpec(download=1, upload=1))


# The fedhydra runner's methods, each declared once
# (experiments/registry.py): built over the shared one-shot client stage.
for _method in (
    registry.Method("fedhydra", server=_fedhydra, server_epochs=True),
    registry.Method("dense", server=_dense, server_epochs=True),
    registry.Method("feddf", server=_feddf, server_epochs=True),
    registry.Method("os_fedavg", server=_os_fedavg,
                    rounds=_os_fedavg_rounds, check=_one_aggregation),
    registry.Method("coboosting", server=_coboosting, server_epochs=True),
    registry.Method("ot_fusion", server=_ot_fusion,
                    hparams=ot_fusion_lib.OTFusionHyperParams),
):
  registry.declare(_method)
del _method
