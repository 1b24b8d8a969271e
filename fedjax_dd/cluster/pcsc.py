"""PCSC: the privacy-preserving cosine similarity protocol of DisUE's SSC.

DisUE (Leng et al., Sec. 4.3 "Secure Similarity Computation", Algorithm 1,
lines 10-17) computes the cosine matrix of Eq. 3 with the PCSC protocol of
Lu et al. ("Toward efficient and privacy-preserving computing in big data
era", IEEE Network 28(4), 2014). This module implements it on the host with
exact integers.

Source followed
---------------
A public Java implementation of the protocol ("An Efficient and
Privacy-Preserving Cosine Similarity Computing Protocol", class ``PPCGUI``,
parameters ``k1..k4``), which matches the article's outline: random masking
with large primes ``p``, ``α`` and a secret ``s``. For vectors ``a`` (Alice)
and ``b`` (Bob) of length ``n``, both extended by two zeros:

1. Alice draws primes ``p`` (``k1`` bits) and ``α`` (``k2`` bits), a secret
   ``s ∈ [1, p)`` and ``c_i`` (``k3`` bits) for ``i = 1..n+2``; sends
   ``(α, p, C_1..C_{n+2})`` with ``C_i = s (a_i α + c_i) mod p`` (the source
   writes ``s c_i`` when ``a_i = 0``, the same number).
2. Bob computes ``D_i = b_i α C_i mod p`` if ``b_i != 0`` and ``D_i = r_i
   C_i mod p`` with a random ``r_i`` (``k4`` bits) if ``b_i = 0``, and sends
   ``D = Σ_i D_i mod p``.
3. Alice computes ``E = s^{-1} D mod p = α² (a·b) + R`` and ``a·b = (E −
   (E mod α²)) / α²``, and the cosine as ``a·b / (‖a‖ ‖b‖)``.

Our changes, each needed for DisUE's vectors and each exact:

* **Signed entries.** Updates are signed, so the remainder ``R = α(Σ_{b_i≠0}
  b_i c_i + Σ_{b_i=0} r_i a_i) + Σ_{b_i=0} r_i c_i`` can be negative. Alice
  lifts ``E`` to ``(−p/2, p/2]`` and rounds: ``a·b = ⌊(E + ⌊α²/2⌋) / α²⌋``,
  exact when ``|R| < α²/2`` and ``|α² a·b + R| < p/2``, which
  :meth:`PCSCParams.check` enforces before any arithmetic.
* **Fixed point, unit length.** Each party quantises its unit-length
  vector, ``a_q = round(2^f a / ‖a‖)`` with ``f = frac_bits`` (see
  :func:`quantize`), so ``a_q · b_q / 2^{2f}`` is the cosine to within
  ``√n · 2^{-f}``; no norm is exchanged. Everything after quantisation is
  Python-integer arithmetic.

Randomness comes from the caller's ``np.random.Generator`` for
reproducibility; a deployment would use a cryptographic source.

Threat model and how Algorithm 1 is realised
--------------------------------------------
Only Alice, who draws ``s``, can unmask ``D``, so the server cannot compute
Algorithm 1's ``Sim_{u,v} = SSC.Compute(E(ω_u), E(ω_v))`` itself. For every
pair ``u < v`` of the round's cohort, client ``u`` is Alice with ``a = Δ_u``
and client ``v`` is Bob with ``b = Δ_v`` (fresh ``p, α, s`` per pair); the
server relays ``(α, p, C)`` to ``v`` and ``D`` to ``u``, and ``u`` reports
the cosine, since the server needs ``Sim`` to run AP (Eq. 4).

With honest-but-curious parties, the server learns ``C``, ``D`` and ``Sim``
(so, unlike Sec. 4.3's claim, it sees the similarities; PCSC hides only the
update vectors); client ``u`` learns ``cos(Δ_u, Δ_v)``; client ``v`` learns
``α``, ``p`` and ``C``, whose secrecy rests on ``s``.

Caveat (ours): the masking is not semantically secure. Each ``x_i = s^{-1}
C_i mod p = a_i α + c_i`` is below about ``2^{k2+f+1}`` while correctness
needs ``p > 2 α² n 2^{2f}``, so ``x_1 x_2 < p`` and ``(x_1, x_2)`` is almost
surely the shortest vector of the lattice ``{(u, w): C_1 w ≡ C_2 u (mod
p)}``; Gauss reduction of two ciphertexts gives Bob ``s``, hence ``a`` (see
``tests/cluster/test_pcsc.py``). Use this module to reproduce the paper's
pipeline and count its traffic, not as a privacy guarantee.

Traffic: every element mod ``p`` costs ``k1`` bits, ``α`` costs ``k2``; see
:meth:`PCSCParams.transcript_bits` and :meth:`PCSCParams.relayed_pair_bits`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["PCSCParams", "quantize", "pcsc_cosine", "pcsc_dot",
           "pcsc_similarity_matrix", "random_prime"]

_SMALL_PRIMES = tuple(q for q in range(3, 2000)
                      if all(q % d for d in range(2, int(q**0.5) + 1)))


@dataclasses.dataclass(frozen=True)
class PCSCParams:
  """Security and precision parameters of PCSC.

  The defaults are ours (the source leaves ``k1..k4`` open): exact for
  vectors up to about ``2^40`` entries at ``f = 24`` (see :meth:`check`).

  Attributes:
    k1: bits of the modulus ``p`` (and of every element of ``C`` and ``D``).
    k2: bits of the prime ``α``.
    k3: bits of Alice's masks ``c_i``.
    k4: bits of Bob's masks ``r_i``.
    frac_bits: ``f``, fractional bits of the fixed-point quantisation of the
      unit-length vectors.
    miller_rabin_rounds: Miller-Rabin rounds per prime candidate.
    cosine_bits: bits of the cosine client ``u`` reports to the server.
  """
  k1: int = 512
  k2: int = 200
  k3: int = 128
  k4: int = 128
  frac_bits: int = 24
  miller_rabin_rounds: int = 40
  cosine_bits: int = 32

  def __post_init__(self):
    for name in ("k1", "k2", "k3", "k4", "frac_bits", "miller_rabin_rounds",
                 "cosine_bits"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    if self.k2 < 3 or self.k1 < 3:
      raise ValueError("k1 and k2 must be >= 3 bits (odd primes).")

  def correctness_margin(self, n: int) -> tuple[int, int]:
    """The two exactness conditions' slack in bits (both must be > 0).

    With ``n' = n + 2`` terms, ``|a_i|, |b_i| <= 2^f``, ``c_i < 2^k3``,
    ``r_i < 2^k4``, ``2^(k2-1) <= α < 2^k2`` and ``p >= 2^(k1-1)``:

    * remainder: ``|R| <= n' (α 2^(f + max(k3, k4)) + 2^(k3 + k4)) < α²/2``,
      checked at the smallest ``α`` (the bound is then met for all larger);
    * wrap-around: ``2 (α² n 2^(2f) + α²/2) < p``, checked at the largest
      ``α`` and smallest ``p`` (``|a·b| <= n 2^(2f)``).

    Returns:
      ``(remainder_slack, wraparound_slack)`` as ``floor(log2)`` of the
      ratio of the two sides (``-1`` when violated).
    """
    f, m = self.frac_bits, max(self.k3, self.k4)
    n_terms = n + 2
    a_min = 1 << (self.k2 - 1)
    lhs1 = 2 * n_terms * (a_min * (1 << (f + m)) + (1 << (self.k3 + self.k4)))
    rhs1 = a_min * a_min
    a_max_sq = 1 << (2 * self.k2)
    lhs2 = 2 * a_max_sq * n * (1 << (2 * f)) + a_max_sq
    rhs2 = 1 << (self.k1 - 1)
    slack = lambda lhs, rhs: (rhs // lhs).bit_length() - 1 if lhs < rhs else -1
    return slack(lhs1, rhs1), slack(lhs2, rhs2)

  def check(self, n: int) -> None:
    """Raises ValueError unless PCSC is exact for length-``n`` vectors."""
    if n < 1:
      raise ValueError(f"Vectors must have at least one entry, got n={n}.")
    rem, wrap = self.correctness_margin(n)
    if rem < 0 or wrap < 0:
      raise ValueError(
          f"PCSC parameters {self} are not exact for vectors of length {n}: "
          f"{'the mask remainder can reach α²/2 (raise k2)' if rem < 0 else ''}"
          f"{' and ' if rem < 0 and wrap < 0 else ''}"
          f"{'E can wrap mod p (raise k1)' if wrap < 0 else ''}.")

  @property
  def element_bits(self) -> int:
    """``⌈log2 p⌉``: bits of one element mod ``p`` (``p`` has ``k1`` bits)."""
    return self.k1

  def transcript_bits(self, n: int) -> int:
    """Two-party transcript for length-``n`` vectors: ``k2 + (n + 4) k1``.

    Alice sends ``α``, ``p`` and ``n + 2`` elements of ``C``; Bob ``D``.
    """
    return self.k2 + self.k1 + (n + 2) * self.element_bits + self.element_bits

  def relayed_pair_bits(self, n: int) -> dict[str, int]:
    """One pair through the server: ``{"upload", "download"}`` bits.

    ``upload = T + cosine_bits`` (``u`` sends ``(α, p, C)``, ``v`` sends
    ``D``, ``u`` reports the cosine), ``download = T`` (the server's
    relays), ``T`` = :meth:`transcript_bits`.
    """
    t = self.transcript_bits(n)
    return {"upload": t + self.cosine_bits, "download": t}


# ----------------------------------------------------------------------------
# Integers from the Generator.
# ----------------------------------------------------------------------------


def _random_int(rng: np.random.Generator, bits: int) -> int:
  """Uniform integer in ``[0, 2^bits)``."""
  raw = int.from_bytes(rng.bytes((bits + 7) // 8), "little")
  return raw & ((1 << bits) - 1)


def _random_ints(rng: np.random.Generator, count: int, bits: int) -> np.ndarray:
  """``[count]`` object array of uniform integers in ``[0, 2^bits)``."""
  words = -(-bits // 64)
  raw = rng.integers(0, np.iinfo(np.uint64).max, size=(words, count),
                     dtype=np.uint64, endpoint=True)
  out = raw[0].astype(object)
  for w in range(1, words):
    out = (out << 64) | raw[w].astype(object)
  extra = words * 64 - bits
  return out >> extra if extra else out


def _is_probable_prime(x: int, rng: np.random.Generator, rounds: int) -> bool:
  if x < 2:
    return False
  for q in _SMALL_PRIMES:
    if x % q == 0:
      return x == q
  d, r = x - 1, 0
  while d % 2 == 0:
    d //= 2
    r += 1
  for _ in range(rounds):
    a = 2 + _random_int(rng, x.bit_length() + 64) % (x - 3)
    y = pow(a, d, x)
    if y in (1, x - 1):
      continue
    for _ in range(r - 1):
      y = pow(y, 2, x)
      if y == x - 1:
        break
    else:
      return False
  return True


def random_prime(bits: int, rng: np.random.Generator, *,
                 rounds: int = 40) -> int:
  """A random prime of exactly ``bits`` bits (Miller-Rabin, ``rounds``)."""
  if bits < 3:
    raise ValueError(f"bits must be >= 3, got {bits}.")
  while True:
    x = _random_int(rng, bits) | (1 << (bits - 1)) | 1
    if _is_probable_prime(x, rng, rounds):
      return x


# ----------------------------------------------------------------------------
# The protocol.
# ----------------------------------------------------------------------------


def _check_rng(rng: Any) -> None:
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"rng must be a np.random.Generator, got {type(rng).__name__}.")


def quantize(v: np.ndarray, frac_bits: int) -> np.ndarray:
  """``round(2^f v / ‖v‖)`` as ``[n]`` int64 (zeros for a zero vector).

  Float64 keeps the rounding exact to well below ``2^-f`` for ``f <= 40``.

  Raises:
    ValueError: ``v`` not 1-D or not finite.
  """
  x = np.asarray(v, np.float64)
  if x.ndim != 1:
    raise ValueError(f"Expected a 1-D vector, got shape {x.shape}.")
  if not np.isfinite(x).all():
    raise ValueError("Vectors must be finite.")
  norm = np.linalg.norm(x)
  if norm == 0:
    return np.zeros(x.shape, np.int64)
  return np.rint(x / norm * float(1 << frac_bits)).astype(np.int64)


def _extend(q: np.ndarray) -> np.ndarray:
  """Object array of the entries followed by the two zero entries."""
  return np.concatenate([q.astype(object), np.zeros(2, object)])


@dataclasses.dataclass(frozen=True)
class _AliceKey:
  p: int
  alpha: int
  s: int


def _alice_keygen(rng: np.random.Generator, params: PCSCParams) -> _AliceKey:
  p = random_prime(params.k1, rng, rounds=params.miller_rabin_rounds)
  alpha = random_prime(params.k2, rng, rounds=params.miller_rabin_rounds)
  s = 1 + _random_int(rng, params.k1 + 64) % (p - 1)
  return _AliceKey(p=p, alpha=alpha, s=s)


def _alice_encrypt(a_q: np.ndarray, key: _AliceKey, rng: np.random.Generator,
                   params: PCSCParams) -> np.ndarray:
  """Step 1: ``C_i = s (a_i α + c_i) mod p``, ``[n + 2]`` object."""
  a = _extend(a_q)
  c = _random_ints(rng, a.shape[0], params.k3)
  return (key.s * (a * key.alpha + c)) % key.p


def _bob_respond(b_q: np.ndarray, cipher: np.ndarray, alpha: int, p: int,
                 rng: np.random.Generator, params: PCSCParams) -> int:
  """Step 2: ``D = Σ_i D_i mod p``.

  ``Σ_i (m_i C_i mod p) ≡ (Σ_i m_i C_i) mod p`` with ``m_i = b_i α`` or
  ``r_i``, so one reduction of the exact sum gives the same ``D``.
  """
  b = _extend(b_q)
  r = _random_ints(rng, b.shape[0], params.k4)
  m = np.where(b != 0, b * alpha, r)
  return int(np.dot(m, cipher)) % p


def _alice_decrypt(d: int, key: _AliceKey) -> int:
  """Step 3: ``a·b`` from ``E = s^{-1} D mod p`` (centred, rounded)."""
  e = (pow(key.s, -1, key.p) * d) % key.p
  if e > key.p // 2:
    e -= key.p
  a2 = key.alpha * key.alpha
  return (e + a2 // 2) // a2


def pcsc_dot(a_q: np.ndarray, b_q: np.ndarray, *, rng: np.random.Generator,
             params: PCSCParams = PCSCParams()) -> tuple[int, int]:
  """PCSC on integer vectors: exact ``a_q · b_q`` and the transcript bits.

  Args:
    a_q: Alice's ``[n]`` integers, ``|a_i| <= 2^f``.
    b_q: Bob's ``[n]`` integers, ``|b_i| <= 2^f``.
    rng: Alice's and Bob's randomness (keys, masks).
    params: :class:`PCSCParams`.

  Returns:
    ``(dot, transcript_bits)``, ``transcript_bits =
    params.transcript_bits(n)``.
  """
  _check_rng(rng)
  a_q, b_q = np.asarray(a_q), np.asarray(b_q)
  if a_q.ndim != 1 or a_q.shape != b_q.shape:
    raise ValueError(f"Vectors must be 1-D of equal length, got {a_q.shape} "
                     f"and {b_q.shape}.")
  n = a_q.shape[0]
  params.check(n)
  bound = 1 << params.frac_bits
  if np.abs(a_q).max(initial=0) > bound or np.abs(b_q).max(initial=0) > bound:
    raise ValueError(f"Entries must be within ±2^{params.frac_bits}.")
  key = _alice_keygen(rng, params)
  cipher = _alice_encrypt(a_q, key, rng, params)
  d = _bob_respond(b_q, cipher, key.alpha, key.p, rng, params)
  return _alice_decrypt(d, key), params.transcript_bits(n)


def pcsc_cosine(a: np.ndarray, b: np.ndarray, *, rng: np.random.Generator,
                params: PCSCParams = PCSCParams()) -> tuple[float, int]:
  """Cosine of two float vectors through PCSC (Alice holds ``a``).

  Args:
    a: ``[n]`` Alice's vector (e.g. client ``u``'s update ``Δ_u``).
    b: ``[n]`` Bob's vector.
    rng: randomness of both parties.
    params: :class:`PCSCParams`.

  Returns:
    ``(cosine, transcript_bits)``: the cosine of the unit-length quantised
    vectors, ``a_q · b_q / 2^{2f}`` (within ``√n 2^{-f}`` of the float
    cosine; 0 if either vector is zero), and
    ``params.transcript_bits(n)``.

  Raises:
    ValueError: vectors not 1-D, of different lengths, not finite, or too
      long for ``params``.
  """
  a, b = np.asarray(a), np.asarray(b)
  if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
    raise ValueError(f"Vectors must be 1-D of equal length, got {a.shape} "
                     f"and {b.shape}.")
  f = params.frac_bits
  dot, bits = pcsc_dot(quantize(a, f), quantize(b, f), rng=rng, params=params)
  return dot / (1 << (2 * f)), bits


def pcsc_similarity_matrix(vectors: np.ndarray, *, rng: np.random.Generator,
                           params: PCSCParams = PCSCParams()
                           ) -> tuple[np.ndarray, int, int]:
  """``Sim`` of Eq. 3 over all pairs through PCSC, relayed by the server.

  Pair ``(u, v)``, ``u < v``, runs :func:`pcsc_cosine` with client ``u`` as
  key holder, in row-major order (the result depends on ``rng``'s state).

  Args:
    vectors: ``[S, P]`` host array, row ``i`` client ``i``'s update
      (``jax.device_get`` it first).
    rng: randomness of all parties.
    params: :class:`PCSCParams`.

  Returns:
    ``(sim, bits_per_pair, total_bits)``: ``sim [S, S]`` float64 symmetric,
    diagonal 1 (0 for a zero vector, which needs no protocol);
    ``bits_per_pair`` = upload + download of
    :meth:`PCSCParams.relayed_pair_bits` ``= 2 T + cosine_bits``;
    ``total_bits = S (S - 1) / 2 · bits_per_pair``.
  """
  _check_rng(rng)
  x = np.asarray(vectors)
  if x.ndim != 2 or x.shape[0] < 1:
    raise ValueError(f"vectors must be [S, P] with S >= 1, got {x.shape}.")
  s, n = x.shape
  params.check(n)
  f = params.frac_bits
  quantized = [quantize(row, f) for row in x]
  sim = np.diag([1.0 if q.any() else 0.0 for q in quantized])
  for u in range(s):
    for v in range(u + 1, s):
      dot, _ = pcsc_dot(quantized[u], quantized[v], rng=rng, params=params)
      sim[u, v] = sim[v, u] = dot / (1 << (2 * f))
  pair = params.relayed_pair_bits(n)
  bits_per_pair = pair["upload"] + pair["download"]
  return sim, bits_per_pair, math.comb(s, 2) * bits_per_pair
