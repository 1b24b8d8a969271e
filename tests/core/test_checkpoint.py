"""Tests for fedjax_dd.core.checkpoint."""

import logging
import pathlib
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core import checkpoint as C
from fedjax_dd.core.ledger import Ledger


@flax.struct.dataclass
class ServerState:
  params: dict
  opt_state: tuple
  round: jax.Array


@flax.struct.dataclass
class ExperimentState:
  server: ServerState
  clients: dict  # stacked [C, ...]
  key: jax.Array  # raw uint32 PRNG key
  sampler: np.ndarray
  step_count: int
  extra: None = None


_SPECIAL_F32 = np.array(
    [np.nan, np.inf, -np.inf, -0.0, 1e-45, np.finfo(np.float32).max, 1 / 3],
    np.float32,
)


def make_state(step: int) -> ExperimentState:
  """A small state whose every leaf depends on ``step``."""
  w = (jnp.arange(12, dtype=jnp.float32).reshape(3, 4) + step) / 7.0
  return ExperimentState(
      server=ServerState(
          params={"dense": {"kernel": w, "bias": jnp.full((4,), step * 0.1, jnp.float32)},
                  "special": jnp.asarray(_SPECIAL_F32)},
          opt_state=(jnp.zeros((3, 4), jnp.float32) - step, jnp.int32(step)),
          round=jnp.int32(step),
      ),
      clients={
          "control": jnp.ones((2, 3, 4), jnp.float32) * step,
          "num_examples": jnp.array([5, step], jnp.int32),
          "extremes": jnp.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max, -step], jnp.int32),
      },
      key=jax.random.fold_in(jax.random.PRNGKey(42), step),
      sampler=np.array([step, 2 * step, 0xFFFFFFFF], np.uint32),
      step_count=step,
  )


def assert_bit_identical(got, want):
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    if isinstance(w, (int, float)):
      assert type(g) is type(w) and g == w
      continue
    assert isinstance(g, np.ndarray) == isinstance(w, np.ndarray), (type(g), type(w))
    if jnp.issubdtype(w.dtype, jax.dtypes.prng_key):
      assert g.dtype == w.dtype
      g, w = jax.random.key_data(g), jax.random.key_data(w)
    g, w = np.asarray(g), np.asarray(w)
    assert g.dtype == w.dtype and g.shape == w.shape
    assert g.tobytes() == w.tobytes()


def save_steps(directory, steps, **kwargs):
  with C.CheckpointStore(directory, **kwargs) as store:
    for s in steps:
      assert store.save(s, make_state(s), {"step": s})


def _largest_file(directory: pathlib.Path) -> pathlib.Path:
  files = [p for p in directory.rglob("*") if p.is_file()]
  return max(files, key=lambda p: p.stat().st_size)


# ----------------------------------------------------------------------------
# Round trips
# ----------------------------------------------------------------------------


def test_round_trip_is_bit_identical_with_dataclass_types(tmp_path):
  state = make_state(3)
  ledger = Ledger().record(1, kind="upload", bits=96, count=3)
  meta = {"ledger": ledger.to_dict(), "config": {"lr": 0.1, "name": "fedavg"}}
  with C.CheckpointStore(tmp_path / "ckpt") as store:
    assert store.latest_step() is None
    assert store.restore(make_state(0)) is None
    assert store.save(3, state, meta)
    step, got, got_meta = store.restore(make_state(0))
  assert step == 3
  assert_bit_identical(got, state)
  assert type(got) is ExperimentState and type(got.server) is ServerState
  assert isinstance(got.sampler, np.ndarray)
  assert isinstance(got.server.params["dense"]["kernel"], jax.Array)
  assert got.extra is None
  assert got_meta == meta
  assert Ledger.from_dict(got_meta["ledger"]) == ledger


