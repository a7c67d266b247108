"""The published JSON Schemas (docs/*.schema.json), generated from the pydantic models.

    python -m navdoctor.schemas        # rewrite docs/report.schema.json, rule.schema.json and
                                       # compare.schema.json
tests/test_schemas.py fails when the files in docs/ drift from the models.
"""
from __future__ import annotations

import json
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def schemas() -> dict[str, dict]:
    from .compare import compare_json_schema
    from .report import report_json_schema
    from .rules import rule_json_schema
    return {"report.schema.json": report_json_schema(), "rule.schema.json": rule_json_schema(),
            "compare.schema.json": compare_json_schema()}


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    for name, schema in schemas().items():
        (DOCS / name).write_text(render(schema))
        print(f"wrote docs/{name}")
