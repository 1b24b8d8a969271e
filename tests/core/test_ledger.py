"""Tests for fedjax_dd.core.ledger."""

import dataclasses
import json
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core import ledger as L


# ----------------------------------------------------------------------------
# payload sizes
# ----------------------------------------------------------------------------


def test_num_params_and_model_bits_from_eval_shape_of_a_model():
  def init():
    return {"dense": {"kernel": jnp.ones((784, 10)), "bias": jnp.ones((10,))}}

  abstract = jax.eval_shape(init)
  assert L.num_params(abstract) == 7850
  assert L.num_params(init()) == 7850
  assert L.model_bits(abstract) == 7850 * 32
  assert L.model_bits(abstract, bits_per_param=16) == 7850 * 16


def test_num_params_counts_entries_whatever_the_dtype():
  tree = [jax.ShapeDtypeStruct((3, 4), jnp.float16), np.zeros((2,), np.int64),
          None]
  assert L.num_params(tree) == 14
  assert L.num_params({}) == 0 and L.num_params(None) == 0


def test_num_params_rejects_python_numbers_and_bad_bits():
  with pytest.raises(ValueError, match="array leaves"):
    L.num_params({"lr": 0.1})
  with pytest.raises(ValueError, match="bits_per_param"):
    L.model_bits(jnp.zeros(3), bits_per_param=-1)
  with pytest.raises(ValueError, match="bits_per_param"):
    L.model_bits(jnp.zeros(3), bits_per_param=2.5)


def test_bits_to_bytes():
  assert L.bits_to_bytes(16) == 2 and isinstance(L.bits_to_bytes(16), int)
  assert L.bits_to_bytes(np.int64(12)) == 1.5
  with pytest.raises(ValueError, match="bits"):
    L.bits_to_bytes(-8)


def test_convention_constants():
  assert (L.BITS_PER_PARAM, L.BITS_PER_PIXEL_CHANNEL, L.BITS_PER_SOFT_LABEL,
          L.BITS_PER_HARD_LABEL) == (32, 8, 32, 8)


# ----------------------------------------------------------------------------
# Ledger
# ----------------------------------------------------------------------------


def _example_ledger():
  # Round 1: 3 clients upload 10 bits each; server sends 4 bits to 2 clients.
  # Round 2: 1 peer message of 5 bits, 1 upload of 3 bits.
  return (
      L.Ledger()
      .record(1, kind="upload", bits=10, count=3, tag="model")
      .record(1, kind="download", bits=4, count=2, tag="model")
      .record(2, kind="peer", bits=5, tag="data")
      .record(2, kind="upload", bits=3, tag="model")
  )


def test_record_is_immutable():
  empty = L.Ledger()
  one = empty.record(1, kind="upload", bits=8)
  assert empty.entries == ()
  assert len(one.entries) == 1
  assert one.entries[0] == L.LedgerEntry(round=1, kind="upload", bits=8, count=1, tag="")
  with pytest.raises(dataclasses.FrozenInstanceError):
    one.entries = ()


def test_round_totals_and_peer_counted_as_upload():
  ledger = _example_ledger()
  r1 = ledger.round_totals(1)
  assert r1 == {
      "round": 1,
      "bits_uploaded": 30,
      "bits_downloaded": 8,
      "bits_peer": 0,
      "bits_total": 38,
      "bytes_uploaded": 3.75,
      "bytes_downloaded": 1,
      "bytes_peer": 0,
      "bytes_total": 4.75,
  }
  r2 = ledger.round_totals(2)
  # Peer traffic is part of upload and total, and reported alone.
  assert (r2["bits_uploaded"], r2["bits_peer"], r2["bits_downloaded"], r2["bits_total"]) == (8, 5, 0, 8)
  assert r2["bytes_total"] == 1 and isinstance(r2["bytes_total"], int)
  assert ledger.round_totals(7)["bits_total"] == 0


