"""HFLDD's chained stages: the cache round trip, Eq. 18 in the report, the
label bits charged; tiny hand-checkable cases, no training."""

import numpy as np
import pytest

from fedjax_dd.algorithms import hfldd
from fedjax_dd.algorithms import hfldd_stages
from fedjax_dd.cluster.sampling import Topology
from fedjax_dd.core.stage_cache import StageCache, StaleStageError
from fedjax_dd.data.stacked import ClientData

# 5 clients; clusters {0, 1, 2} (head 1) and {3, 4} (head 4): 3 members.
TOPO = Topology(homogeneous=np.array([0, 1, 2, 0, 1]),
                heterogeneous=np.array([0, 0, 0, 1, 1]),
                heads=np.array([1, 4]))


def _stages(counts=(2, 3, 1)):
  # 2 heads, 4x4x1 images, 3 classes; members sent 2 + 3 + 1 = 6 samples.
  hybrid = ClientData(x=np.zeros((2, 7, 4, 4, 1), np.uint8),
                      y=np.zeros((2, 7, 3), np.float32),
                      num_examples=np.array([7, 4], np.int32))
  return hfldd_stages.Stages(
      topology=TOPO, counts=np.array(counts), hybrid=hybrid,
      times={"label_knowledge": 1.5}, info={"privacy": {"x": 1}})


def test_sent_label_bits_counts_what_is_sent():
  assert hfldd.sent_label_bits(learned_labels=False) == 0
  assert hfldd.sent_label_bits(learned_labels=True) == 32
  assert hfldd.sent_label_bits(0, learned_labels=True) == 0   # Eq. 18
  assert hfldd.sent_label_bits(8, learned_labels=False) == 8


def test_setup_ledger_is_eq18_first_two_terms_by_hand():
  s = _stages()
  assert (s.pixels_per_sample, s.distilled_samples) == (16, 6)
  ledger = hfldd.setup_ledger(s.topology, s.counts, aux_size=10,
                              num_classes=3,
                              pixels_per_sample=s.pixels_per_sample)
  totals = ledger.cumulative()
  # N |D_g| N_c B1 = 5 * 10 * 3 * 32 = 4,800 bits = 600 bytes up;
  # sum |D~_i| B2 = 6 * 16 * 8 = 768 bits = 96 bytes between peers (which
  # their senders upload).
  assert ledger.tag_totals()["soft_labels"]["bytes_total"] == 600
  assert totals["bytes_peer"] == 96
  assert totals["bytes_total"] == 696
  with_labels = hfldd.setup_ledger(s.topology, s.counts, aux_size=10,
                                   num_classes=3,
                                   pixels_per_sample=s.pixels_per_sample,
                                   bits_per_sent_label=32)
  # + 6 samples * 3 entries * 32 bits = 576 bits = 72 bytes.
  assert with_labels.tag_totals()["distilled_labels"]["bytes_total"] == 72


def test_stage_fields_report_eq18_in_bytes_by_hand():
  s = _stages()
  out = hfldd_stages.stage_fields(
      s, aux_size=10, num_classes=3, member_data="kip", num_params=100,
      rounds=2, bytes_by_tag={}, training_seconds=4.0,
      topology_figure_path="t.png")
  # 4,800 + 768 + H |w| (2T - 1) B1 = 2 * 100 * 3 * 32 = 19,200 bits;
  # 24,768 bits = 3,096 bytes.
  assert out["eq18_bytes"] == 3096
  assert out["num_heads"] == 2 and out["num_clients"] == 5
  assert out["distilled_samples_total"] == 6
  assert out["head_dataset_sizes"] == [7, 4]
  assert out["sent_label_bytes"] == 0
  assert out["stage_seconds"] == {"label_knowledge": 1.5, "training": 4.0}
  assert s.times == {"label_knowledge": 1.5}   # the stages are not altered
  assert out["privacy"] == {"x": 1} and out["kip_loss"] is None


def _clients_and_uploads():
  # 5 clients of 2 images each, client c's images all 10 c + i; the three
  # members (0, 2, 3) send one image each, 200 + j: no raw image.
  x = np.zeros((5, 2, 4, 4, 1), np.uint8)
  for c in range(5):
    for i in range(2):
      x[c, i] = 10 * c + i
  data = ClientData(x=x, y=np.array([[0, 1]] * 5, np.int32),
                    num_examples=np.full(5, 2, np.int32))
  sent = hfldd.SentData(
      x=np.stack([np.full((1, 4, 4, 1), 200 + j, np.uint8)
                  for j in range(3)]),
      y=np.eye(3, dtype=np.float32)[[[2], [2], [2]]],
      mask=np.ones((3, 1), bool), senders=np.array([0, 2, 3]))
  return data, sent


def test_stages_or_load_computes_once_and_refuses_other_settings(tmp_path):
  cache = StageCache(tmp_path)
  data, sent = _clients_and_uploads()
  calls = []

  def compute():
    calls.append(1)
    hybrid = hfldd.build_hybrid_data(data, TOPO, sent, num_classes=3)
    return hfldd_stages.Stages(
        topology=TOPO, counts=sent.counts, hybrid=hybrid,
        times={"label_knowledge": 1.5}, info={"privacy": {"x": 1}},
        sent=sent)

  first = hfldd_stages.stages_or_load(cache, {"k": 1}, compute, data=data,
                                      num_classes=3)
  again = hfldd_stages.stages_or_load(cache, {"k": 1}, compute, data=data,
                                      num_classes=3)
  assert len(calls) == 1 and not first.cached and again.cached
  np.testing.assert_array_equal(again.topology.heads, TOPO.heads)
  np.testing.assert_array_equal(again.topology.heterogeneous,
                                TOPO.heterogeneous)
  np.testing.assert_array_equal(again.counts, [1, 1, 1])
  # Head 1: its 2 images + members 0 and 2; head 4: its 2 + member 3.
  np.testing.assert_array_equal(again.hybrid.num_examples, [4, 3])
  np.testing.assert_array_equal(again.hybrid.x[0, :, 0, 0, 0],
                                [10, 11, 200, 201])
  np.testing.assert_array_equal(again.hybrid.x[1, :3, 0, 0, 0],
                                [40, 41, 202])
  for field in ("x", "y", "num_examples"):
    np.testing.assert_array_equal(getattr(again.hybrid, field),
                                  getattr(first.hybrid, field))
  assert again.times == first.times and again.info == first.info
  with pytest.raises(StaleStageError, match="k"):
    hfldd_stages.stages_or_load(cache, {"k": 2}, compute, data=data,
                                num_classes=3)


