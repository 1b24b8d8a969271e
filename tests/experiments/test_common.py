"""Config glue of experiments/common.py: re-split, steps, KIP options, stats."""

import dataclasses

import ml_collections
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core import keys
from fedjax_dd.data import preprocess
from fedjax_dd.data import sources
from fedjax_dd.distill.kip import KipOptions
from fedjax_dd.experiments import common
from fedjax_dd.experiments.configs import fedd3 as fedd3_config
from fedjax_dd.experiments.configs import hfldd as hfldd_config


def _config(**kw):
  return ml_collections.ConfigDict({"data": {
      "dataset": "digits", "data_dir": "", "seed": 0, "resplit": 0.0, **kw}})


def test_load_dataset_resplit_80_20_on_digits():
  plain = common.load_dataset(_config())
  assert (plain.x_train.shape[0], plain.x_test.shape[0]) == (1437, 360)
  re = common.load_dataset(_config(resplit=0.8))
  # 1,797 pooled images: round(1437.6) = 1438 train, 359 test.
  assert (re.x_train.shape[0], re.x_test.shape[0]) == (1438, 359)
  # The named stream is default_rng([data.seed, 5]), as it has always been.
  for rng in (keys.numpy_stream(0, keys.Stream.RESPLIT),
              np.random.default_rng([0, 5])):
    want = sources.resplit(plain, 0.8, rng=rng)
    np.testing.assert_array_equal(re.x_test, want.x_test)
    np.testing.assert_array_equal(re.y_train, want.y_train)
  other = common.load_dataset(_config(resplit=0.8, seed=1))
  assert not np.array_equal(other.y_test, re.y_test)


def test_local_steps_from_steps_or_epochs():
  n = np.array([0, 1, 16, 17, 100])
  c = ml_collections.ConfigDict({"client": {"batch_size": 16, "local_steps": 0,
                                            "local_epochs": 1.0}})
  np.testing.assert_array_equal(common.local_steps(c, n), [0, 1, 1, 2, 7])
  c.client.local_epochs = 2.0
  np.testing.assert_array_equal(common.local_steps(c, n), [0, 2, 2, 4, 14])
  c.client.local_steps = 5          # overrides the epochs
  np.testing.assert_array_equal(common.local_steps(c, n), [0, 5, 5, 5, 5])


def test_kip_options_one_name_per_setting():
  c = fedd3_config.get_config("mnist_noniid_kip_labels")
  opts = common.kip_options(c)
  assert opts == KipOptions(max_iterations=3000, learn_labels=True,
                            clip_pixels=True)
  for f in dataclasses.fields(KipOptions):   # every field from kip.<field>
    assert c.kip[f.name] == getattr(opts, f.name)
  h = common.kip_options(hfldd_config.get_config("smoke"))
  assert h.stop_accuracy is None and h.max_iterations == 4
  assert h.segment_iterations == 2


def test_kip_kernel_depth_zero_is_the_kernels_default():
  c = hfldd_config.get_config("smoke")
  x = np.random.default_rng(0).normal(size=(3, 8, 8, 1)).astype(np.float32)
  from fedjax_dd.kernels import native
  np.testing.assert_allclose(common.kip_kernel(c)(x, x),
                             native.fc_kernel(depth=4)(x, x), rtol=1e-6)
  c.kip.kernel = "nope"
  with pytest.raises(ValueError, match="kip.kernel"):
    common.kip_kernel(c)


def test_kip_kernel_impl_selects_the_implementation():
  c = hfldd_config.get_config("smoke")
  assert c.kip.kernel_impl == "native"   # the default
  x = np.random.default_rng(0).normal(size=(3, 8, 8, 1)).astype(np.float32)
  from fedjax_dd.kernels import native
  c.kip.kernel_impl = "native"
  np.testing.assert_allclose(common.kip_kernel(c)(x, x),
                             native.fc_kernel(depth=4)(x, x), rtol=1e-6)
  c.kip.kernel, c.kip.kernel_depth, c.kip.kernel_kind = "conv", 2, "nngp"
  np.testing.assert_allclose(
      common.kip_kernel(c)(x, x),
      native.conv_kernel(depth=2, kind="nngp")(x, x), rtol=1e-6)
  c.kip.kernel_impl = "nt"
  with pytest.raises(ValueError, match="kip.kernel_impl"):
    common.kip_kernel(c)


