"""The notebook path: prepare a task, fit an algorithm with a workdir, resume."""

import json
import os

import jax
import numpy as np
import optax
import pytest

import fedjax_dd
from fedjax_dd.core import fit as fit_lib
from fedjax_dd.core import prepare as prepare_lib
from fedjax_dd.data.sources import Dataset
from fedjax_dd.data.stacked import stack_clients


def _tiny_dataset(num_train=24):
  # 2 classes of 4x4 images: class 0 dark on the left half, class 1 on the
  # right; num_train train and 8 test images.
  rng = np.random.default_rng(0)

  def make(n):
    y = np.arange(n) % 2
    x = rng.integers(0, 40, size=(n, 4, 4, 1)).astype(np.uint8)
    x[y == 0, :, :2] += 200
    x[y == 1, :, 2:] += 200
    return x, y.astype(np.int32)

  x_train, y_train = make(num_train)
  x_test, y_test = make(8)
  return Dataset(x_train=x_train, y_train=y_train, x_test=x_test,
                 y_test=y_test, num_classes=2, name="tiny")


def test_prepare_resizes_and_normalises_with_the_train_split():
  ds = _tiny_dataset()
  p = prepare_lib.prepare(ds, "digits_cnn")  # 8x8x1 model input
  assert p.dataset.x_train.shape == (24, 8, 8, 1)
  assert p.dataset.x_test.shape == (8, 8, 8, 1)
  x = p.dataset.x_train.astype(np.float64) / 255.0
  np.testing.assert_allclose(p.mean, [x.mean()], rtol=1e-5)
  np.testing.assert_allclose(p.std, [x.std()], rtol=1e-4)
  assert p.task.input_shape == (8, 8, 1) and p.task.num_classes == 2


def test_prepare_floors_a_constant_channel_and_rejects_unknown_models():
  ds = _tiny_dataset()
  flat = Dataset(x_train=np.full_like(ds.x_train, 7), y_train=ds.y_train,
                 x_test=ds.x_test, y_test=ds.y_test, num_classes=2,
                 name="flat")
  p = prepare_lib.prepare(flat, "digits_cnn", input_shape=(4, 4, 1))
  assert p.dataset.x_train.shape == (24, 4, 4, 1)  # no resize asked
  np.testing.assert_array_equal(p.std, np.float32([prepare_lib.MIN_STD]))
  with pytest.raises(ValueError, match="lenet6"):
    prepare_lib.prepare(ds, "lenet6")


def test_entry_point_prepares_the_same_task(tmp_path):
  from fedjax_dd.experiments import common  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments.configs import fedavg  # pylint: disable=g-import-not-at-top
  config = fedavg.get_config("smoke")
  cli = common.load_and_prepare(config)
  lib = fedjax_dd.prepare(config.data.dataset, config.model.name)
  np.testing.assert_array_equal(cli.mean, lib.mean)
  np.testing.assert_array_equal(cli.std, lib.std)
  np.testing.assert_array_equal(cli.dataset.x_train, lib.dataset.x_train)
  assert cli.task.module == lib.task.module  # same model and layer forms
  del tmp_path


def test_local_steps_by_hand():
  ds = _tiny_dataset()
  parts = [np.arange(0, 10), np.arange(10, 13), np.arange(13, 24)]
  data = stack_clients(ds.x_train, ds.y_train, parts)  # 10, 3, 11 examples
  # ceil(1.5 * ceil(n / 4)): ceil(1.5 * 3), ceil(1.5 * 1), ceil(1.5 * 3).
  np.testing.assert_array_equal(
      fit_lib.local_steps(data, batch_size=4, epochs=1.5), [5, 2, 5])
  np.testing.assert_array_equal(
      fit_lib.local_steps(data, batch_size=4, steps=3), [3, 3, 3])
  with pytest.raises(ValueError, match="exactly one"):
    fit_lib.local_steps(data, batch_size=4)


