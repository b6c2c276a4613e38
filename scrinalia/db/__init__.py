"""Database access: SQLAlchemy 2 Core on psycopg 3."""