def test_the_stage_cache_holds_what_the_heads_received_not_their_data(
    tmp_path):
  # Before: stages/hfldd/0/state/x held every head's D_h, its own raw
  # images included (145 raw training images in hfldd.py:smoke).
  cache = StageCache(tmp_path)
  data, sent = _clients_and_uploads()
  hfldd_stages.stages_or_load(
      cache, {"k": 1}, lambda: hfldd_stages.Stages(
          topology=TOPO, counts=sent.counts,
          hybrid=hfldd.build_hybrid_data(data, TOPO, sent, num_classes=3),
          times={}, info={}, sent=sent), data=data, num_classes=3)
  stored = cache.load(hfldd_stages.STAGE, {"k": 1}).arrays
  raw = {data.x[c, i].tobytes() for c in range(5) for i in range(2)}
  images = [a for a in stored.values() if a.dtype == np.uint8]
  assert images, sorted(stored)
  for a in images:
    for img in a.reshape(-1, 4, 4, 1):
      assert img.tobytes() not in raw
  assert sorted(stored) == ["counts", "heads", "heterogeneous",
                            "homogeneous", "senders", "sent_mask", "sent_x",
                            "sent_y"]


def test_run_stages_chains_clusters_uploads_and_heads_data():
  # Two clients per homogeneous cluster; every member sends all its rows.
  x = np.arange(4 * 3 * 2 * 2 * 1, dtype=np.uint8).reshape(4, 3, 2, 2, 1)
  data = ClientData(x=x, y=np.array([[0, 1, 0]] * 4, np.int32),
                    num_examples=np.array([3, 2, 3, 1], np.int32))
  homo = np.array([0, 0, 1, 1])
  s = hfldd_stages.run_stages(
      data, num_classes=2, cluster=lambda: (homo, {"label_knowledge": 0.0},
                                            {"aux_size": 7}),
      send=hfldd_stages.raw_sender(num_classes=2),
      topology_rng=np.random.default_rng(0))
  t = s.topology
  assert t.num_clients == 4
  # Every client's rows end up at exactly one head: 3 + 2 + 3 + 1 = 9.
  assert int(np.sum(s.hybrid.num_examples)) == 9
  assert s.distilled_samples == int(np.sum(data.num_examples)) - int(
      np.sum(data.num_examples[t.heads]))
  assert s.info["aux_size"] == 7
  assert s.info["privacy"]["identical_to_raw_fraction"] == 1.0
  assert set(s.times) == {"label_knowledge", "cluster_sampling",
                          "dataset_generation", "privacy"}
  assert s.soft_labels is None  # this cluster step gives none


def test_soft_labels_leave_the_info_and_round_trip_through_the_cache(
    tmp_path):
  x = np.arange(4 * 3 * 2 * 2 * 1, dtype=np.uint8).reshape(4, 3, 2, 2, 1)
  data = ClientData(x=x, y=np.array([[0, 1, 0]] * 4, np.int32),
                    num_examples=np.array([3, 2, 3, 1], np.int32))
  soft = np.random.default_rng(0).dirichlet([1.0, 1.0], (4, 5)).astype(
      np.float32)
  compute = lambda: hfldd_stages.run_stages(  # noqa: E731
      data, num_classes=2,
      cluster=lambda: (np.array([0, 0, 1, 1]), {}, {"soft_labels": soft}),
      send=hfldd_stages.raw_sender(num_classes=2),
      topology_rng=np.random.default_rng(0))
  cache = StageCache(tmp_path)
  fresh = hfldd_stages.stages_or_load(cache, {"k": 1}, compute, data=data,
                                      num_classes=2)
  assert "soft_labels" not in fresh.info  # an array, kept out of the JSON
  np.testing.assert_array_equal(fresh.soft_labels, soft)
  loaded = hfldd_stages.stages_or_load(cache, {"k": 1}, lambda: None,
                                       data=data, num_classes=2)
  assert loaded.cached
  np.testing.assert_array_equal(loaded.soft_labels, soft)


def test_a_cache_of_the_older_layout_is_refused_naming_its_directory(
    tmp_path):
  cache = StageCache(tmp_path)
  data, _ = _clients_and_uploads()
  cache.save(hfldd_stages.STAGE, {"k": 1},
             {"homogeneous": TOPO.homogeneous,
              "heterogeneous": TOPO.heterogeneous, "heads": TOPO.heads,
              "counts": np.array([1, 1, 1]), "x": data.x[:2],
              "y": np.zeros((2, 2, 3), np.float32),
              "num_examples": np.array([2, 2], np.int32)},
             {"times": {}, "info": {}})
  with pytest.raises(StaleStageError,
                     match="older fedjax-dd and holds the heads' own raw "
                     "images; delete that directory"):
    hfldd_stages.stages_or_load(cache, {"k": 1}, lambda: None, data=data,
                                num_classes=3)