def test_cumulative():
  ledger = _example_ledger()
  total = ledger.cumulative()
  assert total["bits_uploaded"] == 38
  assert total["bits_downloaded"] == 8
  assert total["bits_peer"] == 5
  assert total["bits_total"] == 46
  assert total["bytes_total"] == 5.75
  assert total["bytes_uploaded"] + total["bytes_downloaded"] == total["bytes_total"]
  assert ledger.cumulative(through_round=1)["bits_total"] == 38
  assert ledger.cumulative(through_round=0)["bits_total"] == 0
  assert "round" not in total


def test_rounds_sorted_even_if_recorded_out_of_order():
  ledger = L.Ledger().record(3, kind="upload", bits=8).record(1, kind="download", bits=16)
  assert ledger.rounds == [1, 3]
  assert [ledger.cumulative(through_round=r)["bits_total"]
          for r in ledger.rounds] == [16, 24]


def test_tag_totals():
  tags = _example_ledger().tag_totals()
  assert sorted(tags) == ["data", "model"]
  assert tags["model"]["bits_uploaded"] == 33
  assert tags["model"]["bits_downloaded"] == 8
  assert tags["data"]["bits_peer"] == 5
  assert tags["data"]["bits_total"] == 5


def test_dict_round_trip_through_json():
  ledger = _example_ledger()
  data = json.loads(json.dumps(ledger.to_dict()))
  back = L.Ledger.from_dict(data)
  assert back == ledger
  assert back.cumulative() == ledger.cumulative()


def test_numpy_integers_accepted():
  ledger = L.Ledger().record(np.int64(2), kind="upload", bits=np.int32(16), count=np.int64(3))
  assert ledger.entries[0].round == 2 and type(ledger.entries[0].round) is int
  assert ledger.cumulative()["bits_total"] == 48
  json.dumps(ledger.to_dict())  # plain Python ints


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(round=1, kind="uplink", bits=1), "kind"),
        (dict(round=-1, kind="upload", bits=1), "round"),
        (dict(round=1, kind="upload", bits=-8), "bits"),
        (dict(round=1, kind="upload", bits=1.5), "bits"),
        (dict(round=1, kind="upload", bits=1, count=-1), "count"),
        (dict(round=True, kind="upload", bits=1), "round"),
        (dict(round=1, kind="upload", bits=1, tag=3), "tag"),
    ],
)
def test_record_validation(kwargs, match):
  r = kwargs.pop("round")
  with pytest.raises(ValueError, match=match):
    L.Ledger().record(r, **kwargs)


def test_from_dict_validation():
  with pytest.raises(ValueError, match="version"):
    L.Ledger.from_dict({"version": 99, "entries": []})
  with pytest.raises(ValueError, match="entry 0"):
    L.Ledger.from_dict({"version": 1, "entries": [{"round": 1}]})
  with pytest.raises(ValueError, match="kind"):
    L.Ledger.from_dict(
        {"version": 1, "entries": [{"round": 1, "kind": "x", "bits": 1, "count": 1, "tag": ""}]}
    )


# ----------------------------------------------------------------------------
# FedAvg / SCAFFOLD closed forms (HFLDD Eq. 3)
# ----------------------------------------------------------------------------


def _run_fedavg(n, t, p, b1, **kwargs):
  ledger = L.Ledger()
  for r in range(1, t + 1):
    down, up = L.fedavg_round_bits(p, n, r, bits_per_param=b1, **kwargs)
    # As the rounds loop records it: n messages of one client's size.
    ledger = ledger.record(r, kind="download", bits=down // n, count=n,
                           tag="model")
    ledger = ledger.record(r, kind="upload", bits=up // n, count=n,
                           tag="model")
  return ledger


