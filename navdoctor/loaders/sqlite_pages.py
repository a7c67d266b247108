"""Read integer columns of an SQLite rowid table straight from the database file's b-tree
pages, into numpy, without SQLite formatting anything.

Written from the file format's documentation (https://www.sqlite.org/fileformat2.html):
 - the database header (first 100 bytes of page 1) gives the page size, the bytes reserved at
   the end of each page, the journal mode (file format versions 1 legacy, 2 WAL) and the size
   of the database in pages;
 - a table b-tree's interior pages (type 0x05) hold (left child page, key) cells and a
   right-most child; their children, in cell order then the right-most one, cover rowids in
   increasing order. Its leaf pages (type 0x0D) hold the rows: each cell is the payload size
   (varint), the rowid (varint) and the record;
 - a record is a header (its size as a varint, then one serial type varint per column) and a
   body (the columns' bytes, in order). Serial types: 0 NULL, 1..6 big-endian two's-complement
   integers of 1, 2, 3, 4, 6, 8 bytes, 7 a float, 8 and 9 the integers 0 and 1, 10 and 11
   reserved, even N >= 12 a BLOB of (N-12)/2 bytes, odd N >= 13 a TEXT of (N-13)/2 bytes;
 - a record with fewer columns than the table (rows written before ALTER TABLE ADD COLUMN)
   takes the column's default for the missing ones; an INTEGER PRIMARY KEY column is the rowid
   (the record holds NULL in its place);
 - a payload larger than the usable page size less 35 bytes spills to overflow pages.

`int_chunks` yields what nsys._int_chunks yields (int64 arrays: rowid, then the requested
columns, NULL as the caller's sentinel; rows in rowid order), decoding each batch of leaf pages
with a few numpy operations per column: no Python loop per row or per leaf page.

Anything outside these assumptions raises `Unsupported` (with the rowid from which rows are
still to be read, all rows before it having been yielded), and the caller reads the rest of the
table through SQLite. So do: a WAL-mode database or a `-wal`/`-journal` file beside it, a
requested value in overflow pages (columns in a long record's first, local part are read), a
value that is not an integer or NULL in a requested column (a REAL, TEXT or BLOB: SQLite's
printf('%lld') of those is not a plain integer decode), a column default that is not an
integer literal where a record lacks the column, generated columns, columns of REAL affinity,
WITHOUT ROWID and virtual tables, a big-endian machine, and any page that fails a consistency
check (SQLite's own checks of a record's sizes included; in tests, every file with a changed
byte that SQLite reported malformed was refused).
Setting NAVDOCTOR_SQLITE_PAGES=0 (or `ENABLED = False`) sends every table through SQLite.
"""
from __future__ import annotations

import os
import queue
import re
import sqlite3
import sys
import threading
from typing import Iterator

import numpy as np

ENV = "NAVDOCTOR_SQLITE_PAGES"
ENABLED = True
# Rows per yielded chunk (about; whole leaf pages): as many as CHUNK_BYTES of decoded int64
# values hold, at most CHUNK_ROWS; and the most bytes of pages in one batch. The consumer
# runs a few DuckDB statements per chunk, each with a fixed cost (~13 ms per INSERT of
# 131 072 calls; 2.07 M calls went in 0.28 s as 16 chunks, 0.10 s as one), so chunks are
# large, bounded in bytes (the queue holds two: about 3 x CHUNK_BYTES in memory).
CHUNK_ROWS = 1 << 20
CHUNK_BYTES = 32 << 20
MAX_BATCH_BYTES = 32 << 20
# Rows decoded at a time within a batch.
SUB_ROWS = 16384
# One thread reads and decodes the next batches while the consumer works on the last one.
THREADED = True

_FRONT = 8  # bytes before the first page of a batch buffer: 8-byte windows may start there
_LEAF, _INTERIOR = 0x0D, 0x05
_MAX_DEPTH = 64

# Lookup tables indexed by a serial-type code: the serial type itself for 0..255, _MISSING
# for a column the record lacks, _LONG for a serial type above 255 (a BLOB or TEXT).
_MISSING, _LONG = 256, 257
_CODES = 258
_st = np.arange(_CODES)
# Bytes in the record body (10 and 11 are reserved: -1).
_SIZE = np.where(_st >= 12, (_st - 12) >> 1,
                 np.array([0, 1, 2, 3, 4, 6, 8, 8, 0, 0, -1, -1] + [0] * 246)[np.minimum(_st, 257)])
