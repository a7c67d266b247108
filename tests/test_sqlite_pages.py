"""The SQLite page reader (navdoctor/loaders/sqlite_pages.py) gives exactly the arrays of the
text path (SQLite's printf, nsys._text_chunks), whether it reads a table itself, stops part-way
or leaves it to SQLite; on the repository's nsys exports and on small SQLite files made here
for each case it must handle or refuse."""
from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from navdoctor import store  # noqa: E402
from navdoctor.loaders import nsys, sqlite_pages  # noqa: E402

FIX = Path(__file__).resolve().parent.parent / "fixtures"
NSYS_FIXTURES = sorted(
    [p for p in FIX.glob("gpu/**/*.sqlite.gz")] + [p for p in FIX.glob("synthetic/**/*.sqlite")],
    key=str)


def _arrays(it, k: int) -> np.ndarray:
    parts = list(it)
    for a in parts:
        assert a.dtype == np.int64 and a.ndim == 2 and a.shape[1] == k
    return np.concatenate(parts) if parts else np.empty((0, k), dtype=np.int64)


def compare(path, table: str, cols: list[str]) -> tuple[str | None, int | None]:
    """Asserts that _int_chunks (page reader, then SQLite for what it leaves) equals the text
    path; returns (why the page reader stopped, rowid from which SQLite read) or (None, None)
    when it read the whole table."""
    src = nsys._Source(str(path))
    try:
        got = _arrays(nsys._int_chunks(src, table, cols), 1 + len(cols))
        want = _arrays(nsys._text_chunks(src, table, cols), 1 + len(cols))
        assert got.shape == want.shape
        assert np.array_equal(got, want)
        if src.page_fallbacks:
            (_, why, resume), = src.page_fallbacks
            return why, resume
        return None, None
    finally:
        src.close()


def make_db(path, sql: str, rows=(), *, page_size: int | None = None, wal: bool = False,
            insert: str | None = None, encoding: str | None = None, vacuum: str | None = None):
    db = sqlite3.connect(path)
    if page_size:
        db.execute(f"PRAGMA page_size = {page_size}")
    if encoding:
        db.execute(f"PRAGMA encoding = '{encoding}'")
    if vacuum:
        db.execute(f"PRAGMA auto_vacuum = {vacuum}")
    if wal:
        db.execute("PRAGMA journal_mode = WAL")
    db.executescript(sql)
    if rows:
        db.executemany(insert, rows)
    db.commit()
    return db


# ----------------------------------------------------------------------- the fixtures --

@pytest.fixture(scope="module")
def unzipped(tmp_path_factory):
    d = tmp_path_factory.mktemp("nsys")

    def get(p: Path) -> Path:
        if p.suffix != ".gz":
            return p
        out = d / (str(p.relative_to(FIX)).replace("/", "_")[:-3])
        if not out.exists():
            with gzip.open(p, "rb") as g, open(out, "wb") as f:
                shutil.copyfileobj(g, f)
        return out
    return get


THOROUGH = {"gpu/nav_default/nsys.sqlite.gz", "gpu/handmade/yolo_seg_stream.nsys.sqlite.gz",
            "synthetic/memory-um-page-faults-fires.sqlite"}


@pytest.mark.parametrize("fixture", NSYS_FIXTURES, ids=lambda p: str(p.relative_to(FIX)))
def test_fixture_tables_equal_the_text_path(fixture, unzipped):
    """Every rowid table of every nsys export in fixtures/: its integer columns, as the loader
    asks for them (the page reader reads them all itself), and in a few exports also each
    column alone (TEXT and REAL ones go to SQLite)."""
    path = unzipped(fixture)
    src = nsys._Source(str(path))
    tables = [t for t in src.tables.values() if src.has_rowid(t)]
    infos = {t: src.db.execute(f"PRAGMA table_info({nsys._q(t)})").fetchall() for t in tables}
    src.close()
    assert tables
    for t in tables:
        ints = [r[1] for r in infos[t] if "INT" in (r[2] or "").upper()]
        if ints:
            assert compare(path, t, ints) == (None, None), t
        if str(fixture.relative_to(FIX)) in THOROUGH:
            for r in infos[t]:
                compare(path, t, [r[1]])


