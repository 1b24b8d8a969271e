"""Presets that follow a paper's protocol, or its authors' code: each value
asserted against the number the paper (or the code) gives, which the test
names."""

import numpy as np
import pytest

from fedjax_dd.experiments import checks
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import base
from fedjax_dd.experiments.configs import centralized as centralized_config
from fedjax_dd.experiments.configs import dynafed as dynafed_config
from fedjax_dd.experiments.configs import fedd3 as fedd3_config
from fedjax_dd.experiments.configs import fedseq as fedseq_config
from fedjax_dd.experiments.configs import hfldd as hfldd_config
from fedjax_dd.experiments.configs import hfldd_random as random_config
from fedjax_dd.experiments.configs import hfldd_wodd as wodd_config
from tests.conftest import validate_with_shared_data

HFLDD_BASES = ("mnist_c1", "mnist_c2", "mnist_c10", "cifar10_c1",
               "cifar10_c2")
HFLDD_MODULES = (hfldd_config, random_config, wodd_config, fedseq_config)


@pytest.mark.parametrize("module", HFLDD_MODULES + (dynafed_config,))
@pytest.mark.parametrize("name", HFLDD_BASES)
def test_hfldd_gpu_names_are_aliases_of_the_paper_presets(module, name):
  # The _paper presets run on a CPU too; _gpu was their former name.
  paper = module.get_config(f"{name}_paper")
  assert module.get_config(f"{name}_gpu").to_dict() == paper.to_dict()
  validate_with_shared_data(paper)


@pytest.mark.parametrize("name", ["mnist_hfldd", "cifar10_hfldd"])
def test_hfldd_centralized_gpu_names_are_aliases(name):
  paper = centralized_config.get_config(f"{name}_paper")
  assert centralized_config.get_config(f"{name}_gpu").to_dict() == (
      paper.to_dict())
  # Shi et al., Sec. VI-A.1 (80 % / 20 %) and A.4 (T = 300; CL: batch 64,
  # lr 0.01, SGD as pre-training).
  assert (paper.data.resplit, paper.rounds) == (0.8, 300)
  assert (paper.client.optimizer, paper.client.lr,
          paper.client.batch_size) == ("sgd", 0.01, 64)


@pytest.mark.parametrize("module", HFLDD_MODULES[:3])
@pytest.mark.parametrize("name", HFLDD_BASES)
def test_hfldd_paper_presets_carry_sec_vi_a(module, name):
  """Shi et al., Sec. VI-A (``../shared/papers/hfldd.txt``)."""
  c = module.get_config(f"{name}_paper")
  mnist = name.startswith("mnist")
  # A.1: "each dataset is divided into 80% for training and 20% for
  # testing"; 1,000 global samples from FMNIST (MNIST) or Tiny-ImageNet.
  assert c.data.resplit == 0.8
  assert c.data.aux_size == 1000
  assert c.data.aux_dataset == (base.FASHION_MNIST if mnist
                                else base.TINY_IMAGENET_AUX)
  # A.1: 1, 2 or 10 of the ten classes per client.
  assert c.data.partition.num_classes_per_client == int(name.split("_c")[1])
  # A.4: N = 100; pre-training lr 0.01, E_1 = 10 steps, batch 64, SGD.
  assert c.data.num_clients == 100
  assert (c.client.optimizer, c.client.lr) == ("sgd", 0.01)
  assert (c.client.pretrain_steps, c.client.pretrain_batch_size) == (10, 64)
  # A.4: K = 10; |D~_i| = 400; KIP lr 0.004, at most 3,000 iterations,
  # target minibatch of 10, lambda = 1e-6.
  assert c.hfldd.num_homogeneous == 10
  assert c.hfldd.support_size == 400
  assert (c.kip.lr, c.kip.max_iterations, c.kip.target_batch_size,
          c.kip.reg) == (0.004, 3000, 10, 1e-6)
  assert c.kip.stop_accuracy is None  # no accuracy stop in the text
  # A.4: heads train E_2 = 2, batch 32; T = 300 rounds.
  assert (c.client.local_epochs, c.client.batch_size) == (2.0, 32)
  assert c.rounds == 300
  assert not c.paper_departures
  assert c.hfldd.member_data == {hfldd_config: "kip", random_config: "random",
                                 wodd_config: "raw"}[module]


