"""Property tests for fedjax_dd.data.partition on tiny label arrays."""

import functools

import jax
import numpy as np
import pytest

from fedjax_dd.data import partition as P

# 20 samples, 4 classes, 5 samples per class, interleaved: label = i % 4.
LABELS = np.arange(20) % 4


def _rng(seed=0):
  return np.random.default_rng(seed)


def _check_disjoint_sorted(parts, n):
  for p in parts:
    assert p.dtype == np.int64 and p.ndim == 1 and p.size > 0
    assert np.all(np.diff(p) > 0)  # Sorted, no duplicates within a client.
    assert p.min() >= 0 and p.max() < n
  joined = np.concatenate(parts)
  assert joined.size == np.unique(joined).size  # Disjoint across clients.
  return joined


def _covers_all(parts, n):
  joined = _check_disjoint_sorted(parts, n)
  np.testing.assert_array_equal(np.sort(joined), np.arange(n))


# Every scheme with randomness, as a function of the generator alone.
SCHEMES = {
    "iid": lambda rng: P.iid(LABELS, 3, rng),
    "hfldd": lambda rng: P.pathological(LABELS, 3, 2, rng, style="hfldd"),
    "balanced": lambda rng: P.pathological(LABELS, 4, 2, rng,
                                           style="balanced"),
    "fedd3": lambda rng: P.pathological(LABELS, 4, 2, rng, style="fedd3"),
    "dirichlet": lambda rng: P.dirichlet(LABELS, 2, 1.0, rng, min_size=2),
    "dirichlet_client": lambda rng: P.dirichlet_client(LABELS, 3, 1.0, rng),
    "disjoint": lambda rng: P.disjoint_classes(LABELS, 2, rng),
    "quantity": lambda rng: P.quantity_skew(LABELS, 3, rng, sigma=1.0),
}


# ---------------------------------------------------------------- generic


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_same_seed_same_split_independent_of_global_state(name):
  np.random.seed(1)
  a = SCHEMES[name](_rng(7))
  np.random.seed(2)  # Global NumPy state must not matter.
  b = SCHEMES[name](_rng(7))
  assert len(a) == len(b)
  for pa, pb in zip(a, b):
    np.testing.assert_array_equal(pa, pb)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_different_seeds_give_different_splits(name):
  splits = {tuple(map(tuple, SCHEMES[name](_rng(s)))) for s in range(8)}
  assert len(splits) > 1


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("bad_rng", [0, None, "jax_key"])
def test_only_numpy_generators_are_accepted(name, bad_rng):
  if bad_rng == "jax_key":
    bad_rng = jax.random.key(0)
  with pytest.raises(TypeError, match="np.random.Generator"):
    SCHEMES[name](bad_rng)


@pytest.mark.parametrize("fn", [
    functools.partial(P.iid),
    functools.partial(P.pathological, num_classes_per_client=1,
                      style="fedd3"),
    functools.partial(P.dirichlet, alpha=1.0, min_size=1),
    functools.partial(P.dirichlet_client, alpha=1.0),
    functools.partial(P.disjoint_classes, classes_per_client=1),
    functools.partial(P.quantity_skew),
])
@pytest.mark.parametrize("num_clients", [0, -1, 21])
def test_bad_num_clients(fn, num_clients):
  with pytest.raises(ValueError, match="num_clients"):
    fn(LABELS, num_clients, rng=_rng())


@pytest.mark.parametrize("labels, match", [
    (np.zeros((4, 1), np.int64), r"shape \[N\]"),
    (np.zeros(0, np.int64), "empty"),
    (np.array([0.0, 1.0]), "integers"),
    (np.array([0, -1]), "non-negative"),
])
def test_bad_labels(labels, match):
  with pytest.raises(ValueError, match=match):
    P.iid(labels, 1, _rng())


# ---------------------------------------------------------------- iid


def test_iid_covers_everything_evenly():
  parts = P.iid(LABELS, 3, _rng())
  _covers_all(parts, 20)
  assert sorted(p.size for p in parts) == [6, 7, 7]


# ---------------------------------------------------------------- fedd3


