"""The rules' pydantic models: what validates a rule file's items (rules.load_rule_file, when
the rule file's text is not in the validated-rules cache) and gives docs/rule.schema.json. The
rest of navdoctor holds rules as rules.Rule, plain objects made from these models' dumps, so
that an analysis whose rule files were validated before imports no pydantic (~50 ms)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .rule_expr import Category, Severity, check_expression


class Remedy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    text: str = ""
    code: str | None = None
    link: str | None = None
    verify: str | None = Field(None, description="id of a remedy `navdoctor verify` can apply")
    only_for: list[Literal["training", "inference", "vision", "single_gpu"]] | None = Field(
        None, description="offer the remedy only to these kinds of job (kernelnames."
                          "workload_traits): a camera- or JPEG-specific remedy is not for a "
                          "language model, a batch-several-cameras one not for training")
    whatif: str | None = Field(None, description="id of the what-if model's remedy this one is "
                               "(navdoctor/whatif.py TRANSFORMS), for its expected speed-up; "
                               "by default the one its `verify` id stands for")


class Bound(BaseModel):
    """Expected range of one metric in an example: min <= value <= max (either may be left out)."""
    model_config = ConfigDict(extra="forbid")
    min: float | None = None
    max: float | None = None


class Example(BaseModel):
    """A case `navdoctor rules test` checks: the traces of one run (trace files, or a
    `navdoctor diagnose` run directory holding kineto.json.gz / nsys.sqlite[.gz]) on which the
    rule must fire or must stay quiet, with the metric values it must find there."""
    model_config = ConfigDict(extra="forbid")
    expect: Literal["fire", "quiet"]
    traces: str | list[str] = Field(
        description="paths relative to the rule file: trace files of one run, or a run directory")
    metrics: dict[str, Bound] = Field(
        {}, description="bounds on the metrics of the row the finding comes from (or, quiet, "
                        "of the row the verdict's trusted trace gives)")
    params: dict[str, float | int | str | bool] = Field(
        {}, description="parameters set for this case only (as --set would)")
    note: str = ""

    @property
    def trace_list(self) -> list[str]:
        return [self.traces] if isinstance(self.traces, str) else list(self.traces)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    title: str
    category: Category
    severity: Severity
    description: str = ""
    query: str = Field(description="DuckDB SQL over the trace store; returns named metrics")
    condition: str = Field(description="expression over metrics and params, e.g. 'share >= min_share'")
    params: dict[str, float | int | str | bool] = {}
    message: str = Field(description="str.format template over metrics and params")
    at_stake: str | None = Field(None, description="metric with the ns per step this finding costs")
    at_stake_in_class: bool = Field(
        False, description="the time at stake is one of the breakdown's buckets of the rule's "
                           "class (io, memory, launch): the finding then expects no more than "
                           "its class's estimated gain (report 2.8)")
    remedies: list[Remedy] = []
    examples: list[Example] = Field(
        [], description="cases `navdoctor rules test` runs: traces where the rule must fire or stay quiet")
    source_file: str | None = Field(None, exclude=True)

    @field_validator("condition")
    @classmethod
    def _condition_parses(cls, v: str) -> str:
        check_expression(v)
        return v