_SIZE[_MISSING] = 0
_SIZE = _SIZE.astype(np.int32)
_SIZE_U8 = _SIZE[:256].copy()
# Not an integer (or NULL) in a requested column: REAL, reserved, BLOB, TEXT.
_NOT_INT = (_st == 7) | ((_st >= 10) & (_st != _MISSING))
# Shift that sign-extends the low bytes of a big-endian 8-byte window; 0 for no bytes.
_SHIFT = np.zeros(_CODES, dtype=np.int64)
_SHIFT[1:7] = 64 - 8 * _SIZE[1:7]
# Serial types whose value is in the header alone (NULL, 0, 1), and missing columns.
_NO_BODY = np.isin(_st, [0, 8, 9, _MISSING])


class Unsupported(Exception):
    """The page reader does not read (the rest of) this table. Every row with a rowid below
    `resume_rowid` has been yielded; None: none has."""

    def __init__(self, why: str, resume_rowid: int | None = None):
        super().__init__(why)
        self.why = why
        self.resume_rowid = resume_rowid


def enabled() -> bool:
    return ENABLED and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# ------------------------------------------------------------------------------ the plan --

class _Header:
    def __init__(self, path: str):
        if os.path.exists(path + "-wal"):
            raise Unsupported("a -wal file is beside the database")
        if os.path.exists(path + "-journal"):
            raise Unsupported("a -journal file is beside the database")
        with open(path, "rb") as f:
            h = f.read(100)
            self.file_size = os.fstat(f.fileno()).st_size
        if len(h) < 100 or h[:16] != b"SQLite format 3\x00":
            raise Unsupported("no SQLite header")
        ps = int.from_bytes(h[16:18], "big")
        ps = 65536 if ps == 1 else ps
        if ps < 512 or ps > 65536 or ps & (ps - 1):
            raise Unsupported(f"page size {ps}")
        if h[18] != 1 or h[19] != 1:
            raise Unsupported("WAL mode" if 2 in (h[18], h[19]) else f"file format {h[18]}/{h[19]}")
        if (h[21], h[22], h[23]) != (64, 32, 32):
            raise Unsupported("payload fractions")
        self.page_size = ps
        self.usable = ps - h[20]
        if self.usable < 480:
            raise Unsupported(f"{h[20]} reserved bytes per page")
        if int.from_bytes(h[44:48], "big") not in (1, 2, 3, 4):
            raise Unsupported("schema format")
        pages = int.from_bytes(h[28:32], "big")
        change, valid_for = h[24:28], h[92:96]
        if pages == 0 or change != valid_for:
            pages = self.file_size // ps
        if pages * ps > self.file_size:
            raise Unsupported("the file is shorter than its header says")
        self.pages = pages


def _int_literal(text: str | None) -> tuple[bool, int | None]:
    """(understood, value) of a column default as PRAGMA table_info gives it."""
    if text is None or text.strip().upper() == "NULL":
        return True, None
    t = text.strip()
    while t.startswith("(") and t.endswith(")"):
        t = t[1:-1].strip()
    if re.fullmatch(r"[+-]?[0-9]+", t):
        v = int(t)
        if -(1 << 63) <= v < (1 << 63):
            return True, v
    return False, None


def _real_affinity(decl: str | None) -> bool:
    d = (decl or "").upper()
    return "INT" not in d and not any(k in d for k in ("CHAR", "CLOB", "TEXT")) and \
        any(k in d for k in ("REAL", "FLOA", "DOUB"))


