"""Settings says when a model directory is unknown to every online runner (decision 0145): a real runner
daemon reports, at registration, the model directories it sees on its host (``sees`` in the registry:
its workers' configured paths and the directories under SCRINALIA_MODEL_ROOTS); the Settings page warns
when a saved path is none of them, and does not when it is one."""
from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect
from sqlalchemy import text

from scrinalia.domains.archive import registry
from tests.panel.conftest import RunnerControl
from tests.panel.helpers import ADMIN, login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_settings_warns_of_a_model_directory_no_online_runner_sees(page, panel_engine, panel_database_url,
                                                                   tmp_path, monkeypatch):
    root = tmp_path / "models"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    monkeypatch.setenv("SCRINALIA_MODEL_ROOTS", str(root))
    runner = RunnerControl(panel_database_url, name="models-runner", capabilities="panel-model",
                           flags=("--devices", "none"))
    try:
        runner.start().wait_registered(panel_engine)
        [seen] = [r for r in registry.list_runners(panel_engine) if r.name == "models-runner" and r.stopped_at is None]
        assert seen.sees == {"model_dirs": [str(root / "tiny")], "model_roots": [str(root)]}

        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        page.goto("/#/workers/panel-model/settings")
        form = page.get_by_role("form", name="Settings of Needs a model (test)")
        form.get_by_label("Model", exact=True).fill("/srv/models/absent")
        form.get_by_role("button", name="Save settings").click()
        warning = page.locator('[data-settings-warnings] [data-field="engine_options.model"]')
        expect(warning).to_contain_text("no online runner of panel-model (models-runner) saw /srv/models/absent")
        expect(warning).to_contain_text("EngineUnavailable")
        shot(page, "44-settings-unseen-model")

        form.get_by_label("Model", exact=True).fill(str(root / "tiny"))
        form.get_by_role("button", name="Save settings").click()
        expect(page.get_by_role("status").filter(has_text="Saved: revision 2")).to_be_visible()
        expect(page.locator("[data-settings-warnings] .notice")).to_have_count(0)
    finally:
        runner.stop()
        runner.remove_socket_dir()
        with panel_engine.begin() as conn:
            conn.execute(text("DELETE FROM archive_worker_settings WHERE worker_name = 'panel-model'"))
