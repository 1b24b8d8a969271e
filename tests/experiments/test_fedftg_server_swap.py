"""experiments/reference/fedftg_server_swap.py: its PyTorch <-> Flax
conversions of LeNet-5 (the reference side's layout against our model)."""

import importlib.util
import pathlib
import sys

import jax
import numpy as np
import pytest

_DIR = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "reference"


def _load():
  sys.path.insert(0, str(_DIR))  # the script imports the adapter beside it
  try:
    spec = importlib.util.spec_from_file_location(
        "fedftg_server_swap", _DIR / "fedftg_server_swap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  finally:
    sys.path.remove(str(_DIR))
  return mod


def test_imports_without_torch_and_unflatten_checks_the_length():
  swap = _load()
  assert "--side" in swap.__doc__
  template = {"a": np.zeros((2, 3)), "b": np.zeros((4,))}
  out = swap.unflatten(template, np.arange(10.0))
  np.testing.assert_array_equal(out["a"], [[0, 1, 2], [3, 4, 5]])
  np.testing.assert_array_equal(out["b"], [6, 7, 8, 9])
  with pytest.raises(ValueError, match="11 parameters for a model of 10"):
    swap.unflatten(template, np.arange(11.0))
  z = swap.lockstep_noise(7, 3)
  assert z.shape == (3, 50, 100) and z.dtype == np.float32
  np.testing.assert_array_equal(z, swap.lockstep_noise(7, 3))


def test_set_parses_as_the_field_and_fills_none_valued_fields():
  swap = _load()
  assert swap._set_value(True, "false") is False
  assert swap._set_value(False, "True") is True
  three = swap._set_value(10, "3")
  assert three == 3 and isinstance(three, int)
  assert swap._set_value(0.1, "0.05") == 0.05
  assert swap._set_value("kl", "l1_logits") == "l1_logits"
  # A field that is None now (student_discrepancy): the text, or a number.
  assert swap._set_value(None, "kl") == "kl"
  assert swap._set_value(None, "4") == 4 and swap._set_value(None, "0.5") == 0.5
  assert swap._set_value("kl", "None") is None
  assert swap._set_value(None, "") is None


def test_lenet_conversion_reproduces_the_logits_and_inverts():
  torch = pytest.importorskip("torch")
  from fedjax_dd.models import get_model
  swap = _load()
  torch.manual_seed(0)
  net = swap.fedftg_adapter._lenet5(torch, 1, 10, 28)()
  sd = {k: v.detach().numpy() for k, v in net.state_dict().items()}
  x = np.random.default_rng(1).standard_normal((4, 1, 28, 28)).astype(
      np.float32)
  with torch.no_grad():
    want = net(torch.from_numpy(x)).numpy()
  params = swap.lenet_to_flax(sd)
  module = get_model("lenet5").build(10)
  got = module.apply({"params": jax.tree_util.tree_map(np.asarray, params)},
                     np.moveaxis(x, 1, -1), train=False)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  back = swap.flax_lenet_to_state_dict(params)
  assert back.keys() == sd.keys()
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k])