def test_restore_into_abstract_template(tmp_path):
  state = make_state(2)
  with C.CheckpointStore(tmp_path) as store:
    store.save(2, state)
    template = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "dtype") else x,
        make_state(0),
    )
    step, got, meta = store.restore(template)
  assert (step, meta) == (2, {})
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(state)):
    assert np.asarray(g).tobytes() == np.asarray(w).tobytes()
  assert type(got) is ExperimentState


def test_typed_keys_round_trip(tmp_path):
  state = {
      "fry": jax.random.key(7),
      "rbg": jax.random.split(jax.random.key(3, impl="rbg"), 2),
      "w": jnp.ones(3),
  }
  with C.CheckpointStore(tmp_path) as store:
    store.save(1, state)
    # Concrete template.
    _, got, _ = store.restore(
        {"fry": jax.random.key(0), "rbg": jax.random.split(jax.random.key(0, impl="rbg"), 2),
         "w": jnp.zeros(3)}
    )
    assert_bit_identical(got, state)
    assert jax.random.key_impl(got["rbg"]) == jax.random.key_impl(state["rbg"])
    # Abstract template from eval_shape keeps the key dtypes.
    _, got_abs, _ = store.restore(jax.eval_shape(lambda: state))
    assert_bit_identical(got_abs, state)
    # Raw uint32 template: typed keys are stored as their key data.
    _, got_raw, _ = store.restore(
        {"fry": jax.random.PRNGKey(0), "rbg": jnp.zeros((2, 4), jnp.uint32), "w": jnp.zeros(3)}
    )
  np.testing.assert_array_equal(got_raw["fry"], jax.random.key_data(state["fry"]))
  np.testing.assert_array_equal(got_raw["rbg"], jax.random.key_data(state["rbg"]))
  # Same draws after the round trip.
  np.testing.assert_array_equal(
      jax.random.uniform(got["fry"], (4,)), jax.random.uniform(state["fry"], (4,))
  )


def test_raw_key_saved_restores_into_typed_template(tmp_path):
  raw = jax.random.PRNGKey(5)
  with C.CheckpointStore(tmp_path) as store:
    store.save(0, {"key": raw})
    _, got, _ = store.restore({"key": jax.random.key(0)})
  assert jnp.issubdtype(got["key"].dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(got["key"]), raw)


def test_restore_explicit_older_step(tmp_path):
  save_steps(tmp_path, [1, 2, 3])
  with C.CheckpointStore(tmp_path) as store:
    step, got, meta = store.restore(make_state(0), step=2)
  assert (step, meta) == (2, {"step": 2})
  assert_bit_identical(got, make_state(2))


def test_checkpoint_complete_when_save_returns(tmp_path):
  # A second store on the directory, with the first never closed (as after a
  # kill), sees the finished checkpoint.
  writer = C.CheckpointStore(tmp_path)
  writer.save(4, make_state(4))
  assert (tmp_path / "4" / C.COMMIT_MARKER).is_file()
  with C.CheckpointStore(tmp_path) as reader:
    assert reader.latest_step() == 4
    step, got, _ = reader.restore(make_state(0))
  assert step == 4
  assert_bit_identical(got, make_state(4))
  writer.close()


# ----------------------------------------------------------------------------
# save_every / retention / overwrite
# ----------------------------------------------------------------------------


def test_save_every_and_force(tmp_path):
  with C.CheckpointStore(tmp_path, save_every=2, max_to_keep=None) as store:
    assert store.save(1, make_state(1)) is False
    assert store.save(2, make_state(2)) is True
    assert store.save(3, make_state(3), force=True) is True
    assert store.save(5, make_state(5)) is False
    assert store.should_save(4) and not store.should_save(5)
    assert store.all_steps() == [2, 3]
    assert store.latest_step() == 3


def test_keeps_last_n(tmp_path):
  save_steps(tmp_path, [1, 2, 3, 4, 5], max_to_keep=2)
  assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["4", "5"]
  with C.CheckpointStore(tmp_path, max_to_keep=2) as store:
    assert store.all_steps() == [4, 5]