def test_the_loaders_store_is_the_same_without_the_page_reader(unzipped, monkeypatch):
    from test_nsys_loader import STORE_TABLES
    for fixture in (FIX / "gpu" / "nav_default" / "nsys.sqlite.gz",
                    FIX / "gpu" / "handmade" / "yolo_seg_stream.nsys.sqlite.gz"):
        path = str(unzipped(fixture))
        stores = []
        for on in (True, False):
            monkeypatch.setattr(sqlite_pages, "ENABLED", on)
            c = store.open_store()
            res = nsys.load_nsys_sqlite(c, path, 1)
            stores.append(({t: c.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                            for t in STORE_TABLES}, sorted(res.warnings)))
            c.close()
        assert stores[0] == stores[1]
        assert stores[0][0]["kernels"]


# --------------------------------------------------------------------- integer values --

EDGES = [0, 1, -1, 8, 9, 127, 128, -128, -129, 255, 256, 32767, 32768, -32768, -32769,
         2**23 - 1, 2**23, -2**23, -2**23 - 1, 2**31 - 1, 2**31, -2**31, -2**31 - 1,
         2**47 - 1, 2**47, -2**47, -2**47 - 1, 2**63 - 1, -2**63, 2**62, None]


def test_every_integer_size_sign_and_null(tmp_path):
    p = tmp_path / "ints.sqlite"
    rows = [(EDGES[i % len(EDGES)], EDGES[(i * 7 + 3) % len(EDGES)], i, -i * 1_000_003)
            for i in range(3000)]
    make_db(p, "CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER, d INTEGER)", rows,
            insert="INSERT INTO t VALUES (?, ?, ?, ?)").close()
    assert compare(p, "t", ["a", "b", "c", "d"]) == (None, None)
    assert compare(p, "t", ["d", "a", "a"]) == (None, None)  # any order, repeats
    assert compare(p, "t", []) == (None, None)  # the rowids alone


