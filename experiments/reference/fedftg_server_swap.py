r"""Both FedFTG servers on the same inputs: the reference's fine-tuning and ours.

This is *our* glue. ``fedftg_adapter.py --dump_dir=D`` saves, before each
server fine-tuning of a reference run, what goes into it: the global model
(the cohort's FedAvg), the generator, the clients' models and class counts,
and the round's learning rates. This script runs one server on those inputs
``--reps`` times, each with its own random numbers, and writes one JSON line
per (round, repetition): the global model's test accuracy before and after,
and the generator's loss terms averaged over the round's steps. So the two
servers are compared on identical teachers, student and generator, and any
difference in the fine-tuning gain is the server's own.

  TORCHENV/bin/python experiments/reference/fedftg_server_swap.py \
      --side=reference --ref_dir=REF --dumps=D --partition=part_seed0.npz \
      --data=../shared/datasets/fashion_mnist.npz --reps=10 --out=ref.jsonl
  TORCHENV/bin/python experiments/reference/fedftg_server_swap.py \
      --side=ours --dumps=D --partition=part_seed0.npz \
      --data=../shared/datasets/fashion_mnist.npz --reps=10 --out=ours.jsonl

``TORCHENV`` has torch and this project installed (both sides read the
dumps with torch). ``--side=reference`` calls the reference's
``train_global_model_cgan_bs_weight_iloop_fz_dis`` unchanged, seeding
``torch`` and ``numpy`` with ``1000 · round + rep`` first. ``--side=ours``
converts the inputs to our Flax models (:func:`lenet_to_flax`,
:func:`generator_to_flax`; checked against the PyTorch models' outputs
first) and runs one round of our IGA (:func:`fedjax_dd.distill.iga.make_iga`)
with ``experiments/configs/fedftg.py:fmnist_dir0.01``'s settings; ``--set
name=value`` overrides any ``IGAHyperParams`` field (``name=None`` sets
None), to measure one departure at a time. Both sides use the learning
rates ``0.1 · 0.998^(round−1)`` and ``0.01 · 0.998^(round−1)`` and the key
``1000 · round + rep``, and evaluate on the test set as the adapter
normalises it, so ``before`` is the same on both.

``--lockstep=DIR`` feeds both sides the same random inputs: the noise of
:func:`lockstep_noise` (the reference's ``torch.randn`` is replaced for the
call) and the reference's own labels (its ``generate_labels`` after
``numpy`` is seeded), one ``(z, y)`` per iteration as the reference draws
them. Each run then saves the fine-tuned student, the test accuracy and the
generator's terms ``(L_cd, L_cf, L_div)`` at every step, and
``--side=compare`` tabulates how far the two sides are apart; with
``--iterations=N`` (ours: also ``--set iterations=N``) the round stops
after ``N`` iterations. ``--perturb=EPS`` multiplies the generator's
parameters by ``1 + EPS·N(0, 1)`` first, to see how far differences of
rounding size carry within one implementation.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fedftg_adapter  # pylint: disable=g-import-not-at-top,wrong-import-position
from torch_export import nchw_rows_to_nhwc, nhwc_rows_to_nchw  # pylint: disable=g-import-not-at-top,wrong-import-position


def unflatten(state_dict_like, flat):
  """Splits a flat parameter vector ``[P]`` in ``state_dict`` order (the
  reference's ``get_mdl_params`` / ``set_client_from_params``) into numpy
  arrays of the state dict's shapes."""
  out, i = {}, 0
  for name, v in state_dict_like.items():
    n = int(np.prod(v.shape))
    out[name] = np.asarray(flat[i:i + n], np.float32).reshape(tuple(v.shape))
    i += n
  if i != len(flat):
    raise ValueError(f"{len(flat)} parameters for a model of {i}.")
  return out


def _conv(w):
  return np.transpose(np.asarray(w, np.float32), (2, 3, 1, 0))  # OIHW->HWIO


def _lenet_map(side: int, conv2_bias) -> tuple[int, int, int]:
  """``(H, W, C)`` of the map LeNet-5's first dense layer reads."""
  s = ((side - 4) // 2 - 4) // 2
  return s, s, np.shape(conv2_bias)[0]


def lenet_to_flax(sd, side: int = 28):
  """The adapter's PyTorch LeNet-5 state dict as our ``models/lenet.py``
  parameters.

  The first dense layer reads PyTorch's NCHW flattening; ours flattens
  NHWC, so its input rows are permuted to ``(h, w, c)`` order.
  """
  a = lambda k: np.asarray(sd[k], np.float32)
  fc1 = nchw_rows_to_nhwc(a("fc1.weight").T,
                          _lenet_map(side, sd["conv2.bias"]))
  return {
      "conv1": {"kernel": _conv(sd["conv1.weight"]), "bias": a("conv1.bias")},
      "conv2": {"kernel": _conv(sd["conv2.weight"]), "bias": a("conv2.bias")},
      "fc1": {"kernel": fc1, "bias": a("fc1.bias")},
      "fc2": {"kernel": a("fc2.weight").T, "bias": a("fc2.bias")},
      "fc3": {"kernel": a("fc3.weight").T, "bias": a("fc3.bias")},
  }


def generator_to_flax(sd, ngf: int = 64, side: int = 28):
  """The reference's ``CGeneratorA`` state dict as our
  ``models/cgenerator.CGeneratorA`` ``(params, batch_stats)``.

  PyTorch views the concatenated dense outputs as ``[B, 2·ngf, s, s]``
  (feature ``c·s² + h·s + w``); ours reshapes each branch to ``[B, s, s,
  ngf]`` (feature ``h·s·ngf + w·ngf + c``), so the dense columns are
  permuted.
  """
  hwc = (side // 4, side // 4, ngf)
  a = lambda k: np.asarray(sd[k], np.float32)

  def dense(prefix):  # output features (c, h, w) -> (h, w, c)
    return {"kernel": nchw_rows_to_nhwc(a(prefix + ".weight"), hwc).T,
            "bias": nchw_rows_to_nhwc(a(prefix + ".bias"), hwc)}

  def bn(prefix):
    return ({"scale": a(prefix + ".weight"), "bias": a(prefix + ".bias")},
            {"mean": a(prefix + ".running_mean"),
             "var": a(prefix + ".running_var")})

  (bn0, st0), (bn1, st1), (bn2, st2) = (bn("conv_blocks0.0"),
                                        bn("conv_blocks1.1"),
                                        bn("conv_blocks2.1"))
  conv = lambda p: {"kernel": _conv(sd[p + ".weight"]), "bias": a(p + ".bias")}
  params = {"noise_fc": dense("l1.0"), "label_fc": dense("l2.0"),
            "bn0": bn0, "bn1": bn1, "bn2": bn2,
            "conv1": conv("conv_blocks1.0"), "conv2": conv("conv_blocks2.0"),
            "conv3": conv("conv_blocks2.3")}
  stats = {"bn0": st0, "bn1": st1, "bn2": st2,
           "bn_out": {"mean": a("conv_blocks2.5.running_mean"),
                      "var": a("conv_blocks2.5.running_var")}}
  return params, stats


def _torch_generator(data_obj, state_dict):
  """The reference's ``CGeneratorA`` as its ``train.py`` builds it
  (``nz=100``, default ``ngf=64``), holding ``state_dict``."""
  from models import gan_models  # pylint: disable=g-import-not-at-top
  g = gan_models.CGeneratorA(nz=100, ngf=64, nc=data_obj.channels,
                             img_size=data_obj.width, n_cls=data_obj.n_cls)
  g.load_state_dict(state_dict)
  return g


def _load(torch, path, perturb):
  """A dump; with ``perturb > 0`` the generator's float parameters are
  multiplied by ``1 + perturb · N(0, 1)`` (a fixed draw, the same on both
  sides): ``--perturb`` measures how far rounding-sized differences carry
  through one round."""
  d = torch.load(path, weights_only=False)
  if perturb > 0:
    rng = np.random.default_rng(12345)
    d["generator"] = {
        k: (v * (1 + perturb * torch.from_numpy(
            rng.standard_normal(tuple(v.shape)).astype(np.float32)))
            if v.is_floating_point() and "running" not in k else v)
        for k, v in d["generator"].items()}
  return d


def _dumps(path):
  files = sorted(glob.glob(os.path.join(path, "round_*.pt")))
  if not files:
    raise SystemExit(f"No round_*.pt in {path}.")
  return [(int(re.search(r"round_(\d+)", f).group(1)), f) for f in files]


# Iterations of the reference's fine-tuning (hard-coded there).
REFERENCE_ITERATIONS = 10


class _Stop(Exception):
  """Ends the reference's round early (``--iterations``)."""


def lockstep_noise(seed: int, iterations: int, batch_size: int = 50,
                   nz: int = 100):
  """``--lockstep``'s noise: one ``z [B, nz]`` per iteration, shared by
  both sides."""
  rng = np.random.default_rng(seed)
  return rng.standard_normal((iterations, batch_size, nz)).astype(np.float32)


def _save_student(args, side, rnd, rep, state_dict, terms, accuracy):
  """``--lockstep``: the fine-tuned student (PyTorch layout), the per-step
  generator terms ``[steps, 3]`` (cd, cf, div), the test accuracy
  ``(before, after)`` and the iterations run."""
  tag = f"_p{args.perturb:g}" if args.perturb else ""
  np.savez(os.path.join(args.lockstep,
                        f"{side}{tag}_round{rnd:03d}_rep{rep}.npz"),
           terms=np.asarray(terms, np.float64),
           accuracy=np.asarray(accuracy, np.float64),
           iterations=args.iterations or REFERENCE_ITERATIONS,
           **{k.replace(".", "__"): v for k, v in state_dict.items()})


def _reference_side(args, torch, data_obj, dumps, out):
  from methods import local_fn_gan as lfg  # pylint: disable=g-import-not-at-top
  lenet = fedftg_adapter._lenet5(  # pylint: disable=protected-access
      torch, data_obj.channels, data_obj.n_cls, data_obj.width)
  terms = []
  original_flow = lfg.compute_backward_flow_G_dis

  def flow(*a, **k):
    loss, md, cls, ap = original_flow(*a, **k)
    terms.append((-float(md), float(cls), float(ap)))
    return loss, md, cls, ap

  lfg.compute_backward_flow_G_dis = flow
  randn = torch.randn
  for rnd, path in dumps:
    d = _load(torch, path, args.perturb)
    for rep in range(args.reps):
      seed = 1000 * rnd + rep
      torch.manual_seed(seed)
      np.random.seed(seed)
      if args.lockstep:
        zs = iter(lockstep_noise(seed,
                                 args.iterations or REFERENCE_ITERATIONS))

        def fixed_randn(*shape, **kw):
          del kw
          try:
            return torch.from_numpy(next(zs)).reshape(*shape[0])
          except StopIteration:
            raise _Stop() from None

        torch.randn = fixed_randn
      s_model = lenet()
      s_model.load_state_dict(d["student"])
      g_model = _torch_generator(data_obj, d["generator"])
      _, before = lfg.get_acc_loss(data_obj.tst_x, data_obj.tst_y, s_model,
                                   d["dataset_name"], 0)
      terms.clear()
      t0 = time.time()
      try:
        lfg.train_global_model_cgan_bs_weight_iloop_fz_dis(
            s_model, g_model, lenet(), d["client_params"], d["class_counts"],
            d["glb_lr"], d["gen_lr"], d["batch_size"], 10**9,
            d["weight_decay"], d["dataset_name"], None, None, data_obj.tst_x,
            data_obj.tst_y)
      except _Stop:  # --iterations: s_model is updated in place
        pass
      torch.randn = randn
      _, after = lfg.get_acc_loss(data_obj.tst_x, data_obj.tst_y, s_model,
                                  d["dataset_name"], 0)
      if args.lockstep:
        _save_student(args, "reference", rnd, rep,
                      {k: v.detach().numpy()
                       for k, v in s_model.state_dict().items()}, terms,
                      (before, after))
      md, cls, ap = np.mean(np.asarray(terms), axis=0)
      _write(out, {"side": "reference", "round": rnd, "rep": rep,
                   "before": float(before), "after": float(after),
                   "gain": float(after - before),
                   "gen_cd": float(md), "gen_cf": float(cls),
                   "gen_div": float(ap), "seconds": round(time.time() - t0, 2)})


def _our_side(args, torch, data_obj, dumps, out):
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_dd import models  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.task import Classifier  # pylint: disable=g-import-not-at-top
  from fedjax_dd.distill.iga import IGAHyperParams, make_iga  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import sections  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments.configs import fedftg  # pylint: disable=g-import-not-at-top
  from fedjax_dd.models.cgenerator import CGeneratorA  # pylint: disable=g-import-not-at-top

  i = fedftg.get_config("fmnist_dir0.01").iga
  hparams = sections.iga(i)
  fields = {f.name for f in dataclasses.fields(IGAHyperParams)}
  for item in args.set:
    name, value = item.split("=", 1)
    if name not in fields:
      raise SystemExit(f"--set {name}: not an IGAHyperParams field.")
    hparams = dataclasses.replace(
        hparams, **{name: _set_value(getattr(hparams, name), value)})
  side = data_obj.width
  # The entry point's LeNet-5; its inputs are normalised already.
  task = Classifier(module=models.get_model("lenet5").build(data_obj.n_cls),
                    input_shape=(side, side, data_obj.channels),
                    preprocess=lambda x: x, num_classes=data_obj.n_cls)
  generator = CGeneratorA(out_shape=(side, side, data_obj.channels),
                          nz=i.nz, ngf=i.ngf, num_classes=data_obj.n_cls)
  x_test = np.moveaxis(data_obj.tst_x, 1, -1)
  y_test = data_obj.tst_y.reshape(-1)
  predict = jax.jit(lambda p, x: jnp.argmax(task.apply(p, {}, x,
                                                       train=False)[0], -1))

  def accuracy(params):
    hits = sum(int(np.sum(np.asarray(predict(params, x_test[j:j + 1000]))
                          == y_test[j:j + 1000]))
               for j in range(0, len(y_test), 1000))
    return hits / len(y_test)

  lenet = fedftg_adapter._lenet5(  # pylint: disable=protected-access
      torch, data_obj.channels, data_obj.n_cls, side)
  template = lenet().state_dict()
  igas = {}
  for rnd, path in dumps:
    d = _load(torch, path, args.perturb)
    student = jax.tree_util.tree_map(jnp.asarray, lenet_to_flax(d["student"],
                                                                side))
    teachers = [lenet_to_flax(unflatten(template, row), side)
                for row in d["client_params"]]
    teacher_params = jax.tree_util.tree_map(
        lambda *xs: jnp.asarray(np.stack(xs)), *teachers)
    k = len(teachers)
    teacher_stats = {}
    gen_params, gen_stats = generator_to_flax(d["generator"], i.ngf, side)
    _check(torch, d, lenet, data_obj, task, generator, student, gen_params,
           gen_stats, x_test)
    if k not in igas:  # K_max = K: no padding, as the reference
      igas[k] = make_iga(task, generator, num_teachers_max=k,
                         hparams=hparams)
    iga = igas[k]
    for rep in range(args.reps):
      seed = 1000 * rnd + rep
      state = iga.init(jax.random.key(seed), student, {})
      state = state.replace(
          gen_params=jax.tree_util.tree_map(jnp.asarray, gen_params),
          gen_stats=jax.tree_util.tree_map(jnp.asarray, gen_stats),
          rounds=jnp.asarray(rnd - 1, jnp.int32))
      t0 = time.time()
      round_fn, trace = iga.round, []
      if args.lockstep:
        round_fn, trace = _lockstep_round(
            iga, seed, d["class_counts"],
            args.iterations or REFERENCE_ITERATIONS)
      _, sp, _, metrics = round_fn(state, student, {}, teacher_params,
                                   teacher_stats,
                                   jnp.asarray(d["class_counts"]), rnd - 1)
      before, after = accuracy(student), accuracy(sp)
      if args.lockstep:
        _save_student(args, "ours", rnd, rep,
                      flax_lenet_to_state_dict(jax.device_get(sp), side),
                      trace, (before, after))
      m = {key: float(v) for key, v in jax.device_get(metrics).items()}
      _write(out, {"side": "ours", "set": list(args.set), "round": rnd,
                   "rep": rep, "before": before, "after": after,
                   "gain": after - before, "gen_cd": m.get("gen_cd"),
                   "gen_cf": m.get("gen_cf"), "gen_div": m.get("gen_div"),
                   "student_cd": m.get("student_cd"),
                   "seconds": round(time.time() - t0, 2)})


def _lockstep_round(iga, seed, class_counts, iterations):
  """Our IGA round on ``--lockstep``'s inputs: the reference's labels
  (its ``generate_labels`` after ``numpy`` is seeded with ``seed``, as it
  runs on the reference side) and :func:`lockstep_noise`, one ``(z, y)``
  per iteration (``fresh_samples=False``). Returns the round function and
  the list its generator steps append ``(cd, cf, div)`` to."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_dd.distill import iga as iga_lib  # pylint: disable=g-import-not-at-top
  from methods import train_gan_fn  # pylint: disable=g-import-not-at-top
  loop, programs = iga.round.args
  if loop.hp.fresh_samples or loop.hp.iterations != iterations:
    raise SystemExit("--lockstep needs --set fresh_samples=False and "
                     f"--set iterations={iterations} on our side.")
  np.random.seed(seed)
  b = loop.hp.batch_size
  # The reference draws all its labels at once for its fixed 10 iterations
  # (a shuffle of exact class proportions) and takes the first B per
  # iteration, also when --iterations stops it early.
  labels = train_gan_fn.generate_labels(
      REFERENCE_ITERATIONS * b, np.sum(class_counts, axis=0))[:iterations * b]
  draw = iga_lib._Draw(  # pylint: disable=protected-access
      z=jnp.asarray(lockstep_noise(seed, iterations, b, loop.nz))[:, None],
      y=jnp.asarray(labels.reshape(iterations, 1, b), jnp.int32))
  trace = []

  def generator_step(*a):
    carry, m = programs.generator_step(*a)
    trace.append((float(m["gen_cd"]), float(m["gen_cf"]),
                  float(m["gen_div"])))
    return carry, m

  fixed = programs._replace(draw=lambda *a: draw,
                            generator_step=generator_step)
  return functools.partial(iga_lib._round, loop, fixed), trace  # pylint: disable=protected-access


def flax_lenet_to_state_dict(params, side: int = 28):
  """Inverse of :func:`lenet_to_flax`."""
  fc1 = nhwc_rows_to_nchw(np.asarray(params["fc1"]["kernel"], np.float32),
                          _lenet_map(side, params["conv2"]["bias"])).T
  conv = lambda k: np.transpose(np.asarray(k), (3, 2, 0, 1))
  a = lambda x: np.asarray(x, np.float32)
  return {"conv1.weight": conv(params["conv1"]["kernel"]),
          "conv1.bias": a(params["conv1"]["bias"]),
          "conv2.weight": conv(params["conv2"]["kernel"]),
          "conv2.bias": a(params["conv2"]["bias"]),
          "fc1.weight": fc1, "fc1.bias": a(params["fc1"]["bias"]),
          "fc2.weight": a(params["fc2"]["kernel"]).T,
          "fc2.bias": a(params["fc2"]["bias"]),
          "fc3.weight": a(params["fc3"]["kernel"]).T,
          "fc3.bias": a(params["fc3"]["bias"])}


def _check(torch, d, lenet, data_obj, task, generator, student, gen_params,
           gen_stats, x_test):
  """Refuses to run unless the converted models reproduce PyTorch's
  outputs (logits on 64 test images; generator images in both BatchNorm
  modes) to 1e-4 of each output's largest entry (in training mode the
  last BatchNorm standardises 8 images, whose entries reach about 16)."""
  s = lenet()
  s.load_state_dict(d["student"])
  s.eval()
  with torch.no_grad():
    want = s(torch.from_numpy(data_obj.tst_x[:64])).numpy()
  got = np.asarray(task.apply(student, {}, x_test[:64], train=False)[0])
  rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
  err = rel(got, want)
  g = _torch_generator(data_obj, d["generator"])
  z = np.random.default_rng(0).standard_normal((8, 100)).astype(np.float32)
  y = np.arange(8) % data_obj.n_cls
  onehot = np.eye(data_obj.n_cls, dtype=np.float32)[y]
  for train in (False, True):
    g.train(train)
    with torch.no_grad():
      want_x = g(torch.from_numpy(z), torch.from_numpy(onehot)).numpy()
    out = generator.apply({"params": gen_params, "batch_stats": gen_stats},
                          z, y, train=train,
                          mutable=["batch_stats"] if train else False)
    got_x = np.asarray(out[0] if train else out)
    err = max(err, rel(got_x, np.moveaxis(want_x, 1, -1)))
  if err > 1e-4:
    raise SystemExit(f"Converted models differ from PyTorch's by {err:.2e} "
                     "(relative).")


def compare(reference_dir: str, other_dirs) -> str:
  """A markdown table of ``--lockstep`` runs: one row per round and
  repetition of each directory in ``other_dirs`` (ours, perhaps with
  ``--set``, or the reference with ``--perturb``) against the reference's
  files in ``reference_dir``. Columns:
  the test accuracy after the round on each side; the largest relative
  difference of the generator's per-step terms ``(cd, cf, div)`` at the
  first step, over the first iteration's ``K`` steps and over all steps;
  and of the fine-tuned students' parameters (per tensor, relative to that
  tensor's largest entry)."""
  rows = ["| run | round | K | after: reference | after: run | "
          "terms Δ, step 1 | terms Δ, iteration 1 | terms Δ, all steps | "
          "student Δ |", "|" + "---|" * 9]
  for d in other_dirs:
    for path in sorted(glob.glob(os.path.join(d, "*_round*_rep*.npz"))):
      tail = re.search(r"_round\d+_rep\d+\.npz$", path).group(0)
      ref = os.path.join(reference_dir, "reference" + tail)
      if not os.path.exists(ref):
        continue
      a, b = np.load(path), np.load(ref)
      n = min(len(a["terms"]), len(b["terms"]))
      ta, tb = a["terms"][:n], b["terms"][:n]
      rel = np.max(np.abs(ta - tb) / np.abs(tb), axis=1)
      k = n // int(b["iterations"])
      student = max(float(np.max(np.abs(a[f] - b[f])) / np.max(np.abs(b[f])))
                    for f in b.files
                    if f not in ("terms", "accuracy", "iterations"))
      rnd = int(re.search(r"round(\d+)", tail).group(1))
      rows.append(
          f"| {os.path.basename(d.rstrip('/'))} | {rnd} | {k} | "
          f"{float(b['accuracy'][1]):.4f} | {float(a['accuracy'][1]):.4f} | "
          f"{rel[0]:.1e} | {rel[:k].max():.1e} | {rel.max():.1e} | "
          f"{student:.1e} |")
  return "\n".join(rows)


def _write(out, rec):
  out.write(json.dumps(rec) + "\n")
  out.flush()
  print(json.dumps(rec), flush=True)


def _set_value(current, value: str):
  """``--set``'s text as the type of the field's current value; a field
  that is None now takes a number if the text is one, else the text, and
  ``None`` (or nothing) sets None."""
  if value in ("", "None"):
    return None
  if isinstance(current, bool):
    return value.lower() in ("1", "true", "yes")
  if current is not None:
    return type(current)(value)
  for kind in (int, float):
    try:
      return kind(value)
    except ValueError:
      pass
  return value


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--side", required=True,
                  choices=("reference", "ours", "compare"),
                  help="compare: print the table of compare(--lockstep, "
                  "--others) and exit")
  ap.add_argument("--others", default="",
                  help="compare: comma-separated --lockstep directories of "
                  "our side")
  ap.add_argument("--ref_dir",
                  help="checkout of ZhangLin-PKU/FedFTG (both sides load its "
                  "generator class; the reference side its server)")
  ap.add_argument("--dumps",
                  help="directory of fedftg_adapter.py --dump_dir")
  ap.add_argument("--partition")
  ap.add_argument("--data")
  ap.add_argument("--rounds", default="",
                  help="comma-separated rounds (default: every dump)")
  ap.add_argument("--reps", type=int, default=10)
  ap.add_argument("--set", action="append", default=[],
                  help="ours: NAME=VALUE overrides an IGAHyperParams field")
  ap.add_argument("--lockstep", default="",
                  help="DIR: both sides draw the same noise and labels "
                  "(lockstep_noise, the reference's generate_labels); the "
                  "fine-tuned student and per-step generator terms go to "
                  "DIR/<side>_roundRRR_repN.npz")
  ap.add_argument("--iterations", type=int, default=0,
                  help="with --lockstep: stop the round after this many "
                  "iterations (ours: also --set iterations=N)")
  ap.add_argument("--perturb", type=float, default=0.0,
                  help="relative noise on the generator's parameters "
                  "(see _load)")
  ap.add_argument("--threads", type=int, default=1)
  ap.add_argument("--out")
  args = ap.parse_args(argv)
  if args.side == "compare":
    print(compare(args.lockstep, args.others.split(",")))
    return
  missing = [n for n in ("ref_dir", "dumps", "partition", "data", "out")
             if not getattr(args, n)]
  if missing:
    ap.error("--side=reference/ours needs " +
             ", ".join("--" + n for n in missing))
  if args.lockstep:
    os.makedirs(args.lockstep, exist_ok=True)

  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  fedftg_adapter._install_stubs(torch)  # pylint: disable=protected-access
  sys.path.insert(0, os.path.abspath(args.ref_dir))
  dumps = _dumps(args.dumps)
  if args.rounds:
    keep = {int(r) for r in args.rounds.split(",")}
    dumps = [(r, p) for r, p in dumps if r in keep]
  data_obj = fedftg_adapter._data_object(  # pylint: disable=protected-access
      args.data, args.partition)
  with open(args.out, "a") as out:
    (_reference_side if args.side == "reference" else _our_side)(
        args, torch, data_obj, dumps, out)


if __name__ == "__main__":
  main()