def test_retention_counts_only_committed_steps(tmp_path):
  with C.CheckpointStore(tmp_path, max_to_keep=2) as store:
    store.save(1, make_state(1))
    store.save(2, make_state(2))
    (tmp_path / "2" / C.COMMIT_MARKER).unlink()  # step 2 now uncommitted
    store.save(3, make_state(3))
    # Committed: 1 and 3, so nothing is deleted yet.
    assert store.all_steps() == [1, 3]
    assert (tmp_path / "2").is_dir()
    store.save(4, make_state(4))
    assert store.all_steps() == [3, 4]
    assert not (tmp_path / "1").exists() and not (tmp_path / "2").exists()


def test_saving_an_older_step_replaces_newer_ones(tmp_path, caplog):
  save_steps(tmp_path, [1, 2, 3])
  with C.CheckpointStore(tmp_path) as store:
    with caplog.at_level(logging.WARNING, logger=C.__name__):
      assert store.save(2, make_state(20), {"redo": True})
    assert store.all_steps() == [1, 2]
    step, got, meta = store.restore(make_state(0))
  assert (step, meta) == (2, {"redo": True})
  assert_bit_identical(got, make_state(20))
  assert "step 3" in caplog.text and "step 2" in caplog.text


# ----------------------------------------------------------------------------
# Corrupted and partial checkpoints
# ----------------------------------------------------------------------------


def _flip_byte(step_dir):
  path = _largest_file(step_dir / "state")
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))


def _flip_array_byte(step_dir):
  # Array chunks live in "d/" folders of the OCDBT store.
  chunks = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  path = max(chunks, key=lambda p: p.stat().st_size)
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x01
  path.write_bytes(bytes(data))


def _truncate(step_dir):
  path = _largest_file(step_dir / "state")
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])


def _delete_data_file(step_dir):
  _largest_file(step_dir / "state").unlink()


def _garbage_meta(step_dir):
  (step_dir / "meta" / "metadata").write_text("{not json")


def _remove_marker(step_dir):
  (step_dir / C.COMMIT_MARKER).unlink()


def _garbage_marker(step_dir):
  (step_dir / C.COMMIT_MARKER).write_bytes(b"\x00\xffgarbage")


_CORRUPTIONS = {
    "flip_byte": (_flip_byte, "does not match its checksum"),
    "flip_array_byte": (_flip_array_byte, "does not match its checksum"),
    "truncate": (_truncate, "bytes, expected"),
    "delete_data_file": (_delete_data_file, "is missing"),
    "garbage_meta": (_garbage_meta, "meta/metadata"),
    "no_commit_marker": (_remove_marker, "no commit marker"),
    "garbage_marker": (_garbage_marker, "commit marker unreadable"),
}


@pytest.mark.parametrize("name", sorted(_CORRUPTIONS))
def test_corrupt_latest_falls_back_to_previous(tmp_path, caplog, name):
  corrupt, reason = _CORRUPTIONS[name]
  save_steps(tmp_path, [1, 2, 3])
  corrupt(tmp_path / "3")
  with C.CheckpointStore(tmp_path) as store:
    with caplog.at_level(logging.WARNING, logger=C.__name__):
      step, got, meta = store.restore(make_state(0))
    assert (step, meta) == (2, {"step": 2})
    assert_bit_identical(got, make_state(2))
    assert "step 3" in caplog.text and reason in caplog.text
    with pytest.raises(ValueError, match="corrupt or incomplete"):
      store.restore(make_state(0), step=3)