def test_fedd3_classes_are_consecutive_and_split_evenly():
  parts = P.pathological(LABELS, 4, 2, _rng(), style="fedd3")
  _covers_all(parts, 20)
  counts = P.class_counts(LABELS, parts, 4)
  for i in range(4):
    # Client i holds exactly classes i and i + 1 (mod 4).
    assert set(np.flatnonzero(counts[i])) == {i, (i + 1) % 4}
    # Class i's 5 samples are split 3/2 between clients i - 1 and i.
    assert sorted([counts[i, i], counts[(i - 1) % 4, i]]) == [2, 3]


def test_fedd3_with_fewer_slots_than_classes_is_exact():
  parts = P.pathological(LABELS, 2, 1, _rng(), style="fedd3")
  _check_disjoint_sorted(parts, 20)
  np.testing.assert_array_equal(P.class_counts(LABELS, parts, 4),
                                [[5, 0, 0, 0], [0, 5, 0, 0]])
  np.testing.assert_array_equal(parts[0], [0, 4, 8, 12, 16])


# ---------------------------------------------------------------- hfldd


@pytest.mark.parametrize("seed", range(20))
def test_hfldd_every_client_has_c_classes_and_every_class_is_held(seed):
  parts = P.pathological(LABELS, 3, 2, _rng(seed), style="hfldd")
  _covers_all(parts, 20)  # 3 clients x 2 >= 4 classes: all classes held.
  counts = P.class_counts(LABELS, parts, 4)
  assert np.all((counts > 0).sum(axis=1) == 2)
  for c in range(4):
    held = counts[:, c][counts[:, c] > 0]
    assert held.sum() == 5
    assert held.max() - held.min() <= 1  # Even split among holders.


def test_hfldd_label_sets_overlap_when_needed():
  # 4 clients x 3 classes over 4 classes: sets must overlap.
  parts = P.pathological(LABELS, 4, 3, _rng(), style="hfldd")
  _covers_all(parts, 20)
  counts = P.class_counts(LABELS, parts, 4)
  assert np.all((counts > 0).sum(axis=1) == 3)
  holders = (counts > 0).sum(axis=0)
  assert holders.sum() == 12 and holders.min() >= 1 and holders.max() >= 2


def test_hfldd_single_client_takes_whole_classes():
  parts = P.pathological(LABELS, 1, 2, _rng(3), style="hfldd")
  counts = P.class_counts(LABELS, parts, 4)
  assert sorted(counts[0].tolist()) == [0, 0, 5, 5]


# ---------------------------------------------------------------- balanced


def _balanced_two_holders(num_clients, classes_per_client, seed):
  """A balanced split of :data:`LABELS`: every sample placed, each client
  with its ``classes_per_client`` classes, each class with two holders;
  its ``[clients, classes]`` counts."""
  parts = P.pathological(LABELS, num_clients, classes_per_client, _rng(seed),
                         style="balanced")
  _covers_all(parts, 20)
  counts = P.class_counts(LABELS, parts, 4)
  assert np.all((counts > 0).sum(axis=1) == classes_per_client)
  np.testing.assert_array_equal((counts > 0).sum(axis=0), [2, 2, 2, 2])
  return counts


@pytest.mark.parametrize("seed", range(10))
def test_balanced_c1_two_clients_per_class_with_equal_shares(seed):
  # 8 clients x 1 class over 4 classes: each class (5 samples) goes to
  # exactly 2 clients, cut 3 + 2.
  counts = _balanced_two_holders(8, 1, seed)
  for c in range(4):
    assert sorted(counts[:, c][counts[:, c] > 0].tolist()) == [2, 3]


@pytest.mark.parametrize("seed", range(10))
def test_balanced_c2_distinct_classes_and_equal_holders(seed):
  # 4 clients x 2 classes over 4 classes: 8 slots, 2 holders per class.
  _balanced_two_holders(4, 2, seed)


def test_balanced_hfldd_mnist_shape_ten_clients_per_class():
  # HFLDD's C = 1, N = 100, K = 10 with 60 samples per class: 10 clients per
  # class, 6 samples each.
  labels = np.repeat(np.arange(10), 60)
  parts = P.pathological(labels, 100, 1, _rng(4), style="balanced")
  counts = P.class_counts(labels, parts, 10)
  np.testing.assert_array_equal((counts > 0).sum(axis=0), [10] * 10)
  np.testing.assert_array_equal([p.size for p in parts], [6] * 100)
  # The earlier draw on the same labels is uneven (the reason for the fix).
  old = P.class_counts(labels, P.pathological(labels, 100, 1, _rng(4),
                                              style="hfldd"), 10)
  assert (old > 0).sum(axis=0).max() > 10