def test_hfldd_smoke_twin_of_the_paper_presets():
  smoke, twin = (hfldd_config.get_config(a) for a in ("smoke", "smoke_paper"))
  assert twin.data.resplit == 0.8  # Sec. VI-A.1's re-split
  twin.data.resplit = 0.0
  assert twin.to_dict() == smoke.to_dict()


@pytest.mark.slow
def test_hfldd_smoke_twin_runs(tmp_path):
  c = hfldd_config.get_config("smoke_paper")
  c.run.progress = False
  s = registry.run(c, str(tmp_path))
  assert np.isfinite(s["final_test_accuracy"])
  assert s["config"]["data"]["resplit"] == 0.8


# The authors' code (github.com/rruisong/FedD3): fedd3_main.py, the README's
# non-IID MNIST command, utils/dd_kip.py and fedd3/fedd3_server.py.
AUTHORS_PRESETS = ("mnist_noniid_kip_authors", "cifar10_noniid_kip_authors",
                   "mnist_noniid_random_authors",
                   "cifar10_noniid_random_authors")


@pytest.mark.parametrize("arg", AUTHORS_PRESETS + ("smoke_authors",))
def test_fedd3_authors_presets_carry_the_authors_code(arg):
  c = fedd3_config.get_config(arg)
  # dd_kip.py: one_hot(..., center=True); class_balanced_sample for every
  # target batch; get_normalization_data on each client's images; the
  # support uploaded unquantised.
  assert c.kip.centered_labels and c.kip.balanced_targets
  assert c.kip.client_normalization and c.fedd3.float_upload
  assert not c.kip.learn_labels  # LEARN_LABELS = False
  # fedd3_server.py: Adam(lr=1e-3 from -slr 0.001, weight_decay=1e-4);
  # README: -sne 500 server epochs of -sbs 50.
  assert (c.client.optimizer, c.client.lr, c.client.weight_decay) == (
      "adam", 1e-3, 1e-4)
  assert c.client.batch_size == 50
  assert c.rounds == (3 if arg == "smoke_authors" else 500)
  checks.check_values(c)
  validate_with_shared_data(c)
  if arg == "smoke_authors":
    return
  # The paper's own values the authors' command repeats (App. C, README):
  # 500 clients, C_k = 2, 1 image per class, KIP lr 0.004, FC depth 4,
  # at most 3,000 iterations, threshold 0.999, target batch 10 (-cib 10).
  assert c.data.num_clients == 500
  assert c.data.partition.num_classes_per_client == 2
  assert c.fedd3.images_per_class == 1
  assert (c.kip.lr, c.kip.kernel, c.kip.kernel_depth, c.kip.reg) == (
      0.004, "fc", 4, 1e-6)
  assert (c.kip.stop_accuracy, c.kip.target_batch_size) == (0.999, 10)
  assert c.kip.max_iterations == (0 if "random" in arg else 3000)
  assert c.model.name == ("alexcifarnet" if arg.startswith("cifar10")
                          else "lenet5")
  assert c.fedd3.distiller == "kip"
  # The random control differs from the KIP preset by KIP's iterations only.
  if "random" in arg:
    kip = fedd3_config.get_config(arg.replace("random", "kip"))
    kip.kip.max_iterations = 0
    assert kip.to_dict() == c.to_dict()


def test_fedd3_authors_smoke_twin_runs(tmp_path):
  c = fedd3_config.get_config("smoke_authors")
  smoke = fedd3_config.get_config("smoke")
  # The smoke run's size and budget with the authors' switches on.
  for path in ("data.dataset", "data.num_clients", "kip.max_iterations",
               "fedd3.images_per_class", "model.name"):
    assert common.config_value(c, path) == common.config_value(smoke, path)
  c.run.progress = False
  s = registry.run(c, str(tmp_path))
  assert np.isfinite(s["final_test_accuracy"])
  # 10 clients x 2 classes x 2 images of 8x8 float32 pixels plus a byte per
  # hard label: 4 · (64 · 32 + 8) bits a client.
  assert s["gce_message_bits"] == [[1, 4 * (64 * 32 + 8)]]
  assert s["privacy"]["uploaded_images"] == 40
  assert s["paper_departures"] == list(fedd3_config.AUTHORS_DEPARTURES)