def test_orbax_tmp_dir_is_reported_and_ignored(tmp_path, caplog):
  save_steps(tmp_path, [1, 2, 3])
  # An interrupted save of step 4: a partial copy under Orbax's tmp name.
  tmp_dir = tmp_path / "4.orbax-checkpoint-tmp-1700000000000000"
  shutil.copytree(tmp_path / "3", tmp_dir)
  (tmp_dir / C.COMMIT_MARKER).unlink()
  _truncate(tmp_dir)
  _flip_byte(tmp_path / "3")
  with C.CheckpointStore(tmp_path) as store:
    assert store.latest_step() == 3
    with caplog.at_level(logging.WARNING, logger=C.__name__):
      step, got, _ = store.restore(make_state(0))
    assert step == 2
    assert_bit_identical(got, make_state(2))
    assert "step 4" in caplog.text and "temporary" in caplog.text
    assert "step 3" in caplog.text
    # The next save clears the leftover and the bad step.
    store.save(3, make_state(33))
    assert not tmp_dir.exists()
    step, got, _ = store.restore(make_state(0))
  assert step == 3
  assert_bit_identical(got, make_state(33))


def test_walks_back_to_oldest_good_step(tmp_path, caplog):
  save_steps(tmp_path, [1, 2, 3], max_to_keep=3)
  _flip_byte(tmp_path / "3")
  _remove_marker(tmp_path / "2")
  with C.CheckpointStore(tmp_path) as store:
    with caplog.at_level(logging.WARNING, logger=C.__name__):
      step, got, _ = store.restore(make_state(0))
  assert step == 1
  assert_bit_identical(got, make_state(1))
  assert "step 3" in caplog.text and "step 2" in caplog.text


def test_all_corrupt_returns_none(tmp_path, caplog):
  save_steps(tmp_path, [1, 2])
  _delete_data_file(tmp_path / "1")
  _garbage_meta(tmp_path / "2")
  with C.CheckpointStore(tmp_path) as store:
    with caplog.at_level(logging.WARNING, logger=C.__name__):
      assert store.restore(make_state(0)) is None
  assert "step 1" in caplog.text and "step 2" in caplog.text


def test_resume_after_corruption_overwrites_bad_step(tmp_path):
  save_steps(tmp_path, [1, 2, 3])
  _truncate(tmp_path / "3")
  with C.CheckpointStore(tmp_path) as store:
    step, _, _ = store.restore(make_state(0))
    assert step == 2
    assert store.save(3, make_state(30))
    step, got, _ = store.restore(make_state(0))
  assert step == 3
  assert_bit_identical(got, make_state(30))


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------


def test_template_mismatch_raises_instead_of_falling_back(tmp_path):
  save_steps(tmp_path, [1, 2])
  with C.CheckpointStore(tmp_path) as store:
    with pytest.raises(ValueError, match="does not match the template"):
      store.restore({"w": jnp.zeros(3)})
    wrong_shape = make_state(0).replace(sampler=np.zeros(5, np.uint32))
    with pytest.raises(ValueError, match="step 2.*does not match the template"):
      store.restore(wrong_shape)


def test_missing_step_raises(tmp_path):
  save_steps(tmp_path, [1])
  with C.CheckpointStore(tmp_path) as store:
    with pytest.raises(ValueError, match="No checkpoint for step 5"):
      store.restore(make_state(0), step=5)