def test_sparse_and_negative_rowids(tmp_path):
    p = tmp_path / "sparse.sqlite"
    rows = [(r, r // 3) for r in [-2**63, -5, 0, 1, 2, 10**6, 10**12, 2**63 - 1]]
    rows += [(10**13 + 7 * i, i) for i in range(2000)]
    make_db(p, "CREATE TABLE t (x INTEGER)", rows, insert="INSERT INTO t(rowid, x) VALUES (?, ?)").close()
    assert compare(p, "t", ["x"]) == (None, None)


@pytest.mark.parametrize("page_size", [512, 1024, 65536])
def test_page_sizes_and_deep_btrees(tmp_path, page_size):
    """512-byte pages make a b-tree of several interior levels."""
    p = tmp_path / f"ps{page_size}.sqlite"
    n = 60_000 if page_size == 512 else 20_000
    rows = [(i * 1_000_000_007 % 2**40, i % 5 or None, -i) for i in range(n)]
    make_db(p, "CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER)", rows, page_size=page_size,
            insert="INSERT INTO t VALUES (?, ?, ?)").close()
    db = sqlite3.connect(p)
    assert db.execute("PRAGMA page_size").fetchone()[0] == page_size
    db.close()
    assert compare(p, "t", ["a", "b", "c"]) == (None, None)
    if page_size == 512:
        plan = sqlite_pages._Plan(sqlite3.connect(p), str(p), "t", ["a"], nsys._NULL)
        with open(p, "rb") as f:
            leaves = plan.leaves(f)
        assert leaves.size > 400 * 4  # over 400 leaves: two interior levels at least


def test_small_batches_and_threads(tmp_path, monkeypatch):
    p = tmp_path / "many.sqlite"
    make_db(p, "CREATE TABLE t (a INTEGER, b INTEGER)", [(i, i * i) for i in range(50_000)],
            insert="INSERT INTO t VALUES (?, ?)").close()
    want = compare(p, "t", ["a", "b"])
    for threaded in (False, True):
        for rows, sub in ((1, 1), (300, 7), (100_000, 16384)):
            monkeypatch.setattr(sqlite_pages, "THREADED", threaded)
            monkeypatch.setattr(sqlite_pages, "CHUNK_ROWS", rows)
            monkeypatch.setattr(sqlite_pages, "SUB_ROWS", sub)
            assert compare(p, "t", ["a", "b"]) == want == (None, None)


def test_a_consumer_that_stops_early_ends_the_reader_thread(tmp_path, monkeypatch):
    import threading
    p = tmp_path / "many.sqlite"
    make_db(p, "CREATE TABLE t (a INTEGER)", [(i,) for i in range(20_000)],
            insert="INSERT INTO t VALUES (?)").close()
    monkeypatch.setattr(sqlite_pages, "CHUNK_ROWS", 100)
    db = sqlite3.connect(p)
    it = sqlite_pages.int_chunks(db, str(p), "t", ["a"], nsys._NULL)
    next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "sqlite-pages"]


# ----------------------------------------------------------------- records and columns --

def test_long_text_before_the_integers(tmp_path):
    """Strings of 58 bytes and more have serial types of two bytes or more: those records'
    headers are decoded varint by varint."""
    p = tmp_path / "text.sqlite"
    rows = [("x" * (i % 300), i, "y" * (i % 70), -i, b"z" * (i % 90)) for i in range(5000)]
    make_db(p, "CREATE TABLE t (s TEXT, a INTEGER, u TEXT, b INTEGER, z BLOB)", rows,
            insert="INSERT INTO t VALUES (?, ?, ?, ?, ?)").close()
    assert compare(p, "t", ["a", "b"]) == (None, None)
    assert compare(p, "t", ["b"]) == (None, None)
    why, _ = compare(p, "t", ["a", "s"])
    assert why == "a value that is not an integer"


def test_overflow_payloads(tmp_path, monkeypatch):
    """A row larger than a page spills into overflow pages: columns in its first, local part
    are read; one beyond it sends the table to SQLite from that batch on."""
    monkeypatch.setattr(sqlite_pages, "CHUNK_ROWS", 50)
    p = tmp_path / "overflow.sqlite"
    rows = [(i, -i, (b"q" * 9000) if i % 500 == 499 and i > 2000 else b"", i * 3)
            for i in range(3000)]
    make_db(p, "CREATE TABLE t (a INTEGER, b INTEGER, big BLOB, c INTEGER)", rows,
            page_size=512, insert="INSERT INTO t VALUES (?, ?, ?, ?)").close()
    assert compare(p, "t", ["a", "b"]) == (None, None)
    assert compare(p, "t", []) == (None, None)
    why, resume = compare(p, "t", ["a", "c"])
    assert why == "a value in overflow pages" and 1 < resume <= 2500


def test_a_real_text_or_blob_in_an_integer_column(tmp_path, monkeypatch):
    """printf('%lld') of a REAL, TEXT or BLOB is no integer decode: from the batch holding
    one, SQLite reads the rest of the table (the rows before come from the pages)."""
    monkeypatch.setattr(sqlite_pages, "CHUNK_ROWS", 100)
    for odd in (2.5, -7.0, "12abc", "", b"\x01\x02", 1e300):
        p = tmp_path / f"odd{abs(hash(repr(odd)))}.sqlite"
        rows = [(i, odd if i == 3500 else i * 11) for i in range(4000)]
        make_db(p, "CREATE TABLE t (a INTEGER, b)", rows, page_size=512,
                insert="INSERT INTO t VALUES (?, ?)").close()
        why, resume = compare(p, "t", ["a", "b"])
        assert why == "a value that is not an integer"
        assert 1 < resume <= 3501
        assert compare(p, "t", ["a"]) == (None, None)


def test_real_affinity_columns_go_to_sqlite(tmp_path):
    p = tmp_path / "real.sqlite"
    make_db(p, "CREATE TABLE t (a INTEGER, r REAL, d DOUBLE)", [(i, i, 3) for i in range(100)],
            insert="INSERT INTO t VALUES (?, ?, ?)").close()
    assert compare(p, "t", ["a"]) == (None, None)
    assert compare(p, "t", ["a", "r"])[0] == "column r has REAL affinity"
    assert compare(p, "t", ["d"])[0] == "column d has REAL affinity"


def test_rows_written_before_alter_table_add_column(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_pages, "CHUNK_ROWS", 100)
    p = tmp_path / "alter.sqlite"
    db = make_db(p, "CREATE TABLE t (a INTEGER)", [(i,) for i in range(1000)],
                 insert="INSERT INTO t VALUES (?)")
    db.executescript("""
        ALTER TABLE t ADD COLUMN b INTEGER;
        ALTER TABLE t ADD COLUMN c INTEGER DEFAULT 7;
        ALTER TABLE t ADD COLUMN d INTEGER DEFAULT -123456789012;
        ALTER TABLE t ADD COLUMN e INTEGER DEFAULT (42);
        ALTER TABLE t ADD COLUMN f INTEGER DEFAULT 'text';
        ALTER TABLE t ADD COLUMN g INTEGER DEFAULT 1.5;
        ALTER TABLE t ADD COLUMN h TEXT DEFAULT 12;""")
    db.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   [(i, i, None, i, i, i, i, i) for i in range(1000, 1500)])
    db.commit()
    db.close()
    assert compare(p, "t", ["a", "b", "c", "d", "e"]) == (None, None)
    # h has TEXT affinity: the old rows take its default, 12; the new ones hold text
    assert compare(p, "t", ["a", "h"])[0] == "a value that is not an integer"
    for col in ("f", "g"):
        why, resume = compare(p, "t", ["a", col])
        assert why == "a record lacks a column whose default is not an integer"
        assert resume is None  # the first rows lack it


