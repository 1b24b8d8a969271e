"""KIP on real MNIST: learned labels are no worse than fixed ones (slow).

KIP (Nguyen, Chen, Lee, ICLR 2021, Tab. 1 and App. A) finds that learning
the support labels raises KRR test accuracy. One client holds the whole
training set; both runs share the key, the initial support, the target
batches and the iteration count, and differ only in ``learn_labels``. The
support is kept in the pixel range (``clip_pixels``) and evaluated as
uint8, i.e. as FedD3 and HFLDD send it.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.distill import kip
from fedjax_dd.kernels import krr
from fedjax_dd.kernels.native import fc_kernel
from tests.conftest import shared_dataset


@pytest.fixture(scope="module")
def mnist():
  d = np.load(shared_dataset("mnist.npz"))
  x_train = np.asarray(d["x_train"], np.uint8).reshape(-1, 28, 28, 1)
  x_test = np.asarray(d["x_test"], np.uint8).reshape(-1, 28, 28, 1)
  return (x_train, np.asarray(d["y_train"], np.int32), x_test[:5000],
          np.asarray(d["y_test"], np.int32)[:5000])


def _krr_test_accuracy(mnist, ipc, learn_labels):
  x_train, y_train, x_test, y_test = mnist
  mean = np.array([x_train.mean() / 255.0], np.float32)
  std = np.array([x_train.std() / 255.0], np.float32)
  options = dataclasses.replace(kip.KIP_PAPER, learn_labels=learn_labels,
                                clip_pixels=True, max_iterations=300,
                                target_batch_size=500,
                                segment_iterations=300)
  res = kip.distill_clients(
      jax.random.PRNGKey(0), x_train[None], y_train[None],
      np.array([len(y_train)], np.int32), num_classes=10,
      kernel_fn=fc_kernel(depth=4), mean=mean, std=std,
      images_per_class=ipc, options=options, allow_raw_upload=True)
  kernel = fc_kernel(depth=4, batch_size=1000)
  norm = lambda x: (jnp.asarray(x, jnp.float32) / 255.0 - mean) / std
  xs = norm(kip.quantize(res.x[0]))
  pred, _ = krr.krr_predict_checked(kernel(xs, xs), kernel(norm(x_test), xs),
                                    res.y[0], options.reg,
                                    warn_on_jitter=False)
  assert np.all(np.isfinite(np.asarray(pred)))
  return float(np.mean(np.argmax(np.asarray(pred), -1) == y_test))


@pytest.mark.slow
@pytest.mark.parametrize("ipc", [1, 10])
def test_learned_labels_no_worse_than_fixed_labels(mnist, ipc):
  fixed = _krr_test_accuracy(mnist, ipc, learn_labels=False)
  learned = _krr_test_accuracy(mnist, ipc, learn_labels=True)
  assert learned >= fixed, (ipc, fixed, learned)
