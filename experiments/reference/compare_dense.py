r"""Side-by-side table of DENSE server distillations: the reference (the
adapter's JSON lines, ``dense_adapter.py``) against ours (``metrics.jsonl``
of ``experiments/configs/dense.py`` runs on the same teachers).

  .venv/bin/python experiments/reference/compare_dense.py \
      --ref=ref_seed0.jsonl,ref_seed1.jsonl,ref_seed2.jsonl \
      --ours=OURS/seed_0,OURS/seed_1,OURS/seed_2 [--names=reference,ours]

Prints Markdown: per seed the final and best test accuracy of each side over
the epochs both ran, their mean ± sd, the per-epoch accuracy as mean ± sd,
and the bar (the two final means within the larger of the two seed sds):
:func:`fedjax_dd.utils.gains.dense_report`.
"""

from __future__ import annotations

import argparse

from fedjax_dd.utils import gains


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ref", required=True, help="comma-separated JSON lines")
  ap.add_argument("--ours", required=True, help="comma-separated workdirs")
  ap.add_argument("--names", default="reference,ours")
  args = ap.parse_args(argv)
  print(gains.dense_report(args.ref.split(","), args.ours.split(","),
                           args.names.split(",")))


if __name__ == "__main__":
  main()