@pytest.mark.parametrize("ddl, alias", [
    ("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)", True),
    ("CREATE TABLE t (id integer NOT NULL PRIMARY KEY, v INTEGER)", True),
    ("CREATE TABLE t (id INTEGER, v INTEGER, PRIMARY KEY (id))", True),
    ("CREATE TABLE t (id INTEGER PRIMARY KEY DESC, v INTEGER)", False),
    ("CREATE TABLE t (id INT PRIMARY KEY, v INTEGER)", False),
    ("CREATE TABLE t (id INTEGER, v INTEGER, PRIMARY KEY (id, v))", False),
])
def test_integer_primary_key(tmp_path, ddl, alias):
    """An INTEGER PRIMARY KEY column is the rowid (the record holds NULL); the look-alikes
    that are not (DESC, INT, a composite key) are ordinary columns."""
    p = tmp_path / "ipk.sqlite"
    make_db(p, ddl, [(i * 5 - 100, i) for i in range(2000)], insert="INSERT INTO t VALUES (?, ?)").close()
    assert compare(p, "t", ["id", "v"]) == (None, None)
    assert compare(p, "t", ["v", "id"]) == (None, None)
    assert compare(p, "t", ["id"]) == (None, None)
    db = sqlite3.connect(p)
    plan = sqlite_pages._Plan(db, str(p), "t", ["id"], nsys._NULL)
    assert (plan.ipk is not None) == alias


def test_utf16_and_autovacuum_databases(tmp_path):
    for enc, vac in (("UTF-16le", None), ("UTF-16be", "FULL"), ("UTF-8", "INCREMENTAL")):
        p = tmp_path / f"{enc}{vac}.sqlite"
        db = make_db(p, "CREATE TABLE t (s TEXT, a INTEGER); CREATE TABLE u (b INTEGER)",
                     [("é" * (i % 80), i) for i in range(3000)], encoding=enc, vacuum=vac,
                     insert="INSERT INTO t VALUES (?, ?)")
        db.executemany("INSERT INTO u VALUES (?)", [(i,) for i in range(3000)])
        db.execute("DELETE FROM t WHERE a % 3 = 0")
        db.commit()
        db.close()
        assert compare(p, "t", ["a"]) == (None, None)
        assert compare(p, "u", ["b"]) == (None, None)


def test_empty_table(tmp_path):
    p = tmp_path / "empty.sqlite"
    make_db(p, "CREATE TABLE t (a INTEGER)").close()
    assert compare(p, "t", ["a"]) == (None, None)


# ------------------------------------------------------------------- refused: to SQLite --

