"""docs/configuration.md's table of groups lists exactly the groups and options conf/ has: a new group or option must
appear there."""

import re

from tests.config.helpers import options
from tests.conftest import CONF, ROOT

# conf/ folders that are not groups a user picks: Hydra's own, and the settings of a pair of choices (config.yaml's
# `optional model_algorithm: ${model}_${algorithm}`), which docs/configuration.md describes apart from the table
NOT_CHOICES = {"hydra", "model_algorithm", "model_dataset"}


def test_the_group_table_lists_every_option_of_every_group():
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| .* \| ([\w, ]+) \|$", text, re.M)
    assert len(rows) >= 10, rows
    for group, listed in rows:
        assert sorted(o.strip() for o in listed.split(",")) == sorted(options(group)), group
    groups = {p.name for p in CONF.iterdir() if p.is_dir() and not p.name.startswith("__")} - NOT_CHOICES
    assert sorted(group for group, _ in rows) == sorted(groups)
