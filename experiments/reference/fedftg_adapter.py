r"""Adapter: runs FedFTG's released PyTorch code on a partition of ours.

This is *our* glue, not FedFTG's code. It imports the reference's modules
from a checkout given by ``--ref_dir`` (github.com/ZhangLin-PKU/FedFTG; see
``experiments/reference/README.md``), supplies what that code lacks for this
setting, and calls its FedFTG loop (``methods/FedFTG.py`` ->
``methods/local_fn_gan.py: train_FedGAN_common`` and its server fine-tuning
``train_global_model_cgan_bs_weight_iloop_fz_dis``) unchanged.

  /path/to/torch-venv/bin/python experiments/reference/fedftg_adapter.py \
      --ref_dir=REF --partition=part_seed0.npz \
      --data=../shared/datasets/fashion_mnist.npz --seed=0 --rounds=30 \
      --out=ref_seed0.jsonl

What the adapter supplies (nothing in ``--ref_dir`` is edited):

1. **Data.** ``utils/util_dataset.DatasetObject`` only knows CIFAR-10/100
   and makes its own split. The adapter passes an object with the same
   attributes built from ``--data`` (an ``x_train/y_train/x_test/y_test``
   uint8 NHWC npz) and the client index sets of ``--partition`` (written by
   ``export_partition.py``), normalised with the partition file's
   ``mean``/``std`` as our task does, in NCHW. ``dataset`` is ``"mnist"``,
   the name under which the reference's fine-tuning uses ``nz = 100``.
2. **Client augmentation.** The reference's ``Dataset`` hard-codes
   ``3x32x32`` images in its random crop; the adapter's is the same code
   (flip, then a zero-pad-4 random crop, each with probability 0.5) for the
   images' own ``C x H x W``.
3. **Models.** ``models/model_choose_fn.py`` imports modules the repository
   lacks, so the adapter builds LeNet-5 itself with the layers of
   ``models/lenet.py``, PyTorch's default initialisation and the
   ``forward(x, flag, flag_2)`` signature the reference calls. The
   generator is the reference's ``CGeneratorA`` as its ``train.py`` builds
   it (``nz=100``, default ``ngf``).
4. **CPU.** ``Tensor.cuda`` and ``Module.cuda`` return the object unchanged
   when no GPU exists.
5. **Unused imports.** ``torchvision`` (only ``transforms.ToTensor``, HWC ->
   CHW without scaling), ``torch.utils.tensorboard``, ``PIL`` and
   ``matplotlib`` are replaced by minimal stand-ins in ``sys.modules``.
6. **Logging.** A wrapper around the server fine-tuning evaluates the
   global model on the test set just before and just after it, and writes
   one JSON line per round to ``--out`` (``round``,
   ``test_accuracy_before_ft``, ``test_accuracy``, ``gain``, ``clients``,
   ``seconds``). With ``--skip_train_eval`` (default) the reference's
   evaluations on anything but the test set return NaN instead; they draw
   no random numbers, so training is unchanged.
7. **Dumps** (``--dump_dir``, off by default). Before each server
   fine-tuning the adapter saves its inputs to ``round_RRR.pt``: the global
   model and the generator as state dicts, the clients' flat parameter
   vectors ``[K, P]`` and class counts ``[K, C]``, and the two learning
   rates. It only copies, so the run is unchanged.
   ``fedftg_server_swap.py`` runs both servers on these inputs.

``--init=flax`` (a diagnostic of ours, off by default) initialises LeNet-5
as our Flax model is (LeCun-normal truncated weights, zero biases).

Protocol, as the reference's ``train.py`` runs FedFTG: seeds ``torch``,
``random`` and ``numpy`` with ``--seed``; ``act_prob = 0.15`` (each client
takes part with probability 0.15, drawn by the reference, so the cohort size
varies around 15); 5 local epochs, batch 50, SGD lr ``0.1·0.998^i``, weight
decay 1e-3, clip 10; ``trial=True`` (no checkpoints).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import types

import numpy as np


def _install_stubs(torch):
  """Stand-ins for the modules the reference imports but this run does not
  use (item 5 of the module docstring)."""

  class ToTensor:

    def __call__(self, img):
      return torch.from_numpy(np.ascontiguousarray(np.moveaxis(img, -1, 0)))

  class Compose:

    def __init__(self, fns):
      self.fns = fns

    def __call__(self, x):
      for f in self.fns:
        x = f(x)
      return x

  tv = types.ModuleType("torchvision")
  tv.transforms = types.ModuleType("torchvision.transforms")
  tv.transforms.ToTensor = ToTensor
  tv.transforms.Compose = Compose
  tv.datasets = types.ModuleType("torchvision.datasets")
  sys.modules.update({"torchvision": tv,
                      "torchvision.transforms": tv.transforms,
                      "torchvision.datasets": tv.datasets})

  class SummaryWriter:

    def __init__(self, *a, **k):
      pass

    def __getattr__(self, name):
      return lambda *a, **k: None

  tb = types.ModuleType("torch.utils.tensorboard")
  tb.SummaryWriter = SummaryWriter
  sys.modules["torch.utils.tensorboard"] = tb
  for name in ("PIL", "PIL.Image", "matplotlib", "matplotlib.pyplot"):
    if name not in sys.modules:
      try:
        __import__(name)
      except ImportError:
        sys.modules[name] = types.ModuleType(name)
  sys.modules["PIL"].Image = sys.modules["PIL.Image"]
  sys.modules["matplotlib"].pyplot = sys.modules["matplotlib.pyplot"]

  if not torch.cuda.is_available():
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self


def _dataset_class(torch):
  """The reference's ``Dataset`` (item 2), for any ``C x H x W``."""

  class Dataset(torch.utils.data.Dataset):

    def __init__(self, data_x, data_y=True, train=False, dataset_name=""):
      self.name = dataset_name
      self.train = train
      self.X_data = data_x
      self.y_data = data_y
      if not isinstance(data_y, bool):
        self.y_data = data_y.astype("float32")

    def __len__(self):
      return len(self.X_data)

    def __getitem__(self, idx):
      img = self.X_data[idx]
      if self.train:
        img = np.flip(img, axis=2).copy() if (np.random.rand() > .5) else img
        if np.random.rand() > .5:
          pad = 4
          c, h, w = img.shape
          extended = np.zeros((c, h + pad * 2, w + pad * 2), np.float32)
          extended[:, pad:-pad, pad:-pad] = img
          d1, d2 = np.random.randint(pad * 2 + 1, size=2)
          img = extended[:, d1:d1 + h, d2:d2 + w]
      img = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32))
      if isinstance(self.y_data, bool):
        return img
      return img, self.y_data[idx]

  return Dataset


