"""Writes tests/kernels/golden_ntk.npz: neural-tangents reference kernels.

Run from the repository root with neural-tangents 0.6.5 on jax 0.5.3::

    PYTHONPATH=. python tests/kernels/make_golden.py

Float64 (x64 is enabled in this script only). For the FC and ConvNet kernels
of :mod:`fedjax_dd.kernels.ntk`, NTK and NNGP, depths 1-3 (ConvNet: as deep as
the images allow), NTK parameterisation (and the standard one at depth 2), it
stores on tiny seeded inputs:

* ``k``: ``k(x1, x2)`` of 3 and 4 images;
* ``g1``, ``g2``: the gradients of ``sum(k(x1, x2) * w12)`` w.r.t. ``x1`` and
  ``x2``;
* ``ks``, ``gs``: ``k(xs, xs)`` of a support of 4 images whose last one
  duplicates the first (cos = 1 off the diagonal), and the gradient of
  ``sum(k(xs, xs) * wss)`` w.r.t. ``xs``.

``tests/kernels/test_native.py`` checks :mod:`fedjax_dd.kernels.native`
against them without neural-tangents.
"""

from __future__ import annotations

import os

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import neural_tangents  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_dd.kernels import ntk  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                   "golden_ntk.npz")

# (arch, image shape, depths).
CASES = (
    ("fc", (6, 6, 1), (1, 2, 3)),
    ("fc", (4, 4, 3), (1, 2, 3)),
    ("conv", (8, 8, 1), (1, 2, 3)),
    ("conv", (4, 4, 3), (1, 2)),
)
KINDS = ("ntk", "nngp")


def case_key(arch, shape, depth, kind, par):
  return f"{arch}_{'x'.join(map(str, shape))}_d{depth}_{kind}_{par}"


def main():
  rng = np.random.default_rng(20240611)
  out = {"versions": np.array([f"jax {jax.__version__}",
                               f"neural_tangents {neural_tangents.__version__}"
                               ])}
  w12 = rng.normal(size=(3, 4))
  wss = rng.normal(size=(4, 4))
  out["w12"], out["wss"] = w12, wss
  for shape in sorted({c[1] for c in CASES}):
    tag = "x".join(map(str, shape))
    out[f"{tag}_x1"] = rng.normal(size=(3,) + shape)
    out[f"{tag}_x2"] = rng.normal(size=(4,) + shape)
    xs = rng.normal(size=(4,) + shape)
    xs[3] = xs[0]
    out[f"{tag}_xs"] = xs
  for arch, shape, depths in CASES:
    tag = "x".join(map(str, shape))
    x1, x2, xs = (jnp.asarray(out[f"{tag}_{n}"]) for n in ("x1", "x2", "xs"))
    for depth in depths:
      for kind in KINDS:
        for par in ("ntk", "standard") if depth == 2 else ("ntk",):
          k = getattr(ntk, f"{arch}_kernel")(depth=depth, kind=kind,
                                             parameterization=par)
          key = case_key(arch, shape, depth, kind, par)
          out[f"{key}_k"] = np.asarray(k(x1, x2))
          g1, g2 = jax.grad(lambda a, b: jnp.sum(k(a, b) * w12),
                            argnums=(0, 1))(x1, x2)
          out[f"{key}_g1"], out[f"{key}_g2"] = np.asarray(g1), np.asarray(g2)
          out[f"{key}_ks"] = np.asarray(k(xs, xs))
          out[f"{key}_gs"] = np.asarray(
              jax.grad(lambda a: jnp.sum(k(a, a) * wss))(xs))
  for name, v in out.items():
    if v.dtype.kind == "f":
      assert v.dtype == np.float64 and np.all(np.isfinite(v)), name
  np.savez_compressed(OUT, **out)
  print(f"wrote {OUT}: {len(out)} arrays, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
  main()
