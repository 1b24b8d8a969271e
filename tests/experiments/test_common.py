"""Config glue of experiments/common.py: the dataset re-split option."""

import ml_collections
import numpy as np

from fedjax_dd.data import sources
from fedjax_dd.experiments import common


def _config(**kw):
  return ml_collections.ConfigDict({"dataset": "digits", "data_dir": "",
                                    "data_seed": 0, **kw})


def test_load_dataset_resplit_80_20_on_digits():
  plain = common.load_dataset(_config())
  assert (plain.x_train.shape[0], plain.x_test.shape[0]) == (1437, 360)
  off = common.load_dataset(_config(resplit=0.0))
  np.testing.assert_array_equal(off.x_test, plain.x_test)
  re = common.load_dataset(_config(resplit=0.8))
  # 1,797 pooled images: round(1437.6) = 1438 train, 359 test.
  assert (re.x_train.shape[0], re.x_test.shape[0]) == (1438, 359)
  want = sources.resplit(plain, 0.8, rng=np.random.default_rng(
      [0, common._RESPLIT_STREAM]))  # pylint: disable=protected-access
  np.testing.assert_array_equal(re.x_test, want.x_test)
  np.testing.assert_array_equal(re.y_train, want.y_train)
  other = common.load_dataset(_config(resplit=0.8, data_seed=1))
  assert not np.array_equal(other.y_test, re.y_test)