def test_bad_meta_writes_nothing(tmp_path):
  with C.CheckpointStore(tmp_path) as store:
    with pytest.raises(ValueError, match="JSON-serialisable"):
      store.save(1, make_state(1), {"array": np.zeros(2)})
    with pytest.raises(ValueError, match="meta must be a dict"):
      store.save(1, make_state(1), ["not", "a", "dict"])
    assert store.all_steps() == []
  assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_to_keep=0), "max_to_keep"),
        (dict(save_every=0), "save_every"),
        (dict(save_every=1.5), "save_every"),
    ],
)
def test_constructor_validation(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    C.CheckpointStore(tmp_path, **kwargs)


def test_step_validation_and_closed_store(tmp_path):
  store = C.CheckpointStore(tmp_path)
  with pytest.raises(ValueError, match="step"):
    store.save(-1, make_state(0))
  with pytest.raises(ValueError, match="step"):
    store.save(True, make_state(0))
  assert store.save(np.int64(2), make_state(2))
  assert store.latest_step() == 2
  store.close()
  store.close()  # idempotent
  with pytest.raises(ValueError, match="closed"):
    store.save(3, make_state(3))
  with pytest.raises(ValueError, match="closed"):
    store.restore(make_state(0))


def test_read_meta_reads_only_committed_steps(tmp_path):
  store = C.CheckpointStore(tmp_path / "ck")
  assert store.read_meta(0) is None
  store.save(3, {"x": jnp.ones(2)}, {"fingerprint": {"a": 1}}, force=True)
  assert store.read_meta(3) == {"fingerprint": {"a": 1}}
  assert store.read_meta(4) is None
  (tmp_path / "ck" / "3" / "meta" / "metadata").write_text("{not json")
  assert store.read_meta(3) is None
  store.close()


_FIXTURES = sorted((pathlib.Path(__file__).parent / "checkpoints").glob(
    "orbax-*"))


def test_checkpoint_fixtures_exist_for_both_ends():
  # One written by each end of the supported range (make_checkpoint_fixtures).
  majors = {p.name.split("-")[1].rsplit(".", 1)[0] for p in _FIXTURES}
  assert {"0.11", "0.12"} <= majors, _FIXTURES


@pytest.mark.parametrize("fixture", _FIXTURES, ids=lambda p: p.name)
def test_restores_checkpoints_of_other_orbax_versions(fixture, tmp_path):
  # A checkpoint written by orbax-checkpoint 0.11 (jax 0.5.3, the `cpu`
  # extra) restores bit-identically on 0.12 (newest jax) and the reverse.
  shutil.copytree(fixture, tmp_path / "ckpt")
  with C.CheckpointStore(tmp_path / "ckpt") as store:
    step, state, meta = store.restore(make_state(0))
  assert step == 3 and meta == {"step": 3}
  assert (jax.tree_util.tree_structure(state)
          == jax.tree_util.tree_structure(make_state(3)))
  with np.load(fixture / "expected_leaves.npz") as saved:
    want = [saved[f"arr_{i}"] for i in range(len(saved.files))]
  got = leaf_arrays(state)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    assert g.tobytes() == w.tobytes()


def leaf_arrays(state) -> list[np.ndarray]:
  """Every leaf of a state as a NumPy array (typed keys as their data)."""
  out = []
  for leaf in jax.tree_util.tree_leaves(state):
    if (hasattr(leaf, "dtype")
        and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)):
      leaf = jax.random.key_data(leaf)
    out.append(np.asarray(leaf))
  return out


def test_as_restored_drops_the_client_mesh_from_avals_without_copying():
  from fedjax_dd.core.checkpoint import as_restored  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.clients import ClientMapper  # pylint: disable=g-import-not-at-top
  if jax.device_count() < 2:
    pytest.skip("needs two host devices for the sharded mapper")
  out = ClientMapper(backend="sharded").map(lambda x: x * 2.0,
                                            in_axes=(0,))(jnp.ones((4, 3)))
  moved = jax.device_put(out, jax.devices()[0])
  # jax.device_put keeps the source's mesh in the aval (jax 0.5.3 and 0.12).
  assert moved.aval.sharding.mesh.axis_names == ("clients",)
  tree = {"a": moved, "n": 3, "b": jnp.arange(2)}
  fresh = as_restored(tree)
  assert fresh["a"].aval.sharding.mesh.axis_names == ()
  assert fresh["a"].sharding == moved.sharding
  assert (fresh["a"].addressable_data(0).unsafe_buffer_pointer()
          == moved.addressable_data(0).unsafe_buffer_pointer())
  np.testing.assert_array_equal(np.asarray(fresh["a"]), 2.0)
  assert fresh["n"] == 3 and fresh["b"] is tree["b"]
