"""Unified-memory page faults: the nsys loader's um_events (names from the export's ENUM
tables, old schemas without the columns or tables) and memory-um-page-faults' evidence and
near misses. Fire/quiet on the synthetic traces is in test_synthetic_rules.SYNTHETIC_CASES."""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nsys_factory import NsysExport  # noqa: E402
from test_synthetic_rules import nsys_um_faults  # noqa: E402

from navdoctor import store  # noqa: E402
from navdoctor.analysis import analyze  # noqa: E402
from navdoctor.loaders import nsys  # noqa: E402
from navdoctor.rules import load_rules  # noqa: E402

PAGE = 0x7F5000001000
RULE = "memory-um-page-faults"


def um_export(tmp_path, **write) -> Path:
    x = NsysExport()
    x.gpu()
    x.step(0, 0, 10_000_000)
    x.kernel(1_000_000, 9_000_000, "k")
    x.um_gpu_fault(2_000_000, 2_100_000, PAGE, 3, access="write")
    x.um_migration(2_010_000, 2_090_000, 65536, address=PAGE)
    x.um_cpu_fault(9_500_000, PAGE)
    x.um_migration(9_600_000, 9_700_000, 1 << 21, "DtoH", cause="user", address=PAGE)
    x.memcpy(3_000_000, 3_100_000, 4096)          # an ordinary copy: no unified-memory row
    return x.write(tmp_path / "um.sqlite", **write)


def load(path) -> list[tuple]:
    con = store.open_store()
    try:
        nsys.load_nsys_sqlite(con, str(path), 1)
        return con.execute("""SELECT kind, side, faults, bytes, access_type, direction, cause,
                                     start_ns, end_ns, address FROM um_events ORDER BY start_ns""").fetchall()
    finally:
        con.close()


EXPECTED = [
    ("gpu_fault", "gpu", 3, None, "write", None, None, 2_000_000, 2_100_000, PAGE),
    ("migration", "gpu", None, 65536, None, "HtoD", "coherence", 2_010_000, 2_090_000, PAGE),
    ("cpu_fault", "cpu", 1, None, None, None, None, 9_500_000, 9_500_000, PAGE),
    ("migration", "cpu", None, 1 << 21, None, "DtoH", "user", 9_600_000, 9_700_000, PAGE),
]


def test_loads_faults_and_migrations(tmp_path):
    assert load(um_export(tmp_path)) == EXPECTED


def test_enum_labels_alone_give_the_same_rows(tmp_path):
    assert load(um_export(tmp_path, enum_columns=("label",))) == EXPECTED


def test_codes_are_read_from_the_exports_enum_tables(tmp_path):
    """Swap the meaning of two codes in the export's ENUM tables: the names follow the
    tables, not numbers written in the loader."""
    path = um_export(tmp_path)
    db = sqlite3.connect(path)
    db.execute("UPDATE ENUM_CUDA_UNIF_MEM_MIGRATION SET name = CASE id WHEN 1 THEN "
               "'CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_EVICTION' WHEN 2 THEN "
               "'CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_USER' ELSE name END")
    db.execute("UPDATE ENUM_CUDA_UNIF_MEM_ACCESS_TYPE SET name = 'CUDA_UNIFIED_MEMORY_ACCESS_TYPE_ATOMIC' WHERE id = 2")
    # the code of 'Unified Device-to-Host' now names an ordinary copy: not a migration any more
    db.execute("UPDATE ENUM_CUDA_MEMCPY_OPER SET name = 'CUDA_MEMCPY_KIND_DTOH', label = 'Device-to-Host' WHERE id = 12")
    db.commit()
    db.close()
    got = load(path)
    assert [(r[0], r[4], r[6]) for r in got] == [("gpu_fault", "atomic", None), ("migration", None, "user"),
                                                ("cpu_fault", None, None)]