class _Plan:
    """Where the table is and how to decode the requested columns."""

    def __init__(self, db: sqlite3.Connection, path: str, table: str, cols: list[str],
                 null: int):
        self.path, self.table, self.null = path, table, null
        self.head = _Header(path)
        row = db.execute("SELECT type, rootpage, sql FROM sqlite_master WHERE name = ?",
                         (table,)).fetchone()
        if row is None or row[0] != "table":
            raise Unsupported("not a table")
        _, root, sql = row
        if not isinstance(root, int) or root < 2 or root > self.head.pages:
            raise Unsupported("root page")
        if sql is None or re.search(r"WITHOUT\s+ROWID", sql, re.I) or \
                re.match(r"\s*CREATE\s+VIRTUAL", sql, re.I):
            raise Unsupported("WITHOUT ROWID or virtual table")
        self.root = root
        q = '"' + table.replace('"', '""') + '"'
        info = db.execute(f"PRAGMA table_xinfo({q})").fetchall()
        if not info or any(r[6] for r in info):
            raise Unsupported("generated or hidden columns")
        pks = [r for r in info if r[5]]
        ipk = None
        if len(pks) == 1 and (pks[0][2] or "").strip().upper() == "INTEGER":
            origins = [r[3] for r in db.execute(f"PRAGMA index_list({q})")]
            if "pk" not in origins:
                ipk = pks[0][0]  # the column is the rowid
        by_name = {r[1].lower(): r for r in info}
        self.cids: list[int] = []       # record position of each requested column
        self.defaults: list[tuple[bool, int | None]] = []
        for c in cols:
            r = by_name.get(c.lower())
            if r is None:
                raise Unsupported(f"no column {c}")
            if r[0] != ipk and _real_affinity(r[2]):
                raise Unsupported(f"column {c} has REAL affinity")
            self.cids.append(r[0])
            self.defaults.append(_int_literal(r[4]))
        self.ipk = ipk
        self.ncols = 1 + max([c for c in self.cids if c != ipk], default=-1)
        # The record columns to decode (each once), their defaults, and for each requested
        # column its row among them (-1: the rowid).
        self.need = sorted({c for c in self.cids if c != ipk})
        self.need_defaults = [self.defaults[self.cids.index(c)] for c in self.need]
        self.out_rows = [-1 if c == ipk else self.need.index(c) for c in self.cids]

    # -- the b-tree ------------------------------------------------------------------
    def leaves(self, f) -> np.ndarray:
        """The leaf pages of the table, in rowid order. The b-tree is walked level by level
        (each level's pages in key order); a level is the leaves when its first page is one:
        every leaf's type is checked when it is decoded."""
        ps, npages = self.head.page_size, self.head.pages
        seen = np.array([self.root], dtype=np.int64)  # the interior pages so far
        level = seen
        fd = f.fileno()
        for _ in range(_MAX_DEPTH):
            kind = os.pread(fd, 1, (int(level[0]) - 1) * ps)
            if kind == bytes([_LEAF]):
                return level
            nxt: list[np.ndarray] = []
            for pg in level.tolist():
                page = os.pread(fd, ps, (pg - 1) * ps)
                if len(page) != ps:
                    raise Unsupported("short read")
                if page[0] != _INTERIOR:
                    raise Unsupported(f"page {pg} of type {page[0]} among interior pages")
                n = int.from_bytes(page[3:5], "big")
                if n == 0 or 12 + 2 * n > self.head.usable:
                    raise Unsupported(f"page {pg}: cell count")
                b = np.frombuffer(page, dtype=np.uint8)
                ptr = 12 + 2 * np.arange(n)
                off = (b[ptr].astype(np.int64) << 8) | b[ptr + 1]
                if n and (off.min() < 12 + 2 * n or off.max() > self.head.usable - 5):
                    raise Unsupported(f"page {pg}: cell offset")
                kids = ((b[off].astype(np.int64) << 24) | (b[off + 1].astype(np.int64) << 16)
                        | (b[off + 2].astype(np.int64) << 8) | b[off + 3])
                nxt.append(np.append(kids, int.from_bytes(page[8:12], "big")))
            level = np.concatenate(nxt)
            if level.min() < 2 or level.max() > npages:
                raise Unsupported("child page out of range")
            if np.unique(level).size != level.size or np.isin(level, seen).any():
                raise Unsupported("a page is reached twice")
            seen = np.concatenate([seen, level])
        raise Unsupported("b-tree too deep")


# ------------------------------------------------------------------------------ decoding --