def test_fedavg_matches_hfldd_eq3_with_seed():
  # N=3 clients, T=4 rounds, |w|=10, B1=32: N (2T-1) |w| B1 = 3*7*10*32.
  ledger = _run_fedavg(3, 4, 10, 32, initial_model_as_seed=True)
  total = ledger.cumulative()
  assert total["bits_total"] == 6720
  assert total["bits_uploaded"] == 3 * 4 * 10 * 32  # 3840
  assert total["bits_downloaded"] == 3 * 3 * 10 * 32  # 2880
  assert ledger.round_totals(1)["bits_downloaded"] == 0
  assert ledger.round_totals(2)["bits_downloaded"] == 960


def test_fedavg_matches_hfldd_eq3_without_seed():
  # N 2T |w| B1 = 3*8*10*32.
  ledger = _run_fedavg(3, 4, 10, 32, initial_model_as_seed=False)
  assert ledger.cumulative()["bits_total"] == 7680
  assert ledger.round_totals(1)["bits_downloaded"] == 960


def test_scaffold_uploads_twice_the_model():
  # Uploads: 3 clients * 4 rounds * 2|w| * 32 = 7680; downloads as FedAvg 2880.
  ledger = _run_fedavg(3, 4, 10, 32, upload_multiplier=2)
  total = ledger.cumulative()
  assert total["bits_uploaded"] == 7680
  assert total["bits_downloaded"] == 2880
  assert total["bits_total"] == 10560


def test_fedavg_round_bits_single_rounds():
  assert L.fedavg_round_bits(10, 3, 1) == (0, 960)
  assert L.fedavg_round_bits(10, 3, 1, initial_model_as_seed=False) == (960, 960)
  assert L.fedavg_round_bits(10, 3, 2, download_multiplier=2, upload_multiplier=2) == (1920, 1920)
  # Round 1 with a seed downloads nothing whatever the multiplier.
  assert L.fedavg_round_bits(10, 3, 1, download_multiplier=2) == (0, 960)
  assert L.fedavg_round_bits(10, 0, 5) == (0, 0)


def test_fedavg_round_bits_validation():
  with pytest.raises(ValueError, match="round_index"):
    L.fedavg_round_bits(10, 3, 0)
  with pytest.raises(ValueError, match="num_params"):
    L.fedavg_round_bits(-1, 3, 1)


# ----------------------------------------------------------------------------
# GCE
# ----------------------------------------------------------------------------


def test_gce_hand_computed():
  # 0.5 / (0.5^1 * (log2(2) + log2(4))) = 0.5 / (0.5 * 3) = 1/3.
  assert L.gce(0.5, [1, 3], 1) == pytest.approx(1 / 3)
  # gamma = 0: 0.5 / 3.
  assert L.gce(0.5, [1, 3], 0) == pytest.approx(1 / 6)
  # acc 0.75, gamma 2, V = [7]: 0.75 / (0.0625 * 3) = 4.
  assert L.gce(0.75, [7], 2) == pytest.approx(4.0)
  assert L.gce(0.0, [1], 1) == 0.0


@pytest.mark.parametrize(
    "acc, volumes, gamma, match",
    [
        (1.0, [1], 1, "accuracy"),
        (-0.1, [1], 1, "accuracy"),
        (0.5, [], 1, "empty"),
        (0.5, [0, 0], 1, "positive"),
        (0.5, [-1, 4], 1, ">= 0"),
        (0.5, [1], -1, "gamma"),
        (0.5, [1], math.nan, "gamma"),
    ],
)
def test_gce_validation(acc, volumes, gamma, match):
  with pytest.raises(ValueError, match=match):
    L.gce(acc, volumes, gamma)


# ----------------------------------------------------------------------------
# traffic to target / metrics files
# ----------------------------------------------------------------------------


_ROWS = [
    {"round": 1, "test_accuracy": 0.30, "bytes_total_cumulative": 100},
    {"round": 2, "bytes_total_cumulative": 200},  # not evaluated
    {"round": 3, "test_accuracy": None, "bytes_total_cumulative": 300},
    {"round": 4, "test_accuracy": 0.62, "bytes_total_cumulative": 400},
    {"round": 5, "test_accuracy": 0.58, "bytes_total_cumulative": 500},
    {"round": 6, "test_accuracy": 0.71, "bytes_total_cumulative": 600},
]


