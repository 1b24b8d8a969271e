"""IGA / FedFTG gain tables over seeds (fedjax_dd/utils/gains.py) and the
script that calls them (experiments/iga_gains.py)."""

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
