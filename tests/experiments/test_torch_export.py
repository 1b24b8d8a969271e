"""Flax ConvBNNet -> PyTorch state dict (experiments/reference/torch_export.py):
the converted model's logits equal ours within 1e-5."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

_PATH = (pathlib.Path(__file__).resolve().parents[2] / "experiments" /
         "reference" / "torch_export.py")


def _load():
  spec = importlib.util.spec_from_file_location("torch_export", _PATH)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _perturbed_stats(stats, key):
  # Non-trivial running statistics, so that a mean/var mix-up shows.
  leaves, tree = jax.tree_util.tree_flatten(stats)
  keys = jax.random.split(key, len(leaves))
  return jax.tree_util.tree_unflatten(
      tree, [a + 0.3 * jnp.abs(jax.random.normal(k, a.shape))
             for a, k in zip(leaves, keys)])


@pytest.mark.parametrize("name,shape", [("cnn2", (28, 28, 1)),
                                        ("cnn3", (32, 32, 3))])
def test_converted_logits_equal_ours(name, shape):
  from fedjax_dd.models import get_model
  exp = _load()
  module = get_model(name).build(10)
  x = jax.random.uniform(jax.random.PRNGKey(1), (4, *shape))
  v = module.init(jax.random.PRNGKey(0), x, train=False)
  stats = _perturbed_stats(v["batch_stats"], jax.random.PRNGKey(2))
  mean, std = np.full(shape[-1], 0.13), np.full(shape[-1], 0.31)
  ours = module.apply({"params": v["params"], "batch_stats": stats},
                      (x - mean) / std, train=False)

  sd = exp.flax_to_torch(v["params"], stats, features=module.features,
                         image_hw=shape[:2])
  net = exp.build_torch(module.features, module.kernel_size, 10, shape[-1],
                        shape[:2])
  missing = net.load_state_dict({k: torch.from_numpy(a) for k, a in sd.items()},
                                strict=True)
  assert not missing.missing_keys and not missing.unexpected_keys
  wrapped = exp.normalized(net, mean, std).eval()
  with torch.no_grad():
    theirs = wrapped(torch.from_numpy(np.asarray(x).transpose(0, 3, 1, 2)))
  np.testing.assert_allclose(theirs.numpy(), np.asarray(ours), atol=1e-5,
                             rtol=0)
  # The logits are not all alike: a wrong flatten order would show.
  assert float(np.ptp(np.asarray(ours))) > 0.1


def test_dense_rows_follow_pytorchs_flatten_order():
  # A 2x2x2 feature map (h, w, c) whose dense kernel picks feature (h=0,
  # w=1, c=1): in NCHW order that is c·4 + h·2 + w = 5.
  exp = _load()
  kernel = np.zeros((8, 1), np.float32)
  kernel[(0 * 2 + 1) * 2 + 1, 0] = 1.0
  params = {"conv1": {"kernel": np.zeros((1, 1, 1, 2), np.float32)},
            "bn1": {"scale": np.ones(2, np.float32),
                    "bias": np.zeros(2, np.float32)},
            "fc": {"kernel": kernel, "bias": np.zeros(1, np.float32)}}
  stats = {"bn1": {"mean": np.zeros(2, np.float32),
                   "var": np.ones(2, np.float32)}}
  sd = exp.flax_to_torch(params, stats, features=(2,), image_hw=(4, 4))
  assert sd["fc.weight"].shape == (1, 8)
  assert np.flatnonzero(sd["fc.weight"][0]).tolist() == [5]
  assert sd["blocks.0.0.weight"].shape == (2, 1, 1, 1)