def test_traffic_to_target_first_reaching_row():
  assert L.traffic_to_target(_ROWS, 0.6) == {"round": 4, "bytes": 400}
  assert L.traffic_to_target(_ROWS, 0.62) == {"round": 4, "bytes": 400}  # >= counts
  assert L.traffic_to_target(_ROWS, 0.7) == {"round": 6, "bytes": 600}
  assert L.traffic_to_target(_ROWS, 0.3) == {"round": 1, "bytes": 100}
  assert L.traffic_to_target(_ROWS, 0.9) is None
  assert L.traffic_to_target([], 0.1) is None


def test_traffic_to_target_custom_keys():
  rows = [{"t": 1, "acc": 0.2, "mb": 1.5}, {"t": 2, "acc": 0.9, "mb": 3.0}]
  got = L.traffic_to_target(rows, 0.5, accuracy_key="acc", bytes_key="mb", round_key="t")
  assert got == {"round": 2, "bytes": 3.0}


def test_traffic_to_target_missing_bytes_is_an_error():
  with pytest.raises(ValueError, match="bytes_total_cumulative"):
    L.traffic_to_target([{"round": 1, "test_accuracy": 0.9}], 0.5)


def test_traffic_to_target_from_ledger_rows():
  ledger = _run_fedavg(3, 4, 10, 32)
  accs = [0.2, 0.4, 0.6, 0.8]
  # The rows the rounds loop writes: the running totals after each round.
  rows = [{"round": r, "test_accuracy": a,
           "bytes_total_cumulative":
               ledger.cumulative(through_round=r)["bytes_total"]}
          for r, a in zip(ledger.rounds, accs)]
  # Through round 3: uploads 3*3*320 = 2880 bits, downloads 2*3*320 = 1920
  # bits; 4800 bits = 600 bytes.
  assert L.traffic_to_target(rows, 0.55) == {"round": 3, "bytes": 600}


def test_load_metrics(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in _ROWS) + "\n\n")
  rows = L.load_metrics(path)
  assert rows == _ROWS
  assert L.traffic_to_target(rows, 0.6) == {"round": 4, "bytes": 400}


def test_load_metrics_skips_truncated_last_line(tmp_path, caplog):
  path = tmp_path / "metrics.jsonl"
  path.write_text(json.dumps(_ROWS[0]) + "\n" + '{"round": 2, "test_acc')
  with caplog.at_level(logging.WARNING):
    rows = L.load_metrics(path)
  assert rows == [_ROWS[0]]
  assert "truncated last line 2" in caplog.text


