r"""PCSC benchmark: seconds and bytes for one pair of client updates.

  python -m fedjax_dd.experiments.bench.bench_pcsc --out bench_pcsc.json

Times one run of the PCSC protocol (:mod:`fedjax_dd.cluster.pcsc`, default
:class:`~fedjax_dd.cluster.pcsc.PCSCParams`) between two random update
vectors of the size of a model from the registry, by phase: key generation
(two primes and ``s``, independent of the length), quantisation of both
vectors, Alice's masking, Bob's response and Alice's unmasking. Bytes are
exact (the documented formula): the two-party transcript and the
server-relayed pair of DisUE's Algorithm 1 (upload + download).

* ``lenet5``: the registry's LeNet-5 on 28x28x1 inputs, all of it.
* ``resnet18``: the registry's ResNet-18 on 32x32x3. By default a slice of
  ``--slice`` (1,000,000) elements is timed and the length-dependent phases
  are extrapolated linearly to the full length (key generation is added
  once); the output says so (``extrapolated: true``). ``--full`` times all of
  it (it holds several GB of Python integers).

``per_round`` scales a pair to one DisUE round of ``--cohort`` clients (Sec.
5.1: 100 clients, active fraction 0.15, so 15 clients and 105 pairs), run
sequentially on one core. Bytes grow as ``k1 = 512`` bits per parameter,
16x a float32 upload.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time


def _param_count(name: str) -> int:
  import jax
  import jax.numpy as jnp
  from fedjax_dd.core.ledger import num_params
  from fedjax_dd.models import get_model

  spec = get_model(name)
  module = spec.build(10)
  shape = (1,) + tuple(spec.input_shape)
  variables = jax.eval_shape(
      lambda: module.init(jax.random.PRNGKey(0), jnp.zeros(shape),
                          train=False))
  return num_params(variables["params"])


def time_pair(n: int, seed: int = 0) -> dict:
  """One PCSC run on two random length-``n`` vectors, timed by phase."""
  import numpy as np
  from fedjax_dd.cluster import pcsc

  params = pcsc.PCSCParams()
  rng = np.random.default_rng(seed)
  a, b = rng.normal(size=n), rng.normal(size=n)
  t0 = time.perf_counter()
  key = pcsc._alice_keygen(rng, params)
  t1 = time.perf_counter()
  a_q = pcsc.quantize(a, params.frac_bits)
  b_q = pcsc.quantize(b, params.frac_bits)
  t2 = time.perf_counter()
  cipher = pcsc._alice_encrypt(a_q, key, rng, params)
  t3 = time.perf_counter()
  d = pcsc._bob_respond(b_q, cipher, key.alpha, key.p, rng, params)
  t4 = time.perf_counter()
  dot = pcsc._alice_decrypt(d, key)
  t5 = time.perf_counter()
  phases = {"keygen": t1 - t0, "quantize": t2 - t1, "alice_mask": t3 - t2,
            "bob_respond": t4 - t3, "alice_unmask": t5 - t4}
  exact = int(a_q.astype(object) @ b_q.astype(object))
  if dot != exact:
    raise AssertionError(f"PCSC dot {dot} != exact {exact}")
  cosine = dot / (1 << (2 * params.frac_bits))
  plain = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
  return {"n": n, "phases_s": phases, "seconds": t5 - t0,
          "abs_error_vs_float_cosine": abs(cosine - plain)}


def bench(name: str, n_full: int, slice_len: int | None, cohort: int,
          repeats: int) -> dict:
  from fedjax_dd.cluster.pcsc import PCSCParams

  params = PCSCParams()
  n_timed = n_full if slice_len is None else min(slice_len, n_full)
  runs = [time_pair(n_timed, seed=r) for r in range(repeats)]
  best = min(runs, key=lambda r: r["seconds"])
  keygen = best["phases_s"]["keygen"]
  scale = n_full / n_timed
  seconds = keygen + (best["seconds"] - keygen) * scale
  t = params.transcript_bits(n_full)
  relayed = params.relayed_pair_bits(n_full)
  relayed_bits = relayed["upload"] + relayed["download"]
  pairs = math.comb(cohort, 2)
  return {
      "model": name,
      "num_params": n_full,
      "timed_length": n_timed,
      "extrapolated": n_timed != n_full,
      "seconds_per_pair": seconds,
      "timed_seconds": best["seconds"],
      "phases_s": best["phases_s"],
      "abs_error_vs_float_cosine": best["abs_error_vs_float_cosine"],
      "bytes_per_pair_two_party": t / 8,
      "bytes_per_pair_relayed": relayed_bits / 8,
      "relayed_bits": relayed,
      "per_round": {"cohort": cohort, "pairs": pairs,
                    "seconds": seconds * pairs,
                    "bytes": relayed_bits * pairs / 8},
  }


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="JSON file to write.")
  parser.add_argument("--slice", type=int, default=1_000_000,
                      help="elements timed for ResNet-18 (extrapolated).")
  parser.add_argument("--full", action="store_true",
                      help="time ResNet-18 at full length.")
  parser.add_argument("--cohort", type=int, default=15,
                      help="clients per round for the per-round figures.")
  parser.add_argument("--repeats", type=int, default=3,
                      help="LeNet-5 repetitions (best is reported).")
  args = parser.parse_args(argv)

  from fedjax_dd.cluster.pcsc import PCSCParams
  results = {
      "params": vars(PCSCParams()),
      "lenet5": bench("lenet5", _param_count("lenet5"), None, args.cohort,
                      args.repeats),
      "resnet18": bench("resnet18", _param_count("resnet18"),
                        None if args.full else args.slice, args.cohort, 1),
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  }
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  for name in ("lenet5", "resnet18"):
    r = results[name]
    note = (f" (extrapolated from {r['timed_length']:,} elements)"
            if r["extrapolated"] else "")
    print(f"{name}: P={r['num_params']:,} {r['seconds_per_pair']:.3g} s/pair"
          f"{note}, {r['bytes_per_pair_two_party']:,.0f} B two-party, "
          f"{r['bytes_per_pair_relayed']:,.0f} B relayed")
  return results


if __name__ == "__main__":
  main()