def _setup():
  p = prepare_lib.prepare(_tiny_dataset(), "digits_cnn", input_shape=(4, 4, 1))
  ds = p.dataset
  parts = fedjax_dd.iid(ds.y_train, 4, np.random.default_rng(0))
  data = stack_clients(ds.x_train, ds.y_train, parts)
  steps = fit_lib.local_steps(data, batch_size=3, epochs=1.0)
  algo = fedjax_dd.fedavg(fedjax_dd.LocalTraining(p.task, optax.sgd(0.1),
                                                  batch_size=3,
                                                  max_steps=int(steps.max())))
  return p, data, steps, algo


def test_fit_resumed_equals_uninterrupted(tmp_path):
  p, data, steps, algo = _setup()
  kw = dict(clients_per_round=2, seed=3)
  straight = fit_lib.fit(algo, p, data, steps, rounds=3,
                         workdir=tmp_path / "a", **kw)
  first = fit_lib.fit(algo, p, data, steps, rounds=2,
                      workdir=tmp_path / "b", **kw)
  assert [r["round"] for r in first.rows] == [1, 2]
  resumed = fit_lib.fit(algo, p, data, steps, rounds=3,
                        workdir=tmp_path / "b", **kw)
  assert int(resumed.state.round) == 3
  drop = ("wall", "time", "seconds")
  clean = lambda rows: [{k: v for k, v in r.items()
                         if not any(d in k for d in drop)} for r in rows]
  assert clean(resumed.rows) == clean(straight.rows)
  jax.tree.map(np.testing.assert_array_equal, resumed.state.server.params,
               straight.state.server.params)
  # Every row is in the workdir's metrics.jsonl, and a checkpoint exists.
  with open(os.path.join(tmp_path / "b", "metrics.jsonl")) as f:
    assert [json.loads(line)["round"] for line in f] == [1, 2, 3]
  assert os.listdir(tmp_path / "b" / "checkpoints")
  # The ledger counted each round's model exchange.
  assert resumed.ledger.cumulative()["bytes_total"] == (
      straight.ledger.cumulative()["bytes_total"]) > 0


def test_fit_resumed_on_other_devices_warns_and_records_them(tmp_path,
                                                           caplog):
  from fedjax_dd.core import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  p, data, steps, algo = _setup()
  kw = dict(clients_per_round=2, seed=3, workdir=tmp_path / "w")
  with caplog.at_level("WARNING"):
    fit_lib.fit(algo, p, data, steps, rounds=1, **kw)
  assert "another environment" not in caplog.text
  ls = p.task.module.layers
  here = dict(workdir_lib.current_environment(),
              forms={"task.conv_impl": ls.conv_impl,
                     "task.phase_split": ls.phase_split,
                     "task.fuse_first_block": ls.fuse_first_block,
                     "task.fold_norm": ls.fold_norm,
                     "task.dtype": "float32"})
  record = workdir_lib.read_environment(tmp_path / "w")
  assert record == {"started": here, "resumed": []}
  # As if the first round had run with one more host device.
  elsewhere = {**here, "devices": here["devices"] + 1}
  (tmp_path / "w" / workdir_lib.ENVIRONMENT_FILE).write_text(
      json.dumps({"started": elsewhere, "resumed": []}))
  with caplog.at_level("WARNING"):
    resumed = fit_lib.fit(algo, p, data, steps, rounds=2, **kw)
  assert [r["round"] for r in resumed.rows] == [1, 2]  # resumed, not refused
  assert (f"devices {elsewhere['devices']} -> {here['devices']}"
          in caplog.text)
  assert workdir_lib.read_environment(tmp_path / "w") == {
      "started": elsewhere, "resumed": [here]}


