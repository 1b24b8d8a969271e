"""fedftg under DisUE's protocol (a baseline of disue.py; same presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/fedftg.py:fmnist_dir0.01 --workdir=/tmp/fedftg
  ...fedftg.py:cifar10_dir0.01 / cifar10_dir0.1 / smoke / *_gpu

See experiments/configs/disue.py for the protocol and the presets.
FedFTG (Zhang et al., CVPR 2022): FedAvg of the cohort, then IGA with
the cohort's clients as teachers (labels from their class counts, per-class
teacher weights), with FedFTG's code choices (``FEDFTG_CODE`` below, where
IGA's defaults follow DisUE's paper). Each stays selectable
(``--config.iga.discrepancy=kl``, ``cd_through_teachers=True``,
``generator_per_teacher=False``, ``fresh_samples=True``,
``cf_weighting=per_sample``). ``--config.model.init=torch`` starts from
PyTorch's initialisation, as the released code does.

Expected: test accuracy about 0.69 after round 30 (fmnist_dir0.01
--config.rounds=30, seeds 0-2); against FedFTG's released code:
experiments/results/fedftg_reference_fmnist.md.
"""

from fedjax_dd.experiments.configs import disue


# FedFTG's code choices for its server fine-tuning (methods/local_fn_gan.py,
# train_global_model_cgan_bs_weight_iloop_fz_dis and train_gan_fn.py), where
# IGA's defaults follow DisUE's paper instead.
FEDFTG_CODE = {
    # Generator: mean absolute logit difference (not Eq. 9's KL), with the
    # teachers' logits detached (its gradient reaches the generator through
    # the student only) ...
    "discrepancy": "l1_logits",
    "cd_through_teachers": False,
    # ... student: cross-entropy with the weighted ensemble, averaged over
    # the classes (the KL's gradient / C).
    "student_discrepancy": "kl",
    "student_class_mean": True,
    # One Adam step per client per iteration, on that client's terms.
    "generator_per_teacher": True,
    # One (z, y) per iteration for its generator and 5 student steps.
    "fresh_samples": False,
    # L_cf: a client's batch-mean CE times its mean class weight.
    "cf_weighting": "batch_mean",
}


def get_config(arg: str = "fmnist_dir0.01"):
  c = disue.protocol("fedftg", arg)
  c.iga.update(FEDFTG_CODE)
  return c
