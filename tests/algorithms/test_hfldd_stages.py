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


def test_stages_or_load_computes_once_and_refuses_other_settings(tmp_path):
  cache = StageCache(tmp_path)
  calls = []

  def compute():
    calls.append(1)
    return _stages()

  first = hfldd_stages.stages_or_load(cache, {"k": 1}, compute)
  again = hfldd_stages.stages_or_load(cache, {"k": 1}, compute)
  assert len(calls) == 1 and not first.cached and again.cached
  np.testing.assert_array_equal(again.topology.heads, TOPO.heads)
  np.testing.assert_array_equal(again.topology.heterogeneous,
                                TOPO.heterogeneous)
  np.testing.assert_array_equal(again.counts, [2, 3, 1])
  np.testing.assert_array_equal(again.hybrid.num_examples, [7, 4])
  assert again.hybrid.x.shape == (2, 7, 4, 4, 1)
  assert again.times == first.times and again.info == first.info
  with pytest.raises(StaleStageError, match="k"):
    hfldd_stages.stages_or_load(cache, {"k": 2}, compute)


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
