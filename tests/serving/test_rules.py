"""Block/allow lists: parsing names what is wrong, matching, and refreshes that never half-apply."""

from __future__ import annotations

import pytest

from pipeline.serving.rules import RuleBook, RuleHit, RulesError, parse_rules

RULES = b'''
[block]
card = ["card-1"]
device = ["dev-9"]
[allow]
merchant = ["mer-7"]
'''


def test_matching_names_every_list_the_payment_is_on():
    rules = parse_rules(RULES)
    assert rules.match("card-1", "mer-7", "dev-9") == (RuleHit("block", "card", "card-1"),
                                                       RuleHit("block", "device", "dev-9"),
                                                       RuleHit("allow", "merchant", "mer-7"))
    assert rules.match("card-2", "mer-1", None) == ()
    assert str(rules.match("card-1", "m", None)[0]) == "blocklist:card=card-1"


@pytest.mark.parametrize(("text", "message"), [
    (b'[blok]\ncard = ["x"]', r"unknown table \[blok\]"),
    (b'[block]\ncards = ["x"]', "unknown key block.cards"),
    (b'[block]\ncard = "x"', "block.card must be a list of non-empty strings"),
    (b'[allow]\ndevice = [""]', "allow.device must be a list of non-empty strings"),
    (b'[block\n', "not valid UTF-8 TOML"),
])
def test_an_invalid_file_is_refused_by_name(text, message):
    with pytest.raises(RulesError, match=message):
        parse_rules(text, "rules.toml")


def test_refresh_swaps_whole_sets_and_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "rules.toml"
    book = RuleBook(path)
    assert book.refresh() and book.rules.match("card-1", "m", None) == ()  # no file: no rules
    path.write_bytes(RULES)
    assert book.refresh() and book.rules.match("card-1", "m", None)
    live = book.rules
    path.write_bytes(b'[block]\ncard = ["card-1", 7]')
    assert not book.refresh()
    assert book.rules is live  # the broken file changed nothing
    status = book.status()
    assert (status.refreshes, status.failures) == (2, 1)
    assert "block.card must be a list" in status.last_error and status.digest == live.digest
    assert status.counts["block.card"] == 1 and status.counts["allow.merchant"] == 1
