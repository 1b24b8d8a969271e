"""DisUE's default generator term (FedFTG's L1 on logits, issue 38) and the
baselines that share DisUE's protocol but not that choice."""

import pytest

from fedjax_dd.experiments.configs import disue
from fedjax_dd.experiments.configs import feddf_datafree
from fedjax_dd.experiments.configs import fedftg


@pytest.mark.parametrize("arg", disue.PRESETS)
def test_disue_presets_use_l1_logits_for_the_generator(arg):
  c = disue.get_config(arg)
  assert c.iga.discrepancy == "l1_logits"
  assert c.iga.student_discrepancy == "kl"
  # The departure from Eq. 9 is recorded with the run (summary.json).
  assert any("Eq. 9" in d for d in c.paper_departures)


def test_protocol_and_baselines_keep_their_own_terms():
  # The shared protocol keeps the IGA group's Eq. 9 default, so data-free
  # FedDF is unchanged; FedFTG sets its code's pair itself.
  assert disue.protocol("disue", "smoke").iga.discrepancy == "kl"
  assert feddf_datafree.get_config("smoke").iga.discrepancy == "kl"
  assert not any("Eq. 9" in d for d in
                 feddf_datafree.get_config("smoke").paper_departures)
  f = fedftg.get_config("smoke").iga
  assert (f.discrepancy, f.student_discrepancy) == ("l1_logits", "kl")
  # FedFTG's code detaches the teachers' logits in its generator term;
  # DisUE's Eq. 13 (and data-free FedDF) differentiate through them.
  assert not f.cd_through_teachers
  assert disue.protocol("disue", "smoke").iga.cd_through_teachers
  assert feddf_datafree.get_config("smoke").iga.cd_through_teachers
