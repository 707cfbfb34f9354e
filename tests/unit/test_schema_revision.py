"""A worker refuses a database its migrations have not reached, and says what to run."""

from app.adapters.mysql.schema import judge_revision, revisions

KNOWN = ["0008", "0007", "0006"]


def test_the_head_passes_silently():
    assert judge_revision("0008", KNOWN).ok and not judge_revision("0008", KNOWN).message


def test_a_schema_behind_the_code_or_none_at_all_is_refused_with_what_to_run():
    for found in ("0007", None):
        verdict = judge_revision(found, KNOWN)
        assert not verdict.ok and "alembic upgrade head" in verdict.message and "0008" in verdict.message


def test_a_schema_ahead_of_the_code_passes_with_a_warning():
    verdict = judge_revision("0009", KNOWN)
    assert verdict.ok and "does not know" in verdict.message


def test_the_code_knows_its_migrations_head_first():
    known = revisions()
    assert known and known[0] == max(known) and len(known) == len(set(known))
