r"""Side-by-side table of FedFTG runs: the reference (the adapter's JSON lines)
against ours (``metrics.jsonl`` with ``iga.evaluate_before=True``).

  .venv/bin/python experiments/reference/compare_fedftg.py \
      --ref=ref_seed0.jsonl,ref_seed1.jsonl --ours=DIR/seed_0,DIR/seed_1 \
      [--rounds=R]

Prints Markdown: per seed the mean fine-tuning gain per round (test accuracy
of the global model just after fine-tuning minus just before) and the final
accuracy; the per-round accuracy (after fine-tuning) as mean ± sd over the
seeds for each side; and the issue's bar (our mean gain within the
reference's seed range or within 0.01 of its mean; the per-round curves
overlap within one sd of each side):
:func:`fedjax_dd.utils.gains.fedftg_report`.
"""

from __future__ import annotations

import argparse

from fedjax_dd.utils import gains


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ref", required=True, help="comma-separated JSON lines")
  ap.add_argument("--ours", required=True, help="comma-separated workdirs")
  ap.add_argument("--rounds", type=int, default=0)
  ap.add_argument("--names", default="reference,ours")
  args = ap.parse_args(argv)
  print(gains.fedftg_report(args.ref.split(","), args.ours.split(","),
                            args.rounds, args.names.split(",")))


if __name__ == "__main__":
  main()
