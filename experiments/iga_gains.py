r"""Per-seed and per-window table of server-distillation gains, from runs'
``metrics.jsonl`` (DisUE's IGA, FedFTG's fine-tuning; FedAvg alongside).

  python experiments/iga_gains.py [--rounds=R] [--window=5] \
      [--extra=iga_ensemble_accuracy,iga_student_cd] \
      kl=DIR/kl l1_logits=DIR/l1 fedavg=DIR/fedavg

Each argument is ``LABEL=DIR``, ``DIR`` a sweep workdir (``seed_*/``) or a
single run's workdir, every round evaluated (``run.eval_every=1``), with
``iga.evaluate_before=True`` for the runs that distil. The gain of a round is
the test accuracy of the global model just after the server's distillation
minus just before it (``test_accuracy - test_accuracy_before_iga``); runs
without ``test_accuracy_before_iga`` (FedAvg) show their accuracy only.
Every run is cut to the same rounds: ``--rounds``, or by default the fewest
any run has, so runs stopped at different depths are compared on the rounds
they share. Prints Markdown (:func:`fedjax_dd.utils.gains.gains_report`).
"""

from __future__ import annotations

import argparse
import os

from fedjax_dd.utils import gains


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("runs", nargs="+", metavar="LABEL=DIR")
  ap.add_argument("--rounds", type=int, default=0,
                  help="rounds to compare (default: the fewest any run has)")
  ap.add_argument("--window", type=int, default=5)
  ap.add_argument("--extra", default="",
                  help="comma-separated metrics.jsonl keys to average")
  args = ap.parse_args(argv)
  runs = {}
  for spec in args.runs:
    label, _, path = spec.partition("=")
    if not path:
      label, path = os.path.basename(os.path.normpath(spec)), spec
    runs[label] = path
  try:
    print(gains.gains_report(runs, args.rounds, args.window,
                             [k for k in args.extra.split(",") if k]))
  except ValueError as e:
    raise SystemExit(str(e)) from e


if __name__ == "__main__":
  main()
