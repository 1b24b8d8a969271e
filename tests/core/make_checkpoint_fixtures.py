"""Writes the cross-version checkpoint fixture of the running Orbax.

Run once per end of the supported range (e.g. in a venv with the ``cpu``
extra, orbax-checkpoint 0.11.x, and in one with the newest, 0.12.x):

    python tests/core/make_checkpoint_fixtures.py

It writes ``make_state(3)`` of ``test_checkpoint.py`` with
:class:`fedjax_dd.core.checkpoint.CheckpointStore` to
``tests/core/checkpoints/orbax-<version>/``, and its leaves' bytes beside it
(``expected_leaves.npz``);
``test_checkpoint.py::test_restores_checkpoints_of_other_orbax_versions``
restores every such directory on whichever end runs the tests.
"""

import importlib.metadata
import pathlib
import shutil
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tests.core import test_checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position
from fedjax_dd.core import checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position

STEP = 3


def main():
  version = importlib.metadata.version("orbax-checkpoint")
  out = pathlib.Path(__file__).parent / "checkpoints" / f"orbax-{version}"
  shutil.rmtree(out, ignore_errors=True)
  state = test_checkpoint.make_state(STEP)
  with checkpoint.CheckpointStore(out) as store:
    store.save(STEP, state, {"step": STEP})
  # Orbax 0.12 writes the absolute path of this machine into its success
  # markers; keep the fixture free of it (and re-seal our commit marker).
  for marker in out.rglob("commit_success.txt"):
    marker.write_text("Checkpoint commit was successful.\n")
  checkpoint._write_marker(out / str(STEP), STEP)  # pylint: disable=protected-access
  # The leaves as written: XLA versions may round make_state's arithmetic
  # differently by an ulp, so the test compares against these bytes.
  np.savez(out / "expected_leaves.npz", *test_checkpoint.leaf_arrays(state))
  print(out)


if __name__ == "__main__":
  main()
