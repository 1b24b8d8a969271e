r"""Benchmark of FedHydra's server stages on MNIST-shaped inputs.

1. Model stratification (Alg. 2), m = 5 clients x c = 10 classes with the
   2-layer CNN: all m·c generator trainings as ONE batched program (the
   engine's default backend, and plain ``vmap``) against a Python loop over
   the pairs (the ``loop`` client backend: one jitted per-pair step, called
   for every pair and step). Both make ``T_G`` host-side steps.
   Reports ms per generator step (one step of one pair) and
   ``speedup_vs_loop`` of the default backend.
2. HASA: seconds per global epoch (T_G generator steps + the student phase).
3. ``batching_gain_bound``: the per-image cost of one generator step (one
   generator, one teacher) at the per-pair batch divided by that at the
   batch of all m·c pairs. It bounds what any batched program can gain over
   the loop on this backend; near 1 means the step is compute-bound.

Teachers are freshly initialised CNN2s: timing does not depend on their
weights. Compilation is excluded (one warm-up call each).

  python -m fedjax_dd.experiments.bench.bench_fedhydra --out bench_fedhydra.json
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import optax

import fedjax_dd
from fedjax_dd import models
from fedjax_dd.algorithms import stratify as stratify_lib
from fedjax_dd.core.clients import ClientMapper, default_backend
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import dfkd
from fedjax_dd.distill import ensemble


def _timed(fn, repeats):
  jax.block_until_ready(fn())
  t0 = time.perf_counter()
  for _ in range(repeats):
    out = fn()
  jax.block_until_ready(out)
  return (time.perf_counter() - t0) / repeats


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--clients", type=int, default=5)
  ap.add_argument("--steps", type=int, default=30, help="T_G of Alg. 2")
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--ngf", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--hasa_generator_steps", type=int, default=30,
                  help="T_G of HASA (CPU preset: 30)")
  ap.add_argument("--hasa_student_steps", type=int, default=40,
                  help="student steps per HASA epoch (CPU preset: 40)")
  args = ap.parse_args(argv)
  m, c = args.clients, 10
  task = Classifier(models.get_model("cnn2").build(c), (28, 28, 1),
                    lambda x: x.astype(jnp.float32) / 255.0, c)
  inits = [task.init(jax.random.PRNGKey(i)) for i in range(m)]
  stack = lambda i: jax.tree_util.tree_map(lambda *a: jnp.stack(a),
                                           *[x[i] for x in inits])
  tv = ((stack(0), stack(1)),)
  norm = ensemble.unit_normalizer([0.1307], [0.3081])
  groups = (ensemble.TeacherGroup(task, norm, tuple(range(m))),)
  gen = models.Generator(out_shape=(28, 28, 1), nz=100, ngf=args.ngf)
  default = default_backend()
  results = {"m": m, "c": c, "stratify_steps": args.steps,
             "stratify_batch": args.batch, "ngf": args.ngf,
             "backend": jax.default_backend(), "default_backend": default,
             "devices": jax.device_count()}
  pair_steps = m * c * args.steps
  for backend in dict.fromkeys((default, "vmap", "loop")):
    strat = stratify_lib.make_stratifier(
        groups, gen, num_classes=c, steps=args.steps, batch_size=args.batch,
        mapper=ClientMapper(backend))
    sec = _timed(lambda: strat(tv, jax.random.PRNGKey(0)).u, args.repeats)
    results[f"stratify_{backend}_seconds"] = sec
    results[f"stratify_{backend}_ms_per_generator_step"] = 1e3 * sec / pair_steps
  results["speedup_vs_loop"] = (results["stratify_loop_seconds"] /
                                results[f"stratify_{default}_seconds"])
  # What batching could gain at best: one generator and one teacher (shared
  # weights, so no grouped convolutions) at the per-pair batch and at all
  # m·c pairs' batch. If the per-image cost does not fall, the step is
  # compute-bound and no batched program can beat the loop by much.
  per_image = {}
  gv = gen.init(jax.random.PRNGKey(0), jnp.zeros((1, 100)), train=False)
  tp, ts = jax.tree_util.tree_map(lambda a: a[0], tv[0])

  @jax.jit
  def gen_grad(gp, gs, z):
    def loss(gp):
      x, _ = gen.apply({"params": gp, "batch_stats": gs}, z, train=True,
                       mutable=["batch_stats"])
      logits, _ = task.apply(tp, ts, norm(x), train=False)
      return optax.softmax_cross_entropy_with_integer_labels(
          logits, jnp.zeros((z.shape[0],), jnp.int32)).mean()
    return jax.grad(loss)(gp)

  for b in (args.batch, m * c * args.batch):
    z = jax.random.normal(jax.random.PRNGKey(1), (b, 100))
    sec = _timed(lambda: gen_grad(gv["params"], gv["batch_stats"], z),
                 max(args.repeats, 3))
    per_image[b] = 1e3 * sec / b
  results["generator_step_ms_per_image"] = {str(b): v
                                            for b, v in per_image.items()}
  results["batching_gain_bound"] = (per_image[args.batch] /
                                    per_image[m * c * args.batch])
  hp = dfkd.DFKDHyperParams(batch_size=64,
                            generator_steps=args.hasa_generator_steps,
                            student_steps=args.hasa_student_steps,
                            pool_size=40)
  d = dfkd.make_dfkd(groups, gen, task, norm,
                     stratify_lib.stratified_ensemble, hp,
                     student_optimizer=optax.sgd(0.01, momentum=0.9))
  state = d.init(jax.random.PRNGKey(1), *task.init(jax.random.PRNGKey(9)))
  ctx = (jnp.full((c, m), 1.0 / m), jnp.full((c, m), 1.0 / c))
  holder = {"s": state}

  def one_epoch():
    holder["s"], _ = d.epoch(holder["s"], tv, ctx)
    return holder["s"].params

  results["hasa_seconds_per_epoch"] = _timed(one_epoch, max(args.repeats, 2))
  results["hasa_config"] = {"batch_size": 64,
                            "generator_steps": args.hasa_generator_steps,
                            "student_steps": args.hasa_student_steps,
                            "ngf": args.ngf}
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2, sort_keys=True)
  print(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
  fedjax_dd.configure_cpu()  # one host device per core, before JAX starts
  main()
