"""KIP's segment checkpoints: a call killed after a segment and resumed
returns what an uninterrupted call returns, bit for bit."""

import jax
import numpy as np
import pytest

from fedjax_dd.core.stage_cache import StageCache, StaleStageError, TreeCheckpoint
from fedjax_dd.distill import kip
from fedjax_dd.kernels.native import fc_kernel
from tests.distill.test_kip import MEAN, STD, _args, _clients


class _Killed(Exception):
  pass


class _MemoryStore:
  """Keeps the last saved segment in memory; raises after ``kill_after``
  saves (the run stopped right after that segment was saved)."""

  def __init__(self, kill_after=None):
    self.saved, self.kill_after, self.saves, self.resumed = None, kill_after, 0, None

  def resume(self, template):
    if self.saved is None:
      return None
    state, done = self.saved
    # What a store hands back: host arrays of the template's shapes.
    assert jax.tree_util.tree_structure(state) == (
        jax.tree_util.tree_structure(template))
    self.resumed = done
    return jax.tree_util.tree_map(np.array, state), done

  def save(self, state, done):
    self.saved = (jax.device_get(state), done)
    self.saves += 1
    if self.kill_after is not None and self.saves >= self.kill_after:
      self.kill_after = None
      raise _Killed


def _run(store=None, **kw):
  x, y, n = _clients()
  args = dict(num_classes=3, kernel_fn=fc_kernel(depth=2), mean=MEAN, std=STD,
              images_per_class=2, max_iterations=20, segment_iterations=5,
              stop_accuracy=2.0)
  args.update(kw)
  return kip.distill_clients(jax.random.PRNGKey(3), x, y, n,
                             segment_store=store, **_args(**args))


def _assert_identical(a, b):
  for name, u, v in zip(a.__dataclass_fields__, jax.tree_util.tree_leaves(a),
                        jax.tree_util.tree_leaves(b)):
    u, v = np.asarray(u), np.asarray(v)
    assert u.dtype == v.dtype and u.shape == v.shape, name
    assert u.tobytes() == v.tobytes(), name


@pytest.mark.parametrize("options,kill_after", [
    ({}, 1), ({}, 3),                                # fixed budget
    # Clients 1 and 2 stop at iteration 6 (segment 3), client 0 at 7: the
    # call resumes after segment 3 with one client still running.
    ({"stop_accuracy": 0.95, "min_iterations": 6, "target_batch_size": 4,
      "segment_iterations": 2}, 3),
    ({"learn_labels": True, "support_size": 4, "images_per_class": None}, 2),
], ids=["budget_1", "budget_3", "early_stop", "labels_support"])
def test_killed_and_resumed_call_is_bit_identical(options, kill_after):
  whole = _run(**options)
  store = _MemoryStore(kill_after=kill_after)
  with pytest.raises(_Killed):
    _run(store, **options)
  resumed = _run(store, **options)
  assert store.resumed == options.get("segment_iterations", 5) * kill_after
  _assert_identical(whole, resumed)
  if "min_iterations" in options:
    np.testing.assert_array_equal(whole.iterations, [7, 6, 6])


def test_dp_kip_resumes_bit_identically():
  options = dict(dp_clip=1.0, dp_noise_multiplier=1.0, stop_accuracy=None,
                 target_batch_size=4)
  whole = _run(**options)
  store = _MemoryStore(kill_after=2)
  with pytest.raises(_Killed):
    _run(store, **options)
  _assert_identical(whole, _run(store, **options))


def test_a_store_holding_the_last_segment_runs_nothing_more():
  store = _MemoryStore()
  whole = _run(store)
  saves = store.saves
  assert store.saved[1] == 20 and saves == 4
  _assert_identical(whole, _run(store))
  # The saved state was the end: no segment ran (and none was saved) again.
  assert store.saves == saves


def test_tree_checkpoint_on_disk_resumes_and_refuses_other_settings(tmp_path):
  cache = StageCache(tmp_path / "stages")
  whole = _run()
  saves = []

  class Killing(TreeCheckpoint):
    def save(self, tree, done):
      super().save(tree, done)
      saves.append(done)
      if len(saves) == 2:
        raise _Killed

  with pytest.raises(_Killed):
    _run(Killing(cache, "kip", {"seed": 0}))
  store = TreeCheckpoint(cache, "kip", {"seed": 0})
  assert store.path.is_dir()
  _assert_identical(whole, _run(store))
  # Another fingerprint is refused, as the stage cache refuses it.
  with pytest.raises(StaleStageError, match="seed"):
    _run(TreeCheckpoint(cache, "kip", {"seed": 1}))
  # Another shape (a larger support) is ignored: the call starts afresh.
  other = TreeCheckpoint(cache, "kip", {"seed": 0})
  assert other.resume(jax.eval_shape(lambda: {"z": np.zeros(3)})) is None
  store.clear()
  assert not store.path.exists()
  assert store.resume(None) is None


def test_tree_checkpoint_every_k_saves(tmp_path):
  cache = StageCache(tmp_path)
  store = TreeCheckpoint(cache, "t", {}, every=3)
  tree = {"a": np.arange(4, dtype=np.float32), "b": np.zeros((), bool)}
  template = jax.eval_shape(lambda: tree)
  store.save(tree, 5)
  store.save(tree, 10)
  assert store.resume(template) is None
  store.save({"a": tree["a"] + 1, "b": np.ones((), bool)}, 15)
  got, done = store.resume(template)
  assert done == 15 and got["b"] and got["a"].dtype == np.float32
  np.testing.assert_array_equal(got["a"], tree["a"] + 1)
  with pytest.raises(ValueError, match="every"):
    TreeCheckpoint(cache, "t", {}, every=0)
