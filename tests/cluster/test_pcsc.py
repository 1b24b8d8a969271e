"""PCSC (Lu et al. 2014) as DisUE's secure similarity computation."""

import numpy as np
import pytest

from fedjax_dd.cluster import pcsc
from fedjax_dd.cluster.pcsc import (PCSCParams, pcsc_cosine, pcsc_dot,
                                    pcsc_similarity_matrix, quantize)


def _cos(a, b):
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_exact_integer_dot_by_hand():
  a = np.array([3, -2, 0, 5])
  b = np.array([1, 4, 7, -2])
  dot, bits = pcsc_dot(a, b, rng=np.random.default_rng(0))
  assert dot == 3 - 8 + 0 - 10  # -15
  assert bits == 200 + (4 + 4) * 512


def test_extreme_entries_are_exact():
  # Every entry at the ±2^f bound, zeros on both sides, both signs.
  params = PCSCParams()
  m = 1 << params.frac_bits
  a = np.array([m, -m, 0, m, 0, -m])
  b = np.array([m, m, m, 0, 0, -m])
  for seed in range(3):
    dot, _ = pcsc_dot(a, b, rng=np.random.default_rng(seed), params=params)
    assert dot == int(a.astype(object) @ b.astype(object))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cosine_matches_plain_cosine_to_fixed_point_precision(seed):
  rng = np.random.default_rng(seed)
  a, b = rng.normal(size=64), rng.normal(size=64)
  b[::5] = 0.0  # Bob's zero entries take the r_i branch
  params = PCSCParams()
  got, _ = pcsc_cosine(a, b, rng=rng, params=params)
  assert abs(got - _cos(a, b)) <= 2.0**-(params.frac_bits - 4)
  # Fewer fractional bits, coarser but still within the bound.
  coarse = PCSCParams(frac_bits=12)
  got, _ = pcsc_cosine(a, b, rng=rng, params=coarse)
  assert abs(got - _cos(a, b)) <= 2.0**-(coarse.frac_bits - 4)


def test_opposite_orthogonal_and_zero_vectors():
  rng = np.random.default_rng(0)
  a = np.array([1.0, 2.0, -3.0])
  assert pcsc_cosine(a, -2 * a, rng=rng)[0] == pytest.approx(-1.0, abs=1e-6)
  assert pcsc_cosine(a, np.array([2.0, -1.0, 0.0]), rng=rng)[0] == pytest.approx(
      0.0, abs=1e-6)
  assert pcsc_cosine(a, np.zeros(3), rng=rng)[0] == 0.0


def test_bits_follow_the_documented_formula():
  params = PCSCParams(k1=512, k2=200, k3=128, k4=128, cosine_bits=32)
  n = 10
  # Alice: α (200) + p (512) + (n + 2) elements of C; Bob: D (512).
  t = 200 + 512 + 12 * 512 + 512
  assert params.transcript_bits(n) == t == 7368
  assert pcsc_cosine(np.ones(n), np.arange(n, dtype=float),
                     rng=np.random.default_rng(0), params=params)[1] == t
  assert params.relayed_pair_bits(n) == {"upload": t + 32, "download": t}
  sim, per_pair, total = pcsc_similarity_matrix(
      np.random.default_rng(1).normal(size=(4, n)),
      rng=np.random.default_rng(2), params=params)
  assert per_pair == 2 * t + 32
  assert total == 6 * per_pair  # 4 clients: 6 pairs


def test_ciphertext_elements_take_k1_bits():
  params = PCSCParams()
  rng = np.random.default_rng(0)
  key = pcsc._alice_keygen(rng, params)
  assert key.p.bit_length() == params.k1
  assert key.alpha.bit_length() == params.k2
  cipher = pcsc._alice_encrypt(np.array([5, -3, 0]), key, rng, params)
  assert cipher.shape == (5,)  # n + 2
  assert all(0 <= int(c) < key.p for c in cipher)


def test_deterministic_given_the_rng():
  x = np.random.default_rng(0).normal(size=(3, 16))
  a = pcsc_similarity_matrix(x, rng=np.random.default_rng(5))
  b = pcsc_similarity_matrix(x, rng=np.random.default_rng(5))
  np.testing.assert_array_equal(a[0], b[0])
  assert a[1:] == b[1:]
  key_a = pcsc._alice_keygen(np.random.default_rng(9), PCSCParams())
  key_b = pcsc._alice_keygen(np.random.default_rng(9), PCSCParams())
  assert key_a == key_b


