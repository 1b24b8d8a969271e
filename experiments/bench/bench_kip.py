r"""KIP benchmark: all clients in one program vs per-client loops.

  python -m fedjax_dd.experiments.bench.bench_kip --out bench_kip.json
  python -m fedjax_dd.experiments.bench.bench_kip --clients 10,100 --ipc 1 \
      --out b.json

For C clients holding MNIST-shaped data (two classes each, as FedD3's
non-IID split), reports ms per KIP iteration per client for:

* ``batched``: the all-client jitted program (``distill.kip``) on the
  engine's default backend for KIP (``auto`` with workload ``"kip"``: one
  vmap on CPU, sharded over the devices elsewhere);
* ``vmap``: the same program as one plain vmap over all clients;
* ``sharded``: the client axis over the host devices, in the engine's
  training chunks;
* ``loop``: a Python loop over clients calling one jitted per-client program
  (the ``loop`` backend);
* ``rejit``: a loop that builds and jits a fresh per-client program for every
  client, as the reference implementation does (compile time included).

``speedup_vs_loop`` per client count is ``loop / batched`` at the first
``--ipc`` value; ``speedup_vs_loop_by_ipc`` holds every value. Peak resident
memory of each measurement (run in its own subprocess) is reported.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import fedjax_dd


def _data(num_clients: int, per_client: int, seed: int = 0):
  import numpy as np
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 255, (num_clients, per_client, 28, 28, 1), np.uint8)
  y = np.stack([np.resize([c % 10, (c + 1) % 10], per_client)
                for c in range(num_clients)]).astype(np.int32)
  n = np.full((num_clients,), per_client, np.int32)
  return x, y, n


def measure(mode: str, num_clients: int, ipc: int, iterations: int,
            per_client: int, reps: int = 1) -> dict:
  """One mode's ms per KIP iteration per client: the best of ``reps``
  timed calls after the compiling one (``rejit``: no separate compile).

  The row also holds every rep (``rep_ms_per_iteration_per_client``) and
  the compiling call's seconds (``first_call_seconds``, None for
  ``rejit``).
  """
  import jax
  import numpy as np
  from fedjax_dd.core.clients import ClientMapper
  from fedjax_dd.distill import kip
  from fedjax_dd.kernels.native import fc_kernel

  x, y, n = _data(num_clients, per_client)
  common = dict(num_classes=10, mean=[0.13], std=[0.31], images_per_class=ipc,
                # Never stop early: time full iterations.
                options=kip.KipOptions(max_iterations=iterations,
                                       segment_iterations=iterations,
                                       stop_accuracy=2.0))
  key = jax.random.PRNGKey(0)

  def batched(backend, xs, ys, ns, kernel):
    res = kip.distill_clients(key, xs, ys, ns, kernel_fn=kernel,
                              mapper=ClientMapper(backend=backend,
                                                  workload="kip"), **common)
    jax.block_until_ready(res.x)

  def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

  kernel = fc_kernel()
  first = None
  if mode in ("batched", "vmap", "sharded"):
    backend = "auto" if mode == "batched" else mode
    first = timed(lambda: batched(backend, x, y, n, kernel))  # compile
    run = lambda: batched(backend, x, y, n, kernel)
  elif mode == "loop":
    # Compile the per-client program.
    first = timed(lambda: batched("loop", x[:1], y[:1], n[:1], kernel))
    run = lambda: batched("loop", x, y, n, kernel)
  else:  # rejit: a fresh kernel closure, so a fresh program, per client
    def run():
      for c in range(num_clients):
        batched("vmap", x[c:c + 1], y[c:c + 1], n[c:c + 1], fc_kernel())
  rep_ms = [1e3 * timed(run) / (iterations * num_clients)
            for _ in range(reps)]
  return {"mode": mode, "backend": (ClientMapper(workload="kip").resolved_backend
                                    if mode == "batched" else mode),
          "num_clients": num_clients, "images_per_class": ipc,
          "iterations": iterations,
          "ms_per_iteration_per_client": min(rep_ms),
          "rep_ms_per_iteration_per_client": rep_ms,
          "first_call_seconds": first,
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          "devices": str(jax.devices()), "numpy": np.__version__}


def _subprocess(**kwargs) -> dict:
  proc = subprocess.run([sys.executable, "-m",
                         "fedjax_dd.experiments.bench.bench_kip",
                         "--_worker", json.dumps(kwargs)],
                        capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    return {"error": proc.stderr[-2000:], **kwargs}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="bench_kip.json")
  p.add_argument("--clients", default="10,100,500")
  p.add_argument("--ipc", default="1,10")
  p.add_argument("--iterations", type=int, default=50)
  p.add_argument("--per_client", type=int, default=120)
  p.add_argument("--modes", default="batched,vmap,sharded,loop,rejit")
  p.add_argument("--rejit_max_clients", type=int, default=100,
                 help="skip the re-jitting loop above this many clients")
  p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args._worker:
    print(json.dumps(measure(**json.loads(args._worker))))
    return {}
  report = {"results": [], "speedup_vs_loop": {}, "speedup_vs_rejit": {},
            "speedup_vs_loop_by_ipc": {}, "speedup_vs_rejit_by_ipc": {}}
  ipcs = [int(v) for v in args.ipc.split(",")]
  for ipc in ipcs:
    for c in [int(v) for v in args.clients.split(",")]:
      rows = {}
      for mode in args.modes.split(","):
        if mode == "rejit" and c > args.rejit_max_clients:
          continue
        r = _subprocess(mode=mode, num_clients=c, ipc=ipc,
                        iterations=args.iterations, per_client=args.per_client)
        report["results"].append(r)
        rows[mode] = r.get("ms_per_iteration_per_client")
        print(json.dumps(r), file=sys.stderr)
      for ref in ("loop", "rejit"):
        if rows.get("batched") and rows.get(ref):
          ratio = rows[ref] / rows["batched"]
          report[f"speedup_vs_{ref}_by_ipc"].setdefault(str(ipc), {})[str(c)] = ratio
          if ipc == ipcs[0]:
            report[f"speedup_vs_{ref}"][str(c)] = ratio
  with open(args.out, "w") as f:
    json.dump(report, f, indent=2)
  print(json.dumps({k: report[k] for k in ("speedup_vs_loop_by_ipc",
                                           "speedup_vs_rejit_by_ipc")},
                   indent=2))
  return report


if __name__ == "__main__":
  fedjax_dd.configure_cpu()  # one host device per core, before JAX starts
  main()