def test_balanced_holders_differ_by_at_most_one_when_not_divisible():
  # 6 clients x 1 class over 4 classes: 6 = 4 + 2, so holders are 1 or 2.
  parts = P.pathological(LABELS, 6, 1, _rng(1), style="balanced")
  holders = (P.class_counts(LABELS, parts, 4) > 0).sum(axis=0)
  assert sorted(holders.tolist()) == [1, 1, 2, 2]


@pytest.mark.parametrize("style", ["balanced", "hfldd", "fedd3"])
@pytest.mark.parametrize("per_client", [0, 5, 2.0])
def test_pathological_bad_classes_per_client(style, per_client):
  with pytest.raises(ValueError, match="num_classes_per_client"):
    P.pathological(LABELS, 2, per_client, _rng(), style=style)


def test_pathological_bad_style():
  with pytest.raises(ValueError, match="style"):
    P.pathological(LABELS, 2, 2, _rng(), style="fedavg")


def test_pathological_rejects_empty_clients():
  # Class 0 has 1 sample but, with 1 class per client, fedd3 gives class 0 to
  # clients 0 and 3 (4 clients over 3 classes): one of them gets nothing.
  labels = np.array([0, 1, 1, 2, 2])
  with pytest.raises(ValueError, match="received no samples"):
    P.pathological(labels, 4, 1, _rng(), style="fedd3")


# ---------------------------------------------------------------- dirichlet


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_covers_and_meets_min_size(seed):
  labels = np.arange(40) % 4
  parts = P.dirichlet(labels, 3, 0.5, _rng(seed), min_size=5)
  _covers_all(parts, 40)
  assert min(p.size for p in parts) >= 5


def test_dirichlet_huge_alpha_is_an_even_split():
  labels = np.arange(40) % 4  # 10 per class.
  parts = P.dirichlet(labels, 2, 1e6, _rng(), min_size=1)
  np.testing.assert_array_equal(P.class_counts(labels, parts, 4),
                                [[5, 5, 5, 5], [5, 5, 5, 5]])


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_tiny_alpha_works(seed):
  labels = np.arange(40) % 4
  parts = P.dirichlet(labels, 2, 0.01, _rng(seed), min_size=1)
  _covers_all(parts, 40)
  # With alpha = 0.01 each class lands (almost) entirely on one client.
  counts = P.class_counts(labels, parts, 4)
  assert np.all(counts.max(axis=0) >= 9)


def test_dirichlet_non_finite_draw_falls_back_to_one_hot():

  class NanDirichlet(np.random.Generator):

    def dirichlet(self, alpha, size=None):
      return np.full(len(alpha), np.nan)

  labels = np.arange(40) % 4
  parts = P.dirichlet(labels, 2, 0.01, NanDirichlet(np.random.PCG64(0)),
                      min_size=1)
  _covers_all(parts, 40)
  counts = P.class_counts(labels, parts, 4)
  assert np.all(np.sort(counts, axis=0) == [[0] * 4, [10] * 4])


def test_dirichlet_impossible_up_front():
  with pytest.raises(ValueError, match="at least 6 samples"):
    P.dirichlet(LABELS, 4, 1.0, _rng(), min_size=6)  # 4 x 6 > 20.


def test_dirichlet_gives_up_after_max_tries():
  # One class, 4 clients, min_size 5 of 20: needs a draw of exactly 5/5/5/5,
  # which Dir(0.001) essentially never produces.
  labels = np.zeros(20, np.int64)
  with pytest.raises(ValueError, match="max_tries=50"):
    P.dirichlet(labels, 4, 0.001, _rng(), min_size=5, max_tries=50)


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha=0.0), "alpha"),
    (dict(alpha=-1.0), "alpha"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(alpha=1.0, min_size=0), "min_size"),
    (dict(alpha=1.0, max_tries=0), "max_tries"),
])
def test_dirichlet_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    P.dirichlet(LABELS, 2, rng=_rng(), **kwargs)


# ------------------------------------------------------- dirichlet_client

