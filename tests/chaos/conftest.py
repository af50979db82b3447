"""The chaos suite reuses the real PostgreSQL server of the fencing tests."""

from tests.fencing.conftest import pg_dsn, postgres

__all__ = ["pg_dsn", "postgres"]
