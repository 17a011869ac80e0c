r"""The profile database: measured shard times in one SQLite file, shared by concurrent profilers.

One SQLite file marked as ours by ``PRAGMA application_id`` (:data:`APPLICATION_ID`) and a ``meta``
table holding the layout version (:data:`SCHEMA_VERSION`). Any other SQLite file is refused before
anything is written to it (one line, the file left byte for byte as it was); a version-1 file (no
application id, no backward column) is upgraded in place. Tables: ``timings`` keyed by (signature,
provider, device_name) with the forward median and, for torch rows, the backward median;
``failures`` (shards that cannot run here, so they are not retried); ``claims`` (shards a live
process is measuring now: owner host, pid, a token per run and the claim time). A claim is void once
its row is timed, when its process is gone (same host, pid not running) or after
``claim_timeout_s`` (another host's process that died). WAL journal, a busy timeout, and
``INSERT OR IGNORE`` in short ``BEGIN IMMEDIATE`` transactions let several processes profile into one
file at the same time without losing or corrupting rows.

:meth:`ProfileDB.lookup_fn` gives the cost model an ``(op, factors) -> seconds | (forward, backward)
| None`` function that reads the signatures :func:`objectives.profile.profile_graph` wrote back.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping, Sequence

from objectives.onnx_build import shard_spec
from objectives.ort_timing import _first_line
from objectives.profile_providers import _backend, detect_device_name
from planner.core.errors import InputError
from planner.core.graph import Op, Tensor

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "ProfileRow", "ProfileDB", "MeasuredFn"]

MeasuredFn = Callable[[Op, Mapping[str, int]], "float | tuple[float, float | None] | None"]
"""Measured seconds of an op's per-device shard under a configuration: the forward time, or
``(forward, backward)`` where the backward was measured too; ``None`` when not in the database."""

APPLICATION_ID = 0x504C4E52
"""``PRAGMA application_id`` of a planner profile database ("PLNR")."""
SCHEMA_VERSION = "2"
"""Layout written by this planner (1: no application id, no backward times, no claims)."""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS timings (
    signature TEXT NOT NULL,
    provider TEXT NOT NULL,
    device_name TEXT NOT NULL,
    median_s REAL NOT NULL,
    repeats INTEGER NOT NULL,
    spread_s REAL NOT NULL,
    measured_dtypes TEXT NOT NULL,
    method TEXT NOT NULL,
    description TEXT NOT NULL,
    created_unix REAL NOT NULL,
    backward_median_s REAL,
    backward_spread_s REAL,
    PRIMARY KEY (signature, provider, device_name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS failures (
    signature TEXT NOT NULL,
    provider TEXT NOT NULL,
    device_name TEXT NOT NULL,
    reason TEXT NOT NULL,
    description TEXT NOT NULL,
    created_unix REAL NOT NULL,
    PRIMARY KEY (signature, provider, device_name)
) WITHOUT ROWID;
"""
_CLAIMS = """
CREATE TABLE IF NOT EXISTS claims (
    signature TEXT NOT NULL,
    provider TEXT NOT NULL,
    device_name TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    token TEXT NOT NULL,
    claimed_unix REAL NOT NULL,
    PRIMARY KEY (signature, provider, device_name)
) WITHOUT ROWID
"""
_V1_TABLES = frozenset({"meta", "timings", "failures"})
_TIMING_COLUMNS = (
    "signature",
    "provider",
    "device_name",
    "median_s",
    "repeats",
    "spread_s",
    "measured_dtypes",
    "method",
    "description",
    "created_unix",
    "backward_median_s",
    "backward_spread_s",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRow:
    """One row of the ``timings`` table."""

    signature: str
    provider: str
    device_name: str
    median_s: float
    repeats: int
    spread_s: float
    measured_dtypes: str
    method: str
    description: str
    created_unix: float
    """When it was measured (seconds since the Unix epoch)."""
    backward_median_s: float | None = None
    """Median backward seconds; ``None``: not measured (the cost model scales the forward)."""
    backward_spread_s: float | None = None


# --------------------------------------------------------------------------------------------------
# The database.


class _Foreign(Exception):
    """The file is an SQLite database that is not ours (the message says what it holds)."""


def _alive(host: str, pid: int) -> bool:
    """False only when the claiming process is known to be gone (same host, no such pid)."""
    if host != socket.gethostname():
        return True  # cannot tell: the claim's age decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class ProfileDB:
    """Timings keyed by (shard signature, provider, device name), in one SQLite file.

    Safe for several processes at once (WAL journal, busy timeout, ``INSERT OR IGNORE`` in short
    transactions, claims for the work in progress). Open one per process; use as a context manager
    or call :meth:`close`.

    Parameters
    ----------
    path:
        The database file; created (with its folder) when missing and ``create``.
    timeout_s:
        How long to wait for another process's write lock (seconds).
    create:
        Create the file when it does not exist; else a missing file is an :class:`InputError`
        (reading timings for a plan).

    Raises
    ------
    InputError
        The file is missing (``create=False``), not an SQLite database, an SQLite database that is
        not a planner profile database (refused before anything is written to it), or one written
        by a newer planner.

    Examples
    --------
    >>> import tempfile, os
    >>> with ProfileDB(os.path.join(tempfile.mkdtemp(), "p.db")) as db:
    ...     db.timings(provider="cpu", device_name="test")
    {}
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 60.0, create: bool = True) -> None:
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise InputError(
                    f"no profile database at {self.path}; run `planner profile MODEL --profile-db {self.path}` first"
                )
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(
                    f"cannot create folder for profile database {self.path}: {exc}; choose another path"
                ) from None
        elif not self.path.is_file():
            raise InputError(f"profile database {self.path} is not a regular file; choose another path")
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            # reading the header and the schema writes nothing: a foreign file is left as it was
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            if self._identify(self._conn) != "current":
                self._write(self._create_or_upgrade)
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot switch journal to WAL (got {mode})")
            self._conn.execute("PRAGMA synchronous = NORMAL")  # durable enough with WAL, much faster
            columns = [row[1] for row in self._conn.execute("PRAGMA table_info(timings)")]
        except _Foreign as exc:
            self._conn.close()
            raise InputError(f"{self.path} {exc}; choose another path (the file was left unchanged)") from None
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc) from None
        if tuple(columns) != _TIMING_COLUMNS:
            self._conn.close()
            raise InputError(
                f"profile database {self.path} has another layout (timings columns {', '.join(columns)}); "
                "delete it or choose another path"
            )
        self._token = uuid.uuid4().hex
        self._host = socket.gethostname()

    # -- plumbing

    def _error(self, exc: BaseException) -> InputError:
        return InputError(
            f"profile database {self.path} is unreadable ({_first_line(exc)}); if it is a planner profile "
            "database delete it, or choose another path"
        )

    @staticmethod
    def _identify(conn: sqlite3.Connection) -> Literal["current", "empty", "v1"]:
        """What the file holds; :class:`_Foreign` when it is another program's database."""
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
            if not name.startswith("sqlite_")
        }
        if application_id == APPLICATION_ID:
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if version is None or version[0] != SCHEMA_VERSION:
                found = version[0] if version else "?"
                if found.isdigit() and int(found) > int(SCHEMA_VERSION):
                    raise _Foreign(
                        f"is a profile database of a newer planner (layout {found}, this one reads {SCHEMA_VERSION}); "
                        "upgrade planner"
                    )
                raise _Foreign(f"is a profile database of unknown layout {found}")
            return "current"
        if application_id == 0 and not tables:
            return "empty"  # a new file (or an SQLite file with nothing in it)
        if application_id == 0 and tables == _V1_TABLES:
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if version is not None and version[0] == "1":
                return "v1"
        what = f"application id {application_id:#x}" if application_id else f"tables {', '.join(sorted(tables))}"
        raise _Foreign(f"is an SQLite database but not a planner profile database ({what})")

    @classmethod
    def _create_or_upgrade(cls, conn: sqlite3.Connection) -> None:
        """In the write transaction: create the layout, or upgrade a version-1 file."""
        state = cls._identify(conn)  # again: another process may have created it meanwhile
        if state == "current":
            return
        if state == "v1":
            conn.execute("ALTER TABLE timings ADD COLUMN backward_median_s REAL")
            conn.execute("ALTER TABLE timings ADD COLUMN backward_spread_s REAL")
        else:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(_CLAIMS)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _write(self, body: Callable[[sqlite3.Connection], object]) -> object:
        """Run ``body`` in one short write transaction (taken at once, so it never deadlocks)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> ProfileDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reading

    def timings(self, *, provider: str, device_name: str) -> dict[str, float]:
        """Signature -> median forward seconds, for one provider and device (one SELECT)."""
        rows = self._query(
            "SELECT signature, median_s FROM timings WHERE provider = ? AND device_name = ?",
            (provider, device_name),
        )
        return {signature: float(median) for signature, median in rows}

    def timings_with_backward(self, *, provider: str, device_name: str) -> dict[str, tuple[float, float | None]]:
        """Signature -> (median forward seconds, median backward seconds or ``None``)."""
        rows = self._query(
            "SELECT signature, median_s, backward_median_s FROM timings WHERE provider = ? AND device_name = ?",
            (provider, device_name),
        )
        return {s: (float(f), None if b is None else float(b)) for s, f, b in rows}

    def failures(self, *, provider: str, device_name: str) -> dict[str, str]:
        """Signature -> reason, for shards recorded as unable to run on this provider and device."""
        rows = self._query(
            "SELECT signature, reason FROM failures WHERE provider = ? AND device_name = ?",
            (provider, device_name),
        )
        return dict(rows)

    def sources(self) -> list[tuple[str, str, str, int]]:
        """``(provider, device_name, dtypes, timings)`` of every group of timings, most timings first."""
        rows = self._query(
            "SELECT provider, device_name, measured_dtypes, COUNT(*) FROM timings "
            "GROUP BY provider, device_name, measured_dtypes"
        )
        merged: dict[tuple[str, str], tuple[Counter[str], int]] = {}
        for provider, device, dtypes, count in rows:
            seen, total = merged.get((provider, device), (Counter(), 0))
            seen.update({d: count for d in str(dtypes).split(",") if d})
            merged[(provider, device)] = (seen, total + int(count))
        out = [(p, d, ",".join(sorted(seen)), total) for (p, d), (seen, total) in merged.items()]
        return sorted(out, key=lambda s: (-s[3], s[0], s[1]))

    def rows(self) -> list[ProfileRow]:
        """Every timing, ordered by signature, provider and device."""
        rows = self._query(
            f"SELECT {', '.join(_TIMING_COLUMNS)} FROM timings ORDER BY signature, provider, device_name"
        )
        return [ProfileRow(**dict(zip(_TIMING_COLUMNS, row))) for row in rows]

    def integrity_ok(self) -> bool:
        """True when SQLite's ``PRAGMA integrity_check`` finds nothing wrong."""
        return self._query("PRAGMA integrity_check") == [("ok",)]

    # -- writing

    def record(self, rows: Iterable[ProfileRow]) -> int:
        """Insert timings in one transaction; rows whose key exists are kept as they are.

        Also drops this process's claims on the inserted signatures. Returns the number of rows
        inserted.
        """
        rows = list(rows)
        values = [tuple(getattr(row, c) for c in _TIMING_COLUMNS) for row in rows]
        if not values:
            return 0
        columns = ", ".join(_TIMING_COLUMNS)
        sql = f"INSERT OR IGNORE INTO timings ({columns}) VALUES ({', '.join('?' * len(_TIMING_COLUMNS))})"

        def insert(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(sql, values)
            inserted = conn.total_changes - before
            self._release(conn, [(r.signature, r.provider, r.device_name) for r in rows])
            return inserted

        try:
            return int(self._write(insert))  # type: ignore[arg-type]
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def record_failures(
        self, failures: Iterable[tuple[str, str, str]], *, provider: str, device_name: str
    ) -> None:
        """Insert (signature, reason, description) of shards that cannot run here, in one transaction."""
        now = time.time()
        values = [(s, provider, device_name, reason, desc, now) for s, reason, desc in failures]
        if not values:
            return
        sql = (
            "INSERT OR IGNORE INTO failures (signature, provider, device_name, reason, description, created_unix)"
            " VALUES (?, ?, ?, ?, ?, ?)"
        )

        def insert(conn: sqlite3.Connection) -> None:
            conn.executemany(sql, values)
            self._release(conn, [(v[0], provider, device_name) for v in values])

        try:
            self._write(insert)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    # -- claims: who measures what when several processes profile into one file

    def _release(self, conn: sqlite3.Connection, keys: Sequence[tuple[str, str, str]]) -> None:
        conn.executemany(
            "DELETE FROM claims WHERE signature = ? AND provider = ? AND device_name = ? AND token = ?",
            [(*key, self._token) for key in keys],
        )

    def claim(
        self, signatures: Sequence[str], *, provider: str, device_name: str, claim_timeout_s: float = 3600.0
    ) -> tuple[list[str], list[str]]:
        """Claim shards to measure, in one transaction.

        A signature is claimed unless it is already timed or failed, or claimed by another live
        process (a claim older than ``claim_timeout_s`` seconds, or whose process is gone from this
        host, is taken over).

        Returns
        -------
        (mine, done_or_taken)
            Signatures this process now holds; the others (timed, failed, or claimed elsewhere).
        """
        now = time.time()
        pid = os.getpid()

        def take(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
            mine: list[str] = []
            other: list[str] = []
            for signature in signatures:
                key = (signature, provider, device_name)
                where = "signature = ? AND provider = ? AND device_name = ?"
                done = conn.execute(
                    f"SELECT 1 FROM timings WHERE {where} UNION ALL SELECT 1 FROM failures WHERE {where}", key + key
                ).fetchone()
                if done is not None:
                    other.append(signature)
                    continue
                held = conn.execute(f"SELECT host, pid, token, claimed_unix FROM claims WHERE {where}", key).fetchone()
                if held is not None:
                    host, owner, token, claimed = held
                    if token != self._token and now - claimed < claim_timeout_s and _alive(host, owner):
                        other.append(signature)
                        continue
                conn.execute(
                    "INSERT OR REPLACE INTO claims (signature, provider, device_name, host, pid, token, claimed_unix)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    key + (self._host, pid, self._token, now),
                )
                mine.append(signature)
            return mine, other

        try:
            return self._write(take)  # type: ignore[return-value]
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def release_claims(self) -> None:
        """Drop every claim this connection still holds (a run stopped before measuring them)."""
        try:
            self._write(lambda conn: conn.execute("DELETE FROM claims WHERE token = ?", (self._token,)))
        except sqlite3.Error:
            pass  # best effort: the claims expire, and a dead process's claims are taken over at once

    def claimed_elsewhere(self, signatures: Iterable[str], *, provider: str, device_name: str) -> set[str]:
        """Of ``signatures``, those held now by another process's live claim."""
        rows = self._query(
            "SELECT signature, host, pid FROM claims WHERE provider = ? AND device_name = ? AND token != ?",
            (provider, device_name, self._token),
        )
        wanted = set(signatures)
        return {s for s, host, pid in rows if s in wanted and _alive(host, pid)}

    # -- for the cost model

    def lookup_fn(
        self,
        provider: str = "cpu",
        device_name: str | None = None,
        *,
        tensors: Mapping[str, Tensor] | None = None,
        dtype: str | None = None,
    ) -> MeasuredFn:
        """A function giving the measured seconds of ``(op, factors)``, ``None`` if absent.

        The timings of this provider and device are read once, now; the returned function rebuilds
        the shard's signature and looks it up. It returns the forward seconds, or
        ``(forward, backward)`` where the backward was measured too (torch providers).

        Parameters
        ----------
        provider:
            A key of :data:`PROVIDERS`.
        device_name:
            The device the timings were taken on; default: this machine's
            (:func:`detect_device_name`).
        tensors:
            The graph's tensors (:func:`objectives.torch_profile.tensor_view`); needed by torch
            providers, whose signature is the PyTorch call the op maps to.
        dtype:
            torch providers: the dtype the calls ran in (default: the provider's).

        Raises
        ------
        InputError
            Unknown provider, or a torch provider without ``tensors``.
        """
        backend = _backend(provider)
        device = device_name or detect_device_name(provider)
        table = self.timings_with_backward(provider=provider, device_name=device)
        if backend.needs_tensors and tensors is None:
            raise InputError(f"looking up {provider} timings needs the graph's tensors; pass tensors=")
        chosen = dtype or backend.default_dtype

        def measured(op: Op, factors: Mapping[str, int]) -> float | tuple[float, float | None] | None:
            if not table:
                return None
            if backend.needs_tensors:
                shard = backend.shard(op, factors, tensors or {}, chosen)
                if isinstance(shard, str):
                    return None
                key = shard.key
            else:
                if op.node is None:
                    return None
                spec = shard_spec(op, factors)
                if spec is None:
                    return None
                key = spec.key
            found = table.get(key)
            if found is None:
                return None
            return found[0] if found[1] is None else found

        return measured
