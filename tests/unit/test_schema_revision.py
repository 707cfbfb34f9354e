"""A worker runs on a schema at its own head, or on a newer one that still serves its release; it
refuses any other and says what to run, or which releases fit."""

from app.adapters.mysql.schema import FoundSchema, judge_revision, revisions

KNOWN = ["0008", "0007", "0006"]


def test_the_head_passes_silently():
    assert judge_revision("0008", KNOWN).ok and not judge_revision("0008", KNOWN).message


def test_a_schema_behind_the_code_or_none_at_all_is_refused_with_what_to_run():
    for found in ("0007", None):
        verdict = judge_revision(found, KNOWN)
        assert not verdict.ok and "python -m app.admin migrate" in verdict.message and "0008" in verdict.message


def test_a_newer_schema_that_still_serves_this_release_passes_with_a_warning():
    verdict = judge_revision(FoundSchema("0009", "1.0.0"), KNOWN, version="1.1.0")
    assert verdict.ok and "serves release 1.0.0 and later" in verdict.message
    assert judge_revision(FoundSchema("0009", "1.1.0"), KNOWN, version="1.1.0").ok


def test_a_newer_schema_that_no_longer_serves_this_release_is_refused_with_the_releases_that_fit():
    verdict = judge_revision(FoundSchema("0012", "1.2.0"), KNOWN, version="1.1.0")
    assert not verdict.ok
    assert "serves release 1.2.0 and later" in verdict.message and "run release 1.2.0 or later" in verdict.message


def test_a_newer_schema_that_says_nothing_of_the_releases_it_serves_is_refused():
    verdict = judge_revision(FoundSchema("0009", None), KNOWN, version="1.1.0")
    assert not verdict.ok and "t_schema_release" in verdict.message


def test_a_development_version_is_served_by_what_serves_its_release():
    assert judge_revision(FoundSchema("0009", "1.0.0"), KNOWN, version="1.1.0.dev0").ok
    assert not judge_revision(FoundSchema("0009", "1.1.0"), KNOWN, version="1.1.0.dev0").ok


def test_the_code_knows_its_migrations_head_first():
    known = revisions()
    assert known and known[0] == max(known) and len(known) == len(set(known))
