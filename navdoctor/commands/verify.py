"""`navdoctor verify`: run a script with and without each remedy and judge the speed-ups."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click

from ..textsafe import terminal_text
from .outputs import check_outputs, check_before_work, check_html_path, progress_printer


def run(script: str | None, script_args: Sequence[str], remedies: Sequence[str], repeats: int,
        warmup: int, priming: int, steps: int, margin: float, classify: bool, timeout: int,
        out_base: str, json_path: str | None, html_path: str | None, quiet: bool) -> int:
    from ..collect.requirements import require_torch
    require_torch("verify", bundled=script is None)
    from ..collect.diagnose import BUNDLED_WORKLOAD
    from ..verify import command as vc
    check_before_work(json_path)
    check_html_path(html_path)
    check_outputs({"--json": json_path, "--html": html_path}, [script] if script else [])
    script = script or str(BUNDLED_WORKLOAD)
    cuda = False
    if not remedies:
        import torch
        cuda = torch.cuda.is_available()
    plan = vc.plan_from_ids(script, list(script_args), list(remedies), cuda)
    vc.check_script(script)
    settings = vc.Settings(repeats=repeats, warmup=warmup, steps=steps, margin=margin,
                           timeout=timeout, classify=classify, priming=priming)
    out_dir = vc.new_verify_dir(out_base, Path(script).stem)
    try:
        result = vc.verify(plan, settings, out_dir, progress_printer(quiet or json_path == "-"))
    except vc.ScriptFailed as e:
        click.echo(f"navdoctor: error: {terminal_text(str(e))}", err=True)
        return 1
    vc.emit(result, json_path, quiet, html_path=html_path)
    return 0