# 10 classes x 100 samples, shuffled.
LABELS_1000 = np.random.default_rng(123).permutation(np.arange(1000) % 10)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("alpha", [0.01, 1.0, 100.0])
def test_dirichlet_client_equal_sizes_disjoint_valid(seed, alpha):
  parts = P.dirichlet_client(LABELS_1000, 7, alpha, _rng(seed))
  assert [p.size for p in parts] == [1000 // 7] * 7   # 142; 6 unused
  _check_disjoint_sorted(parts, 1000)


def test_dirichlet_client_divisible_split_uses_everything():
  parts = P.dirichlet_client(LABELS, 4, 0.5, _rng(0))
  assert [p.size for p in parts] == [5] * 4
  _covers_all(parts, 20)


def test_dirichlet_client_given_size():
  parts = P.dirichlet_client(LABELS_1000, 5, 1.0, _rng(0), client_size=30)
  assert [p.size for p in parts] == [30] * 5
  _check_disjoint_sorted(parts, 1000)


@pytest.mark.parametrize("seed", range(3))
def test_dirichlet_client_small_alpha_concentrates(seed):
  # 20 clients of 20 samples over classes of 100: a class runs out only if
  # more than 5 clients favour it, so most clients keep a single class
  # (Dir(0.01) over 10 classes still gives some priors a second class).
  parts = P.dirichlet_client(LABELS_1000, 20, 0.01, _rng(seed),
                             client_size=20)
  counts = P.class_counts(LABELS_1000, parts, 10)
  assert ((counts > 0).sum(axis=1) == 1).mean() >= 0.5
  assert (counts.max(axis=1) / 20).mean() >= 0.85
  # Near IID for a large alpha: every client holds many classes.
  parts = P.dirichlet_client(LABELS_1000, 20, 1000.0, _rng(seed),
                             client_size=20)
  held = (P.class_counts(LABELS_1000, parts, 10) > 0).sum(axis=1)
  assert held.min() >= 5


def test_dirichlet_client_exhausted_class_moves_on_to_the_rest():
  # Two classes of 10, two clients of 10: whatever the priors, both classes
  # are dealt completely, so a client whose class ran out got the other.
  labels = np.repeat([0, 1], 10)
  for seed in range(5):
    parts = P.dirichlet_client(labels, 2, 0.01, _rng(seed))
    _covers_all(parts, 20)


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha=0.0), "alpha must be a positive finite"),
    (dict(alpha=-1.0), "alpha must be a positive finite"),
    (dict(alpha=float("nan")), "alpha must be a positive finite"),
    (dict(alpha=1.0, client_size=-1), "client_size must be an int >= 0"),
    (dict(alpha=1.0, client_size=1.5), "client_size must be an int >= 0"),
    (dict(alpha=1.0, client_size=6),
     "needs 24 samples, but there are only 20"),
])
def test_dirichlet_client_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    P.dirichlet_client(LABELS, 4, rng=_rng(), **kwargs)


# ---------------------------------------------------------------- disjoint


@pytest.mark.parametrize("seed", range(5))
def test_disjoint_classes_no_shared_class(seed):
  parts = P.disjoint_classes(LABELS, 2, _rng(seed))
  _covers_all(parts, 20)  # 2 x 2 = 4 classes: everything is used.
  counts = P.class_counts(LABELS, parts, 4)
  assert np.all(np.sort(counts, axis=1) == [0, 0, 5, 5])
  assert np.all((counts > 0).sum(axis=0) == 1)


def test_disjoint_classes_leaves_extra_classes_unused():
  parts = P.disjoint_classes(LABELS, 3, _rng(), classes_per_client=1)
  _check_disjoint_sorted(parts, 20)
  counts = P.class_counts(LABELS, parts, 4)
  assert np.all(counts.sum(axis=1) == 5)
  assert (counts.sum(axis=0) == 0).sum() == 1


def test_disjoint_classes_too_many_clients():
  with pytest.raises(ValueError, match="needs 6 distinct classes"):
    P.disjoint_classes(LABELS, 3, _rng())
  with pytest.raises(ValueError, match="classes_per_client"):
    P.disjoint_classes(LABELS, 2, _rng(), classes_per_client=0)


# ---------------------------------------------------------------- quantity


