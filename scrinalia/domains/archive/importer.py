"""Archive import: JSONL or CSV descriptions into ``archive_documents``, all or nothing.

Every line is validated first; any error (with its line number) means nothing is written. The valid
set is then written in ONE transaction. A reference code already in the archive is an error by default
(``on_conflict="error"``), or is skipped (``"skip"``) or updated (``"update"``).
"""
from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

from scrinalia.db.tables import DOCUMENT_STATUSES

TEXT_FIELDS = ("reference_code", "title", "scope_and_content", "admin_biographical_history", "provenance",
               "date_text", "level", "extent", "language", "creator")
DATE_FIELDS = ("date_start", "date_end")
FIELDS = TEXT_FIELDS + DATE_FIELDS + ("status",)
REQUIRED = ("reference_code", "title")
ON_CONFLICT = ("error", "skip", "update")
_YEAR = re.compile(r"^\d{3,4}$")
_YEAR_MONTH = re.compile(r"^(\d{3,4})-(\d{2})$")


@dataclass(frozen=True)
class LineError:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class ImportFailed(ValueError):
    """Nothing was imported; ``errors`` lists every bad line."""

    def __init__(self, errors: list[LineError]) -> None:
        self.errors = errors
        shown = "\n".join(str(e) for e in errors[:50])
        more = f"\n... and {len(errors) - 50} more" if len(errors) > 50 else ""
        super().__init__(f"{len(errors)} error(s), nothing was imported:\n{shown}{more}")


@dataclass
class ImportReport:
    read: int = 0
    inserted: int = 0
    updated: int = 0
    skipped: int = 0


def parse_date(value: Any, *, end: bool) -> date | None:
    """ISO date, or a year (``1750``) or year-month (``1750-03``), widened to the start or end."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    raw = str(value).strip()
    if _YEAR.match(raw):
        return date(int(raw), 12, 31) if end else date(int(raw), 1, 1)
    m = _YEAR_MONTH.match(raw)
    if m:
        year, month = int(m.group(1)), int(m.group(2))
        if end:
            nxt = date(year + (month == 12), month % 12 + 1, 1)
            return date.fromordinal(nxt.toordinal() - 1)
        return date(year, month, 1)
    return date.fromisoformat(raw)


def validate_record(raw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """(clean record, []) or (None, messages)."""
    if not isinstance(raw, dict):
        return None, [f"expected an object, got {type(raw).__name__}"]
    problems: list[str] = []
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        problems.append(f"unknown field(s): {', '.join(unknown)} (expected some of {', '.join(FIELDS)})")
    clean: dict[str, Any] = {}
    _clean_texts(raw, clean, problems)
    _clean_dates(raw, clean, problems)
    status = raw.get("status") or "DRAFT"
    if status not in DOCUMENT_STATUSES:
        problems.append(f"status: must be one of {', '.join(DOCUMENT_STATUSES)}, got {status!r}")
    clean["status"] = status
    return (None, problems) if problems else (clean, [])


def _clean_texts(raw: dict[str, Any], clean: dict[str, Any], problems: list[str]) -> None:
    """The text fields, stripped (a number is read as text; empty is NULL); the required ones present."""
    for name in TEXT_FIELDS:
        value = raw.get(name)
        if value is None or value == "":
            clean[name] = None
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            clean[name] = str(value).strip()
        else:
            problems.append(f"{name}: must be text, got {type(value).__name__}")
    problems += [f"{name}: is required" for name in REQUIRED if not clean.get(name)]
    if clean.get("reference_code") and len(clean["reference_code"]) > 200:
        problems.append("reference_code: is longer than 200 characters")


def _clean_dates(raw: dict[str, Any], clean: dict[str, Any], problems: list[str]) -> None:
    """The date fields, widened (``parse_date``), and in order."""
    for name in DATE_FIELDS:
        try:
            clean[name] = parse_date(raw.get(name), end=name == "date_end")
        except (ValueError, TypeError):
            problems.append(f"{name}: {raw.get(name)!r} is not a date (YYYY-MM-DD, YYYY-MM or YYYY)")
    if clean.get("date_start") and clean.get("date_end") and clean["date_end"] < clean["date_start"]:
        problems.append(f"date_end: {clean['date_end']} is before date_start {clean['date_start']}")


def read_jsonl(stream: Iterable[str]) -> Iterator[tuple[int, Any, str | None]]:
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line), None
        except json.JSONDecodeError as exc:
            yield number, None, f"invalid JSON: {exc.msg} (column {exc.colno})"


def read_csv(stream: io.TextIOBase) -> Iterator[tuple[int, Any, str | None]]:
    reader = csv.DictReader(stream)
    if reader.fieldnames is None:
        return
    header_unknown = [h for h in reader.fieldnames if h not in FIELDS]
    if header_unknown:
        yield 1, None, f"unknown column(s): {', '.join(header_unknown)} (expected some of {', '.join(FIELDS)})"
        return
    start = reader.line_num + 1
    for row in reader:
        problem = _row_shape(row, len(reader.fieldnames))
        record = None if problem else _filled(row)
        if problem or record:  # a blank line is no record
            yield start, record, problem
        start = reader.line_num + 1


def _filled(row: dict[str, str]) -> dict[str, str] | None:
    """The row's non-empty values; None for a row of blanks."""
    if not any((v or "").strip() for v in row.values()):
        return None
    return {k: v for k, v in row.items() if v != ""}


