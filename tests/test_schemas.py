"""The JSON Schemas published in docs/ match the models, and real reports validate."""
import json
from pathlib import Path

from navdoctor.schemas import DOCS, render, schemas


def test_published_schemas_are_current():
    for name, schema in schemas().items():
        assert (DOCS / name).read_text() == render(schema), f"run: python -m navdoctor.schemas ({name})"


def test_report_round_trips_through_its_model(cli):
    from navdoctor.report import Report
    fix = Path(__file__).resolve().parent.parent / "fixtures/gpu/nav_default"
    r = cli("analyze", fix / "kineto.json.gz", fix / "nsys.sqlite.gz", "--json", "-")
    data = json.loads(r.stdout)
    assert Report.model_validate(data).model_dump(mode="json") == data


def test_schema_doc_lists_every_table_as_in_code():
    from navdoctor.store import TABLES
    doc = (DOCS / "schema.md").read_text()
    for table, columns in TABLES.items():
        assert f"```sql\n{table} ({columns.strip()}\n)\n```" in doc, table
