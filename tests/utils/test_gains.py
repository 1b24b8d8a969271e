"""Server-distillation tables over seeds (fedjax_dd/utils/gains.py) and the
scripts that call them (experiments/iga_gains.py, experiments/reference/)."""

import json

import numpy as np
import pytest

from fedjax_dd.experiments import iga_gains
from fedjax_dd.utils import gains


def _run(d, before, after):
  d.mkdir(parents=True)
  rows = []
  for t, a in enumerate(after):
    r = {"round": t + 1, "test_accuracy": a}
    if before is not None:
      r["test_accuracy_before_iga"] = before[t]
      r["m"] = float(t)  # mean over rounds 1-2: 0.5
    rows.append(json.dumps(r) + "\n")
  (d / "metrics.jsonl").write_text("".join(rows))


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_mean_sd_format():
  # mean 0.2, sample sd sqrt(((0.1)^2 + (0.1)^2) / 1) = 0.1414.
  assert gains.fmt_mean_sd([0.1, 0.3]) == "0.200 ± 0.141"
  assert gains.fmt_mean_sd([0.1, 0.3], sign=True) == "+0.200 ± 0.141"
  assert gains.fmt_mean_sd([0.25], 4) == "0.2500 ± 0.0000"


def test_hand_checked_gains_finals_and_common_rounds(tmp_path):
  # Seed 0 gains +0.1, -0.1 (mean 0); seed 1 gains +0.2, +0.2 (mean +0.2);
  # FedAvg seed 0 has a third round, which the common cut (2) drops.
  _run(tmp_path / "kl" / "seed_0", [0.5, 0.6], [0.6, 0.5])
  _run(tmp_path / "kl" / "seed_1", [0.3, 0.4], [0.5, 0.6])
  _run(tmp_path / "fa" / "seed_0", None, [0.4, 0.6, 0.9])
  _run(tmp_path / "fa" / "seed_1", None, [0.2, 0.4])
  groups = {"kl": gains.read_group(str(tmp_path / "kl")),
            "fa": gains.read_group(str(tmp_path / "fa"))}
  assert gains.common_rounds(groups) == 2
  text = gains.gain_tables(groups, 2, window=1, extra=("m",))
  # mean gain (0 + 0.2) / 2 = 0.1, sd sqrt(0.02) = 0.141; 1 of 4 rounds
  # lowered; finals 0.5 / 0.6.
  assert ("| kl | 0, 1 | +0.000 / +0.200 | +0.100 ± 0.141 | 1 of 4 | "
          "0.500 / 0.600 | 0.550 ± 0.071 | 0.550 ± 0.000 | 0.500 ± 0.000 |"
          ) in text
  # FedAvg: mean accuracy per seed 0.5 and 0.3; it has no "m".
  assert ("| fa | 0, 1 | – | – | – | 0.600 / 0.400 | 0.500 ± 0.141 | "
          "0.400 ± 0.141 | – |") in text
  # Window of round 2: kl accuracy (0.5 + 0.6) / 2, gains -0.1 and +0.2.
  assert "| 2–2 | 0.550 ± 0.071 | +0.050 ± 0.212 | 0.500 ± 0.141 | – |" in text
  # The report reads the same workdirs and cuts to the common 2 rounds.
  assert gains.gains_report({"kl": str(tmp_path / "kl"),
                             "fa": str(tmp_path / "fa")},
                            window=1, extra=("m",)) == text


def test_a_single_run_workdir_is_seed_0(tmp_path):
  _run(tmp_path / "one", [0.5, 0.5], [0.7, 0.4])
  assert list(gains.read_group(str(tmp_path / "one"))) == [0]
  b, a = gains.series(gains.read_run(str(tmp_path / "one")), 2)
  np.testing.assert_allclose(a - b, [0.2, -0.1])


def test_more_rounds_than_a_run_has_is_refused(tmp_path):
  _run(tmp_path / "a", [0.5], [0.6])
  with pytest.raises(ValueError, match="only 1"):
    gains.gains_report({"a": str(tmp_path / "a")}, rounds=2)
  with pytest.raises(SystemExit, match="only 1"):
    iga_gains.main([f"a={tmp_path / 'a'}", "--rounds=2"])


def test_fedftg_table_hand_checked(tmp_path):
  refs, ours = [], []
  for s, (gr, go) in enumerate([(0.01, 0.02), (0.03, 0.00)]):
    p = tmp_path / f"ref{s}.jsonl"
    _jsonl(p, [{"round": t + 1, "test_accuracy_before_ft": 0.5,
                "test_accuracy": 0.5 + gr} for t in range(3)])
    d = tmp_path / f"ours{s}"
    d.mkdir()
    # A round evaluated without the before column is not a fine-tuning row.
    _jsonl(d / "metrics.jsonl",
           [{"round": 0, "test_accuracy": 0.1}]
           + [{"round": t + 1, "test_accuracy_before_iga": 0.5,
               "test_accuracy": 0.5 + go} for t in range(3)])
    refs.append(str(p))
    ours.append(str(d))
  text = gains.fedftg_report(refs, ours, rounds=2)
  assert "| 0 | +0.010 | +0.020 | 0.510 | 0.520 | 2 |" in text
  # Gains: reference 0.01, 0.03 (mean 0.020, sd 0.014); ours 0.02, 0.
  assert ("| mean ± sd | 0.020 ± 0.014 | 0.010 ± 0.014 | 0.520 ± 0.014 | "
          "0.510 ± 0.014 | |") in text
  # ours' mean gain 0.010 lies in the reference's range [0.01, 0.03].
  assert "Bar, gain: ours +0.010 against the reference's +0.020" in text
  assert ": met." in text
  # Curves: |0.52 - 0.51| = 0.01 <= 0.014 + 0.014 in both rounds.
  assert "in 2 of 2 rounds: met." in text


def test_dense_table_hand_checked(tmp_path):
  refs, ours = [], []
  for s, (r, o) in enumerate([([0.2, 0.6, 0.4], [0.3, 0.5]),
                              ([0.4, 0.2, 0.9], [0.1, 0.7])]):
    p = tmp_path / f"ref{s}.jsonl"
    _jsonl(p, [{"args": 1}] + [{"epoch": e + 1, "test_accuracy": a}
                                for e, a in enumerate(r)])
    d = tmp_path / f"ours{s}"
    d.mkdir()
    _jsonl(d / "metrics.jsonl", [{"step": 0, "test_accuracy": 0.1}]
           + [{"step": e + 1, "test_accuracy": a} for e, a in enumerate(o)]
           + [{"step": 2, "loss": 1.0}])
    refs.append(str(p))
    ours.append(str(d))
  text = gains.dense_report(refs, ours, names=("theirs", "mine"))
  # Cut to 2 epochs: reference finals 0.6 / 0.2, bests 0.6 / 0.4.
  assert "| 0 | 0.6000 | 0.5000 | 0.6000 | 0.5000 |" in text
  assert "| 1 | 0.2000 | 0.7000 | 0.4000 | 0.7000 |" in text
  # Finals: theirs 0.4 ± 0.2828, mine 0.6 ± 0.1414; gap 0.2 <= 0.2828.
  assert "| mean ± sd | 0.4000 ± 0.2828 | 0.6000 ± 0.1414 |" in text
  assert "| 1 | 0.3000 ± 0.1414 | 0.2000 ± 0.1414 |" in text
  assert "after 2 epochs, apart by 0.2000 against the larger seed sd 0.2828: met." in text
