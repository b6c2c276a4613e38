"""The demo collection: ~200 ISAD(G)-style descriptions shipped with the package, for ``make dev``.

``load_demo_collection(engine)`` imports them (skipping those already present) and seeds what the
workers need to show something: typologies, a few entity stopwords, and cleaning rules (two REWRITE
rules and a VALIDATE rule). There is no LLM_CHECK rule: no model is shipped for it. Regenerate the
file with ``scripts/make_demo_collection.py``.
"""
from __future__ import annotations

from importlib import resources

from sqlalchemy import Engine, text

from scrinalia.domains.archive.importer import import_records, read_jsonl

TYPOLOGIES = [
    ("correspondence", "letters sent or received"),
    ("minutes", "records of the meetings of a body"),
    ("register", "parish or civil registers"),
    ("deed", "notarial or legal deeds"),
    ("map", "maps and plans"),
    ("photograph", "photographs and negatives"),
    ("accounts", "financial records"),
    ("lawsuit", "judicial records"),
]
STOPWORDS = ["Sé", "Real", "Dom"]
RULES = [
    ("collapse-spaces", "REWRITE", "title", r"\s{2,}", " ", "runs of spaces become one space"),
    ("collapse-spaces-scope", "REWRITE", "scope_and_content", r"[ \t]{2,}", " ", "runs of spaces become one"),
    ("lorem-ipsum", "VALIDATE", "scope_and_content", r"(?i)lorem ipsum", None, "placeholder text (lorem ipsum)"),
]


def demo_path():
    return resources.files(__package__).joinpath("collection.jsonl")


def load_demo_collection(engine: Engine) -> int:
    """Import the demo collection (idempotent); returns how many documents were new."""
    with demo_path().open(encoding="utf-8") as fh:
        report = import_records(engine, list(read_jsonl(fh)), on_conflict="skip")
    with engine.begin() as conn:
        for name, description in TYPOLOGIES:
            conn.execute(text("INSERT INTO archive_typologies (name, description) VALUES (:n, :d) "
                              "ON CONFLICT (name) DO NOTHING"), {"n": name, "d": description})
        for term in STOPWORDS:
            conn.execute(text("INSERT INTO archive_entity_stopwords (term) VALUES (:t) ON CONFLICT DO NOTHING"),
                         {"t": term})
        for name, kind, field, pattern, replacement, message in RULES:
            conn.execute(text(
                "INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement, message) "
                "VALUES (:n, CAST(:k AS cleaning_rule_kind), :f, :p, :r, :m) ON CONFLICT (name) DO NOTHING"),
                {"n": name, "k": kind, "f": field, "p": pattern, "r": replacement, "m": message})
    return report.inserted