def test_kip_kernel_impl_neural_tangents():
  pytest.importorskip("neural_tangents")  # The optional `nt` extra.
  from fedjax_dd.kernels import ntk
  c = hfldd_config.get_config("smoke")
  c.kip.kernel_impl = "neural_tangents"
  x = np.random.default_rng(0).normal(size=(3, 8, 8, 1)).astype(np.float32)
  np.testing.assert_allclose(common.kip_kernel(c)(x, x),
                             ntk.fc_kernel(depth=4)(x, x), rtol=1e-6)


def test_prepared_task_uses_the_resolved_conv_impl():
  from fedjax_dd import models
  c = fedd3_config.get_config("smoke")
  assert c.model.conv_impl == "auto"
  assert (common.load_and_prepare(c).task.module.layers.conv_impl
          == models.resolve_conv_impl("auto"))
  c.model.conv_impl = "patches"
  assert (common.load_and_prepare(c).task.module.layers.conv_impl
          == "patches")


def test_prepared_channel_stats_are_the_floored_train_stats(monkeypatch):
  c = fedd3_config.get_config("smoke")
  p = common.load_and_prepare(c)
  mean, std = preprocess.channel_stats(p.dataset.x_train)
  np.testing.assert_array_equal(p.mean, mean)
  np.testing.assert_array_equal(p.std, std)         # digits: above the floor
  assert p.std.dtype == np.float32
  # A constant channel would divide by zero: its std is floored.
  flat = dataclasses.replace(
      p.dataset, x_train=np.full_like(p.dataset.x_train, 7))
  monkeypatch.setattr(common, "load_dataset", lambda config: flat)
  q = common.load_and_prepare(c)
  np.testing.assert_array_equal(q.std, np.float32([common.MIN_STD]))
  np.testing.assert_allclose(q.mean, [7 / 255], rtol=1e-6)


@pytest.mark.parametrize("path, value, message", [
    ("rounds", 0, "config.rounds must be a finite number >= 1"),
    ("run.eval_every", 0, "config.run.eval_every must be"),
    ("client.lr", float("nan"), "config.client.lr must be a finite number > 0"),
    ("client.lr", -0.1, "config.client.lr must be"),
    ("client.momentum", 1.0, "momentum must be < 1"),
    ("client.batch_size", 0, "config.client.batch_size must be"),
    ("model.conv_impl", "im2col", "config.model.conv_impl must be one of"),
])
def test_validate_refuses_unusable_settings(path, value, message):
  from fedjax_dd.experiments.configs import base as base_lib
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")
  common.validate(config)  # the preset itself is fine
  base_lib.set_path(config, path, value)
  with pytest.raises(ValueError, match=message):
    common.validate(config)


def test_validate_refuses_local_training_without_work():
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")
  config.client.local_epochs, config.client.local_steps = 0.0, 0
  with pytest.raises(ValueError, match="no work"):
    common.validate(config)


@pytest.mark.parametrize("name", ["fedhydra", "dense"])
def test_validate_refuses_lr_decay_where_clients_train_in_one_round(name):
  import importlib
  config = importlib.import_module(
      f"fedjax_dd.experiments.configs.{name}").get_config("smoke")
  common.validate(config)
  config.client.lr_decay = 0.9
  with pytest.raises(ValueError, match=(
      r"^\w+'s clients train once, in one round: config.client.lr_decay "
      r"must be 1.0, got 0.9; set --config.client.lr_decay=1.0.$")):
    common.validate(config)


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "disue", "hfldd",
                                  "fedd3", "centralized", "dynafed",
                                  "fedseq"])
def test_validate_lets_a_decaying_method_decay(name):
  import importlib
  config = importlib.import_module(
      f"fedjax_dd.experiments.configs.{name}").get_config("smoke")
  config.client.lr_decay = 0.9
  common.validate(config)


