"""HFLDD stages 5-6 and the Eq. 18 ledger on tiny hand-checkable data."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import hfldd
from fedjax_dd.distill import privacy
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.cluster.sampling import Topology
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import kip
from fedjax_dd.kernels.native import fc_kernel
from fedjax_dd.utils import figures
from fedjax_dd.utils import reporting
from tests.conftest import synthetic_clients, tiny_task, tracing_task

# Clients 0..4 (sizes 5, 9, 12, 7, 6); heterogeneous clusters {0,1,2} with
# head 1 and {3,4} with head 4.
TOPO = Topology(homogeneous=np.array([0, 1, 2, 0, 1]),
                heterogeneous=np.array([0, 0, 0, 1, 1]),
                heads=np.array([1, 4]))


def _data():
  x, y, n = synthetic_clients(num_clients=4)
  x5, y5, _ = synthetic_clients(num_clients=1, sizes=(6,), seed=3)
  return ClientData(x=np.concatenate([x, x5]), y=np.concatenate([y, y5]),
                    num_examples=np.array([5, 9, 12, 7, 6], np.int32))


def test_labels_to_targets_centred_learned_and_degenerate():
  centred = np.array([[-.25, .75, -.25, -.25]])
  np.testing.assert_allclose(kip.labels_to_targets(centred, centered=True),
                             [[0, 1, 0, 0]], atol=1e-7)
  learned = np.array([[2.0, -1.0, 1.0], [-1.0, -0.5, -2.0], [0, 0, 1]])
  t = kip.labels_to_targets(learned, centered=False)
  np.testing.assert_allclose(t, [[2 / 3, 0, 1 / 3], [0, 1, 0], [0, 0, 1]],
                             rtol=1e-6)
  np.testing.assert_allclose(t.sum(-1), 1.0, rtol=1e-6)


def test_soft_target_loss_equals_integer_loss_on_one_hot_and_handles_soft():
  task = tiny_task()
  soft = task  # Classifier.loss takes [B, K] targets itself.
  params, stats = task.init(jax.random.PRNGKey(0))
  x, y, _ = synthetic_clients()
  xb, yb = jnp.asarray(x[2, :8]), jnp.asarray(y[2, :8])
  w = jnp.array([1, 1, 1, 0, 1, 0, 1, 1], jnp.float32)

  @jax.jit
  def everything():
    want, (_, acc) = task.loss(params, stats, xb, yb, weights=w)
    got, (_, acc2) = soft.loss(params, stats, xb, jax.nn.one_hot(yb, 3),
                               weights=w)
    same, _ = soft.loss(params, stats, xb, yb)          # integer path kept
    plain, _ = task.loss(params, stats, xb, yb)
    logits, _ = task.apply(params, stats, task.preprocess(xb), train=True)
    got_u, _ = soft.loss(params, stats, xb, jnp.full((8, 3), 1 / 3))
    # A uniform target: CE = logsumexp(z) - mean(z).
    want_u = jnp.mean(jax.nn.logsumexp(logits, -1) - logits.mean(-1))
    return want, got, acc, acc2, same, plain, got_u, want_u

  want, got, acc, acc2, same, plain, got_u, want_u = everything()
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(acc2, acc, rtol=1e-6)
  np.testing.assert_allclose(same, plain, rtol=1e-6)
  np.testing.assert_allclose(got_u, want_u, rtol=1e-5)


def _sent_stub():
  # Members 0, 2, 3 send 2, 3, 1 rows of a support of size 3.
  x = np.zeros((3, 3, 4, 4, 1), np.uint8)
  for j in range(3):
    x[j] = 100 + j
  y = np.tile(np.array([0.2, 0.3, 0.5], np.float32), (3, 3, 1))
  mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
  return hfldd.SentData(x=x, y=y, mask=mask, senders=np.array([0, 2, 3]))


def test_build_hybrid_data_concatenates_own_raw_and_received_rows():
  data = _data()
  sent = _sent_stub()
  np.testing.assert_array_equal(sent.counts, [2, 3, 1])
  hyb = hfldd.build_hybrid_data(data, TOPO, sent, num_classes=3)
  # Head 1: 9 own + 2 (client 0) + 3 (client 2); head 4: 6 own + 1 (client 3).
  np.testing.assert_array_equal(hyb.num_examples, [14, 7])
  assert hyb.x.shape == (2, 14, 4, 4, 1) and hyb.y.shape == (2, 14, 3)
  np.testing.assert_array_equal(hyb.x[0, :9], data.x[1, :9])
  np.testing.assert_array_equal(hyb.y[0, :9], np.eye(3)[data.y[1, :9]])
  assert (hyb.x[0, 9:11] == 100).all() and (hyb.x[0, 11:14] == 101).all()
  np.testing.assert_allclose(hyb.y[0, 9:14], [[0.2, 0.3, 0.5]] * 5)
  assert (hyb.x[1, 6] == 102).all() and (hyb.x[1, 7:] == 0).all()
  assert (hyb.y[1, 7:] == 0).all()                       # padding


def test_raw_members_is_the_wodd_ablation():
  data = _data()
  sent = hfldd.raw_members(data, TOPO, num_classes=3)
  np.testing.assert_array_equal(sent.senders, [0, 2, 3])
  np.testing.assert_array_equal(sent.counts, [5, 12, 7])
  hyb = hfldd.build_hybrid_data(data, TOPO, sent, num_classes=3)
  np.testing.assert_array_equal(hyb.num_examples, [9 + 5 + 12, 6 + 7])
  assert int(hyb.num_examples.sum()) == int(data.num_examples.sum())
  np.testing.assert_array_equal(hyb.y[1, 6:13].argmax(-1), data.y[3, :7])


def _distill_topo(data, options):
  """``distill_members`` of :data:`TOPO`'s members, 6 images each; a few
  iterations leave some images raw, which is allowed here."""
  return hfldd.distill_members(
      jax.random.PRNGKey(0), data, TOPO, kernel_fn=fc_kernel(depth=1),
      mean=np.array([0.3], np.float32), std=np.array([0.3], np.float32),
      num_classes=3, support_size=6, options=options,
      mapper=ClientMapper(backend="vmap"), allow_raw_upload=True)


def test_distill_members_with_batched_kip_caps_small_clients():
  data = _data()
  sent, res = _distill_topo(data, kip.KipOptions(
      max_iterations=3, segment_iterations=3, stop_accuracy=2.0))
  # Members 0, 2, 3 hold 5, 12, 7 examples: client 0 sends only 5.
  np.testing.assert_array_equal(sent.counts, [5, 6, 6])
  assert sent.x.dtype == np.uint8 and sent.x.shape == (3, 6, 4, 4, 1)
  assert np.isfinite(sent.y).all()
  np.testing.assert_allclose(sent.y[sent.mask].sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(res.iterations, [3, 3, 3])
  hyb = hfldd.build_hybrid_data(data, TOPO, sent, num_classes=3)
  np.testing.assert_array_equal(hyb.num_examples, [9 + 5 + 6, 6 + 6])


# Three one-class clients (client c holds class c); client 0 heads them all.
ONE_HEAD = Topology(homogeneous=np.arange(3), heterogeneous=np.zeros(3, int),
                    heads=np.array([0]))


def _one_class_data():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (3, 8, 4, 4, 1)).astype(np.uint8)
  y = np.repeat(np.arange(3)[:, None], 8, axis=1).astype(np.int32)
  return ClientData(x=x, y=y, num_examples=np.array([8, 8, 6], np.int32))


def _distill_one_class(iterations, **kwargs):
  # HFLDD's default options (a fixed budget), this many iterations.
  return hfldd.distill_members(
      jax.random.PRNGKey(1), _one_class_data(), ONE_HEAD,
      kernel_fn=fc_kernel(depth=1), mean=np.array([0.5], np.float32),
      std=np.array([0.29], np.float32), num_classes=3, support_size=4,
      options=dataclasses.replace(hfldd.HFLDD_KIP, max_iterations=iterations,
                                  segment_iterations=10),
      mapper=ClientMapper(backend="vmap"), **kwargs)


def test_raw_uploads_are_refused_unless_allowed(caplog):
  # No KIP iteration: each member's support is 4 of its raw images. The
  # guard FedD3 runs refuses them by default, naming the count ...
  with pytest.raises(privacy.RawUploadError,
                     match=r"8 of 8 HFLDD KIP images to upload are "
                           r"byte-identical .* kip.max_iterations"):
    _distill_one_class(0)
  # ... and allow_raw_upload sends them with one warning line.
  with caplog.at_level("WARNING"):
    sent, _ = _distill_one_class(0, allow_raw_upload=True)
  assert int(sent.mask.sum()) == 8
  assert "8 of 8 KIP images sent are byte-identical" in caplog.text


def test_single_class_members_upload_images_unlike_any_raw_image():
  data = _one_class_data()
  # No iteration: the support is 4 raw images per member, sent as they are
  # (when allowed).
  sent0, _ = _distill_one_class(0, allow_raw_upload=True)
  p0 = hfldd.sent_privacy(data, sent0)
  assert p0["uploaded_images"] == 8                 # members 1, 2 x 4
  assert p0["identical_to_raw_fraction"] == 1.0
  assert p0["nearest_raw_l2_min"] == 0.0
  # The default is a fixed budget: each one-class member runs all 30
  # iterations (FedD3's accuracy stop would end them at iteration 1).
  sent, res = _distill_one_class(30)
  np.testing.assert_array_equal(res.iterations, [30, 30])
  assert not np.asarray(res.converged).any()
  p = hfldd.sent_privacy(data, sent)
  assert p["uploaded_images"] == 8
  assert p["identical_to_raw_count"] == 0 and p["identical_to_raw_fraction"] == 0.0
  assert p["nearest_raw_l2_min"] > 0.0
  # Byte-level check against every raw image of the sender.
  for j, c in enumerate(sent.senders):
    raw = data.x[c, :data.num_examples[c]].reshape(int(data.num_examples[c]), -1)
    for img in sent.x[j][sent.mask[j]]:
      assert not (raw == img.reshape(1, -1)).all(axis=1).any()
  loss = kip.loss_summary(res.iterations, res.first_loss, res.loss)
  assert set(loss) == {"first_min", "first_median", "last_min", "last_median"}
  assert all(np.isfinite(v) and v >= 0 for v in loss.values())


def test_kip_loss_summary_min_median_skipping_idle_members():
  res = kip.KipResult(
      x=np.zeros((3, 1, 1, 1, 1)), y=np.zeros((3, 1, 2)),
      mask=np.ones((3, 1), bool), counts=np.ones(3, np.int32),
      iterations=np.array([3, 0, 5]), converged=np.zeros(3, bool),
      accuracy=np.zeros(3), loss=np.array([0.5, 0.0, 0.1]),
      first_loss=np.array([1.0, 0.0, 3.0]))
  assert kip.loss_summary(res.iterations, res.first_loss, res.loss) == {
      "first_min": 1.0, "first_median": 2.0, "last_min": 0.1,
      "last_median": 0.3}


def test_random_members_send_own_raw_samples_at_the_kip_budget():
  data = _data()
  sent = hfldd.random_members(data, TOPO, num_classes=3, sample_size=6,
                              rng=np.random.default_rng(0))
  np.testing.assert_array_equal(sent.senders, [0, 2, 3])
  # Members hold 5, 12, 7 examples: min(6, n) each, as KIP's support.
  np.testing.assert_array_equal(sent.counts, [5, 6, 6])
  assert sent.x.shape == (3, 6, 4, 4, 1) and sent.x.dtype == np.uint8
  for j, c in enumerate(sent.senders):
    raw = data.x[c, :data.num_examples[c]].reshape(int(data.num_examples[c]), -1)
    raw_y = data.y[c, :data.num_examples[c]]
    rows = sent.x[j][sent.mask[j]].reshape(int(sent.counts[j]), -1)
    hits = [np.flatnonzero((raw == r).all(axis=1)) for r in rows]
    assert all(h.size for h in hits)
    idx = [h[0] for h in hits]
    assert len(set(idx)) == len(idx)               # without replacement
    np.testing.assert_array_equal(sent.y[j][sent.mask[j]], np.eye(3)[raw_y[idx]])
  assert (sent.x[0, 5] == 0).all() and (sent.y[0, 5] == 0).all()
  # Client 0 has 5 examples: it sends all of them.
  assert sorted(map(bytes, sent.x[0, :5])) == sorted(map(bytes, data.x[0, :5]))
  assert hfldd.sent_privacy(data, sent)["identical_to_raw_fraction"] == 1.0
  again = hfldd.random_members(data, TOPO, num_classes=3, sample_size=6,
                               rng=np.random.default_rng(0))
  np.testing.assert_array_equal(again.x, sent.x)
  with pytest.raises(TypeError, match="Generator"):
    hfldd.random_members(data, TOPO, num_classes=3, sample_size=6, rng=0)


def test_raw_members_privacy_reads_all_identical():
  data = _data()
  p = hfldd.sent_privacy(data, hfldd.raw_members(data, TOPO, num_classes=3))
  assert p["uploaded_images"] == 5 + 12 + 7
  assert p["identical_to_raw_fraction"] == 1.0 and p["nearest_raw_l2_median"] == 0.0


def test_learned_labels_reach_the_heads_and_are_charged_32_bits():
  data = _data()
  sent, res = _distill_topo(data, dataclasses.replace(
      hfldd.HFLDD_KIP, max_iterations=5, segment_iterations=5,
      learn_labels=True))
  mask = np.asarray(sent.mask)
  learned = np.asarray(res.y)[mask]
  one_hot = np.eye(3)[learned.argmax(-1)]
  assert np.abs(learned - one_hot).max() > 1e-3     # the labels moved
  np.testing.assert_allclose(sent.y, kip.labels_to_targets(res.y,
                                                             centered=False))
  hyb = hfldd.build_hybrid_data(data, TOPO, sent, num_classes=3)
  # Head 1 holds its 9 raw rows, then client 0's 5 and client 2's 6 rows.
  np.testing.assert_allclose(hyb.y[0, 9:14], sent.y[0, :5])
  np.testing.assert_allclose(hyb.y[0, 14:20], sent.y[1, :6])
  ledger = hfldd.setup_ledger(TOPO, sent.counts, aux_size=10, num_classes=3,
                              pixels_per_sample=16, bits_per_sent_label=32)
  tags = ledger.tag_totals()
  # 5 + 6 + 6 = 17 rows x 3 float32 entries; images 17 x 16 x 8 bits.
  assert tags["distilled_labels"]["bits_total"] == 17 * 3 * 32
  assert tags["distilled_data"]["bits_total"] == 17 * 16 * 8


def test_head_training_on_one_hot_targets_equals_fedavg_on_labels():
  task = tiny_task()
  x, y, n = synthetic_clients()
  params, stats = task.init(jax.random.PRNGKey(0))
  steps = jnp.array([2, 3, 1, 2], jnp.int32)
  cohort = Cohort(x=jnp.asarray(x), y=jnp.asarray(y), num_examples=jnp.asarray(n),
                  num_steps=steps, client_ids=jnp.arange(4))
  soft_cohort = cohort.replace(y=jax.nn.one_hot(cohort.y, 3))
  key = jax.random.PRNGKey(9)
  ref = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=3))
  alg = hfldd.head_training(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                                          max_steps=3))
  s_ref, _, _ = ref.apply(ref.init(params, stats, 4)[0], {}, cohort, key)
  s_new, _, m = alg.apply(alg.init(params, stats, 4)[0], {}, soft_cohort, key)
  for a, b in zip(jax.tree_util.tree_leaves(s_new.params),
                  jax.tree_util.tree_leaves(s_ref.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert np.isfinite(float(m["train_loss"]))


def test_eq18_ledger_through_the_rounds_loop_and_no_recompilation():
  traces = []
  task = tracing_task(traces)
  data = _data()
  sent = _sent_stub()
  hyb = hfldd.build_hybrid_data(data, TOPO, sent, num_classes=3)
  ledger = hfldd.setup_ledger(TOPO, sent.counts, aux_size=10, num_classes=3,
                              pixels_per_sample=16)
  steps = steps_for(hyb.num_examples, 4, epochs=1.0)
  alg = hfldd.head_training(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                                          max_steps=int(steps.max())))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 2)
  state = ExperimentState(server=server, clients=clients,
                          key=jax.random.PRNGKey(1), round=jnp.asarray(0))
  rounds = 3
  opts = rounds_lib.RoundsOptions(num_rounds=rounds, clients_per_round=2,
                                  progress=False)
  state, ledger, rows = rounds_lib.run_rounds(
      alg, state, jax.device_put(hyb), steps, opts, ledger=ledger,
      on_round=lambda s, r: traces.append("round"))
  p = ledger_lib.num_params(params)                     # 8*16+8 + 3*8+3 = 163
  assert p == 163
  want = hfldd.eq18_bits(num_clients=5, aux_size=10, num_classes=3,
                         distilled_samples=6, pixels_per_sample=16,
                         num_heads=2, num_params=p, rounds=rounds)
  # 5*10*3*32 + 6*16*8 + 2*163*5*32
  assert want == 4800 + 768 + 52160
  assert ledger.cumulative()["bits_total"] == want
  assert ledger.cumulative()["bits_peer"] == 768
  assert rows[-1]["bytes_total_cumulative"] == want // 8
  assert np.isfinite(rows[-1]["train_loss"])
  # One trace for the round program (preprocess is traced once per jit of
  # the local update); later rounds reuse it.
  per_round = [i for i, t in enumerate(traces) if t == "round"]
  assert sum(1 for t in traces[per_round[0]:] if t == 1) == 0


def test_eq18_bits_takes_the_payload_widths():
  kw = dict(num_clients=5, aux_size=10, num_classes=3, distilled_samples=6,
            pixels_per_sample=16, num_heads=2, num_params=163, rounds=3)
  assert hfldd.eq18_bits(**kw) == 4800 + 768 + 52160
  # 16-bit soft labels, 4-bit pixels, 8-bit parameters.
  assert hfldd.eq18_bits(**kw, bits_per_soft_label=16, bits_per_pixel_channel=4,
                         bits_per_param=8) == 4800 // 2 + 768 // 2 + 52160 // 4
  assert hfldd.eq18_bits(**{**kw, "rounds": 0}) == 4800 + 768


def test_target_table_rounds_traffic_and_ratios():
  runs = {
      "hfldd": [{"round": 1, "test_accuracy": 0.5, "bytes_total_cumulative": 100},
                {"round": 2, "test_accuracy": 0.96, "bytes_total_cumulative": 150}],
      "fedavg": [{"round": r, "test_accuracy": a, "bytes_total_cumulative": 1000 * r}
                 for r, a in [(1, 0.2), (2, 0.9), (3, 0.95), (4, 0.97)]],
      "never": [{"round": 1, "test_accuracy": 0.1, "bytes_total_cumulative": 5}],
  }
  table = reporting.target_table(runs, 0.95)
  by = {r["name"]: r for r in table}
  assert (by["hfldd"]["round"], by["hfldd"]["bytes"]) == (2, 150)
  assert (by["fedavg"]["round"], by["fedavg"]["bytes"]) == (3, 3000)
  assert by["fedavg"]["traffic_ratio"] == 20.0 and by["fedavg"]["rounds_ratio"] == 1.5
  assert by["hfldd"]["traffic_ratio"] == 1.0
  assert by["never"]["round"] is None and by["never"]["traffic_ratio"] is None
  assert by["never"]["best_accuracy"] == 0.1
  md = reporting.format_table(table)
  assert "| fedavg | 95.00% | 3 | 3.00 KB | 1.50x | 20.00x | 0.9700 |" in md
  no_ref = reporting.target_table({"fedavg": runs["fedavg"]}, 0.95)
  assert no_ref[0]["traffic_ratio"] is None


def test_topology_layout_and_figure(tmp_path):
  pos = figures.topology_layout(TOPO.heterogeneous, TOPO.heads)
  assert pos.shape == (5, 2) and np.isfinite(pos).all()
  np.testing.assert_allclose(np.linalg.norm(pos[TOPO.heads], axis=1), 1.0)
  for c in (0, 2):                              # members of head 1
    np.testing.assert_allclose(np.linalg.norm(pos[c] - pos[1]), 0.28)
  path = figures.plot_topology(TOPO.homogeneous, TOPO.heterogeneous, TOPO.heads,
                               tmp_path / "t.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