def _lenet5(torch, in_channels, num_classes, side):
  nn = torch.nn

  class LeNet5(nn.Module):
    """``models/lenet.py``'s layers; ``flag``/``flag_2`` as the reference's
    models take them (``flag_2``: also return the penultimate features)."""

    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(in_channels, 6, 5)
      self.conv2 = nn.Conv2d(6, 16, 5)
      s = ((side - 4) // 2 - 4) // 2
      self.fc1 = nn.Linear(16 * s * s, 120)
      self.fc2 = nn.Linear(120, 84)
      self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x, flag=False, flag_2=False):
      del flag
      f = torch.nn.functional
      x = f.max_pool2d(f.relu(self.conv1(x)), 2)
      x = f.max_pool2d(f.relu(self.conv2(x)), 2)
      x = torch.flatten(x, 1)
      x = f.relu(self.fc1(x))
      embed = f.relu(self.fc2(x))
      out = self.fc3(embed)
      return (embed, out) if flag_2 else out

  return LeNet5


def _data_object(data_path, part_path):
  d = np.load(data_path)
  p = np.load(part_path)
  mean = p["mean"].astype(np.float32)
  std = p["std"].astype(np.float32)

  def norm(x):
    x = (x.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(np.moveaxis(x, -1, 1), np.float32)

  x_train, y_train = norm(d["x_train"]), d["y_train"].astype(np.int64)
  idx, off = p["indices"], p["offsets"]
  parts = [idx[off[k]:off[k + 1]] for k in range(len(off) - 1)]
  clnt_x = [x_train[q] for q in parts]
  clnt_y = [y_train[q].reshape(-1, 1) for q in parts]
  n_cls = int(p["num_classes"])
  obj = types.SimpleNamespace()
  obj.dataset = "mnist"
  obj.n_client = len(parts)
  obj.n_cls = n_cls
  if len({len(q) for q in parts}) == 1:
    obj.clnt_x, obj.clnt_y = np.asarray(clnt_x), np.asarray(clnt_y)
  else:
    obj.clnt_x = np.empty(len(parts), object)
    obj.clnt_y = np.empty(len(parts), object)
    for k in range(len(parts)):
      obj.clnt_x[k], obj.clnt_y[k] = clnt_x[k], clnt_y[k]
  obj.tst_x = norm(d["x_test"])
  obj.tst_y = d["y_test"].astype(np.int64).reshape(-1, 1)
  obj.channels, obj.height, obj.width = obj.tst_x.shape[1:]
  obj.name = f"adapter_{os.path.basename(part_path)}"
  return obj


def _dump(torch, path, s_model, g_model, client_params, clnt_cls_num, rest):
  """Saves one fine-tuning call's inputs (item 7 of the module docstring).

  Copies only: no random number is drawn, so the run is unchanged.
  """
  glb_lr, gen_lr, batch_size, _, weight_decay, dataset_name = rest[:6]
  torch.save({
      "student": {k: v.detach().clone()
                  for k, v in s_model.state_dict().items()},
      "generator": {k: v.detach().clone()
                    for k, v in g_model.state_dict().items()},
      "client_params": np.asarray(client_params, np.float32).copy(),
      "class_counts": np.asarray(clnt_cls_num, np.float32).copy(),
      "glb_lr": float(glb_lr), "gen_lr": float(gen_lr),
      "batch_size": int(batch_size), "weight_decay": float(weight_decay),
      "dataset_name": dataset_name}, path)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ref_dir", required=True,
                  help="checkout of ZhangLin-PKU/FedFTG")
  ap.add_argument("--partition", required=True,
                  help="npz from export_partition.py")
  ap.add_argument("--data", required=True, help="x/y train/test uint8 npz")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--act_prob", type=float, default=0.15)
  ap.add_argument("--local_epochs", type=int, default=5)
  ap.add_argument("--batch_size", type=int, default=50)
  ap.add_argument("--lr", type=float, default=0.1)
  ap.add_argument("--lr_decay", type=float, default=0.998)
  ap.add_argument("--weight_decay", type=float, default=1e-3)
  ap.add_argument("--threads", type=int, default=1)
  ap.add_argument("--init", default="torch", choices=("torch", "flax"),
                  help="LeNet-5's initialisation: PyTorch's default, or "
                  "Flax's (LeCun-normal truncated weights, zero biases) as "
                  "our models/lenet.py; a diagnostic of ours, not the "
                  "reference's protocol")
  ap.add_argument("--skip_train_eval", type=int, default=1)
  ap.add_argument("--out", required=True, help="JSON lines, one per round")
  ap.add_argument("--dump_dir", default="",
                  help="write each round's fine-tuning inputs to "
                  "DIR/round_RRR.pt (for fedftg_server_swap.py)")
  args = ap.parse_args(argv)
  if args.dump_dir:
    os.makedirs(args.dump_dir, exist_ok=True)

  import random  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  _install_stubs(torch)
  sys.path.insert(0, os.path.abspath(args.ref_dir))
  from methods import FedFTG  # pylint: disable=g-import-not-at-top
  from methods import local_fn_gan as lfg  # pylint: disable=g-import-not-at-top
  from models import gan_models  # pylint: disable=g-import-not-at-top

  data_obj = _data_object(args.data, args.partition)
  lfg.Dataset = _dataset_class(torch)
  lenet = _lenet5(torch, data_obj.channels, data_obj.n_cls, data_obj.width)

  n_test = len(data_obj.tst_y)
  original_eval = lfg.get_acc_loss

  def get_acc_loss(data_x, data_y, model, dataset_name, w_decay=None):
    if args.skip_train_eval and len(data_x) != n_test:
      return float("nan"), float("nan")
    return original_eval(data_x, data_y, model, dataset_name, w_decay)

  if args.skip_train_eval:
    lfg.get_acc_loss = get_acc_loss

  original_ft = lfg.train_global_model_cgan_bs_weight_iloop_fz_dis
  log = open(args.out, "w")
  state = {"round": 0, "t0": time.time()}

  def fine_tune(s_model, g_model, t_model, client_params, clnt_cls_num,
                *rest):
    _, before = original_eval(data_obj.tst_x, data_obj.tst_y, s_model,
                              data_obj.dataset, 0)
    if args.dump_dir:
      _dump(torch, os.path.join(args.dump_dir,
                                f"round_{state['round'] + 1:03d}.pt"),
            s_model, g_model, client_params, clnt_cls_num, rest)
    s_model = original_ft(s_model, g_model, t_model, client_params,
                          clnt_cls_num, *rest)
    _, after = original_eval(data_obj.tst_x, data_obj.tst_y, s_model,
                             data_obj.dataset, 0)
    s_model.eval()  # as the reference leaves it
    state["round"] += 1
    rec = {"round": state["round"], "test_accuracy_before_ft": float(before),
           "test_accuracy": float(after), "gain": float(after - before),
           "clients": int(len(client_params)),
           "seconds": round(time.time() - state["t0"], 1)}
    log.write(json.dumps(rec) + "\n")
    log.flush()
    print("ADAPTER", json.dumps(rec), flush=True)
    return s_model

  lfg.train_global_model_cgan_bs_weight_iloop_fz_dis = fine_tune

  # As the reference's train.py: seeds, then the initial models.
  torch.manual_seed(args.seed)
  random.seed(args.seed)
  np.random.seed(args.seed)
  model_func = lenet
  init_model = model_func()
  if args.init == "flax":
    with torch.no_grad():
      for m in init_model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
          fan_in = m.weight[0].numel()
          std = (1.0 / fan_in) ** 0.5 / 0.87962566103423978
          torch.nn.init.trunc_normal_(m.weight, 0.0, std, -2 * std, 2 * std)
          torch.nn.init.zeros_(m.bias)
  init_g_model = gan_models.CGeneratorA(
      nz=100, ngf=64, nc=data_obj.channels, img_size=data_obj.width,
      n_cls=data_obj.n_cls)
  with tempfile.TemporaryDirectory() as tmp:
    FedFTG.train_FedFTG(
        data_obj=data_obj, act_prob=args.act_prob, learning_rate=args.lr,
        batch_size=args.batch_size, epoch=args.local_epochs,
        com_amount=args.rounds, print_per=10**9,
        weight_decay=args.weight_decay, model_func=model_func,
        init_model=init_model, init_g_model=init_g_model, sch_step=1,
        sch_gamma=1.0, save_period=args.rounds, suffix="LeNet5", trial=True,
        data_path=tmp + "/", rand_seed=args.seed,
        lr_decay_per_round=args.lr_decay)
  log.close()


if __name__ == "__main__":
  main()
