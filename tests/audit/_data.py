"""Synthetic class-structured images shared by the audit tests."""

import numpy as np

SHAPE = (8, 8, 1)
CLASSES = 10


def templates(seed: int = 0) -> np.ndarray:
  """``[K, H, W, Ch]`` one random grey template per class."""
  return np.random.default_rng(seed).uniform(40, 215, (CLASSES, *SHAPE))


def draw(rng: np.random.Generator, per_class: int,
         t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``per_class`` images of each class: its template plus N(0, 25) grey
  levels of noise, in [2, 253] (so +-2 never clips)."""
  y = np.repeat(np.arange(t.shape[0]), per_class)
  x = t[y] + rng.normal(0.0, 25.0, (y.size, *t.shape[1:]))
  return np.clip(x, 2, 253).round().astype(np.uint8), y.astype(np.int32)


def near_copy(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
  """``x`` with every pixel moved by 2 grey levels, up or down."""
  step = 2 * rng.choice([-1, 1], x.shape)
  return (x.astype(np.int32) + step).astype(np.uint8)
