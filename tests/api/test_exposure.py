"""What an anonymous client reaches: /metrics needs the scrape token or an ADMIN session, no docs UI
(it would load swagger-ui from a CDN), and forwarded headers are believed only from the proxies the
operator names (none by default; the real `scrinalia api` process is tested, not only the app)."""
from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from scrinalia.api.settings import load_api_settings
from scrinalia.settings import SettingsError
from tests.api.conftest import PASSWORD, add_user, make_app
from tests.api.live import live_api

TOKEN = "a-scrape-token-of-some-length"


def test_metrics_need_the_scrape_token_or_an_admin_session(engine, viewer_headers, admin_headers):
    app = make_app(engine, metrics_token=TOKEN)
    with TestClient(app) as client:
        r = client.get("/metrics")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "scrinalia_" not in r.text
        assert client.get("/metrics", headers={"Authorization": "Bearer not-the-token"}).status_code == 401
        assert client.get("/metrics", headers=viewer_headers).status_code == 403
        assert client.get("/metrics", headers=admin_headers).status_code == 200
        r = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "scrinalia_build_info" in r.text


def test_without_a_token_metrics_are_for_admins_only(client, engine):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401


def test_a_short_scrape_token_is_refused_at_start():
    with pytest.raises(SettingsError, match="API_METRICS_TOKEN"):
        load_api_settings(metrics_token="short")


def test_no_docs_ui_and_the_schema_is_still_served(client):
    assert client.get("/api/v1/docs").status_code == 404
    assert client.get("/api/v1/redoc").status_code == 404
    r = client.get("/api/v1/openapi.json")
    assert r.status_code == 200 and r.json()["info"]["title"] == "Scrinalia API"


def test_a_bad_trusted_proxy_is_refused_at_start():
    with pytest.raises(SettingsError, match="API_TRUSTED_PROXIES"):
        load_api_settings(trusted_proxies="10.0.0.0/8, proxy.example.org")
    assert load_api_settings(trusted_proxies="10.0.0.0/8, ::1").proxy_networks == ["10.0.0.0/8", "::1/128"]


def _rotating_logins(base: str, n: int) -> list[int]:
    codes = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for i in range(n):
            r = client.post("/api/v1/auth/login", headers={"X-Forwarded-For": f"198.51.100.{i}"},
                            json={"email": "rl@example.org", "password": f"wrong password {i}"})
            codes.append(r.status_code)
    return codes


def test_scrinalia_api_believes_no_forwarded_header_by_default(database_url, engine):
    add_user(engine, "rl@example.org")
    with live_api(database_url, workers=1, cli=True, API_LOGIN_RATE_LIMIT="3",
                  API_LOCKOUT_THRESHOLD="100") as api:
        codes = _rotating_logins(api.base, 5)
    # every attempt came from 127.0.0.1, whatever the header said: the per-address brake holds
    assert codes == [401, 401, 401, 429, 429], codes


def test_a_configured_proxy_is_believed(database_url, engine):
    add_user(engine, "rl@example.org")
    with live_api(database_url, workers=1, API_LOGIN_RATE_LIMIT="3", API_LOCKOUT_THRESHOLD="100",
                  API_TRUSTED_PROXIES="127.0.0.0/8") as api:
        codes = _rotating_logins(api.base, 5)
        with httpx.Client(base_url=api.base, timeout=30) as client:
            r = client.post("/api/v1/auth/login", headers={"X-Forwarded-For": "198.51.100.77"},
                            json={"email": "rl@example.org", "password": PASSWORD, "issue_token": True})
            assert r.status_code == 200
    assert codes == [401] * 5, codes
    with engine.connect() as conn:
        assert conn.execute(text("SELECT client_address FROM auth_sessions")).scalar_one() == "198.51.100.77"

