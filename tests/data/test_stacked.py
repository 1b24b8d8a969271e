"""Tests for fedjax_dd.data.stacked."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.data import stacked

SENTINEL = 255  # Real examples below never use this pixel value or label.


def _tiny_data():
  """6 images [6, 2, 2, 1]; image i is filled with i + 1, label 10 + i."""
  x = (np.arange(6, dtype=np.uint8) + 1)[:, None, None, None] * np.ones(
      (1, 2, 2, 1), np.uint8)
  y = np.arange(6) + 10
  return x, y


PARTITION = [np.array([0, 3, 5]), np.array([1]), np.array([2, 4])]


def test_stack_clients_shapes_values_and_padding():
  x, y = _tiny_data()
  data = stacked.stack_clients(x, y, PARTITION)
  assert data.x.shape == (3, 3, 2, 2, 1) and data.x.dtype == np.uint8
  assert data.y.shape == (3, 3) and data.y.dtype == np.int32
  assert data.num_examples.dtype == np.int32
  np.testing.assert_array_equal(data.num_examples, [3, 1, 2])
  assert data.num_clients == 3 and data.max_examples == 3
  np.testing.assert_array_equal(data.y, [[10, 13, 15], [11, 0, 0],
                                         [12, 14, 0]])
  np.testing.assert_array_equal(data.x[:, :, 0, 0, 0],
                                [[1, 4, 6], [2, 0, 0], [3, 5, 0]])
  np.testing.assert_array_equal(data.mask, [[True, True, True],
                                            [True, False, False],
                                            [True, True, False]])
  assert isinstance(data.mask, np.ndarray)


def test_stack_clients_pad_to():
  x, y = _tiny_data()
  data = stacked.stack_clients(x, y, PARTITION, pad_to=5)
  assert data.x.shape == (3, 5, 2, 2, 1) and data.max_examples == 5
  assert data.mask.sum() == 6
  with pytest.raises(ValueError, match="pad_to=2"):
    stacked.stack_clients(x, y, PARTITION, pad_to=2)


def test_client_data_is_a_pytree_and_mask_works_on_device():
  x, y = _tiny_data()
  data = jax.device_put(stacked.stack_clients(x, y, PARTITION))
  leaves = jax.tree_util.tree_leaves(data)
  assert len(leaves) == 3 and all(isinstance(l, jax.Array) for l in leaves)
  mask = jax.jit(lambda d: d.mask)(data)
  np.testing.assert_array_equal(mask.sum(axis=1), [3, 1, 2])


@pytest.mark.parametrize("partition, match", [
    ([], "no clients"),
    ([np.array([0]), np.array([], np.int64)], "client 1 has no examples"),
    ([np.array([0, 6])], r"\[0, 6\)"),
    ([np.array([-1])], r"\[0, 6\)"),
    ([np.array([0.0])], "integer"),
])
def test_stack_clients_bad_partition(partition, match):
  x, y = _tiny_data()
  with pytest.raises(ValueError, match=match):
    stacked.stack_clients(x, y, partition)


def test_stack_clients_mismatched_xy():
  x, y = _tiny_data()
  with pytest.raises(ValueError, match="same N"):
    stacked.stack_clients(x, y[:5], PARTITION)


def _sentinel_stack():
  x, y = _tiny_data()
  data = stacked.stack_clients(x, y, PARTITION, pad_to=4)
  mask = data.mask
  xs, ys = data.x.copy(), data.y.copy()
  xs[~mask] = SENTINEL
  ys[~mask] = SENTINEL
  return xs, ys, data.num_examples


def test_sample_batch_never_touches_padding():
  xs, ys, num = _sentinel_stack()
  sample = jax.jit(stacked.sample_batch, static_argnames="batch_size")
  for c in range(3):
    seen = set()
    for k in range(50):
      key = jax.random.fold_in(jax.random.key(c), k)
      xb, yb = sample(key, xs[c], ys[c], num[c], batch_size=8)
      assert xb.shape == (8, 2, 2, 1) and yb.shape == (8,)
      assert xb.dtype == jnp.uint8 and yb.dtype == jnp.int32
      assert not np.any(np.asarray(xb) == SENTINEL)
      assert not np.any(np.asarray(yb) == SENTINEL)
      # Image and label stay paired: image i + 1 <-> label 10 + i.
      np.testing.assert_array_equal(np.asarray(xb)[:, 0, 0, 0] + 9, yb)
      seen.update(np.asarray(yb).tolist())
    # Over 400 draws every real example of the client shows up.
    assert seen == set(ys[c, :num[c]].tolist())


def test_sample_batch_vmapped_over_clients():
  xs, ys, num = _sentinel_stack()
  keys = jax.random.split(jax.random.key(0), 3)
  fn = jax.vmap(functools.partial(stacked.sample_batch, batch_size=16))
  xb, yb = jax.jit(fn)(keys, xs, ys, num)
  assert xb.shape == (3, 16, 2, 2, 1) and yb.shape == (3, 16)
  assert not np.any(np.asarray(yb) == SENTINEL)
  np.testing.assert_array_equal(np.asarray(yb)[1], 11)  # Client 1: 1 example.


def test_sample_batch_does_not_retrace_for_new_keys_or_clients():
  xs, ys, num = _sentinel_stack()
  traces = []

  def counted(key, x, y, n):
    traces.append(None)
    return stacked.sample_batch(key, x, y, n, batch_size=4)

  fn = jax.jit(counted)
  first = fn(jax.random.key(0), xs[0], ys[0], num[0])
  second = fn(jax.random.key(1), xs[2], ys[2], num[2])
  jax.block_until_ready((first, second))
  assert len(traces) == 1


def test_sample_batch_is_deterministic_given_key():
  xs, ys, num = _sentinel_stack()
  a = stacked.sample_batch(jax.random.key(3), xs[0], ys[0], num[0], 6)
  b = stacked.sample_batch(jax.random.key(3), xs[0], ys[0], num[0], 6)
  np.testing.assert_array_equal(a[1], b[1])

