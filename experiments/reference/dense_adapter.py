r"""Adapter: runs DENSE's released server distillation on teachers of ours.

This is *our* glue, not DENSE's code. It imports the reference's modules from
a checkout given by ``--ref_dir`` (github.com/zj-jayzhang/DENSE, commit
237c5dda707ce179740093ebf043f1549adc8266; see
``experiments/reference/README.md``) and runs the ``--type=kd_train`` branch
of its ``loop_df_fl.py`` (the branch is the script's ``__main__`` body, so its
lines are repeated here in order): ``helpers.synthesizers.AdvSynthesizer``
(``gen_data`` each epoch) and ``loop_df_fl.kd_train`` unchanged, on the
client models exported by ``torch_export.py``.

  PYTHONPATH=KORNIA_SITE .venv/bin/python experiments/reference/dense_adapter.py \
      --ref_dir=REF --teachers=teachers.pt \
      --data=../shared/datasets/mnist.npz --seed=0 --epochs=E \
      --out=ref_seed0.jsonl

Defaults: the README's distillation command (``--lr=0.005 --batch_size 256
--synthesis_batch_size=256 --g_steps 30 --lr_g 1e-3 --bn 1.0 --oh 1.0 --T 20
--adv=1``) with the script's other defaults (``nz = 256``; the generator's
``ngf = 64``).

What the adapter supplies (nothing in ``--ref_dir`` is edited):

1. **Teachers.** ``local_weights`` is the list of state dicts in
   ``--teachers``; each model is our architecture
   (``torch_export.build_torch``) behind our normalisation
   (``torch_export.normalized``), so it reads images in ``[0, 1]`` as
   DENSE's MNIST pipeline feeds them. As in the script, every teacher is a
   ``copy.deepcopy`` of the global model with the client's weights loaded.
2. **Student.** ``get_model(args)`` is replaced by a fresh model of the same
   architecture (PyTorch's default initialisation), as the script's student
   is a fresh ``CNNMnist``.
3. **Test data.** ``--data``'s ``x_test / y_test`` (uint8 NHWC) as float
   ``[0, 1]`` NCHW, batches of 256 in order, for the script's ``test``.
4. **CPU.** ``Tensor.cuda`` and ``Module.cuda`` return the object unchanged
   when no GPU exists.
5. **Unused or unavailable imports.** ``wandb``, ``ipdb``, ``models.vit``
   (imports ``torch._six``, gone from torch 2) and ``torchvision`` are
   replaced by stand-ins; those of ``torchvision`` do exactly what the
   synthesizer uses (``Compose``, ``RandomHorizontalFlip``, ``ToTensor``;
   ``save_image`` a no-op). ``kornia`` is the real one.
6. **Logging.** One JSON line per epoch to ``--out`` (``epoch``,
   ``test_accuracy``, ``seconds``, the BatchNorm hooks its synthesizer
   registered, whether the teachers are in training mode).

The reference's ensembles keep the teachers in a plain Python list, which
``torch.nn.Module`` does not register as submodules, so its synthesizer
registers no BatchNorm hook and ``--bn`` has no effect (``bn_hooks: 0``).
``--module_list`` (a diagnostic of ours, off by default) passes the same
teachers as a ``torch.nn.ModuleList``, so that ``L_BN`` takes effect as the
code reads.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time
import types

import numpy as np


def _install_stand_ins() -> None:
  """Stand-ins for the modules the reference imports but we cannot or need
  not provide (module doc, item 5)."""
  import torch  # pylint: disable=g-import-not-at-top

  def module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod

  class Compose:

    def __init__(self, transforms):
      self.transforms = list(transforms)

    def __call__(self, x):
      for t in self.transforms:
        x = t(x)
      return x

  class RandomHorizontalFlip:

    def __init__(self, p=0.5):
      self.p = p

    def __call__(self, img):
      from PIL import Image  # pylint: disable=g-import-not-at-top
      if torch.rand(1).item() < self.p:
        return img.transpose(Image.FLIP_LEFT_RIGHT)
      return img

  class ToTensor:

    def __call__(self, img):
      a = np.asarray(img, np.float32) / 255.0
      if a.ndim == 2:
        a = a[:, :, None]
      return torch.from_numpy(a.transpose(2, 0, 1).copy())

  def _unused(*args, **kwargs):
    raise NotImplementedError("not supplied by the adapter")

  transforms = module("torchvision.transforms", Compose=Compose,
                      RandomHorizontalFlip=RandomHorizontalFlip,
                      ToTensor=ToTensor, RandomCrop=_unused,
                      Normalize=_unused)
  utils = module("torchvision.utils", save_image=lambda *a, **k: None)
  datasets = module("torchvision.datasets")
  models = module("torchvision.models")
  module("torchvision", transforms=transforms, utils=utils,
         datasets=datasets, models=models)
  module("wandb", init=lambda *a, **k: None, log=lambda *a, **k: None)
  module("ipdb", set_trace=lambda *a, **k: None)


def _cpu_cuda() -> None:
  """``.cuda()`` as the identity on a CPU-only torch (module doc, item 4)."""
  import torch  # pylint: disable=g-import-not-at-top
  if not torch.cuda.is_available():
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self


def _import_reference(ref_dir: str):
  """``loop_df_fl`` and ``helpers.synthesizers`` from the checkout."""
  ref_dir = os.path.abspath(ref_dir)
  sys.path.insert(0, ref_dir)
  import torch  # pylint: disable=g-import-not-at-top
  stub_vit = types.ModuleType("models.vit")
  stub_vit.deit_tiny_patch16_224 = None
  sys.modules["models.vit"] = stub_vit
  import models  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  models.vit = stub_vit
  spec = importlib.util.spec_from_file_location(
      "loop_df_fl", os.path.join(ref_dir, "loop_df_fl.py"))
  loop = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(loop)  # Its __main__ body does not run.
  from helpers import synthesizers  # pylint: disable=g-import-not-at-top
  del torch
  return loop, synthesizers


def _load_export(path: str):
  here = pathlib.Path(__file__).resolve().parent
  spec = importlib.util.spec_from_file_location("torch_export",
                                                here / "torch_export.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  import torch  # pylint: disable=g-import-not-at-top
  return mod, torch.load(path, weights_only=False)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--ref_dir", required=True)
  p.add_argument("--teachers", required=True,
                 help="torch_export.py's output")
  p.add_argument("--data", required=True, help="npz with x_test, y_test")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--epochs", type=int, default=200)
  # The README's kd_train command and the script's defaults.
  p.add_argument("--lr", type=float, default=0.005)
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--synthesis_batch_size", type=int, default=256)
  p.add_argument("--g_steps", type=int, default=30)
  p.add_argument("--lr_g", type=float, default=1e-3)
  p.add_argument("--bn", type=float, default=1.0)
  p.add_argument("--oh", type=float, default=1.0)
  p.add_argument("--T", type=float, default=20.0)
  p.add_argument("--adv", type=float, default=1.0)
  p.add_argument("--nz", type=int, default=256)
  p.add_argument("--threads", type=int, default=0,
                 help="torch.set_num_threads (0: torch's default)")
  p.add_argument("--save_dir", default="",
                 help="the synthesizer's image pool (default: a temp dir)")
  p.add_argument("--module_list", action="store_true",
                 help="diagnostic of ours: hand the reference its teachers "
                      "as a torch.nn.ModuleList (module doc)")
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)

  _install_stand_ins()
  _cpu_cuda()
  import torch  # pylint: disable=g-import-not-at-top
  if args.threads:
    torch.set_num_threads(args.threads)
  loop, synthesizers = _import_reference(args.ref_dir)
  export, saved = _load_export(args.teachers)
  from models.generator import Generator  # pylint: disable=g-import-not-at-top

  def get_model():
    net = export.build_torch(saved["features"], saved["kernel_size"],
                             saved["num_classes"], saved["channels"],
                             tuple(saved["image_hw"]))
    return export.normalized(net, saved["mean"], saved["std"])

  data = np.load(args.data)
  x_test = torch.from_numpy(
      (data["x_test"].astype(np.float32) / 255.0).transpose(0, 3, 1, 2))
  y_test = torch.from_numpy(data["y_test"].astype(np.int64))
  test_loader = torch.utils.data.DataLoader(
      torch.utils.data.TensorDataset(x_test, y_test), batch_size=256,
      shuffle=False)
  loop.test_loader = test_loader

  # loop_df_fl.py's __main__, --type=kd_train, in order.
  loop.setup_seed(args.seed)
  global_model = get_model()
  global_model.train()
  local_weights = saved["state_dicts"]
  global_weights = loop.average_weights(
      [{k: v.clone() for k, v in w.items()} for w in local_weights])
  inner = lambda w: {f"model.{k}": v for k, v in w.items()}
  buffers = {k: v for k, v in global_model.state_dict().items()
             if not k.startswith("model.")}  # our normaliser's mean / std.
  global_model.load_state_dict({**inner(global_weights), **buffers})
  avg_acc, _ = loop.test(global_model, test_loader)
  model_list = []
  for w in local_weights:
    net = copy.deepcopy(global_model)
    net.load_state_dict({**inner(w), **buffers})
    model_list.append(net)
  if args.module_list:
    model_list = torch.nn.ModuleList(model_list)
  ensemble_model = loop.Ensemble(model_list)
  ens_acc, _ = loop.test(ensemble_model, test_loader)
  global_model = get_model()

  nz = args.nz
  nc, img_size = saved["channels"], saved["image_hw"][0]
  generator = Generator(nz=nz, ngf=64, img_size=img_size, nc=nc)
  num_class = saved["num_classes"]
  save_dir = args.save_dir or tempfile.mkdtemp(prefix="dense_pool_")
  hooks = []
  hook_cls = synthesizers.DeepInversionHook

  class CountingHook(hook_cls):  # Counts the hooks the synthesizer makes.

    def __init__(self, module):
      super().__init__(module)
      hooks.append(self)

  synthesizers.DeepInversionHook = CountingHook
  synthesizer = synthesizers.AdvSynthesizer(
      ensemble_model, model_list, global_model, generator, nz=nz,
      num_classes=num_class, img_size=(nc, img_size, img_size),
      iterations=args.g_steps, lr_g=args.lr_g,
      synthesis_batch_size=args.synthesis_batch_size,
      sample_batch_size=args.batch_size, adv=args.adv, bn=args.bn,
      oh=args.oh, save_dir=save_dir,
      dataset="cifar10" if nc == 3 else "mnist")  # its branch key
  criterion = loop.KLDiv(T=args.T)
  optimizer = torch.optim.SGD(global_model.parameters(), lr=args.lr,
                              momentum=0.9)
  global_model.train()
  with open(args.out, "w") as out:
    out.write(json.dumps({
        "reference": "zj-jayzhang/DENSE@237c5dda707ce179740093ebf043f1549adc8266",
        "args": vars(args), "fedavg_accuracy": avg_acc / 100,
        "ensemble_accuracy_as_run": ens_acc / 100,
        "teachers_training_mode": [m.training for m in model_list]}) + "\n")
    for epoch in range(args.epochs):
      start = time.time()
      synthesizer.gen_data(epoch)
      loop.kd_train(synthesizer, [global_model, ensemble_model], criterion,
                    optimizer)
      acc, loss = loop.test(global_model, test_loader)
      out.write(json.dumps({
          "epoch": epoch + 1, "test_accuracy": acc / 100, "test_loss": loss,
          "bn_hooks": len(hooks),
          "teachers_training_mode": any(m.training for m in model_list),
          "seconds": time.time() - start}) + "\n")
      out.flush()


if __name__ == "__main__":
  main()