def test_fit_without_workdir_and_bad_arguments():
  p, data, steps, algo = _setup()
  result = fit_lib.fit(algo, p, data, steps, rounds=1, clients_per_round=4)
  assert 0.0 <= result.rows[-1]["test_accuracy"] <= 1.0
  with pytest.raises(ValueError, match=r"clients_per_round must be in \[1, 4\]"):
    fit_lib.fit(algo, p, data, steps, rounds=1, clients_per_round=5)
  with pytest.raises(ValueError, match="rounds must be a whole number >= 1"):
    fit_lib.fit(algo, p, data, steps, rounds=0, clients_per_round=2)


def test_plots(tmp_path):
  rows = [{"round": 1, "test_accuracy": 0.5}, {"round": 2},
          {"round": 3, "test_accuracy": 0.75}]
  path = fedjax_dd.plot_history({"a": rows, "b": rows}, tmp_path / "h.png")
  assert os.path.getsize(path) > 0
  fig = fedjax_dd.plot_history(rows)
  (line,) = fig.axes[0].get_lines()
  np.testing.assert_array_equal(line.get_xdata(), [1, 3])  # round 2 skipped
  with pytest.raises(ValueError, match="no row has 'loss'"):
    fedjax_dd.plot_history(rows, key="loss")
  # Rounds are whole: no tick between two rounds (matplotlib put ticks at
  # 1.0, 1.5, ... 3.0 here).
  fig.canvas.draw()
  ticks = fig.axes[0].get_xticks()
  assert len(ticks) > 1 and np.all(ticks == np.round(ticks))
  # A notebook shows the returned figure as a PNG (pyplot never imported).
  assert fig._repr_png_().startswith(b"\x89PNG")
  labels = np.array([0, 0, 1, 2, 2, 2])
  fig = fedjax_dd.plot_partition(labels, [np.array([0, 2]),
                                          np.array([1, 3, 4, 5])])
  heights = [[bar.get_height() for bar in c] for c in fig.axes[0].containers]
  assert heights == [[1, 1], [1, 0], [0, 3]]  # class j's count per client


def _rounds(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line)["round"] for line in f]


def test_fit_refuses_to_resume_another_run_naming_the_difference(tmp_path):
  from fedjax_dd.core import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  p, data, steps, algo = _setup()
  kw = dict(clients_per_round=2, workdir=tmp_path / "w")
  fit_lib.fit(algo, p, data, steps, rounds=1, seed=0, **kw)
  ds = p.dataset
  other_parts = fedjax_dd.iid(ds.y_train, 4, np.random.default_rng(1))
  other_data = stack_clients(ds.x_train, ds.y_train, other_parts)
  five = stack_clients(ds.x_train, ds.y_train,
                       fedjax_dd.iid(ds.y_train, 5, np.random.default_rng(0)))
  five_steps = fit_lib.local_steps(five, batch_size=3, epochs=1.0)
  prox = fedjax_dd.fedprox(fedjax_dd.LocalTraining(p.task, optax.sgd(0.5),
                                                   batch_size=3,
                                                   max_steps=int(steps.max())),
                           mu=0.1)
  mixes = {
      # another seed
      "seed was 0, now 1": lambda: fit_lib.fit(
          algo, p, data, steps, rounds=2, seed=1, **kw),
      # another partition of the same examples
      "data.x was": lambda: fit_lib.fit(
          algo, p, other_data, steps, rounds=2, seed=0, **kw),
      # FedProx at lr 0.5 into a FedAvg run
      "tx.update.step_size was -0.1, now -0.5": lambda: fit_lib.fit(
          prox, p, data, steps, rounds=2, seed=0, **kw),
      # another client count
      "data.num_examples was": lambda: fit_lib.fit(
          fedjax_dd.fedavg(fedjax_dd.LocalTraining(p.task, optax.sgd(0.1),
                                                   batch_size=3,
                                                   max_steps=int(five_steps.max()))),
          p, five, five_steps, rounds=2, seed=0, **kw),
  }
  for named, call in mixes.items():
    with pytest.raises(workdir_lib.FingerprintMismatchError) as info:
      call()
    message = str(info.value)
    assert named in message and "\n" not in message, message
    assert "use a new workdir=" in message
    assert _rounds(tmp_path / "w") == [1]  # nothing mixed in
  # FedProx's own term is named too.
  with pytest.raises(workdir_lib.FingerprintMismatchError,
                     match="regularizer"):
    mixes["tx.update.step_size was -0.1, now -0.5"]()
  # The same run resumes; one more round is appended.
  resumed = fit_lib.fit(algo, p, data, steps, rounds=2, seed=0, **kw)
  assert [r["round"] for r in resumed.rows] == [1, 2]
  assert _rounds(tmp_path / "w") == [1, 2]


