"""The Postgres store (Cloud SQL): psycopg 3 and its pool."""