def test_wal_mode_goes_to_sqlite(tmp_path):
    p = tmp_path / "wal.sqlite"
    db = make_db(p, "CREATE TABLE t (a INTEGER)", [(i,) for i in range(500)], wal=True,
                 insert="INSERT INTO t VALUES (?)")
    assert os.path.exists(str(p) + "-wal")  # open, not checkpointed: rows in the -wal file
    assert compare(p, "t", ["a"]) == ("a -wal file is beside the database", None)
    db.close()
    assert not os.path.exists(str(p) + "-wal")
    with pytest.raises(sqlite_pages.Unsupported, match="WAL mode"):
        sqlite_pages._Header(str(p))
    # SQLite opening it makes a -wal file again
    assert compare(p, "t", ["a"])[0] in ("WAL mode", "a -wal file is beside the database")


def test_a_journal_file_beside_the_database_goes_to_sqlite(tmp_path):
    p = tmp_path / "j.sqlite"
    make_db(p, "CREATE TABLE t (a INTEGER)", [(i,) for i in range(50)],
            insert="INSERT INTO t VALUES (?)").close()
    Path(str(p) + "-journal").write_bytes(b"")
    assert compare(p, "t", ["a"]) == ("a -journal file is beside the database", None)


def test_without_rowid_and_the_switch(tmp_path, monkeypatch):
    p = tmp_path / "w.sqlite"
    make_db(p, "CREATE TABLE w (k INTEGER PRIMARY KEY, a INTEGER) WITHOUT ROWID;"
               "CREATE TABLE t (a INTEGER)", [(i, i) for i in range(50)],
            insert="INSERT INTO w VALUES (?, ?)").close()
    db = sqlite3.connect(p)
    with pytest.raises(sqlite_pages.Unsupported, match="WITHOUT ROWID"):
        list(sqlite_pages.int_chunks(db, str(p), "w", ["a"], nsys._NULL))
    monkeypatch.setenv(sqlite_pages.ENV, "0")
    assert compare(p, "t", ["a"]) == ("disabled", None)


@pytest.mark.parametrize("ddl, make_row", [
    ("CREATE TABLE t (a INTEGER, b INTEGER)", lambda i: (i, -i)),
    ("CREATE TABLE t (s TEXT, a INTEGER, z BLOB, b INTEGER, w TEXT)",
     lambda i: ("x" * (i % 200), i, b"y" * (i % 7), -i * 99991, "w" * (i % 3))),
])
def test_corrupt_pages_are_refused_not_misread(tmp_path, ddl, make_row):
    """Random bytes of the b-tree's pages changed: where SQLite reads the table, the reader
    gives what SQLite gives or refuses (then SQLite reads it); where SQLite finds the file
    malformed, the reader refuses too. It never crashes."""
    p = tmp_path / "c.sqlite"
    n = 3000
    cols = ", ".join("?" * len(make_row(0)))
    make_db(p, ddl, [make_row(i) for i in range(n)], page_size=1024,
            insert=f"INSERT INTO t VALUES ({cols})").close()
    good = bytearray(p.read_bytes())
    db = sqlite3.connect(p)
    plan = sqlite_pages._Plan(db, str(p), "t", ["a", "b"], nsys._NULL)
    with open(p, "rb") as f:
        leaves = plan.leaves(f)
    db.close()
    rng = np.random.default_rng(7)
    q = tmp_path / "bad.sqlite"
    for trial in range(150):
        bad = bytearray(good)
        page = int(leaves[trial % leaves.size]) if trial % 4 else plan.root
        off = (page - 1) * 1024 + int(rng.integers(0, 40 if trial % 2 else 1024))
        bad[off] = int(rng.integers(0, 256))
        q.write_bytes(bytes(bad))
        with sqlite3.connect(q) as c:
            try:
                ref = [[nsys._NULL if v is None else v for v in r] for r in
                       c.execute("SELECT rowid, a, b FROM t ORDER BY rowid")]
            except sqlite3.DatabaseError:
                ref = None  # malformed
            try:
                got = _arrays(sqlite_pages.int_chunks(c, str(q), "t", ["a", "b"], nsys._NULL), 3)
            except sqlite_pages.Unsupported:
                continue
        assert ref is not None, (trial, off)
        assert all(type(v) is int for r in ref for v in r), (trial, off)  # else refused
        ref = np.array(ref, dtype=np.int64).reshape(-1, 3)
        assert got.shape == ref.shape and np.array_equal(got, ref), (trial, off)
