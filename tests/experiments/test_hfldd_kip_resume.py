"""HFLDD (and FedD3) smoke runs stopped during the clients' KIP resume from
their segment checkpoint and end as an uninterrupted run does."""

import os

import numpy as np
import pytest

from fedjax_dd.algorithms import fedd3_stages
from fedjax_dd.algorithms import hfldd_stages
from fedjax_dd.core import stage_cache
from fedjax_dd.core.ledger import load_metrics
from fedjax_dd.core.workdir import check_layout
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedd3 as fedd3_config
from fedjax_dd.experiments.configs import hfldd as hfldd_config


class _Stopped(Exception):
  pass


def _config():
  config = hfldd_config.get_config("smoke")
  config.run.progress = False
  config.rounds = 1
  return config


def _timeless(value):
  """``value`` without its wall-clock fields (which differ run to run)."""
  if isinstance(value, dict):
    return {k: _timeless(v) for k, v in value.items()
            if not any(t in k for t in ("second", "time", "wall"))}
  if isinstance(value, list):
    return [_timeless(v) for v in value]
  return value


def test_run_stopped_during_member_kip_resumes_from_its_segment(
    tmp_path, monkeypatch):
  config = _config()
  # 4 KIP iterations in segments of 2: the run is stopped once the first
  # segment is saved.
  assert (config.kip.max_iterations, config.kip.segment_iterations) == (4, 2)
  whole = registry.run(config, str(tmp_path / "whole"))

  save, resume = stage_cache.TreeCheckpoint.save, (
      stage_cache.TreeCheckpoint.resume)
  saved, resumed = [], []

  def stopping_save(self, tree, done):
    save(self, tree, done)
    saved.append(done)
    raise _Stopped

  workdir = tmp_path / "stopped"
  monkeypatch.setattr(stage_cache.TreeCheckpoint, "save", stopping_save)
  with pytest.raises(_Stopped):
    registry.run(_config(), str(workdir))
  in_progress = workdir / "stages" / hfldd_stages.KIP_STAGE
  assert saved == [2] and in_progress.is_dir()
  assert not (workdir / "stages" / hfldd_stages.STAGE).exists()
  check_layout(workdir)

  def spying_resume(self, template):
    out = resume(self, template)
    resumed.append(None if out is None else out[1])
    return out

  monkeypatch.setattr(stage_cache.TreeCheckpoint, "save", save)
  monkeypatch.setattr(stage_cache.TreeCheckpoint, "resume", spying_resume)
  again = registry.run(_config(), str(workdir))
  assert resumed == [2]                 # continued from segment 1
  assert not in_progress.exists()       # superseded by the cached stages
  assert (workdir / "stages" / hfldd_stages.STAGE).is_dir()
  assert not again["stages_cached"]
  for key in ("accuracy_by_round", "final_test_accuracy", "clusters",
              "privacy", "kip_loss", "bytes_total", "distilled_samples_total"):
    assert again[key] == whole[key], key
  assert _timeless(again["stage_info"]) == _timeless(whole["stage_info"])
  rows = [load_metrics(os.path.join(d, "metrics.jsonl"))
          for d in (tmp_path / "whole", workdir)]
  assert len(rows[0]) == len(rows[1]) == 1
  assert _timeless(rows[1]) == _timeless(rows[0])
  # The uploads the heads received are the same bytes.
  fingerprint = common.fingerprint(_config(), "hfldd_stages")
  a, b = (stage_cache.StageCache.for_workdir(d).load(hfldd_stages.STAGE,
                                                     fingerprint).arrays
          for d in (tmp_path / "whole", workdir))
  assert set(a) == set(b)
  for k in a:
    assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


def test_a_segment_saved_under_other_settings_is_refused(tmp_path):
  cache = stage_cache.StageCache(tmp_path)
  store = hfldd_stages.kip_checkpoint(cache, {"hfldd.support_size": 20})
  store.save({"z": np.zeros(3, np.float32)}, 2)
  other = hfldd_stages.kip_checkpoint(cache, {"hfldd.support_size": 10})
  with pytest.raises(stage_cache.StaleStageError, match="support_size"):
    other.resume({"z": np.zeros(3, np.float32)})


def _fedd3_config():
  config = fedd3_config.get_config("smoke")
  config.run.progress = False
  config.rounds = 1
  config.kip.segment_iterations = 10        # 20 iterations: two segments
  return config


def test_fedd3_run_stopped_during_kip_resumes_from_its_segment(
    tmp_path, monkeypatch):
  whole = registry.run(_fedd3_config(), str(tmp_path / "whole"))
  save, resume = stage_cache.TreeCheckpoint.save, (
      stage_cache.TreeCheckpoint.resume)
  resumed = []

  def stopping_save(self, tree, done):
    save(self, tree, done)
    raise _Stopped

  def spying_resume(self, template):
    out = resume(self, template)
    resumed.append(None if out is None else out[1])
    return out

  workdir = tmp_path / "stopped"
  with monkeypatch.context() as m:
    m.setattr(stage_cache.TreeCheckpoint, "save", stopping_save)
    with pytest.raises(_Stopped):
      registry.run(_fedd3_config(), str(workdir))
  in_progress = workdir / "stages" / fedd3_stages.KIP_STAGE
  assert in_progress.is_dir()
  monkeypatch.setattr(stage_cache.TreeCheckpoint, "resume", spying_resume)
  again = registry.run(_fedd3_config(), str(workdir))
  assert resumed == [10] and not in_progress.exists()
  assert again["distilled_cached"] is False
  for k in ("final_test_accuracy", "bytes_total", "gce", "privacy",
            "kip_loss", "kip_iterations", "accuracy_by_round"):
    assert again[k] == whole[k], k
  fingerprint = common.distill_fingerprint(_fedd3_config())
  a, b = (stage_cache.StageCache.for_workdir(d).load(fedd3_stages.STAGE,
                                                     fingerprint).arrays
          for d in (tmp_path / "whole", workdir))
  for k in a:
    assert a[k].tobytes() == b[k].tobytes(), k