def test_load_metrics_rejects_bad_middle_line_and_non_objects(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"round": 1}\n{oops\n{"round": 2}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2"):
    L.load_metrics(path)
  path.write_text('{"round": 1}\n[1, 2]\n')
  with pytest.raises(ValueError, match="JSON object"):
    L.load_metrics(path)
  # A malformed last line that does end with a newline was fully written.
  path.write_text('{"round": 1}\n{oops\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2"):
    L.load_metrics(path)


# ----------------------------------------------------------------------------
# Per-client messages (FedD3's V_t)
# ----------------------------------------------------------------------------


def test_record_messages_groups_equal_sizes_and_skips_silent_senders():
  ledger = L.Ledger().record_messages(1, kind="upload", bits=[40, 0, 40, 24],
                                      tag="distilled_data")
  assert [(e.bits, e.count) for e in ledger.entries] == [(24, 1), (40, 2)]
  assert ledger.cumulative()["bits_uploaded"] == 104
  assert L.Ledger().record_messages(1, kind="upload", bits=[0, 0]).entries == ()


def test_message_bits_mean_max_and_groups_add_up():
  ledger = (L.Ledger()
            .record_messages(1, kind="upload", bits=[10, 10, 40], tag="data")
            .record(1, kind="upload", bits=5, count=3, tag="model")
            .record(1, kind="download", bits=1000, count=3, tag="model")
            .record(1, kind="peer", bits=2, count=1, tag="labels")
            .record(3, kind="upload", bits=6, count=2, tag="model"))
  # data: mean (10 + 10 + 40) / 3 = 20, max 40; model 5; peer 2; downloads
  # are not what a client sends.
  assert ledger.message_bits(1) == 20 + 5 + 2
  assert ledger.message_bits(1, reduce="max") == 40 + 5 + 2
  assert ledger.message_bits(1, kinds=("upload",)) == 25
  assert ledger.message_bits(1, kinds=("download",)) == 1000
  assert ledger.message_bits(2) == 0
  assert ledger.message_bits_per_round() == [(1, 27.0), (3, 6.0)]
  with pytest.raises(ValueError, match="reduce"):
    ledger.message_bits(1, reduce="median")


def test_gce_table_is_none_where_eq6_is_undefined():
  assert L.gce_table(0.5, [1, 3], (1, 0)) == {"1": pytest.approx(1 / 3),
                                              "0": pytest.approx(1 / 6)}
  assert L.gce_table(None, [1], (0.5,)) == {"0.5": None}
  assert L.gce_table(1.0, [1], (0.5,)) == {"0.5": None}
  assert L.gce_table(0.5, [0, 0], (0.5,)) == {"0.5": None}


# FedD3 Table 2 cells, (accuracy, V_t of one client, gamma, GCE % printed).
# Image uploads: uint8 pixels, 1 image per class per client (2 classes
# non-IID, 10 IID); MNIST 784 pixels, CIFAR-10 32*32*3 = 3,072.
_MNIST_2 = 2 * 784 * 8  # 12,544 bits
_MNIST_10 = 10 * 784 * 8
_CIFAR_2 = 2 * 3072 * 8
_CIFAR_10 = 10 * 3072 * 8
# Model uploads: |w| * 32 bits per round. The paper's AlexNet is the
# two-conv AlexCifarNet (1,756,426 params); its LeNet the classic LeNet-5 on
# 32x32 inputs (156 + 2,416 + 48,120 + 10,164 + 850 = 61,706 params).
_ALEX = 1_756_426 * 32
_LENET = 61_706 * 32

_TABLE2_ONE_SHOT = [
    # FedD3 KIP, MNIST non-IID: 94.74 %.
    (0.9474, _MNIST_2, 0.01, 7.17),
    # FedD3 KIP, MNIST IID: 94.37 %.
    (0.9437, _MNIST_10, 0.01, 6.09),
    # FedD3 Coreset, MNIST non-IID: 77.29 %.
    (0.7729, _MNIST_2, 0.01, 5.76),
    # FedD3 KIP, CIFAR-10 non-IID: 38.27 %.
    (0.3827, _CIFAR_2, 0.1, 2.58),
    # FedD3 KIP, CIFAR-10 IID: 48.97 %.
    (0.4897, _CIFAR_10, 2.0, 10.50),
    # OSFL FedAvg, CIFAR-10 IID: 36.23 %, one model upload.
    (0.3623, _ALEX, 0.1, 1.47),
    (0.3623, _ALEX, 2.0, 3.46),
]


@pytest.mark.parametrize("acc, bits, gamma, printed", _TABLE2_ONE_SHOT)
def test_gce_reproduces_fedd3_table2_one_shot_cells(acc, bits, gamma, printed):
  # 500 clients each send one message of `bits` in round 1.
  ledger = L.Ledger().record_messages(1, kind="upload", bits=[bits] * 500,
                                      tag="distilled_data")
  volumes = [v for _, v in ledger.message_bits_per_round()]
  assert volumes == [bits]
  assert 100 * L.gce(acc, volumes, gamma) == pytest.approx(printed, abs=0.005)
  # The cohort total would charge log2(500 * bits + 1) instead: far lower.
  cohort = [ledger.round_totals(1)["bits_total"]]
  assert 100 * L.gce(acc, cohort, gamma) < printed - 0.3


_TABLE2_MULTI_SHOT = [
    # MSFL FedAvg, MNIST IID: 96.97 %, best of the first 18 rounds.
    (0.9697, _LENET, 18, 0.01, 0.27),
    (0.9697, _LENET, 18, 0.5, 1.48),
    # MSFL FedProx, CIFAR-10 IID: 47.89 %, first 6 rounds.
    (0.4789, _ALEX, 6, 0.1, 0.33),
    (0.4789, _ALEX, 6, 2.0, 1.14),
]


@pytest.mark.parametrize("acc, model, rounds, gamma, printed", _TABLE2_MULTI_SHOT)
def test_gce_reproduces_fedd3_table2_multi_shot_cells(acc, model, rounds, gamma,
                                                      printed):
  # The rounds loop's ledger: per round, 500 model messages each way; each
  # round charges one client's message, log2(|w| 32 + 1).
  num_params = model // 32
  ledger = _run_fedavg(500, rounds, num_params, 32)
  volumes = ledger.message_bits_per_round()
  assert volumes == [(r, float(model)) for r in range(1, rounds + 1)]
  v = [bits for _, bits in volumes]
  assert 100 * L.gce(acc, v, gamma) == pytest.approx(printed, abs=0.005)


def test_gce_summary_charges_one_client_message_and_the_cohort_separately():
  # 4 clients, 2 rounds, |w| 32 = 40 bits; round 1 has no download.
  ledger = _run_fedavg(4, 2, 10, 4)
  s = L.gce_summary(ledger, final_accuracy=0.5, best_accuracy=0.75,
                    gammas=(0.0,))
  assert s["gce_message_bits"] == [[1, 40.0], [2, 40.0]]
  per_client = 2 * math.log2(41)
  assert s["gce"]["0.0"] == pytest.approx(0.5 / per_client)
  assert s["gce_best"]["0.0"] == pytest.approx(0.75 / per_client)
  # Cohort: round 1 = 4 uploads (160 bits), round 2 = 4 up + 4 down (320).
  assert s["gce_cohort"]["0.0"] == pytest.approx(
      0.5 / (math.log2(161) + math.log2(321)))
  assert L.gce_summary(L.Ledger(), final_accuracy=None, best_accuracy=None,
                       gammas=(0.5,))["gce"] == {"0.5": None}


def test_record_refuses_negative_bits():
  with pytest.raises(ValueError, match=r"^bits must be >= 0, got -8\.$"):
    L.Ledger().record(1, kind="upload", bits=-8)


def test_record_messages_refuses_negative_sizes_naming_the_sender():
  with pytest.raises(ValueError, match=r"^bits must be >= 0 for every sender, "
                     r"got 1 negative \(bits\[2\] = -40\)\.$"):
    L.Ledger().record_messages(1, kind="upload", bits=[40, 0, -40])


def test_record_messages_refuses_a_wrong_shape():
  with pytest.raises(ValueError, match=r"^bits must be \[C\] \(one size per "
                     r"sender, 1-D\), got shape \(3, 1\)\.$"):
    L.Ledger().record_messages(1, kind="upload", bits=np.full((3, 1), 8))
  with pytest.raises(ValueError, match=r"got shape \(\)\.$"):
    L.Ledger().record_messages(1, kind="upload", bits=8)


def test_record_messages_refuses_fractional_sizes():
  with pytest.raises(ValueError, match=r"^bits must be \[C\] integer bit "
                     r"counts, got dtype float64\.$"):
    L.Ledger().record_messages(1, kind="upload", bits=[8.0, 12.5])
