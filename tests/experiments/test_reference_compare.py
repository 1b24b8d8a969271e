"""The reference runs' tables against ours (experiments/reference/
compare_fedftg.py, compare_dense.py), checked by hand."""

import json

from tests.experiments.test_reference_export import _load


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


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
  text = _load("compare_fedftg").fedftg_report(refs, ours, rounds=2)
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
  text = _load("compare_dense").dense_report(refs, ours, names=("theirs", "mine"))
  # Cut to 2 epochs: reference finals 0.6 / 0.2, bests 0.6 / 0.4.
  assert "| 0 | 0.6000 | 0.5000 | 0.6000 | 0.5000 |" in text
  assert "| 1 | 0.2000 | 0.7000 | 0.4000 | 0.7000 |" in text
  # Finals: theirs 0.4 ± 0.2828, mine 0.6 ± 0.1414; gap 0.2 <= 0.2828.
  assert "| mean ± sd | 0.4000 ± 0.2828 | 0.6000 ± 0.1414 |" in text
  assert "| 1 | 0.3000 ± 0.1414 | 0.2000 ± 0.1414 |" in text
  assert "after 2 epochs, apart by 0.2000 against the larger seed sd 0.2828: met." in text
