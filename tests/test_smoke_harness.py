from sqlalchemy import text

def test_harness(engine):
    with engine.connect() as c:
        assert c.execute(text("select count(*) from archive_worker_runs")).scalar() == 0