def _varint(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints starting at buf[pos]: values (int64) and lengths in bytes (int64)."""
    b = buf[pos]
    val = b.astype(np.int64)
    length = np.ones(pos.shape, dtype=np.int64)
    more = np.flatnonzero(b >= 0x80)
    if more.size == 0:
        return val, length
    v = val[more].astype(np.uint64) & np.uint64(0x7F)
    p = pos[more]
    idx = more
    for k in range(1, 9):
        b = buf[p + k].astype(np.uint64)
        if k == 8:
            v = (v << np.uint64(8)) | b
            val[idx] = v.view(np.int64)
            length[idx] = 9
            break
        v = (v << np.uint64(7)) | (b & np.uint64(0x7F))
        done = b < 0x80
        if done.any():
            val[idx[done]] = v[done].view(np.int64)
            length[idx[done]] = k + 1
            keep = ~done
            if not keep.any():
                break
            v, p, idx = v[keep], p[keep], idx[keep]
    return val, length


def _be16(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return (buf[pos].astype(np.int64) << 8) | buf[pos + 1]


class _Corrupt(Exception):
    pass


class _Decoder:
    def __init__(self, plan: _Plan):
        self.plan = plan
        self.ps = plan.head.page_size
        self.usable = plan.head.usable
        self.tail = plan.ncols + 64
        # The value of each serial-type code that has no body bytes (NULL, 0, 1, missing).
        self.consts = np.zeros(_CODES, dtype=np.int64)
        self.consts[[0, _MISSING]] = plan.null
        self.consts[9] = 1

    def new_buffer(self, npages: int) -> np.ndarray:
        return np.zeros(_FRONT + npages * self.ps + self.tail, dtype=np.uint8)

    def decode(self, buf: np.ndarray, npages: int, last_rowid: int | None,
               root: bool = False) -> np.ndarray:
        """The rows of the npages leaf pages in buf: (rows, 1 + requested columns) int64,
        each column contiguous. Decoded SUB_ROWS rows at a time: the temporaries stay small
        (in cache, and reused by the allocator instead of freshly mapped). Only a root page
        (the table's only leaf) may be empty."""
        plan, ps, usable = self.plan, self.ps, self.usable
        base = _FRONT + ps * np.arange(npages, dtype=np.int64)
        if (buf[base] != _LEAF).any():
            raise _Corrupt("not a leaf page")
        ncells = _be16(buf, base + 3)
        if (8 + 2 * ncells > usable).any() or (ncells > (ps - 8) // 6).any():
            raise _Corrupt("cell count")
        if not root and (ncells == 0).any():
            raise _Corrupt("an empty leaf page that is not the root")
        ends = np.cumsum(ncells)
        total = int(ends[-1])
        out = np.empty((1 + len(plan.cids), total), dtype=np.int64)
        cuts = np.unique(np.searchsorted(ends, np.arange(SUB_ROWS, total, SUB_ROWS), side="left"))
        p0 = 0
        for cut in cuts.tolist() + [npages]:
            if p0 >= npages:
                break
            p1 = min(max(cut, p0 + 1), npages)
            r0 = int(ends[p0 - 1]) if p0 else 0
            r1 = int(ends[p1 - 1])
            if r1 > r0:
                self._pages(buf, base[p0:p1], ncells[p0:p1], out[:, r0:r1], last_rowid)
                last_rowid = int(out[0, r1 - 1])
            p0 = p1
        return out.T

    def _pages(self, buf, base, ncells, out, last_rowid) -> None:
        """The cells of the leaf pages at base (offsets in buf) into out (columns, rows)."""
        plan, usable = self.plan, self.usable
        total = out.shape[1]
        page_of = np.repeat(np.arange(base.size, dtype=np.int64), ncells)
        first = np.cumsum(ncells) - ncells
        cell_no = np.arange(total, dtype=np.int64) - np.repeat(first, ncells)
        cbase = base[page_of]
        coff = _be16(buf, cbase + 8 + 2 * cell_no)
        if ((coff < 8 + 2 * ncells[page_of]) | (coff > usable - 4)).any():
            raise _Corrupt("cell offset")
        pos = cbase + coff
        psize, n1 = _varint(buf, pos)
        rowid, n2 = _varint(buf, pos + n1)
        rec = pos + n1 + n2
        if (psize < 1).any():
            raise _Corrupt("payload size")
        # A payload larger than X keeps its first `local` bytes in the cell, then the number
        # of its first overflow page (4 bytes); the rest is in overflow pages, never read
        # here: the columns decoded must lie in the local part.
        x = usable - 35
        local = psize
        over = psize > x
        if over.any():
            m = (usable - 12) * 32 // 255 - 23
            kk = m + (psize - m) % (usable - 4)
            local = np.where(over, np.where(kk <= x, kk, m), psize)
        if (coff + n1 + n2 + local + 4 * over > usable).any():
            raise _Corrupt("payload beyond the page")
        if (np.diff(rowid) <= 0).any() or (last_rowid is not None and rowid[0] <= last_rowid):
            raise _Corrupt("rowids out of order")
        out[0] = rowid
        if not plan.ncols:
            out[1:] = rowid
            return
        hsize, n3 = _varint(buf, rec)
        if ((hsize < n3) | (hsize > local)).any():
            raise Unsupported("a record header in overflow pages") if (hsize <= psize).all() \
                else _Corrupt("record header size")
        self._columns(buf, rec, hsize, n3, psize, local, rowid, out)

    def _columns(self, buf, rec, hsize, n3, psize, local, rowid, out) -> None:
        """Serial types and body offsets of columns 0..ncols-1 of every record, then the
        requested ones' values into out (columns, rows). Arrays are (column, row): each
        column's values lie together. Records whose serial types up to ncols are one byte each
        (all but those with long strings or blobs early on) go through one matrix; the others
        are decoded varint after varint."""
        plan = self.plan
        k = plan.ncols
        nst = hsize - n3  # header bytes of serial types
        head = rec + n3
        col = np.arange(k, dtype=np.int64)[:, None]
        st = buf[head + col]  # (k, rows) uint8: the serial types, when one byte each
        # whole: the record's header was read to its end (its columns are ncols or fewer)
        if nst.min() >= k and st.max() < 0x80:
            codes, size = st, _SIZE_U8[st]
            whole = nst == k
        else:
            present = col < nst
            multi = ((st >= 0x80) & present).any(axis=0)
            codes = st.astype(np.int64)
            whole = nst <= k
            if multi.any():
                slow = np.flatnonzero(multi)
                sst, spresent, whole[slow] = _serial_types_in_order(
                    buf, head[slow], (rec + hsize)[slow], k)
                codes[:, slow] = np.where(sst > 255, _LONG, sst)
                present[:, slow] = spresent
            codes[~present] = _MISSING
            size = _SIZE[codes]
            if multi.any():
                size[:, slow] = np.where(sst > 255, (sst - 12) >> 1, size[:, slow])
        if (size < 0).any():
            raise _Corrupt("reserved serial type")
        need = plan.need  # the record columns to decode
        # Where each needed value ends in buf: the body's start plus the sizes up to it.
        idx = np.empty((len(need), size.shape[1]), dtype=np.int64)
        run = rec + hsize - 8
        r = 0
        for cid in range(k):
            run = run + size[cid]
            if cid == need[r]:
                idx[r] = run
                r += 1
        # As SQLite checks a record: its columns end in its payload, exactly at its end when
        # the whole header was read.
        body_end = run + 8 - rec
        if (np.where(whole, body_end != psize, body_end > psize)).any():
            raise _Corrupt("record sizes do not add up")
        if (body_end > local).any():
            raise Unsupported("a value in overflow pages")
        c = codes[need]
        if _NOT_INT[c].any():
            raise Unsupported("a value that is not an integer")  # caught by the batch
        win = np.ndarray(shape=(buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))
        raw = win[idx]  # the 8 bytes that end where each value ends
        raw.byteswap(inplace=True)
        v = raw.view(np.int64)
        sh = _SHIFT[c]
        v <<= sh
        v >>= sh
        nobody = _NO_BODY[c]
        if nobody.any():
            np.copyto(v, self.consts[c], where=nobody)
            for r, (ok, dflt) in enumerate(plan.need_defaults):
                miss = c[r] == _MISSING
                if dflt is not None or not ok:
                    if miss.any():
                        if not ok:
                            raise Unsupported("a record lacks a column whose default is not "
                                              "an integer")
                        v[r][miss] = dflt
        for j, r in enumerate(plan.out_rows):
            out[1 + j] = rowid if r < 0 else v[r]



def _serial_types_in_order(buf, head, hend, k):
    """Serial types (k, rows) of columns 0..k-1 decoded one varint after the other (records
    with multi-byte serial types), 0 where absent; present: the record has the column; whole:
    its header ends there."""
    n = head.size
    st = np.zeros((k, n), dtype=np.int64)
    present = np.zeros((k, n), dtype=bool)
    cur = head.copy()
    for c in range(k):
        rows = np.flatnonzero(cur < hend)
        if rows.size == 0:
            break
        val, ln = _varint(buf, cur[rows])
        if (cur[rows] + ln > hend[rows]).any():
            raise _Corrupt("serial type beyond the record header")
        st[c, rows] = val
        present[c, rows] = True
        cur[rows] += ln
    if (st < 0).any():
        raise _Corrupt("serial type")
    return st, present, cur >= hend


# ------------------------------------------------------------------------------ reading --

def _read_pages(f, pages: np.ndarray, ps: int, buf: np.ndarray) -> None:
    """Pages (numbers) into buf after _FRONT, in the order given: runs of consecutive pages
    in one read each."""
    n = pages.size
    brk = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = np.concatenate([[0], brk])
    ends = np.concatenate([brk, [n]])
    mv = memoryview(buf)
    fd = f.fileno()
    for s, e in zip(starts.tolist(), ends.tolist()):
        want = (e - s) * ps
        off = _FRONT + s * ps
        got = os.preadv(fd, [mv[off: off + want]], (int(pages[s]) - 1) * ps)
        if got != want:
            raise _Corrupt("short read")


def int_chunks(db: sqlite3.Connection, path: str, table: str, cols: list[str],
               null: int) -> Iterator[np.ndarray]:
    """Yield int64 arrays (rows, 1 + len(cols)): rowid, then cols, NULL as `null`, in rowid
    order, read from the file's pages. Raises Unsupported (before or between the yields)."""
    if not enabled():
        raise Unsupported("disabled")
    if sys.byteorder != "little":
        raise Unsupported("a big-endian machine")
    plan = _Plan(db, path, table, cols, null)
    with open(path, "rb") as f:
        leaves = plan.leaves(f)
    if leaves.size == 0:
        return
    gen = _batches(plan, leaves)
    if THREADED:
        gen = _in_thread(gen)
    try:
        yield from gen
    finally:
        gen.close()


def _batches(plan: _Plan, leaves: np.ndarray) -> Iterator[np.ndarray]:
    dec = _Decoder(plan)
    ps = plan.head.page_size
    max_pages = max(1, MAX_BATCH_BYTES // ps)
    chunk_rows = max(1, min(CHUNK_ROWS, CHUNK_BYTES // (8 * (1 + len(plan.cids)))))
    per_batch = max(1, min(max_pages, 64, chunk_rows))  # the first measures rows per page
    last: int | None = None
    buf = None
    with open(plan.path, "rb") as f:
        i = 0
        while i < leaves.size:
            pages = leaves[i: i + per_batch]
            try:
                if buf is None or buf.size < _FRONT + pages.size * ps + dec.tail:
                    buf = dec.new_buffer(pages.size)
                _read_pages(f, pages, ps, buf)
                a = dec.decode(buf, pages.size, last, root=leaves.size == 1)
            except Unsupported as e:
                raise Unsupported(e.why, None if last is None else last + 1) from None
            except (_Corrupt, IndexError, ValueError, OverflowError, OSError) as e:
                raise Unsupported(f"page check failed: {e}",
                                  None if last is None else last + 1) from None
            i += pages.size
            if a.shape[0]:
                last = int(a[-1, 0])
                rows_per_page = max(1.0, a.shape[0] / pages.size)
                per_batch = int(min(max_pages, max(1, chunk_rows // rows_per_page)))
                yield a


_DONE = object()


def _in_thread(gen: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """gen's items, made by one background thread a couple of items ahead."""
    q: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def work() -> None:
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as e:  # handed to the consumer
            q.put(e)
        finally:
            gen.close()

    th = threading.Thread(target=work, name="sqlite-pages", daemon=True)
    th.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while th.is_alive():
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        th.join()
