"""Exact parameter counts, derived by hand in each test."""

import jax
import jax.numpy as jnp
import pytest

from fedjax_dd import models
from fedjax_dd.core.ledger import num_params


def _variables(module, input_shape, **kwargs):
  # Shapes only: no parameters are materialised.
  return jax.eval_shape(
      lambda k: module.init(k, jnp.zeros((2, *input_shape)), train=False,
                            **kwargs),
      jax.random.key(0))


def _count(module, input_shape, **kwargs):
  return num_params(_variables(module, input_shape, **kwargs)["params"])


def conv(k, cin, cout, bias=True):
  return k * k * cin * cout + (cout if bias else 0)


def dense(din, dout):
  return din * dout + dout


BN = lambda c: 2 * c  # noqa: E731 -- scale + bias; running stats excluded.


def test_lenet5():
  expected = (conv(5, 1, 6) + conv(5, 6, 16) + dense(16 * 4 * 4, 120)
              + dense(120, 84) + dense(84, 10))
  assert expected == 156 + 2416 + 30840 + 10164 + 850 == 44_426
  v = _variables(models.LeNet5(10), (28, 28, 1))
  assert num_params(v["params"]) == 44_426
  assert v["params"]["fc1"]["kernel"].shape == (256, 120)


def test_convnet3_cifar_and_mnist():
  blocks = conv(3, 3, 128) + BN(128) + 2 * (conv(3, 128, 128) + BN(128))
  assert blocks + dense(4 * 4 * 128, 10) == 320_010
  assert _count(models.ConvNet(10), (32, 32, 3)) == 320_010
  # 28 -> 14 -> 7 -> 3 (VALID pooling crops the odd row/column).
  blocks28 = conv(3, 1, 128) + BN(128) + 2 * (conv(3, 128, 128) + BN(128))
  assert blocks28 + dense(3 * 3 * 128, 10) == 308_746
  assert _count(models.ConvNet(10), (28, 28, 1)) == 308_746


def test_convnet_width_depth_configurable():
  # width 8, depth 2 on 8x8x1: 8 -> 4 -> 2.
  expected = (conv(3, 1, 8) + BN(8) + conv(3, 8, 8) + BN(8)
              + dense(2 * 2 * 8, 5))
  assert _count(models.ConvNet(5, width=8, depth=2), (8, 8, 1)) == expected


def test_hfldd_cifar_cnn():
  widths = [128] * 8
  expected, cin = 0, 3
  for c in widths:
    expected += conv(3, cin, c) + BN(c)
    cin = c
  expected += dense(2 * 2 * 128, 10)
  assert expected == 1_043_850
  assert _count(models.HFLDDCifarCNN(10), (32, 32, 3)) == 1_043_850


def test_alexnet():
  convs = (conv(3, 3, 64) + conv(3, 64, 192) + conv(3, 192, 384)
           + conv(3, 384, 256) + conv(3, 256, 256))
  expected = (convs + dense(4 * 4 * 256, 384) + dense(384, 192)
              + dense(192, 10))
  assert expected == 3_900_682
  assert _count(models.AlexNet(10), (32, 32, 3)) == 3_900_682


def test_alexcifarnet_matches_fedd3_reference_count():
  expected = (conv(5, 3, 64) + conv(5, 64, 64) + dense(4096, 384)
              + dense(384, 192) + dense(192, 10))
  assert expected == 1_756_426
  assert _count(models.AlexCifarNet(10), (32, 32, 3)) == 1_756_426


def test_resnet18():
  def block(cin, cout, stride):
    n = conv(3, cin, cout, False) + BN(cout) + conv(3, cout, cout, False)
    n += BN(cout)
    if stride != 1 or cin != cout:
      n += conv(1, cin, cout, False) + BN(cout)
    return n

  expected = conv(3, 3, 64, False) + BN(64)
  cin = 64
  for i, c in enumerate([64, 128, 256, 512]):
    expected += block(cin, c, 1 if i == 0 else 2) + block(c, c, 1)
    cin = c
  expected += dense(512, 10)
  assert expected == 11_173_962
  v = _variables(models.resnet18(10), (32, 32, 3))
  assert num_params(v["params"]) == 11_173_962
  # batch_stats hold a running mean and var for every BN channel.
  bn_channels = (64 + 4 * 64 + 4 * 128 + 128 + 4 * 256 + 256 + 4 * 512 + 512)
  assert num_params(v["batch_stats"]) == 2 * bn_channels


def test_cnn2_cnn3():
  cnn2 = (conv(5, 1, 32, False) + BN(32) + conv(5, 32, 64, False) + BN(64)
          + dense(7 * 7 * 64, 10))
  assert cnn2 == 83_562
  assert _count(models.CNN2(10), (28, 28, 1)) == cnn2
  cnn3 = (conv(3, 3, 32, False) + BN(32) + conv(3, 32, 64, False) + BN(64)
          + conv(3, 64, 128, False) + BN(128) + dense(4 * 4 * 128, 10))
  assert cnn3 == 113_962
  assert _count(models.CNN3(10), (32, 32, 3)) == cnn3


def test_fc_small_config_by_hand():
  # D = 2*3*1 = 6 inputs, width 4, depth 2, 3 classes:
  # (6 + 1) * 4 + (4 + 1) * 4 + (4 + 1) * 3 = 28 + 20 + 15 = 63.
  assert _count(models.FC(3, width=4, depth=2), (2, 3, 1)) == 63
  # depth 0 is a linear classifier: (6 + 1) * 3.
  assert _count(models.FC(3, width=4, depth=0), (2, 3, 1)) == 21
  # Registry default FC1 on 28x28x1: (784 + 1) * 1024 + (1024 + 1) * 10.
  assert _count(models.get_model("fc").build(10), (28, 28, 1)) == 814_090


def test_digits_cnn():
  expected = (conv(3, 1, 32) + conv(3, 32, 64) + dense(2 * 2 * 64, 128)
              + dense(128, 10))
  assert expected == 53_002
  assert _count(models.DigitsCNN(10), (8, 8, 1)) == expected


def test_generator_small_config_by_hand():
  # nz 4, ngf 2, 8x8x1: dense 4 -> 2*2*4, then BN(4) up conv 3x3 4->4 (no
  # bias), BN(4) up conv 3x3 4->2 (no bias), BN(2) conv 3x3 2->1.
  expected = (dense(4, 16) + BN(4) + conv(3, 4, 4, bias=False) + BN(4)
              + conv(3, 4, 2, bias=False) + BN(2) + conv(3, 2, 1))
  assert expected == 335
  gen = models.Generator(out_shape=(8, 8, 1), nz=4, ngf=2)
  assert _count(gen, (4,)) == 335
  cond = models.Generator(out_shape=(8, 8, 1), nz=4, ngf=2, conditional=True,
                          num_classes=3)
  # Plus the [3, 4] label embedding.
  assert _count(cond, (4,), y=jnp.zeros((2,), jnp.int32)) == 335 + 12


@pytest.mark.parametrize("num_classes", [2, 7])
def test_registry_head_scales_with_num_classes(num_classes):
  # Only the last dense layer depends on num_classes: 84 * k + k for LeNet-5.
  spec = models.get_model("lenet5")
  n = _count(spec.build(num_classes), spec.input_shape)
  assert n == 44_426 - 850 + 85 * num_classes
