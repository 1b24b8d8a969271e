"""The jitted evaluator: accuracy, loss, and per-class accuracy."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.evaluate import class_accuracy, make_evaluator
from fedjax_dd.core.task import Classifier


class FirstPixels(nn.Module):
  """Logits = the first three pixels times a scale: a hand-set prediction."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    scale = self.param("scale", nn.initializers.ones, ())
    return scale * x.reshape((x.shape[0], -1))[:, :3]


TASK = Classifier(module=FirstPixels(), input_shape=(2, 2, 1),
                  preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                  num_classes=3)


def _split():
  # Seven images; the predicted class is the one bright pixel's index.
  predicted = [0, 0, 1, 1, 1, 1, 0]
  labels = [0, 0, 0, 1, 0, 0, 0]
  x = np.zeros((7, 2, 2, 1), np.uint8)
  for i, p in enumerate(predicted):
    x[i].reshape(-1)[p] = 200
  return x, np.asarray(labels, np.int32)


def test_class_accuracy_hand_checked_across_padded_batches():
  x, y = _split()
  params, stats = TASK.init(jax.random.PRNGKey(0))
  # Batches of 3: 7 rows become 3 batches with 2 padded rows, which must
  # count for no class.
  ev = make_evaluator(TASK, x, y, batch_size=3, per_class=True)(params, stats)
  # Class 0: rows 0, 1, 2, 4, 5, 6; predicted right in rows 0, 1, 6 (3/6).
  # Class 1: row 3, right (1/1). Class 2: no test example.
  assert ev["class_accuracy"] == [pytest.approx(0.5), pytest.approx(1.0),
                                  None]
  assert ev["accuracy"] == pytest.approx(4 / 7)
  plain = make_evaluator(TASK, x, y, batch_size=3)(params, stats)
  assert "class_accuracy" not in plain
  assert plain["accuracy"] == ev["accuracy"] and plain["loss"] == ev["loss"]
  assert np.isfinite(ev["loss"])


def test_class_accuracy_helper():
  assert class_accuracy(np.array([1.0, 0.0, 0.0]),
                        np.array([4.0, 2.0, 0.0])) == [0.25, 0.0, None]


def test_per_class_evaluator_compiles_once(caplog):
  x, y = _split()
  params, stats = TASK.init(jax.random.PRNGKey(0))
  evaluate = make_evaluator(TASK, x, y, batch_size=3, per_class=True)
  evaluate(params, stats)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    for s in (2.0, -1.0):
      evaluate({"scale": jnp.float32(s)}, stats)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  # A negative scale flips the prediction to the darkest pixel.
  flipped = evaluate({"scale": jnp.float32(-1.0)}, stats)
  assert flipped["class_accuracy"][1] == 0.0


def test_evaluate_server_suffixes_every_figure_of_an_extra_model():
  x, y = _split()
  params, stats = TASK.init(jax.random.PRNGKey(0))
  evaluate = make_evaluator(TASK, x, y, per_class=True)

  class Server:
    pass

  server = Server()
  server.params, server.batch_stats = params, stats
  server.extra = {rounds_lib.EVAL_MODELS: {"before": {
      "params": {"scale": jnp.float32(-1.0)}, "batch_stats": stats}}}
  out = rounds_lib.evaluate_server(evaluate, server)
  assert set(out) == {"accuracy", "loss", "class_accuracy", "accuracy_before",
                      "loss_before", "class_accuracy_before"}
  assert out["class_accuracy"][1] == 1.0
  assert out["class_accuracy_before"][1] == 0.0
