"""docs/configuration.md's table of groups lists exactly the options conf/ has: a new option must appear there."""

import re

from tests.config.helpers import options
from tests.conftest import ROOT


def test_the_group_table_lists_every_option_of_every_group():
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| .* \| ([\w, ]+) \|$", text, re.M)
    assert len(rows) >= 10, rows
    for group, listed in rows:
        assert sorted(o.strip() for o in listed.split(",")) == sorted(options(group)), group
