"""The pipeline's store on MySQL / MariaDB: the store, its transactions and the statements of the
hot path's tables here; the compensation ledger in ``ledger``, the read models of the console and
the watchers in ``reads``."""

from app.adapters.mysql.store import MySqlStore
from app.adapters.mysql.transaction import MySqlTransaction

__all__ = ["MySqlStore", "MySqlTransaction"]
