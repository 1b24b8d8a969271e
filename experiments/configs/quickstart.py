"""Quickstart: the four systems and FedAvg on one partition, in minutes.

  fedjax-dd --config=experiments/configs/quickstart.py --workdir=workdir/quickstart

On the embedded digits data (scikit-learn, offline), one partition (20
clients, 4 classes each) and one seed, it runs FedAvg, FedD3 (one-shot KIP
upload), HFLDD (KIP members, head FedAvg), FedHydra (one-shot, data-free) and
DisUE (clustered FL with IGA), each with the small settings of its
``:smoke`` preset. It reports its progress on stderr
(``--config.run.progress=False``: none), prints one table (method, final
accuracy, expected range, bytes sent, wall time, a note on what the row
shows) and writes ``comparison.png``, ``summary.json`` and every method's
own run in ``WORKDIR/<method>`` (re-running resumes each).

Expected: each row's final accuracy within its range (``EXPECTED`` below;
experiments/results/quickstart_digits.md).
"""

import ml_collections

from fedjax_dd.experiments.configs import base as base_lib


# FedHydra's server in the budget: the generator initialised once (Alg. 1)
# and trained 10 steps per epoch, 12 epochs (the fewest whose student leaves
# chance, experiments/results/quickstart_digits.md), the student one pass
# over the pool per epoch (the reference code) with lr 0.05. The clients
# start from their own inits: one-shot FL's clients share no round before
# the upload, the regime where FedHydra claims its gain over one-shot FedAvg.
FEDHYDRA_OVERRIDES = (("client.local_epochs", 5.0),
                      ("client.independent_init", True),
                      ("dfkd.distill_epochs", 12),
                      ("dfkd.generator_steps", 10),
                      ("dfkd.reset_generator", False),
                      ("dfkd.student_steps", 0),
                      ("dfkd.student_lr", 0.05),
                      ("dfkd.nz", 32), ("dfkd.ngf", 16))
FEDHYDRA_NOTE = ("one-shot, data-free, from clients with their own inits "
                 "(one-shot FL as the paper runs it); 12 server epochs "
                 "(paper 200). With a shared start their plain average "
                 "wins in this budget: see "
                 "experiments/results/quickstart_digits.md")
FEDHYDRA_BASELINE_NOTE = ("the bar for FedHydra: its own clients' "
                          "parameters averaged once, which clients with no "
                          "common start leave near chance")

# Each row's expected final accuracy: the range over three seeds on the
# oldest and newest supported jax, widened to whole hundredths (table
# "Expected ranges" of experiments/results/quickstart_digits.md).
# "fedhydra_baseline": the one-shot FedAvg of FedHydra's clients.
EXPECTED = {"fedavg": (0.46, 0.67), "fedd3": (0.61, 0.71),
            "hfldd": (0.63, 0.78), "fedhydra": (0.23, 0.42),
            "fedhydra_baseline": (0.10, 0.16), "disue": (0.80, 0.90)}


def get_config(arg: str = ""):
  # One comparison, no presets: a name after ':' would be silently dropped.
  if arg:
    raise ValueError(f"Unknown preset {arg!r}: quickstart.py has none; "
                     "use --config=experiments/configs/quickstart.py.")
  # The common groups (engine, run, ...); data and seed are shared by every
  # member: one dataset, partition and seed.
  c = base_lib.base(method="quickstart", dataset="digits",
                    model="digits_cnn", runner="quickstart")
  c.data.num_clients = 20
  # Every member checkpoints every 5 rounds or epochs (and at its last): its
  # steps are short, so a save each step would cost more than a resume saves.
  c.run.checkpoint_every = 5
  c.data.partition = base_lib.pathological(4, style="balanced")
  # method -> its config file in experiments/configs, preset, and (dotted
  # path, value) overrides.
  c.members = ml_collections.ConfigDict({
      "fedavg": {"config": "fedavg", "preset": "smoke",
                 "overrides": (("rounds", 5),),
                 "note": "the reference: 5 rounds of model exchange"},
      "fedd3": {"config": "fedd3", "preset": "smoke",
                "overrides": (("rounds", 5),),
                "note": "one upload of KIP images per client, no model "
                        "exchange"},
      "hfldd": {"config": "hfldd", "preset": "smoke",
                "overrides": (("rounds", 3),),
                "note": "KIP images to cluster heads, then 3 rounds of "
                        "FedAvg among the heads"},
      "fedhydra": {"config": "fedhydra", "preset": "smoke",
                   "overrides": FEDHYDRA_OVERRIDES,
                   "note": FEDHYDRA_NOTE,
                   "baseline_note": FEDHYDRA_BASELINE_NOTE},
      "disue": {"config": "disue", "preset": "smoke",
                "overrides": (("rounds", 5), ("client.clients_per_round", 10),
                              ("client.batch_size", 16),
                              ("client.local_epochs", 2.0),
                              ("iga.discrepancy", "l1_logits"),
                              ("iga.student_discrepancy", "kl")),
                "note": "clustered FL + IGA, FedFTG's L1 generator term "
                        "(the default; Eq. 9's KL measured lower)"},
  })
  # The order of the table and the figure.
  c.order = ("fedavg", "fedd3", "hfldd", "fedhydra", "disue")
  # Two members at a time (fedjax_dd.core.side_by_side): on 2 cores most of a
  # member's time is compilation and tracing on one core, which the other
  # member's compute fills; each member computes what it does alone.
  # --config.workers=1 runs them one after the other.
  c.workers = 2
  # Longest first, so both threads stay busy to the end; members not named
  # start after these, in c.order.
  c.start_order = ("fedhydra", "fedd3", "hfldd", "disue", "fedavg")
  # Each row's expected final accuracy (documentation, not part of the
  # run's identity: base.FINGERPRINT_RULES).
  c.expected = ml_collections.ConfigDict(
      {"source": "experiments/results/quickstart_digits.md", **EXPECTED})
  return c