def test_quantity_skew_sigma_zero_is_even():
  parts = P.quantity_skew(LABELS, 4, _rng(), sigma=0.0)
  _covers_all(parts, 20)
  assert [p.size for p in parts] == [5, 5, 5, 5]


@pytest.mark.parametrize("seed", range(5))
def test_quantity_skew_min_size_and_cover(seed):
  parts = P.quantity_skew(LABELS, 4, _rng(seed), sigma=3.0, min_size=3)
  _covers_all(parts, 20)
  assert min(p.size for p in parts) >= 3


def test_quantity_skew_bad_arguments():
  with pytest.raises(ValueError, match="at least 6 samples"):
    P.quantity_skew(LABELS, 4, _rng(), min_size=6)
  with pytest.raises(ValueError, match="sigma"):
    P.quantity_skew(LABELS, 4, _rng(), sigma=-1.0)
  with pytest.raises(ValueError, match="min_size"):
    P.quantity_skew(LABELS, 4, _rng(), min_size=0)


# ---------------------------------------------------------------- counts


def test_class_counts_hand_example():
  labels = np.array([0, 1, 1, 2, 2, 2])
  counts = P.class_counts(labels, [np.array([0, 1]), np.array([2, 3, 4, 5])],
                          3)
  np.testing.assert_array_equal(counts, [[1, 1, 0], [0, 1, 3]])
  with pytest.raises(ValueError, match=r"\[0, 2\)"):
    P.class_counts(labels, [np.array([0])], 2)


def test_personal_test_split_follows_training_label_counts_by_hand():
  # Training counts: client 0 holds classes 0 and 1 (3 : 1), client 1 only
  # class 1 (1), client 2 only class 2. Test: 8 of class 0, 4 of class 1,
  # 3 of class 2, 2 of class 3 (which no client trains on).
  counts = np.array([[3, 1, 0, 0], [0, 1, 0, 0], [0, 0, 5, 0]])
  test = np.array([0] * 8 + [1] * 4 + [2] * 3 + [3] * 2)
  parts = P.personal_test_split(test, counts, _rng())
  # Class 0 all to client 0; class 1 halved (1 : 1); class 2 to client 2;
  # class 3 left out.
  assert [np.bincount(test[p], minlength=4).tolist() for p in parts] == [
      [8, 2, 0, 0], [0, 2, 0, 0], [0, 0, 3, 0]]
  used = np.concatenate(parts)
  assert np.unique(used).size == used.size == 15
  assert all(np.all(np.diff(p) > 0) for p in parts)
  again = P.personal_test_split(test, counts, _rng())
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  other = P.personal_test_split(test, counts, _rng(1))
  assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_personal_test_split_gives_a_client_of_no_shared_class_nothing():
  counts = np.array([[2, 0], [0, 0]])
  parts = P.personal_test_split(np.array([0, 0, 1]), counts, _rng())
  assert parts[0].tolist() == [0, 1] and parts[1].size == 0
  with pytest.raises(ValueError, match="test_labels"):
    P.personal_test_split(np.array([0, 2]), counts, _rng())
  with pytest.raises(ValueError, match="train_counts"):
    P.personal_test_split(np.array([0]), np.array([1, 2]), _rng())
  with pytest.raises(TypeError, match="Generator"):
    P.personal_test_split(np.array([0]), counts, 0)


def test_stratified_split_by_hand():
  # Client 0: 4 of class 0 and 2 of class 1; client 1: 1 of class 2.
  labels = np.array([0, 0, 0, 0, 1, 1, 2])
  parts = [np.arange(6), np.array([6])]
  train, test = P.stratified_split(labels, parts, 0.25, _rng())
  # round(0.25 * 4) = 1 and round(0.25 * 2) = 1 (halves up) go to test;
  # a class of one example keeps it for training.
  assert np.bincount(labels[test[0]], minlength=3).tolist() == [1, 1, 0]
  assert np.bincount(labels[train[0]], minlength=3).tolist() == [3, 1, 0]
  assert train[1].tolist() == [6] and test[1].size == 0
  for tr, te, p in zip(train, test, parts):
    assert sorted(np.concatenate([tr, te]).tolist()) == p.tolist()
  with pytest.raises(ValueError, match="test_fraction"):
    P.stratified_split(labels, parts, 1.0, _rng())
