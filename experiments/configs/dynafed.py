r"""DynaFed (Pi et al., CVPR 2023) under the HFLDD presets: FedAvg, trajectory
matching on the server after ``L`` rounds, then fine-tuning every aggregate.

  fedjax-dd --config=experiments/configs/dynafed.py:mnist_c1 --workdir=/tmp/dy1
    MNIST, pathological C = 1 on HFLDD's balanced split, 100 clients,
    LeNet-5, E = 2, B = 32, SGD lr 0.01 (the FedAvg presets of fedavg.py,
    which HFLDD's Fig. 3 compares it beside); 15 images per class, 20
    fine-tuning epochs of batch 256 (HFLDD Sec. V-A). Expected with
    --config.rounds=7 (seed 0): about 0.23 at round 7
    (experiments/results/dynafed_mnist_c1.md).
  ...dynafed.py:mnist_c2 / mnist_c10 / cifar10_c1 / cifar10_c2
  ...dynafed.py:<preset>_paper   the authors' synthesis budget (I = 3,000
    matching steps, L = 24 stored rounds, M = 3) and HFLDD's T = 300 rounds
    on its 80 / 20 re-split (HFLDD Sec. VI-A); ``<preset>_gpu`` is an alias.
  ...dynafed.py:smoke   digits, 8 clients, 3 rounds (synthesis at round 2,
    fine-tuning in round 3).

The settings HFLDD does not give come from the authors' code
(``fedjax_dd.algorithms.dynafed``'s docstring): Adam on the images (lr 5e-2)
and on the student rate (lr 1e-5, from 0.04), N = 20 student steps,
fine-tuning by Adam at lr 1e-4.

CPU presets (departures, in ``paper_departures``): synthesis after L = 5
rounds with M = 2 and I = 200 matching steps (the authors: 24 rounds, M = 3,
3,000 steps), so that it fits the CPU and the first rounds HFLDD's Fig. 3
is read at.
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedavg as fedavg_config

CPU_TRAJECTORY_ROUNDS = 5
CPU_EXPERT_ROUNDS = 2
CPU_ITERATIONS = 200
# The HFLDD presets, each also _paper (alias _gpu), and smoke.
_HFLDD = ("mnist_c1", "mnist_c2", "mnist_c10", "cifar10_c1", "cifar10_c2")
PRESETS = ("smoke", *_HFLDD, *(f"{p}_paper" for p in _HFLDD),
           *(f"{p}_gpu" for p in _HFLDD))


def get_config(arg: str = "mnist_c1"):
  gpu = arg.endswith(("_paper", "_gpu"))
  name = arg.removesuffix("_paper").removesuffix("_gpu")
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r}; expected one of {PRESETS} "
                     "(DynaFed runs the HFLDD presets).")
  c = fedavg_config.federated_preset("dynafed", name)
  registry.add_group(c, "dynafed")
  d = c.dynafed
  if name == "smoke":
    c.rounds = 3
    d.images_per_class = 2
    d.trajectory_rounds = 2
    d.expert_rounds = 1
    d.student_steps = 5
    d.iterations = 20
    d.finetune_epochs = 5
    d.finetune_lr = 1e-3
    return c
  if gpu:
    c.rounds = 300
    c.data.resplit = 0.8
    return c
  d.trajectory_rounds = CPU_TRAJECTORY_ROUNDS
  d.expert_rounds = CPU_EXPERT_ROUNDS
  d.iterations = CPU_ITERATIONS
  c.paper_departures = (
      f"Synthesis after L = {CPU_TRAJECTORY_ROUNDS} rounds with M = "
      f"{CPU_EXPERT_ROUNDS} and {CPU_ITERATIONS} matching steps (authors' "
      "code: 24 rounds, M = 3, 3,000 steps), a CPU budget.",
      "The dataset's own train/test split (HFLDD: an 80/20 re-split; "
      "--config.data.resplit=0.8).")
  return c