def test_similarity_matrix_matches_plain_cosines():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(4, 32))
  x[3] = 0.0
  sim, _, _ = pcsc_similarity_matrix(x, rng=rng)
  assert sim.shape == (4, 4) and np.isfinite(sim).all()
  np.testing.assert_array_equal(sim, sim.T)
  np.testing.assert_array_equal(np.diag(sim), [1, 1, 1, 0])
  for u in range(3):
    for v in range(u + 1, 3):
      assert abs(sim[u, v] - _cos(x[u], x[v])) <= 2.0**-20
  np.testing.assert_array_equal(sim[3], [0, 0, 0, 0])


def test_refuses_vectors_of_different_lengths():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="equal length"):
    pcsc_cosine(np.ones(3), np.ones(4), rng=rng)
  with pytest.raises(ValueError, match="equal length"):
    pcsc_dot(np.ones(3, int), np.ones(4, int), rng=rng)
  with pytest.raises(ValueError, match="equal length"):
    pcsc_cosine(np.ones((2, 3)), np.ones((2, 3)), rng=rng)


def test_refuses_parameters_too_small_for_the_length():
  # Wrap-around needs log2(n) < k1 - 2 - 2 k2 - 2 f = 10.
  small = PCSCParams(k1=108, k2=40, k3=8, k4=8, frac_bits=8)
  small.check(1000)
  with pytest.raises(ValueError, match="wrap"):
    small.check(1 << 11)
  with pytest.raises(ValueError, match="not exact"):
    pcsc_cosine(np.ones(1 << 11), np.ones(1 << 11),
                rng=np.random.default_rng(0), params=small)
  # The remainder bound: n' 2^(f + max(k3, k4) + 1) < α_min.
  with pytest.raises(ValueError, match="remainder"):
    PCSCParams(k2=150, k1=4096).check(1 << 30)
  # Small parameters that hold are still exact.
  dot, _ = pcsc_dot(np.array([200, -256, 3]), np.array([-7, 256, 0]),
                    rng=np.random.default_rng(1), params=small)
  assert dot == -1400 - 65536


def test_refuses_non_finite_vectors_and_a_seed():
  with pytest.raises(ValueError, match="finite"):
    quantize(np.array([1.0, np.nan]), 8)
  with pytest.raises(TypeError, match="Generator"):
    pcsc_cosine(np.ones(2), np.ones(2), rng=0)


def _gauss_reduce(u, v):
  """Shortest vector of the 2-D integer lattice spanned by ``u`` and ``v``."""
  dot = lambda x, y: x[0] * y[0] + x[1] * y[1]
  if dot(u, u) > dot(v, v):
    u, v = v, u
  while True:
    uu = dot(u, u)
    m = (2 * dot(u, v) + uu) // (2 * uu)  # round(<u, v> / <u, u>)
    v = (v[0] - m * u[0], v[1] - m * u[1])
    if dot(v, v) >= uu:
      return u
    u, v = v, u


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_receiver_recovers_the_vector_by_lattice_reduction(seed):
  # The caveat of the module docstring: Bob, holding (α, p, C), recovers
  # Alice's quantised vector from two ciphertexts and Gauss reduction.
  params = PCSCParams()
  rng = np.random.default_rng(seed)
  a_q = quantize(rng.normal(size=6), params.frac_bits)
  key = pcsc._alice_keygen(rng, params)
  cipher = [int(c) for c in pcsc._alice_encrypt(a_q, key, rng, params)]
  p, alpha = key.p, key.alpha  # public: sent with C
  t = cipher[1] * pow(cipher[0], -1, p) % p
  # The short vector is ±(x_1, x_2) / g, g = gcd(x_1, x_2); x_i = a_i α + c_i.
  y1, _ = _gauss_reduce((1, t), (0, p))
  centred = lambda z: z - p if z > p // 2 else z
  for g in range(1, 100):
    for sign in (1, -1):
      s_inv = pow(cipher[0] * pow(sign * g * y1, -1, p) % p, -1, p)
      xs = [centred(s_inv * c % p) for c in cipher]
      # Right guess: every x_i mod α is a k3-bit mask c_i (α has k2 bits).
      if all(x % alpha < 1 << params.k3 for x in xs):
        break
    else:
      continue
    break
  recovered = [x // alpha for x in xs[:-2]]
  assert recovered == a_q.tolist()