def test_methods_that_once_trained_at_a_constant_rate_follow_the_round():
  # The engine hands every local update the round: centralized training,
  # DynaFed's clients and FedSeq's members decay with it too. Round index 2
  # of gamma = 0.5 is the step of a quarter of the rate at round index 0
  # (index 2: FedSeq's two-member ring starts at member 0 again, and
  # DynaFed stores both rounds' models before its synthesis round).
  import optax
  from fedjax_dd.algorithms import centralized, dynafed, fedseq
  from fedjax_dd.core.algorithm import Cohort
  from fedjax_dd.core.local import LocalTraining, round_decay
  from tests.conftest import synthetic_clients, tiny_task
  task = tiny_task()
  x, y, n = synthetic_clients(num_clients=2, sizes=(8, 8), n_max=8)
  params, stats = task.init(jax.random.PRNGKey(0))
  key = jax.random.PRNGKey(3)

  def one(build, cohort, lr, decay):
    alg = build(LocalTraining(task, optax.sgd(lr), batch_size=4, max_steps=1,
                              schedule=round_decay(decay)))
    server, clients = alg.init(params, stats, cohort.client_ids.shape[0])
    return alg.apply(server, clients, cohort, key)[0].params

  flat = lambda k: Cohort(x=jnp.asarray(x[:k]), y=jnp.asarray(y[:k]),
                          num_examples=jnp.asarray(n[:k]),
                          num_steps=jnp.ones((k,), jnp.int32),
                          client_ids=jnp.arange(k))
  ring = Cohort(x=jnp.asarray(x)[None], y=jnp.asarray(y)[None],
                num_examples=jnp.asarray(n)[None],
                num_steps=jnp.ones((1, 2), jnp.int32),
                client_ids=jnp.arange(1))
  for build, cohort in (
      (centralized.centralized, flat(1)),
      (lambda t: dynafed.dynafed(t), flat(2)),
      (lambda t: fedseq.fedseq(t, group_size=2), ring)):
    third = cohort.replace(round=jnp.int32(2))
    got = one(build, third, 0.4, 0.5)
    want = one(build, cohort, 0.1, 1.0)
    undecayed = one(build, third, 0.4, 1.0)
    for a, b in zip(jax.tree_util.tree_leaves(got),
                    jax.tree_util.tree_leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not all(np.allclose(a, b) for a, b in zip(
        jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(undecayed)))


def test_hfldd_pretraining_is_plain_sgd_without_the_rounds_augment_or_decay(
    monkeypatch):
  # HFLDD's label-knowledge pretraining (Sec. IV-A) is plain local SGD at
  # client.pretrain_batch_size, whatever the rounds' augment and lr_decay.
  import types
  from fedjax_dd.algorithms import hfldd_stages
  from tests.conftest import tiny_task
  config = hfldd_config.get_config("smoke")
  config.client.augment, config.client.lr_decay = "flip_crop", 0.9
  config.client.pretrain_batch_size = 8
  given = []
  monkeypatch.setattr(hfldd_stages, "label_knowledge_clusters",
                      lambda training, *args, **kwargs: given.append(training))
  task = tiny_task()
  common.label_knowledge_clusters(config, types.SimpleNamespace(task=task),
                                  None, None, None, keys.model_root(0))
  (training,) = given
  assert training.task is task and training.batch_size == 8
  assert training.augment is None and training.schedule is None
  rounds = common.local_training(config, task, 1)
  assert rounds.augment is not None and rounds.schedule.gamma == 0.9


def test_fingerprint_leaves_out_resume_safe_settings():
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")
  fp = common.fingerprint(config)
  assert fp["data.num_clients"] == 8 and fp["model.name"] == "digits_cnn"
  assert "server.teachers_from" in fp        # a path whose contents count
  assert not [k for k in fp if k == "rounds" or k.split(".")[0] in (
      "run", "engine") or k in ("paper_departures", "data.data_dir")]
  config.rounds, config.run.eval_every, config.engine.backend = 9, 3, "vmap"
  assert common.fingerprint(config) == fp
  config.data.seed = 1
  assert common.fingerprint(config)["data.seed"] == 1


def test_validate_names_the_options_of_each_partition():
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")   # pathological(2)
  assert common.partition_options("dirichlet") == (("alpha",), ("min_size",))
  config.data.partition.name = "dirichlet"
  with pytest.raises(ValueError) as info:
    common.validate(config)
  message = str(info.value)
  assert "does not take num_classes_per_client, style" in message
  assert "it needs alpha" in message
  assert "dirichlet: alpha, [min_size]" in message
  assert "pathological: num_classes_per_client, style" in message
  assert "iid: no options" in message
  config.data.partition = ml_collections.ConfigDict({"name": "nope"})
  with pytest.raises(ValueError, match="'nope' is not a partition"):
    common.validate(config)
  config.data.partition = ml_collections.ConfigDict({"name": "iid"})
  common.validate(config)


def _client_config(**client):
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")
  for k, v in client.items():
    config.client[k] = v
  return config


def test_make_optimizer_defaults_are_the_bare_optimizer():
  import jax.numpy as jnp
  import optax
  params = {"w": jnp.array([1.0, -2.0])}
  grads = {"w": jnp.array([30.0, 40.0])}
  for name in ("sgd", "adam"):
    opt = common.make_optimizer(_client_config(optimizer=name, lr=0.1))
    ref = optax.sgd(0.1) if name == "sgd" else optax.adam(0.1)
    got, _ = opt.update(grads, opt.init(params), params)
    want, _ = ref.update(grads, ref.init(params), params)
    np.testing.assert_array_equal(got["w"], want["w"])


def test_make_optimizer_clips_then_decays_then_steps():
  import jax.numpy as jnp
  params = {"w": jnp.array([1.0, -2.0])}
  grads = {"w": jnp.array([30.0, 40.0])}   # norm 50
  opt = common.make_optimizer(_client_config(lr=0.1, grad_clip=10.0,
                                             weight_decay=1e-3))
  updates, _ = opt.update(grads, opt.init(params), params)
  # PyTorch: clip_grad_norm_(10) -> g = (6, 8); SGD adds wd * w; step -lr.
  expect = -0.1 * (np.array([6.0, 8.0]) + 1e-3 * np.array([1.0, -2.0]))
  np.testing.assert_allclose(updates["w"], expect, rtol=1e-6)


@pytest.mark.parametrize("path, value, message", [
    ("client.grad_clip", -1.0, "config.client.grad_clip must be"),
    ("client.lr_decay", 0.0, "config.client.lr_decay must be a finite number > 0"),
    ("client.augment", "mixup", "config.client.augment must be"),
])
def test_validate_refuses_new_client_keys(path, value, message):
  from fedjax_dd.experiments.configs import base as base_lib
  config = _client_config(grad_clip=10.0, lr_decay=0.998, augment="flip_crop")
  common.validate(config)
  assert common.augmentation(config) is not None
  assert common.augmentation(_client_config()) is None
  base_lib.set_path(config, path, value)
  with pytest.raises(ValueError, match=message):
    common.validate(config)


def test_local_training_is_the_client_group_in_one_value():
  import jax.numpy as jnp
  from fedjax_dd.core.clients import ClientMapper
  from tests.conftest import tiny_task
  task = tiny_task()
  config = _client_config(batch_size=7, lr=0.1, grad_clip=10.0,
                          lr_decay=0.998, augment="flip_crop")
  config.engine.backend = "loop"
  training = common.local_training(config, task, 5)
  assert (training.task, training.batch_size, training.max_steps,
          training.schedule.gamma) == (task, 7, 5, 0.998)
  assert training.augment is not None
  assert isinstance(training.mapper, ClientMapper)
  assert training.mapper.backend == "loop"
  # The optimizer is the config's chain: clip to norm 10, then SGD.
  params = {"w": jnp.array([1.0, -2.0])}
  grads = {"w": jnp.array([30.0, 40.0])}
  updates, _ = training.optimizer.update(
      grads, training.optimizer.init(params), params)
  np.testing.assert_allclose(updates["w"], [-0.6, -0.8], rtol=1e-6)
  plain = common.local_training(_client_config(), task, 5)
  assert plain.augment is None and plain.schedule is None


def test_dirichlet_client_is_registered_and_checked():
  from fedjax_dd.experiments.configs import base as base_lib
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  assert common.partition_options("dirichlet_client") == (("alpha",),
                                                          ("client_size",))
  config = fedavg_config.get_config("smoke")
  config.data.partition = base_lib.dirichlet_client(0.01)
  common.validate(config)
  labels = np.arange(40) % 4
  config.data.num_clients = 4
  parts = common.partition(config, labels)
  assert [p.size for p in parts] == [10] * 4
  again = common.partition(config, labels)
  for a, b in zip(parts, again):
    np.testing.assert_array_equal(a, b)
  config.data.partition = base_lib.dirichlet(0.5)
  config.data.partition.name = "dirichlet_client"
  with pytest.raises(ValueError, match="does not take min_size"):
    common.validate(config)


def test_neural_tangents_without_its_extra_is_refused_before_compute(
    monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "neural_tangents"
                      else real(name, *a))
  c = hfldd_config.get_config("smoke")
  c.kip.kernel_impl = "neural_tangents"
  with pytest.raises(ValueError, match=r"fedjax-dd\[nt\]"):
    common.validate(c)
  c.kip.kernel_impl = "native"
  common.validate(c)


def test_os_fedavg_declares_one_round():
  from fedjax_dd.experiments.configs import os_fedavg as os_config  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  config = os_config.get_config("smoke")
  registry.check_method(config)  # rounds = 1
  config.rounds = 5
  with pytest.raises(ValueError, match="os_fedavg is one-shot.*rounds must be 1, got 5"):
    registry.check_method(config)


@pytest.mark.parametrize("path, value, message", [
    ("eval.split", "train", "config.eval.split must be one of"),
    ("eval.test_fraction", 1.0, "config.eval.test_fraction must lie in"),
    ("eval.finetune_steps", -1, "config.eval.finetune_steps must be"),
    ("eval.batch_size", 0, "config.eval.batch_size must be"),
])
def test_validate_refuses_unusable_personal_evaluation(path, value, message):
  from fedjax_dd.experiments.configs import base as base_lib
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")
  config.eval.personal = True
  common.validate(config)
  base_lib.set_path(config, path, value)
  with pytest.raises(ValueError, match=message):
    common.validate(config)


def test_personal_evaluation_only_where_rounds_run_it():
  from fedjax_dd.experiments.configs import fedhydra as fedhydra_config
  config = fedhydra_config.get_config("smoke")
  common.validate(config)
  config.eval.personal = True
  with pytest.raises(ValueError, match="runner 'fedhydra' does not run "
                     "personalized evaluation"):
    common.validate(config)


def test_personal_settings_are_part_of_the_run_fingerprint():
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")
  fp = common.fingerprint(config)
  assert fp["eval.personal"] is False and "eval.batch_size" not in fp
  config.eval.personal, config.eval.finetune_steps = True, 5
  assert common.fingerprint(config)["eval.finetune_steps"] == 5
  assert "eval.personal" not in common.fingerprint(config, "hfldd_stages")


@pytest.mark.parametrize("split", ["test", "client"])
def test_personal_split_is_deterministic_from_the_partition_seed(split):
  from fedjax_dd.experiments.configs import fedavg as fedavg_config
  config = fedavg_config.get_config("smoke")
  config.eval.personal, config.eval.split = True, split
  prepared = common.load_and_prepare(config)
  parts = common.partition(config, prepared.dataset.y_train)
  train, test = common.personal_split(config, prepared, parts)
  again_train, again = common.personal_split(config, prepared, parts)
  np.testing.assert_array_equal(np.asarray(test.y), np.asarray(again.y))
  assert test.num_clients == len(parts) == len(train)
  y = np.asarray(prepared.dataset.y_train)
  if split == "client":
    # About a fifth of each client's examples, every class kept in training.
    for p, t, n in zip(parts, train, np.asarray(test.num_examples)):
      assert t.size + n == p.size and abs(n - 0.2 * p.size) <= 10
      assert set(y[t]) == set(y[p])
  else:
    assert all(np.array_equal(a, b) for a, b in zip(parts, train))
    assert int(np.sum(test.num_examples)) > 0.9 * len(
        prepared.dataset.y_test)
  config.data.seed = 1
  _, other = common.personal_split(config, prepared, parts)
  assert not np.array_equal(np.asarray(other.y), np.asarray(test.y))
  config.eval.personal = False
  assert common.personal_split(config, prepared, parts) == (parts, None)
