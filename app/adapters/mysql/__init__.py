"""The pipeline's store on MySQL / MariaDB."""

from app.adapters.mysql.store import MySqlStore
from app.adapters.mysql.transaction import MySqlTransaction

__all__ = ["MySqlStore", "MySqlTransaction"]
