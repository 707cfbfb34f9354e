"""Every migration since release 1.0.0 says whether it moves the oldest release the schema serves
(``OLDEST_RELEASE_SERVED``: None when it only expands; a release when it contracts), and what they
say never goes back: ``migrations/env.py`` writes the newest into ``t_schema_release``."""

from __future__ import annotations

from alembic.script import ScriptDirectory
from packaging.version import Version

from app.adapters.mysql.schema import alembic_config

# Release 1.0.0's migrations end here; the rule holds from the next one on.
BEFORE_THE_RULE = "0018"


def chain() -> list:
    script = ScriptDirectory.from_config(alembic_config())
    return list(reversed(list(script.walk_revisions())))


def test_every_migration_since_the_first_release_says_whether_it_moves_the_oldest_release_served():
    since = [rev for rev in chain() if rev.revision > BEFORE_THE_RULE]
    assert since, "no migration since the first release"
    silent = [rev.revision for rev in since if not hasattr(rev.module, "OLDEST_RELEASE_SERVED")]
    assert silent == [], f"migrations that do not say OLDEST_RELEASE_SERVED (None: expands only): {silent}"


def test_the_oldest_release_served_is_a_release_and_never_goes_back():
    declared = [(rev.revision, rev.module.OLDEST_RELEASE_SERVED) for rev in chain()
                if getattr(rev.module, "OLDEST_RELEASE_SERVED", None) is not None]
    assert declared, "no migration says which releases the schema serves (t_schema_release's migration does)"
    versions = [Version(value) for _, value in declared]
    assert versions == sorted(versions), f"the oldest release served went back: {declared}"
