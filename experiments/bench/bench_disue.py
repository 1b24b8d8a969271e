r"""DisUE benchmark: seconds per stage of one round, and no recompiles as K changes.

  python -m fedjax_dd.experiments.bench.bench_disue --out bench_disue.json
  python -m fedjax_dd.experiments.bench.bench_disue --model lenet5,cnn3 \
      --out b.json
  python -m fedjax_dd.experiments.bench.bench_disue --dataset fmnist \
      --out b.json

One DisUE round (:mod:`fedjax_dd.algorithms.clustered`, Algorithm 1) under
the protocol of ``experiments/configs/disue.py`` (``fmnist_dir0.01``: N =
100 clients, Act = 0.15 so a cohort of S = 15, 5 local epochs of batch 50,
SGD with clip, weight decay, flip and crop; FedFTG's Dir(0.01) split), cut
into the stages the round runs, each timed to ``block_until_ready``:

* ``local_training``: the mapped client program (the L-phase);
* ``similarity``: ``update_similarity`` of the updates on the device (Eq. 3),
  then the ``[S, S]`` matrix to the host;
* ``ap``: Affinity Propagation on the host (Eq. 4);
* ``aggregation``: the class counts and the segment-weighted means over S
  static segments (Eq. 2), then the FedAvg of the groups;
* ``iga``: one ``IGA.round`` with FedFTG's schedule (10 iterations of 1
  generator step and 5 student steps, batch 50) and the cohort's 15 teacher
  slots.

The stages are the library's own (:func:`fedjax_dd.algorithms.clustered.
clustered_programs`, the runner's ``_iga``, the arguments of
:func:`fedjax_dd.algorithms.disue.affinity_grouping`). A warm-up round
compiles; the report holds the median of ``--rounds`` rounds after it, and
IGA steps per second.

Recompiles: the timed rounds (whose AP finds its own K) and a sweep of K =
1, 3, 7, 15 groups (``labels = arange(S) % K``) run inside
``jax.log_compiles(True)``, counting "Compiling" records.
``recompile_count`` must be 0; ``compiles_in_warmup`` shows the counter
sees compiles at all. IGA evaluates all S teacher slots (the padded ones as
copies of the first real teacher), so its cost should not change with K.

Data: by default synthetic in the model's input shape (10 classes,
``--examples_per_client`` per client: a class template plus noise, split by
the preset's partition), written to a temporary npz, so no dataset is
needed; ``--dataset fmnist`` / ``cifar10`` load ``../shared/datasets/*.npz``.
``--model`` takes a comma-separated list (``lenet5``, ``cnn3``,
``digits_cnn``); ``--set KEY=VALUE`` overrides any config field. With
``--set client.activity=P`` each round draws its cohort as the rounds loop
does, and ``recompile_count`` counts the compile of each new cohort size.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import fedjax_dd

DATASETS = {
    # name: (preset of configs/disue.py, default model)
    "synthetic": ("fmnist_dir0.01", "lenet5"),
    "fmnist": ("fmnist_dir0.01", "lenet5"),
    "cifar10": ("cifar10_dir0.01", "cnn3"),
}
STAGES = ("local_training", "similarity", "ap", "aggregation", "iga")
DEFAULT_KS = (1, 3, 7, 15)


class CompileCounter(logging.Handler):
  """Counts the "Compiling ..." records of ``jax.log_compiles``."""

  def __init__(self):
    super().__init__(level=logging.DEBUG)
    self.count = 0
    self.names: list[str] = []

  def emit(self, record):
    msg = record.getMessage()
    if msg.startswith("Compiling"):
      self.count += 1
      self.names.append(msg)


@contextlib.contextmanager
def count_compiles():
  """``jax.log_compiles(True)`` with a :class:`CompileCounter` on JAX's
  loggers (their records do not reach the console meanwhile)."""
  import jax

  logger = logging.getLogger("jax")
  counter = CompileCounter()
  old_level, old_propagate = logger.level, logger.propagate
  old_handlers = list(logger.handlers)
  logger.handlers = [counter]
  logger.propagate = False
  logger.setLevel(logging.DEBUG)
  try:
    with jax.log_compiles(True):
      yield counter
  finally:
    logger.handlers = old_handlers
    logger.setLevel(old_level)
    logger.propagate = old_propagate


def _parse_value(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def make_config(dataset: str, model: str, *, clients: int, cohort: int,
                overrides: list[str]):
  """The ``disue`` preset of ``dataset`` with the model and overrides."""
  from fedjax_dd.experiments.configs import disue as disue_config

  preset, _ = DATASETS[dataset]
  c = disue_config.protocol("disue", preset)
  c.model.name = model
  c.data.num_clients = clients
  c.client.clients_per_round = cohort
  c.run.progress = False
  for item in overrides:
    key, _, value = item.partition("=")
    *groups, leaf = key.split(".")
    node = c
    for g in groups:
      node = node[g]
    if leaf not in node:
      raise ValueError(f"--set {item}: no config field {key!r}.")
    node[leaf] = _parse_value(value)
  return c


def synthetic_npz(path: str, *, shape, num_classes: int, num_train: int,
                  num_test: int, seed: int = 0) -> str:
  """Writes an FMNIST-like npz: a random template per class plus noise,
  uniform labels; returns the ``npz:`` spec."""
  import numpy as np

  rng = np.random.default_rng(seed)
  templates = rng.integers(0, 256, (num_classes, *shape)).astype(np.int16)

  def split(n):
    y = rng.integers(0, num_classes, n).astype(np.int32)
    noise = rng.integers(-64, 65, (n, *shape), dtype=np.int16)
    x = np.clip(templates[y] + noise, 0, 255).astype(np.uint8)
    return x, y

  x_train, y_train = split(num_train)
  x_test, y_test = split(num_test)
  np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test,
           y_test=y_test)
  return f"npz:{path}"


def _median(values):
  return float(statistics.median(values)) if values else None


def bench_model(config, *, rounds: int, ks, synthetic: bool,
                examples_per_client: int, tmpdir: str) -> dict:
  """Warm-up round, ``rounds`` timed rounds and the K sweep for one model."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from fedjax_dd import models
  from fedjax_dd.algorithms.clustered import clustered_programs
  from fedjax_dd.algorithms.stages import class_counts
  from fedjax_dd.cluster import affinity
  from fedjax_dd.cluster import similarity as similarity_lib
  from fedjax_dd.core import keys as keys_lib
  from fedjax_dd.core import rounds as rounds_lib
  from fedjax_dd.core.ledger import num_params
  from fedjax_dd.experiments import common
  from fedjax_dd.experiments import runners

  if synthetic:
    spec = models.get_model(config.model.name)
    n = config.data.num_clients
    config.data.dataset = synthetic_npz(
        os.path.join(tmpdir, f"synthetic_{config.model.name}.npz"),
        shape=tuple(spec.input_shape), num_classes=10,
        num_train=n * examples_per_client,
        num_test=max(10, examples_per_client // 6))
    config.data.num_classes = 10
  t0 = time.perf_counter()
  prepared = common.load_and_prepare(config)
  parts = common.partition(config, prepared.dataset.y_train)
  data = common.client_data(prepared.dataset, parts)
  num_steps = common.local_steps(config, data.num_examples)
  max_steps = int(jnp.max(num_steps))
  setup_seconds = time.perf_counter() - t0
  task = prepared.task
  d = config.disue

  # The disue runner's arguments (runners._disue).
  training = common.local_training(config, task, max_steps)
  programs = clustered_programs(training)
  iga = runners._iga(config, task)
  # The rounds loop's draw: a fixed cohort, or Bernoulli with
  # client.activity (then each round has its own size, and a new size
  # compiles the client programs again, as it does in the rounds loop).
  sampler = common.cohort(config, data.num_clients)
  init_key, run_key = keys_lib.init_and_run(keys_lib.model_root(config.seed))
  params, stats = task.init(init_key)
  iga_state = iga.init(runners._generator_key(config), params, stats)
  # One layout for every round, as the rounds loop commits its state
  # (fedjax_dd.core.rounds): uncommitted fresh-init arrays would make round
  # 2 compile again.
  params, stats, iga_state = jax.device_put((params, stats, iga_state),
                                            jax.devices()[0])
  iga_hp = config.iga

  def iga_steps(num_teachers):
    # With FedFTG's per-teacher schedule every generator step is K steps.
    gen = int(iga_hp.generator_steps) * (
        int(num_teachers) if iga_hp.generator_per_teacher else 1)
    return int(iga_hp.iterations) * (gen + int(iga_hp.student_steps))

  def timed(fn):
    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return out, time.perf_counter() - t

  def one_round(r, params, stats, iga_state):
    # Round r (1-based) as the rounds loop draws it (cohort.round = r - 1).
    ids, cohort, train_key = rounds_lib.round_cohort(run_key, r, sampler,
                                                     data, num_steps)
    jax.block_until_ready(cohort)
    seconds = {}
    # L-phase, as clustered_distillation's apply calls it.
    keys = keys_lib.client_keys(train_key, cohort.client_ids)
    result, seconds["local_training"] = timed(
        lambda: programs.train(params, stats, (), cohort, keys))
    # Grouping, as affinity_grouping(similarity, "plain", damping,
    # preference) does it.
    rng = keys_lib.numpy_from_key(keys_lib.server_key(train_key))

    def similarity():
      sim = similarity_lib.update_similarity(result.params, params,
                                             mode=d.similarity)
      return np.asarray(jax.device_get(sim))

    sim, seconds["similarity"] = timed(similarity)
    clusters, seconds["ap"] = timed(lambda: affinity.affinity_propagation(
        sim, rng=rng, damping=d.damping, preference=d.preference))
    labels = jnp.asarray(np.asarray(clusters.labels, np.int32), jnp.int32)
    weights = cohort.num_examples

    def aggregation():
      counts = class_counts(cohort, task.num_classes)
      gp, gs, gw, group_counts = programs.group_models(
          result.params, result.batch_stats, labels, weights, counts)
      new_params, new_stats = programs.fedavg_of_groups(gp, gs, gw)
      return gp, gs, group_counts, new_params, new_stats

    (gp, gs, group_counts, new_params, new_stats), seconds["aggregation"] = (
        timed(aggregation))
    (iga_state, new_params, new_stats, m), seconds["iga"] = timed(
        lambda: iga.round(iga_state, new_params, new_stats, gp, gs,
                          group_counts, iga_state.rounds))
    info = {"cohort": int(ids.shape[0]),
            "num_groups": int(clusters.num_clusters),
            "ap_converged": bool(clusters.converged),
            "iga_steps": iga_steps(m["num_teachers"])}
    return new_params, new_stats, iga_state, seconds, info, (result, cohort)

  # Warm-up: compiles every program.
  with count_compiles() as warm:
    t = time.perf_counter()
    params, stats, iga_state, warm_seconds, _, last = one_round(
        1, params, stats, iga_state)
    warmup_total = time.perf_counter() - t

  per_round, infos = [], []
  with count_compiles() as rounds_counter:
    for r in range(2, rounds + 2):
      params, stats, iga_state, sec, info, last = one_round(
          r, params, stats, iga_state)
      per_round.append(sec)
      infos.append(info)

  # K sweep: other segment ids for the aggregation, K real teachers for IGA
  # (group_counts has zero rows k >= K).
  result, cohort = last
  s = int(cohort.client_ids.shape[0])
  weights = cohort.num_examples
  counts = class_counts(cohort, task.num_classes)
  jax.block_until_ready(counts)
  sweep = []
  with count_compiles() as sweep_counter:
    for k in (k for k in ks if k <= s):
      labels = jnp.asarray(np.arange(s, dtype=np.int32) % np.int32(k),
                           jnp.int32)
      t = time.perf_counter()
      gp, gs, gw, group_counts = programs.group_models(
          result.params, result.batch_stats, labels, weights, counts)
      p_k, s_k = programs.fedavg_of_groups(gp, gs, gw)
      jax.block_until_ready((p_k, s_k, group_counts))
      agg_s = time.perf_counter() - t
      (iga_state, _, _, m), iga_s = timed(
          lambda: iga.round(iga_state, p_k, s_k, gp, gs, group_counts,
                            jnp.asarray(rounds + 1, jnp.int32)))
      sweep.append({"k": int(k), "real_teachers": int(m["num_teachers"]),
                    "aggregation_seconds": agg_s, "iga_seconds": iga_s})

  stage_seconds = {st: _median([sec[st] for sec in per_round])
                   for st in STAGES}
  round_seconds = _median([sum(sec.values()) for sec in per_round])
  mapper = common.mapper(config)
  return {
      "model": config.model.name,
      "input_shape": list(task.input_shape),
      "param_count": num_params(params),
      "num_clients": int(data.num_clients),
      "cohort": s,
      "cohort_by_round": [i["cohort"] for i in infos],
      "examples_per_client": int(np.max(np.asarray(data.num_examples))),
      "local_steps": max_steps,
      "client_backend": mapper.resolved_backend,
      "setup_seconds": setup_seconds,
      "warmup_seconds": warmup_total,
      "warmup_stage_seconds": warm_seconds,
      "stage_seconds": stage_seconds,
      "round_seconds": round_seconds,
      "stage_seconds_by_round": per_round,
      "iga_steps_by_round": [i["iga_steps"] for i in infos],
      "iga_steps_per_second": _median([
          i["iga_steps"] / sec["iga"] for i, sec in zip(infos, per_round)]),
      "num_groups_by_round": [i["num_groups"] for i in infos],
      "ap_converged_by_round": [i["ap_converged"] for i in infos],
      "k_sweep": sweep,
      "compiles_in_warmup": warm.count,
      "recompiles_timed_rounds": rounds_counter.count,
      "recompiles_k_sweep": sweep_counter.count,
      "recompile_count": rounds_counter.count + sweep_counter.count,
      "recompiled": [n[:300] for n in rounds_counter.names +
                     sweep_counter.names],
  }


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="JSON file to write.")
  p.add_argument("--dataset", default="synthetic", choices=sorted(DATASETS))
  p.add_argument("--model", default="",
                 help="comma-separated models; default: the dataset's "
                 "preset (lenet5, cifar10: cnn3)")
  p.add_argument("--rounds", type=int, default=3,
                 help="timed rounds after the warm-up (median reported)")
  p.add_argument("--clients", type=int, default=100, help="N")
  p.add_argument("--cohort", type=int, default=15, help="S = Act * N")
  p.add_argument("--examples_per_client", type=int, default=600,
                 help="synthetic data only")
  p.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)),
                 help="real teachers of the recompile sweep (<= cohort)")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="config override, e.g. iga.iterations=1 (repeatable)")
  args = p.parse_args(argv)
  if args.rounds < 1:
    p.error("--rounds must be >= 1")

  import jax

  preset, default_model = DATASETS[args.dataset]
  model_names = [m for m in (args.model or default_model).split(",") if m]
  ks = [k for k in (int(v) for v in args.ks.split(",")) if 1 <= k <=
        args.cohort] or [1, args.cohort]
  report: dict = {
      "command": "python -m fedjax_dd.experiments.bench.bench_disue " +
                 " ".join(argv if argv is not None else sys.argv[1:]),
      "dataset": args.dataset,
      "preset": preset,
      "rounds": args.rounds,
      "ks": ks,
      "jax_version": jax.__version__,
      "devices": jax.device_count(),
      "platform": jax.default_backend(),
      "cpu_count": os.cpu_count(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "results": {},
  }
  with tempfile.TemporaryDirectory() as tmpdir:
    for name in model_names:
      config = make_config(args.dataset, name, clients=args.clients,
                           cohort=args.cohort, overrides=args.set)
      report.setdefault("iga", {k: config.iga[k] for k in (
          "iterations", "generator_steps", "student_steps", "batch_size",
          "nz", "ngf")})
      r = bench_model(config, rounds=args.rounds, ks=ks,
                      synthetic=args.dataset == "synthetic",
                      examples_per_client=args.examples_per_client,
                      tmpdir=tmpdir)
      report["results"][name] = r
      print(json.dumps({"model": name, "stage_seconds": r["stage_seconds"],
                        "round_seconds": r["round_seconds"],
                        "iga_steps_per_second": r["iga_steps_per_second"],
                        "recompile_count": r["recompile_count"]}),
            file=sys.stderr)
  report["recompile_count"] = sum(r["recompile_count"]
                                  for r in report["results"].values())
  report["peak_rss_mb"] = _peak_rss_mb()
  with open(args.out, "w") as f:
    json.dump(report, f, indent=2)
  print(format_table(report))
  return report


def _peak_rss_mb() -> float:
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def format_table(report: dict) -> str:
  """A report as a table: one row per model, seconds per stage."""
  head = (f"{'model':<10} {'params':>9} " +
          " ".join(f"{st:>14}" for st in STAGES) +
          f" {'round':>7} {'IGA steps/s':>11} {'recompiles':>10}")
  rows = [head]
  for name, r in report["results"].items():
    rows.append(f"{name:<10} {r['param_count']:>9,} " +
                " ".join(f"{r['stage_seconds'][st]:>14.3f}" for st in STAGES) +
                f" {r['round_seconds']:>7.2f} {r['iga_steps_per_second']:>11.1f}"
                f" {r['recompile_count']:>10}")
  return "\n".join(rows)


if __name__ == "__main__":
  fedjax_dd.configure_cpu()  # one host device per core, before JAX starts
  main()
