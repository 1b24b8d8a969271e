"""Two processes on localhost (jax.distributed) train like one process."""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import REPO_ROOT

# One FedAvg run of 3 rounds, 6 clients (uneven data), 4 per round, the
# client axis on the sharded backend over every device of the run; prints
# nothing but saves the final parameters from process 0.
_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import jax, optax
    from fedjax_dd.core import clients
    if sys.argv[1] != "single":
        pid, port = int(sys.argv[1]), sys.argv[2]
        clients.initialize_multihost(
            coordinator_address=f"127.0.0.1:{port}", num_processes=2,
            process_id=pid)
    else:
        pid = 0
    import jax.numpy as jnp
    from fedjax_dd.algorithms.fedavg import fedavg
    from fedjax_dd.core import rounds
    from fedjax_dd.core.algorithm import ExperimentState
    from fedjax_dd.core.clients import ClientMapper
    from fedjax_dd.core.local import steps_for
    from fedjax_dd.data.stacked import ClientData
    from tests.conftest import synthetic_clients, tiny_task
    assert jax.device_count() == 2, jax.devices()
    task = tiny_task()
    x, y, n = synthetic_clients(num_clients=6, sizes=(5, 9, 12, 7, 3, 11))
    data = ClientData(x=x, y=y, num_examples=n)
    num_steps = steps_for(n, 4, epochs=1)
    alg = fedavg(task, optax.sgd(0.1), batch_size=4,
                 max_steps=int(np.max(num_steps)),
                 mapper=ClientMapper(backend="sharded"))
    params, stats = task.init(jax.random.PRNGKey(0))
    server, client_states = alg.init(params, stats, 6)
    state = ExperimentState(server, client_states, jax.random.PRNGKey(1),
                            jnp.asarray(0, jnp.int32))
    state, _, rows = rounds.run_rounds(
        alg, state, data, num_steps,
        rounds.RoundsOptions(num_rounds=3, clients_per_round=4,
                             progress=False))
    leaves = [np.asarray(l) for l in
              jax.tree_util.tree_leaves(jax.device_get(state.server.params))]
    np.savez(sys.argv[-1] + f"_{pid}.npz", *leaves)
    print("DONE", jax.process_count(), len(rows))
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if "host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join(
      flags + [f"--xla_force_host_platform_device_count={devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO_ROOT), env.get("PYTHONPATH", "")]).strip(os.pathsep)
  return env


@pytest.mark.multidevice
def test_two_processes_equal_one_process(tmp_path):
  script = tmp_path / "fedavg_run.py"
  script.write_text(_SCRIPT)
  out = str(tmp_path / "params")
  port = str(_free_port())
  procs = [subprocess.Popen([sys.executable, str(script), str(pid), port,
                             out + "_multi"], env=_env(1), cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for pid in (0, 1)]
  results = [p.communicate(timeout=600) for p in procs]
  for p, (stdout, stderr) in zip(procs, results):
    assert p.returncode == 0, stderr[-3000:]
    assert "DONE 2 3" in stdout, stdout
  single = subprocess.run([sys.executable, str(script), "single",
                           out + "_single"], env=_env(2), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  assert "DONE 1 3" in single.stdout
  runs = [np.load(f"{out}_multi_0.npz"), np.load(f"{out}_multi_1.npz"),
          np.load(f"{out}_single_0.npz")]
  for name in runs[0].files:
    # Both processes hold the same model, and it is the single process's.
    np.testing.assert_array_equal(runs[0][name], runs[1][name])
    np.testing.assert_array_equal(runs[0][name], runs[2][name])
