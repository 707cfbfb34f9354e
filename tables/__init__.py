"""SQLAlchemy ``Table`` metadata of the processor's MySQL schema (no queries here).

Alembic migrations in ``migrations/`` are written from and checked against
this metadata (``tests/integration/test_migrations.py``).
"""

from tables.schema import metadata, t_compensation, t_compensation_audit, t_idem, t_lease, t_order, t_waybill_receipt

__all__ = ["metadata", "t_compensation", "t_compensation_audit", "t_idem", "t_lease", "t_order", "t_waybill_receipt"]