def _row_shape(row: dict[Any, Any], columns: int) -> str | None:
    """Why a CSV row does not fit the header (``csv`` keeps extra values under None, missing ones as None)."""
    if None in row:
        return f"{columns + len(row[None])} values for {columns} columns"
    if any(v is None for v in row.values()):
        return f"fewer values than the {columns} columns"
    return None


def detect_format(path: Path, explicit: str | None = None) -> str:
    if explicit:
        return explicit
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    raise ValueError(f"cannot tell the format of {path.name} from its extension (use .jsonl or .csv, or --format)")


def parse(records: Iterable[tuple[int, Any, str | None]]) -> tuple[list[tuple[int, dict[str, Any]]], list[LineError]]:
    good: list[tuple[int, dict[str, Any]]] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    for line, raw, read_error in records:
        if read_error:
            errors.append(LineError(line, read_error))
            continue
        clean, problems = validate_record(raw)
        errors.extend(LineError(line, p) for p in problems)
        if clean is None:
            continue
        code = clean["reference_code"]
        if code in seen:
            errors.append(LineError(line, f"reference_code {code!r} is repeated (first on line {seen[code]})"))
            continue
        seen[code] = line
        good.append((line, clean))
    return good, errors


_EXISTING = text("SELECT reference_code FROM archive_documents WHERE reference_code = ANY(CAST(:codes AS text[]))")
_COLUMNS = ", ".join(FIELDS)
_INSERT = text(
    f"""
    INSERT INTO archive_documents ({_COLUMNS})
    SELECT {", ".join(f"r.{f}" for f in FIELDS[:-1])}, CAST(r.status AS document_status)
      FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
           {", ".join(f"{f} text" for f in TEXT_FIELDS)}, date_start date, date_end date, status text)
    ON CONFLICT (reference_code) DO NOTHING
    """
)
_UPDATE = text(
    f"""
    UPDATE archive_documents AS d
       SET {", ".join(f"{f} = r.{f}" for f in FIELDS[1:-1])}, status = CAST(r.status AS document_status),
           updated_at = now()
      FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
           {", ".join(f"{f} text" for f in TEXT_FIELDS)}, date_start date, date_end date, status text)
     WHERE d.reference_code = r.reference_code
    """
)


def import_records(engine: Engine, records: Iterable[tuple[int, Any, str | None]], *,
                   on_conflict: str = "error") -> ImportReport:
    if on_conflict not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}")
    good, errors = parse(records)
    report = ImportReport(read=len(good) + len({e.line for e in errors}))
    with engine.begin() as conn:  # one transaction: all or nothing
        existing = set(conn.execute(_EXISTING, {"codes": [c["reference_code"] for _, c in good]}).scalars())
        if on_conflict == "error":
            errors.extend(LineError(line, f"reference_code {c['reference_code']!r} is already in the archive")
                          for line, c in good if c["reference_code"] in existing)
        if errors:
            raise ImportFailed(sorted(errors, key=lambda e: e.line))
        _write(conn, [c for _, c in good], existing, on_conflict, report)
    return report


def _write(conn: Connection, records: list[dict[str, Any]], existing: set[str], on_conflict: str,
           report: ImportReport) -> None:
    """Insert the new records; update the known ones (``on_conflict="update"``) or skip them."""
    new = [c for c in records if c["reference_code"] not in existing]
    old = [c for c in records if c["reference_code"] in existing]
    if new:
        report.inserted = conn.execute(_INSERT, {"rows": json.dumps(new, default=str)}).rowcount
    if old and on_conflict == "update":
        report.updated = conn.execute(_UPDATE, {"rows": json.dumps(old, default=str)}).rowcount
    elif old:
        report.skipped = len(old)


def import_file(engine: Engine, path: Path | str, *, fmt: str | None = None,
                on_conflict: str = "error") -> ImportReport:
    path = Path(path)
    kind = detect_format(path, fmt)
    with path.open(encoding="utf-8-sig", newline="") as fh:
        records = read_jsonl(fh) if kind == "jsonl" else read_csv(fh)
        return import_records(engine, list(records), on_conflict=on_conflict)
