"""Image grid PNG: written without pyplot, one row per group."""

import numpy as np
import pytest

from fedjax_dd.utils import image_grid


def test_writes_a_png_and_leaves_pyplot_backend_alone(tmp_path):
  import matplotlib
  backend = matplotlib.rcParams["backend"]
  images = np.zeros((5, 4, 4, 1), np.uint8)
  images[:, 1:3, 1:3] = 255
  path = image_grid.save_image_grid(tmp_path / "g.png", images,
                                    labels=np.arange(5),
                                    rows=np.array([0, 0, 1, 1, 1]))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert matplotlib.rcParams["backend"] == backend


def test_rejects_empty_images(tmp_path):
  with pytest.raises(ValueError, match="non-empty"):
    image_grid.save_image_grid(tmp_path / "g.png", np.zeros((0, 4, 4, 1)),
                               labels=np.zeros(0), rows=np.zeros(0))