def test_old_exports_without_the_columns_or_tables_still_load(tmp_path):
    path = um_export(tmp_path)
    db = sqlite3.connect(path)
    for table, column in (("CUDA_UM_GPU_PAGE_FAULT_EVENTS", "numberOfPageFaults"),
                          ("CUDA_UM_GPU_PAGE_FAULT_EVENTS", "faultAccessType"),
                          ("CUDA_UM_GPU_PAGE_FAULT_EVENTS", "end"),
                          ("CUPTI_ACTIVITY_KIND_MEMCPY", "migrationCause"),
                          ("CUPTI_ACTIVITY_KIND_MEMCPY", "virtualAddress")):
        db.execute(f'ALTER TABLE {table} DROP COLUMN "{column}"')
    db.execute("DROP TABLE ENUM_CUDA_UNIF_MEM_MIGRATION")
    db.execute("DROP TABLE ENUM_CUDA_UNIF_MEM_ACCESS_TYPE")
    db.commit()
    db.close()
    assert load(path) == [
        ("gpu_fault", "gpu", 1, None, None, None, None, 2_000_000, 2_000_000, PAGE),
        ("migration", "gpu", None, 65536, None, "HtoD", None, 2_010_000, 2_090_000, None),
        ("cpu_fault", "cpu", 1, None, None, None, None, 9_500_000, 9_500_000, PAGE),
        ("migration", "cpu", None, 1 << 21, None, "DtoH", None, 9_600_000, 9_700_000, None)]
    # captured without --cuda-um-*: no fault table at all, and no copy kind table either
    bare = um_export(tmp_path, omit=("CUDA_UM_GPU_PAGE_FAULT_EVENTS", "CUDA_UM_CPU_PAGE_FAULT_EVENTS",
                                     "ENUM_CUDA_MEMCPY_OPER"))
    assert [r[0] for r in load(bare)] == ["migration", "migration"]   # the documented fallback codes


def test_evidence_per_step(tmp_path):
    found = {f.rule.id: f for f in analyze([nsys_um_faults(tmp_path, "faults")], load_rules()).findings}
    m = found[RULE].metrics
    # per 10 ms step: 20 groups of 100 us (the migration inside each counts once) + 0.2 ms back
    assert m["stall_ms"] == pytest.approx(2.2) and m["stall_share"] == pytest.approx(0.22)
    assert m["stalled_steps"] == m["steps"] == 5
    assert (m["fault_groups_per_step"], m["gpu_faults_per_step"], m["cpu_faults_per_step"]) == (20, 60, 20)
    assert m["htod_mb_per_step"] == pytest.approx(20 * 65536 / 1e6)
    assert m["dtoh_mb_per_step"] == pytest.approx(20 * 65536 / 1e6)
    assert found[RULE].at_stake_ns == pytest.approx(2.2e6)
    assert "cudaMemPrefetchAsync" in " ".join(r.code or "" for r in found[RULE].rule.remedies)


@pytest.mark.parametrize("variant,steps", [("start-up", range(5)), ("faults", [0])],
                         ids=["before-the-first-step", "first-step-only"])
def test_quiet_on_a_one_off_first_touch(tmp_path, variant, steps):
    rules = load_rules()
    assert RULE not in {f.rule.id for f in analyze([nsys_um_faults(tmp_path, variant, steps)], rules).findings}
    # but the same faults in 3 of 5 steps recur: fired
    assert RULE in {f.rule.id for f in analyze([nsys_um_faults(tmp_path, "faults", [0, 2, 4])], rules).findings}


def test_migrations_while_the_gpu_idles_are_copy_time(tmp_path):
    """A migration is a host<->device copy the driver makes (nsys writes it as a memcpy row of
    a UVM kind): where no kernel runs it is the copy bucket (memory class), not host work or
    idle time; under a kernel, compute."""
    x = NsysExport()
    x.gpu()
    for n in range(3):
        t0 = n * 10_000_000
        x.step(n, t0, t0 + 10_000_000)
        x.kernel(t0 + 1_000_000, t0 + 5_000_000, "k")
        x.um_migration(t0 + 4_000_000, t0 + 5_000_000, 1 << 21, address=PAGE)              # under the kernel
        x.um_migration(t0 + 6_000_000, t0 + 8_000_000, 1 << 21, "DtoH", address=PAGE)      # GPU idle
    shares = analyze([str(x.write(tmp_path / "mig.sqlite"))], load_rules()).verdict.shares
    assert shares["copy"] == pytest.approx(0.2, abs=0.01), shares
    assert shares["compute"] == pytest.approx(0.4, abs=0.01), shares