def test_a_second_fit_on_a_held_workdir_is_refused(tmp_path):
  import threading  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  p, data, steps, algo = _setup()
  held, release = threading.Event(), threading.Event()

  def hold():  # another thread's fit, between two rounds
    with workdir_lib.WorkdirLock(tmp_path / "w"):
      held.set()
      release.wait(60)

  other = threading.Thread(target=hold)
  other.start()
  held.wait(60)
  try:
    with pytest.raises(workdir_lib.WorkdirBusyError,
                       match="in use by another thread"):
      fit_lib.fit(algo, p, data, steps, rounds=3, clients_per_round=2,
                  workdir=tmp_path / "w")
  finally:
    release.set()
    other.join()
  assert not os.path.exists(tmp_path / "w" / "metrics.jsonl")
  # Two threads running fit at once: one runs, the other is refused.
  outcomes = []

  def run(seed):
    try:
      outcomes.append(len(fit_lib.fit(algo, p, data, steps, rounds=3,
                                      clients_per_round=2, seed=seed,
                                      workdir=tmp_path / "v").rows))
    except (workdir_lib.WorkdirBusyError,
            workdir_lib.FingerprintMismatchError) as e:
      outcomes.append(type(e).__name__)

  threads = [threading.Thread(target=run, args=(s,)) for s in (0, 1)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert 3 in outcomes and len(outcomes) == 2
  assert _rounds(tmp_path / "v") == [1, 2, 3]
  # The thread holding a lock may take it again (the entry point, then fit).
  with workdir_lib.WorkdirLock(tmp_path / "u"):
    fit_lib.fit(algo, p, data, steps, rounds=1, clients_per_round=2,
                workdir=tmp_path / "u")


def test_fit_refuses_fractions_large_seeds_and_clipped_steps():
  p, data, steps, algo = _setup()
  kw = dict(clients_per_round=2)
  with pytest.raises(ValueError, match=r"rounds must be a whole number >= 1, "
                                       r"got 2.7"):
    fit_lib.fit(algo, p, data, steps, rounds=2.7, **kw)
  with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\)"):
    fit_lib.fit(algo, p, data, steps, rounds=1, seed=2**32, **kw)
  # max_steps 3 (ceil(6 / 3) = 2 steps, plus one) against 10x the steps.
  short = fedjax_dd.fedavg(fedjax_dd.LocalTraining(p.task, optax.sgd(0.1),
                                                   batch_size=3, max_steps=3))
  with pytest.raises(ValueError, match="asks up to 30 local steps, but the "
                                       "algorithm's local update was built "
                                       "with max_steps=3"):
    fit_lib.fit(short, p, data, steps * 15, rounds=1, **kw)


def test_prepare_logs_a_resize(caplog):
  tiny = _tiny_dataset()
  one = Dataset(x_train=tiny.x_train[:, :1, :1], y_train=tiny.y_train,
                x_test=tiny.x_test[:, :1, :1], y_test=tiny.y_test,
                num_classes=2, name="one_pixel")
  with caplog.at_level("WARNING"):
    p = prepare_lib.prepare(one, "digits_cnn")
  assert p.dataset.x_train.shape[1:] == (8, 8, 1)
  assert ("one_pixel: images resized from 1x1x1 to 8x8x1 (bilinear) for "
          "model digits_cnn.") in caplog.text
