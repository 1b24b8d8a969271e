r"""A FedAvg run whose client axis spans several processes (jax.distributed).

Two processes on one machine, one CPU device each (the first one is the
coordinator)::

  export JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=1
  python -m fedjax_dd.experiments.multiprocess_smoke --coordinator=127.0.0.1:12355 \
      --num_processes=2 --process_id=0 --out=/tmp/mp &
  python -m fedjax_dd.experiments.multiprocess_smoke --coordinator=127.0.0.1:12355 \
      --num_processes=2 --process_id=1 --out=/tmp/mp

On several machines, run the same command on each with the coordinator's
address and each machine's ``--process_id``. ``--num_processes=1`` runs the
same training in one process over its own devices (the reference the test
compares with). Each process writes its final server parameters to
``OUT_<process_id>.npz`` and prints ``DONE <process count> <rounds>``.

The run: 6 clients of random 8x8 images (uneven sizes), the digits CNN,
FedAvg with 4 clients per round for 3 rounds, the ``sharded`` client
backend over every device of every process
(:func:`fedjax_dd.core.clients.initialize_multihost`).
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--coordinator", default="127.0.0.1:12355")
  p.add_argument("--num_processes", type=int, default=2)
  p.add_argument("--process_id", type=int, default=0)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)

  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import clients  # pylint: disable=g-import-not-at-top
  if args.num_processes > 1:
    clients.initialize_multihost(coordinator_address=args.coordinator,
                                 num_processes=args.num_processes,
                                 process_id=args.process_id)
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from fedjax_dd import models  # pylint: disable=g-import-not-at-top
  from fedjax_dd.algorithms.fedavg import fedavg  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import rounds  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.algorithm import ExperimentState  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.local import LocalTraining, steps_for  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.task import Classifier  # pylint: disable=g-import-not-at-top
  from fedjax_dd.data.stacked import ClientData  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  sizes = np.asarray([5, 9, 12, 7, 3, 11], np.int32)
  x = np.zeros((6, 12, 8, 8, 1), np.uint8)
  y = np.zeros((6, 12), np.int32)
  for c, n in enumerate(sizes):
    x[c, :n] = rng.integers(0, 255, (n, 8, 8, 1))
    y[c, :n] = rng.integers(0, 10, n)
  data = ClientData(x=x, y=y, num_examples=sizes)
  task = Classifier(module=models.get_model("digits_cnn").build(10),
                    input_shape=(8, 8, 1),
                    preprocess=lambda v: v.astype(jnp.float32) / 255.0,
                    num_classes=10)
  num_steps = steps_for(sizes, 4, epochs=1)
  alg = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                             max_steps=int(np.max(num_steps)),
                             mapper=clients.ClientMapper(backend="sharded")))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, client_states = alg.init(params, stats, 6)
  state = ExperimentState(server, client_states, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  state, _, rows = rounds.run_rounds(
      alg, state, data, num_steps,
      rounds.RoundsOptions(num_rounds=args.rounds, clients_per_round=4,
                           progress=False, eval_every=0))
  leaves = [np.asarray(v) for v in
            jax.tree_util.tree_leaves(jax.device_get(state.server.params))]
  np.savez(f"{args.out}_{jax.process_index()}.npz", *leaves)
  print("DONE", jax.process_count(), len(rows), flush=True)


if __name__ == "__main__":
  main()
