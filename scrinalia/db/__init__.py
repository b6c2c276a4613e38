"""Database access: SQLAlchemy 2 Core on psycopg 3."""

import logging

# alembic (1.16+) says "setup plugin alembic.autogenerate.*" at INFO when it is first imported: seven
# lines at every start of the scheduler, the runner and the API, about autogenerate, which no process of
# ours uses. Set here, before anything of ours imports alembic (``scrinalia.db.migrate``); its own
# upgrade lines ("Running upgrade ...") are another logger's and stay.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
