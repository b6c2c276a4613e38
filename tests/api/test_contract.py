"""The OpenAPI document tells the truth (issue 28; docs/decisions/0320): schemathesis' own CLI against a
running API (``uvicorn --workers 2``, the panel mounted at ``/``) with an ADMIN's cookie session, as a
user would run it. 0 failures of status-code conformance, schema-valid request rejected and negative
data accepted, the 405 and its ``Allow`` header, and the authentication checks (an operation that needs a
session refuses none and an invalid one, also beside a valid cookie). Bounded: a fixed seed and a few
examples per operation (the coverage phase sends every bound and enum of the document); ~30 s.

Plus the rules one at a time, in-process, so a failure names the rule it broke."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.conftest import PASSWORD, add_user, cookie_login, make_app
from tests.api.live import live_api

CHECKS = ",".join([
    "status_code_conformance", "negative_data_rejection", "positive_data_acceptance", "unsupported_method",
    "allow_header_conformance", "ignored_auth", "missing_required_header",
])

# The three operations whose body a worker of the catalogue validates: which engine, preset and options a
# worker takes is the worker's own (GET /system/workers lists them); one schema per operation can only
# state the union, so a schema-valid body naming another worker's engine is a 422 that says so. They get
# every check but that one, in a second run (decision 0320).
PER_WORKER_BODIES = ["POST /api/v1/system/workers/{name}/runs", "PUT /api/v1/system/workers/{name}/settings",
                     "POST /api/v1/system/schedules"]


def _schemathesis(api_base: str, cookie: str, csrf: str, report: Path, *selection: str) -> subprocess.Popen:
    """schemathesis' CLI, started (the two runs go side by side: the API has two processes)."""
    st = Path(sys.executable).with_name("st")
    report.mkdir()
    return subprocess.Popen(
        [str(st), "run", f"{api_base}/api/v1/openapi.json", "--no-color",
         "-H", f"Cookie: scrinalia_session={cookie}", "-H", f"X-CSRF-Token: {csrf}",
         "--max-examples", "10", "--seed", "28", "--workers", "1", "--phases", "examples,coverage,fuzzing",
         "--exclude-path", "/api/v1/auth/logout", "--output-truncate", "true", "--report-dir", str(report),
         *selection],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=report,  # its cache: not in the tree
    )


def _finished(run: subprocess.Popen) -> str:
    text, _ = run.communicate(timeout=300)
    assert run.returncode == 0, text
    return text


def test_schemathesis_finds_no_failure_against_the_served_document(database_url, engine, tmp_path: Path):
    add_user(engine, "fuzz@example.org", "ADMIN")
    with live_api(database_url, workers=2, API_LOGIN_RATE_LIMIT="10000", API_EVENTS_STREAM_SECONDS="0",
                  API_LOCKOUT_THRESHOLD="100", API_METRICS_TOKEN="a-scrape-token-of-thirty-two-chars") as api:
        r = httpx.post(f"{api.base}/api/v1/auth/login", json={"email": "fuzz@example.org", "password": PASSWORD})
        assert r.status_code == 200, r.text
        session = (api.base, r.cookies["scrinalia_session"], r.json()["csrf_token"])
        excluded = [arg for name in PER_WORKER_BODIES for arg in ("--exclude-name", name)]
        included = [arg for name in PER_WORKER_BODIES for arg in ("--include-name", name)]
        every_check = _schemathesis(*session, tmp_path / "all", "--checks", CHECKS, *excluded)
        bodies = _schemathesis(*session, tmp_path / "bodies", "--checks",
                               CHECKS.replace("positive_data_acceptance,", ""), *included)
        report = _finished(every_check)
        assert "Tested: 25" in report, report  # every operation but the logout and the three below
        assert "Tested: 3" in _finished(bodies)
        assert "Traceback" not in api.log()


def test_an_unsupported_method_is_a_405_that_lists_the_paths_methods(app):
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        r = client.options("/api/v1/auth/login")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"] == "method_not_allowed"
        r = client.put("/api/v1/system/schedules")  # two routes share the path: both methods are listed
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
        r = client.options("/api/v1/system/schedules/7")
        assert r.status_code == 405 and r.headers["allow"] == "DELETE, PATCH"


def test_the_panels_mount_does_not_answer_for_an_api_path(engine, tmp_path: Path):
    from fastapi.testclient import TestClient

    from scrinalia.api.app import create_app
    from tests.api.conftest import HASHER, api_settings
    from tests.api.workers_fixture import WORKERS

    (tmp_path / "index.html").write_text("<!doctype html><title>panel</title>")
    app = create_app(engine=engine, api_settings=api_settings(), catalogue={w.name: w for w in WORKERS},
                     hasher=HASHER, ui_dir=tmp_path)
    with TestClient(app) as client:
        r = client.options("/api/v1/system/runs/0123456789abcdef/cancel")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert client.get("/").status_code == 200  # the panel is still served


def test_an_invalid_bearer_is_refused_even_beside_a_valid_cookie(engine):
    from fastapi.testclient import TestClient

    add_user(engine, "admin@example.org", "ADMIN")
    app = make_app(engine, metrics_token="a-scrape-token-of-thirty-two-chars")
    with TestClient(app) as client:
        cookie_login(client, "admin@example.org")
        assert client.get("/metrics").status_code == 200  # the cookie alone: an ADMIN session
        for header in ("Bearer not-a-token", "Bearer", "Basic YTpi", "garbage"):
            r = client.get("/metrics", headers={"Authorization": header})
            assert r.status_code == 401, (header, r.status_code)
            r = client.get("/api/v1/system/workers", headers={"Authorization": header})
            assert r.status_code == 401, (header, r.status_code)
        r = client.get("/metrics", headers={"Authorization": "Bearer a-scrape-token-of-thirty-two-chars"})
        assert r.status_code == 200


def test_configured_bounds_and_every_answer_are_in_the_document(engine):
    from fastapi.testclient import TestClient

    app = make_app(engine, failures_max_days=90, password_min_length=20)
    with TestClient(app) as client:
        doc = client.get("/api/v1/openapi.json").json()
    failures = doc["paths"]["/api/v1/system/failures"]["get"]
    days = next(p for p in failures["parameters"] if p["name"] == "days")
    assert days["schema"]["maximum"] == 90
    assert doc["components"]["schemas"]["ChangePasswordIn"]["properties"]["new_password"]["minLength"] == 20
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            codes = set(operation["responses"])
            assert "422" in codes, (method, path)
            if path.startswith("/api/v1/system"):
                assert {"401", "403", "404"} <= codes, (method, path, codes)
    assert {"401", "423", "429"} <= set(doc["paths"]["/api/v1/auth/login"]["post"]["responses"])
