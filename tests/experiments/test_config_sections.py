"""Each hyper-parameter dataclass is built from its config group in one call
(``experiments/sections.py``), so a key of ``configs/base.py`` without a
field, or a field without a key, fails here; the library names no config
key."""

import dataclasses

import ml_collections
import pytest

from fedjax_dd.distill.dfkd import DFKDHyperParams
from fedjax_dd.distill.iga import IGAHyperParams
from fedjax_dd.distill.kip import KipOptions
from fedjax_dd.experiments import sections
from fedjax_dd.experiments.configs import base


def _groups():
  c = ml_collections.ConfigDict()
  for add in (base.iga, base.dfkd, base.coboosting):
    add(c)
  base.kip(c, max_iterations=5, stop_accuracy=None)
  return c


@pytest.mark.parametrize("cls, group", [
    (IGAHyperParams, "iga"), (DFKDHyperParams, "dfkd"),
    (KipOptions, "kip")])
def test_each_key_is_a_field_or_named_elsewhere(cls, group):
  section = _groups()[group]
  hp = getattr(sections, group)(section)
  assert isinstance(hp, cls)
  fields = {f.name for f in dataclasses.fields(cls)}
  other = set(sections.NOT_FIELDS[group])
  assert not fields & other
  assert set(section.keys()) - other <= fields
  # Every field that keeps its name carries the config's value.
  for name in fields & set(section.keys()):
    if name != "pool_size":
      assert getattr(hp, name) == section[name], name


def test_derived_fields():
  c = _groups()
  # "" (the derived group's default): the student uses the generator's D.
  c.iga.discrepancy, c.iga.student_discrepancy = "l1", ""
  assert sections.iga(c.iga).student_d == "l1"
  c.dfkd.pool_size, c.dfkd.distill_epochs = 0, 7
  c.dfkd.synthetic_batch_size = 9
  hp = sections.dfkd(c.dfkd)
  assert (hp.pool_size, hp.batch_size) == (7, 9)
  cb = sections.coboosting(c.coboosting, c.dfkd)
  assert (cb.pool_size, cb.batch_size, cb.num_epochs) == (7, 9, 7)
  c.coboosting.cosine = False
  assert sections.coboosting(c.coboosting, c.dfkd).num_epochs == 0
  for name in set(c.coboosting.keys()) - set(sections.NOT_FIELDS["coboosting"]):
    assert getattr(cb, name) == c.coboosting[name], name


@pytest.mark.parametrize("group", ["iga", "dfkd", "coboosting", "kip"])
def test_a_new_key_without_a_field_fails(group):
  c = _groups()
  c[group].unread_setting = 1
  build = ((lambda s: sections.coboosting(s, c.dfkd))
           if group == "coboosting" else getattr(sections, group))
  with pytest.raises(KeyError, match="unread_setting"):
    build(c[group])


def test_a_field_without_a_key_fails():
  c = _groups()
  del c.iga["beta_cf"]
  with pytest.raises(KeyError, match="beta_cf"):
    sections.iga(c.iga)


def test_the_kip_option_keys_the_fingerprint_names_are_kipoptions_fields():
  assert set(base.KIP_OPTION_KEYS) == {
      f.name for f in dataclasses.fields(KipOptions)}
  group = _groups().kip
  assert set(base.KIP_OPTION_KEYS) <= set(group.keys())
