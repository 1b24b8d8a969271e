"""Config groups -> the library's hyperparameter dataclasses.

The library's dataclasses know their fields, not the config's layout. Each
function here builds one from its group in one call
(:func:`fedjax_dd.core.hparams.from_section`): every field from the key of
its name, the fields the config derives passed explicitly, and the group's
keys that are not fields (the run's switches, a generator's or a kernel's
size, read by the glue that builds those) named in :data:`NOT_FIELDS`. A
key without a field or a field without a key raises, so a setting added on
one side only fails at once (``tests/experiments/test_config_sections.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from fedjax_dd.core import hparams as hparams_lib

# Keys of each group that are not fields of its dataclass.
NOT_FIELDS: dict[str, tuple[str, ...]] = {
    # The run's switch, the evaluation before IGA and the conditional
    # generator's size.
    "iga": ("enabled", "evaluate_before", "nz", "ngf"),
    # The generator and the optimisers, the epoch count, FedHydra's
    # stratification and aggregation, FedDF's student.
    "dfkd": ("nz", "ngf", "synthetic_batch_size", "distill_epochs",
             "generator_lr", "generator_b1", "stratify_steps",
             "stratify_batch_size", "aggregation", "sa_average_scale",
             "student_lr", "student_momentum", "feddf_lr", "feddf_steps"),
    # The kernel, built by the caller, and DP-KIP's delta, which only the
    # reported epsilon reads.
    "kip": ("kernel", "kernel_depth", "kernel_kind", "kernel_batch",
            "kernel_impl", "dp_delta"),
    # The student's optimiser and whether its schedule is a cosine.
    "coboosting": ("student_weight_decay", "student_clip", "cosine"),
}


def iga(section: Mapping[str, Any]):
  """:class:`~fedjax_dd.distill.iga.IGAHyperParams` from the ``iga``
  group."""
  from fedjax_dd.distill.iga import IGAHyperParams  # pylint: disable=g-import-not-at-top
  return hparams_lib.from_section(
      IGAHyperParams, section, other_keys=NOT_FIELDS["iga"])


def dfkd(section: Mapping[str, Any]):
  """:class:`~fedjax_dd.distill.dfkd.DFKDHyperParams` from the ``dfkd``
  group: ``batch_size`` is ``synthetic_batch_size``, a ``pool_size`` of 0
  keeps every epoch's batch (``distill_epochs``)."""
  from fedjax_dd.distill.dfkd import DFKDHyperParams  # pylint: disable=g-import-not-at-top
  return hparams_lib.from_section(
      DFKDHyperParams, section, other_keys=NOT_FIELDS["dfkd"],
      batch_size=section["synthetic_batch_size"],
      pool_size=section["pool_size"] or section["distill_epochs"])


def kip(section: Mapping[str, Any]):
  """:class:`~fedjax_dd.distill.kip.KipOptions` from the ``kip`` group."""
  from fedjax_dd.distill.kip import KipOptions  # pylint: disable=g-import-not-at-top
  return hparams_lib.from_section(KipOptions, section,
                                  other_keys=NOT_FIELDS["kip"])


def coboosting(section: Mapping[str, Any], dfkd_section: Mapping[str, Any]):
  """:class:`~fedjax_dd.algorithms.coboosting.CoBoostingHyperParams` from
  the ``coboosting`` group, with the batch, step counts, pool and epochs of
  the ``dfkd`` group as for DENSE (``num_epochs`` 0 without ``cosine``)."""
  from fedjax_dd.algorithms.coboosting import CoBoostingHyperParams  # pylint: disable=g-import-not-at-top
  d = dfkd_section
  return hparams_lib.from_section(
      CoBoostingHyperParams, section, other_keys=NOT_FIELDS["coboosting"],
      batch_size=d["synthetic_batch_size"],
      generator_steps=d["generator_steps"],
      student_steps=d["student_steps"],
      pool_size=d["pool_size"] or d["distill_epochs"],
      num_epochs=d["distill_epochs"] if section["cosine"] else 0)
