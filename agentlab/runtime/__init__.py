"""Where it runs: the PostgreSQL server (embedded or DATABASE_URL), fresh databases, the Harness."""
