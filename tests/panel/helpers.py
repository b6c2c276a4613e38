"""Helpers shared by the panel's tests and fixtures (kept out of conftest so tests can import them)."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "panel"
CHROMIUM = os.environ.get("SCRINALIA_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]
PLUGINS = "tests.panel.panel_workers:WORKERS"
ADMIN = ("admin@panel.test", "admin-password-123")
VIEWER = ("viewer@panel.test", "viewer-password-123")


def shot(page, name: str, full_page: bool = True) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def login(page, email: str, password: str) -> None:
    page.goto("/#/login")
    page.get_by_label("E-mail").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


_CSP_LISTENER = """
document.addEventListener('securitypolicyviolation', (e) => {
  window.reportCspViolation(
    `${e.effectiveDirective} blocked ${e.blockedURI || 'inline'} at ${e.sourceFile}:${e.lineNumber}`);
});
"""


def watch_csp(context) -> list[str]:
    """Every Content-Security-Policy violation of every page and frame of ``context``, as chromium reports
    it: the ``securitypolicyviolation`` event, and the console's "Content Security Policy" errors."""
    violations: list[str] = []
    context.expose_function("reportCspViolation", lambda text: violations.append(text))
    context.add_init_script(_CSP_LISTENER)

    def on_page(page) -> None:
        page.on("console", lambda msg: violations.append(msg.text)
                if msg.type == "error" and "Content Security Policy" in msg.text else None)

    context.on("page", on_page)
    return violations
