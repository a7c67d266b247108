"""Rules are data: YAML files validated by pydantic (rule_models.py), each a SQL query plus a condition.

A rule's query runs over the trace store and returns rows of named metrics; each row whose
condition holds becomes a finding. Thresholds are named `params`, overridable by the user.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import RuleError
from .kernelnames import DISPLAY_NAME_CHARS, display_kernel_name

# An installed wheel carries the rules inside the package (pyproject.toml maps rules/ to
# navdoctor/rules_builtin/); a checkout or an editable install reads rules/ beside navdoctor/.
BUILTIN_RULES_DIR = Path(__file__).resolve().parent / "rules_builtin"
if not BUILTIN_RULES_DIR.is_dir():
    BUILTIN_RULES_DIR = Path(__file__).resolve().parent.parent / "rules"



def _models():
    """The pydantic models (rule_models.py), imported where a rule is validated or its schema
    asked for: not on an analysis whose rule files are in the validated-rules cache."""
    from . import rule_models
    return rule_models


def _plain_copy(value: Any) -> Any:
    """A copy of a dump's value (dicts and lists new, as pydantic's model_dump makes them)."""
    if type(value) is dict:
        return {k: _plain_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_plain_copy(v) for v in value]
    return value


class _Plain:
    """A rule file's model as a plain object: the attributes of the pydantic model of the same
    name in rule_models.py (its fields, in its order), made from that model's model_dump().
    Made with keyword arguments it validates them through the pydantic model, as before;
    made by _from_dump (the loader, from a validated dump) it imports no pydantic. Supports
    what navdoctor and its tests use of a pydantic model: model_validate, model_dump,
    model_copy, equality; anything else goes through to_model()."""

    _FIELDS: tuple[str, ...] = ()
    _NESTED: dict[str, tuple[type, str]] = {}   # field -> (class, 'list' | 'dict')

    def __init__(self, **data: Any):
        self._set(self.to_plain(self._model().model_validate(data)).__dict__)

    @classmethod
    def _model(cls):
        return getattr(_models(), cls.__name__)

    @classmethod
    def model_validate(cls, data: Any):
        """Validated by the pydantic model (its ValidationError as before)."""
        return cls.to_plain(cls._model().model_validate(data))

    @classmethod
    def to_plain(cls, model) -> "_Plain":
        obj = cls._from_dump(model.model_dump())
        for name in cls._EXCLUDE:   # fields the dump leaves out (exclude=True)
            obj.__dict__[name] = getattr(model, name)
        return obj

    @classmethod
    def _from_dump(cls, dump: dict) -> "_Plain":
        obj = cls.__new__(cls)
        values = {}
        for name in cls._FIELDS:
            if name not in dump:
                continue
            value = _plain_copy(dump[name])
            nested = cls._NESTED.get(name)
            if nested is not None:
                kind, shape = nested
                value = ([kind._from_dump(v) for v in value] if shape == "list"
                         else {k: kind._from_dump(v) for k, v in value.items()})
            values[name] = value
        obj._set(values)
        return obj

    def _set(self, values: dict) -> None:
        self.__dict__.update(values)

    def model_dump(self, mode: str = "python", **kwargs: Any) -> dict:
        """pydantic's model_dump (mode "python", no options) without pydantic; else the
        pydantic model's own."""
        if mode != "python" or kwargs:
            return self.to_model().model_dump(mode=mode, **kwargs)
        out = {}
        for name in self._FIELDS:
            if name in self._EXCLUDE or name not in self.__dict__:
                continue
            value = self.__dict__[name]
            nested = self._NESTED.get(name)
            if nested is not None:
                out[name] = ([v.model_dump() for v in value] if nested[1] == "list"
                             else {k: v.model_dump() for k, v in value.items()})
            else:
                out[name] = _plain_copy(value)
        return out

    def to_model(self):
        """The pydantic model of the same fields (validated again)."""
        data = self.model_dump()
        for name in self._EXCLUDE:
            if name in self.__dict__:
                data[name] = self.__dict__[name]
        return self._model().model_validate(data)

    def model_copy(self, deep: bool = False) -> "_Plain":
        import copy
        return copy.deepcopy(self) if deep else copy.copy(self)

    _EXCLUDE: tuple[str, ...] = ()

    def __eq__(self, other: Any) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(
            f"{k}={self.__dict__[k]!r}" for k in self._FIELDS if k in self.__dict__) + ")"


class Remedy(_Plain):
    _FIELDS = ("title", "text", "code", "link", "verify", "whatif", "only_for")


class Bound(_Plain):
    """Expected range of one metric in an example: min <= value <= max (either may be left out)."""
    _FIELDS = ("min", "max")


class Example(_Plain):
    """A case `navdoctor rules test` checks (rule_models.Example)."""
    _FIELDS = ("expect", "traces", "metrics", "params", "note")
    _NESTED = {"metrics": (Bound, "dict")}

    @property
    def trace_list(self) -> list[str]:
        return [self.traces] if isinstance(self.traces, str) else list(self.traces)


class Rule(_Plain):
    """A rule (rule_models.Rule): its fields as attributes."""
    _FIELDS = ("id", "title", "category", "severity", "description", "query", "condition",
               "params", "message", "at_stake", "at_stake_in_class", "remedies", "examples",
               "source_file")
    _NESTED = {"remedies": (Remedy, "list"), "examples": (Example, "list")}
    _EXCLUDE = ("source_file",)
    at_stake_in_class = False   # the model's default, for a Rule made from a dump without it


def rule_json_schema() -> dict:
    return _models().Rule.model_json_schema()


# ---- loading ---------------------------------------------------------------------------

def _field_of(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "?"


CACHE_DIR_ENV = "NAVDOCTOR_CACHE_DIR"


def cache_dir() -> Path | None:
    """NAVDOCTOR_CACHE_DIR, else $XDG_CACHE_HOME/navdoctor, else ~/.cache/navdoctor; None
    (no cache: every rule file is parsed and checked, as without one) where what it would
    be made in does not exist (NAVDOCTOR_CACHE_DIR's parent, XDG_CACHE_HOME, the home
    directory): a HOME that names no directory (a service account's /nonexistent) never
    gets one created."""
    if os.environ.get(CACHE_DIR_ENV):
        path = Path(os.environ[CACHE_DIR_ENV])
        anchor = path.parent
    elif os.environ.get("XDG_CACHE_HOME"):
        anchor = Path(os.environ["XDG_CACHE_HOME"])
        path = anchor / "navdoctor"
    else:
        home = os.path.expanduser("~")
        if home == "~":   # no HOME, and no home in the password database
            return None
        anchor = Path(home)
        path = anchor / ".cache" / "navdoctor"
    try:
        if not anchor.is_absolute() or not anchor.is_dir():
            return None
    except OSError:
        return None
    return path


class ParseCache:
    """What _parse_yaml gave for a rule file's text, by the text's SHA-256, as JSON, in one
    file of cache_dir() per (this code's format, navdoctor's version, the yaml package's
    files): a run whose rule files are all known neither imports PyYAML nor parses (~16 ms
    of a small trace's analysis: 10 ms of import, 6 ms for the built-in rules). Only what
    JSON gives back unchanged is kept (mappings with string keys, lists, strings, finite
    numbers, booleans, None, nothing shared between two places); a text that does not parse
    is never kept, so its error is the parser's own each time. Any error reading or writing
    the cache only means the files are parsed as without it."""

    FORMAT = 2
    MAX_ENTRIES = 256
    # Bounded in memory and on disk: a text over MAX_TEXT_BYTES is parsed each time, never
    # kept (one 100 MB rule file kept made every later analysis read 825 MB of cache), and
    # a cache file over MAX_FILE_BYTES is neither read nor kept (the oldest entries go first).
    MAX_TEXT_BYTES = 256 << 10
    MAX_FILE_BYTES = 4 << 20

    def __init__(self, directory: Path | None = None):
        self.directory = cache_dir() if directory is None else directory
        code = hashlib.sha256(f"{self.FORMAT}\0{_navdoctor_version()}\0{_yaml_stamp()}\0"
                              f"{_validation_stamp()}".encode())
        self.path = None if self.directory is None else \
            self.directory / f"rules-parsed-{code.hexdigest()[:32]}.json"
        self._entries: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        if self._entries is None:
            try:
                if self.path is None or os.path.getsize(self.path) > self.MAX_FILE_BYTES:
                    raise OSError("no cache, or too large")
                with open(self.path, encoding="utf-8") as f:
                    doc = json.load(f)
                self._entries = {k: v for k, v in doc.items()
                                 if isinstance(k, str) and isinstance(v, str)} \
                    if isinstance(doc, dict) else {}
            except (OSError, ValueError, RecursionError):
                self._entries = {}
        return self._entries

    def parse(self, text: str) -> list:
        """_parse_yaml(text), from the cache when it knows the text (a fresh copy each call)."""
        key = self._key(text)
        entries = self._load()
        if key in entries:
            try:
                return json.loads(entries[key])
            except (ValueError, RecursionError):
                pass
        docs = _parse_yaml(text)
        if len(text) <= self.MAX_TEXT_BYTES and _json_safe(docs, set()):
            self._put(key, docs)
        return docs

    def validated(self, text: str) -> list[dict] | None:
        """The dumps of a text's rules as validated before (a fresh copy), else None."""
        entries = self._load()
        kept = entries.get("v:" + self._key(text))
        if kept is not None:
            try:
                dumps = json.loads(kept)
            except (ValueError, RecursionError):
                return None
            if type(dumps) is list and all(type(d) is dict for d in dumps):
                return dumps
        return None

    def keep_validated(self, text: str, dumps: list[dict]) -> None:
        """Keep the dumps of a text whose every rule validated (when JSON gives them back)."""
        if len(text) <= self.MAX_TEXT_BYTES and _json_safe(dumps, set()):
            self._put("v:" + self._key(text), dumps)

    def _put(self, key: str, value: Any) -> None:
        """Keep value as the newest entry (the oldest go past MAX_ENTRIES) and save."""
        entries = self._load()
        entries.pop(key, None)
        try:
            entries[key] = json.dumps(value, allow_nan=False)
        except (ValueError, RecursionError):
            return
        total = sum(len(k) + len(v) + 8 for k, v in entries.items())
        while entries and (len(entries) > self.MAX_ENTRIES or total > self.MAX_FILE_BYTES):
            old = next(iter(entries))
            total -= len(old) + len(entries.pop(old)) + 8
        if self.path is not None and entries:
            write_cache_file(self.directory, self.path, ".rules-parsed-", entries)

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def write_cache_file(directory: Path, path: Path, prefix: str, doc) -> None:
    """Write a cache file as JSON, whole or not at all (a temporary file renamed over it,
    whoever writes at the same time); a cache that cannot be written is no error."""
    tmp = None
    if directory is None or path is None:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
        tmp = None
    except (OSError, ValueError):
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _navdoctor_version() -> str:
    from . import __version__
    return __version__


def _yaml_stamp() -> str:
    """The yaml package's files (names, sizes, times; libyaml's binding among them), found
    without importing it: another PyYAML parses again."""
    return _package_stamp("yaml")


def _validation_stamp() -> str:
    """What a validated rule's dump depends on: the models' code (rule_models.py, rule_expr.py:
    check_expression, and this file: the plain classes) and pydantic's files: either changed,
    the rule files are validated again."""
    here = Path(__file__).resolve().parent
    try:
        code = hashlib.sha256(b"".join((here / n).read_bytes()
                                       for n in ("rule_models.py", "rule_expr.py", "rules.py"))).hexdigest()
    except OSError:
        code = "?"
    return f"{code}\0{_package_stamp('pydantic')}\0{_package_stamp('pydantic_core')}"


def _package_stamp(name: str) -> str:
    """A package's own files (names, sizes, times), found without importing it."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(name)
        where = list(spec.submodule_search_locations or []) if spec else []
        return "|".join(f"{d}:" + ",".join(
            f"{e.name}:{e.stat().st_size}:{e.stat().st_mtime_ns}"
            for e in sorted(os.scandir(d), key=lambda e: e.name) if e.is_file()) for d in where)
    except (ImportError, ValueError, OSError):
        return "?"


def _json_safe(obj: Any, seen: set[int]) -> bool:
    """Whether json.loads(json.dumps(obj)) equals obj, types and sharing included."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return type(obj) in (bool, int, str, type(None))
    if isinstance(obj, float):
        return type(obj) is float and math.isfinite(obj)
    if type(obj) is list:
        if id(obj) in seen:
            return False
        seen.add(id(obj))
        return all(_json_safe(x, seen) for x in obj)
    if type(obj) is dict:
        if id(obj) in seen:
            return False
        seen.add(id(obj))
        return all(type(k) is str and _json_safe(v, seen) for k, v in obj.items())
    return False


_PARSE_CACHE: ParseCache | None = None


def _parse_cache() -> ParseCache:
    """The process's ParseCache (made again when NAVDOCTOR_CACHE_DIR changes)."""
    global _PARSE_CACHE
    if _PARSE_CACHE is None or _PARSE_CACHE.directory != cache_dir():
        _PARSE_CACHE = ParseCache()
    return _PARSE_CACHE


def _parse_yaml(text: str) -> list:
    """The YAML documents of a rule file. libyaml's parser (when PyYAML has it) is ~50x
    faster than the pure-Python one and builds the same objects (same safe constructor and
    resolver); on an error the pure-Python parser runs again so that the message is its own."""
    import yaml
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return list(yaml.load_all(text, Loader=fast))
        except yaml.YAMLError:
            pass
    return list(yaml.safe_load_all(text))


# A rule file is a few kB (the built-in ones: at most 25 kB); one over this is refused, not
# read (a link to /dev/zero read until memory ran out).
MAX_RULE_FILE_BYTES = 4 << 20


def read_rule_text(path: Path) -> str:
    """A rule file's text: a regular file (a link to one is followed), at most
    MAX_RULE_FILE_BYTES, UTF-8; RuleError naming the file otherwise."""
    import stat
    try:
        # (O_NONBLOCK: opening a named pipe would wait for a writer; a regular file ignores it)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise RuleError(str(path), None, None, "not a regular file (a device, a pipe or "
                                                       "a socket): a rule file is YAML text")
            if st.st_size > MAX_RULE_FILE_BYTES:
                raise RuleError(str(path), None, None, _too_large(st.st_size))
            data = f.read(MAX_RULE_FILE_BYTES + 1)
    except OSError as e:
        raise RuleError(str(path), None, None, f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_RULE_FILE_BYTES:   # (it grew while being read)
        raise RuleError(str(path), None, None, _too_large(len(data)))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RuleError(str(path), None, None, f"cannot read: {e}") from None


def _too_large(size: int) -> str:
    return (f"{size / 2**20:.1f} MiB: a rule file is at most {MAX_RULE_FILE_BYTES >> 20} MiB "
            "(rules are a few kB of YAML)")


def load_rule_file(path: Path) -> list[Rule]:
    text = read_rule_text(path)
    cache = _parse_cache()
    dumps = cache.validated(text)
    if dumps is not None:   # every rule of this text validated before: no pydantic
        rules = [Rule._from_dump(d) for d in dumps]
        for rule in rules:
            rule.source_file = str(path)
        return rules
    try:
        docs = cache.parse(text)
    except RecursionError:
        raise RuleError(str(path), None, None, "nested too deeply (YAML of thousands of "
                                               "levels: a rule is a flat mapping)") from None
    except Exception as e:   # (yaml is imported only where a text is parsed)
        yaml = sys.modules.get("yaml")
        if yaml is None or not isinstance(e, yaml.YAMLError):
            raise
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RuleError(str(path), None, None, f"YAML syntax error{where}: {problem}") from None
    rules = []
    for doc in docs:
        if doc is None:
            continue
        items = doc.get("rules") if isinstance(doc, dict) and "rules" in doc else doc
        for item in items if isinstance(items, list) else [items]:
            if not isinstance(item, dict):
                raise RuleError(str(path), None, None, "a rule must be a mapping of fields")
            rule_id = item.get("id") if isinstance(item.get("id"), str) else None
            from pydantic import ValidationError
            try:
                rule = Rule.model_validate(item)
            except ValidationError as e:
                err = e.errors()[0]
                raise RuleError(str(path), rule_id, _field_of(err["loc"]), err["msg"]) from None
            except RecursionError:
                raise RuleError(str(path), rule_id, None, "nested too deeply") from None
            rule.source_file = str(path)
            rules.append(rule)
    cache.keep_validated(text, [r.model_dump() for r in rules])
    return rules


def load_rules_dir(directory: Path) -> list[Rule]:
    if not directory.exists():
        raise RuleError(str(directory), None, None, "no such rules directory")
    files = [directory] if not directory.is_dir() else sorted(
        p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml"))
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for f in files:
        for rule in load_rule_file(f):
            if rule.id in seen:
                raise RuleError(str(f), rule.id, "id", f"duplicate id (also in {seen[rule.id]})")
            seen[rule.id] = str(f)
            rules.append(rule)
    return rules


def load_rules(extra_dirs: list[Path] = (), overrides: dict[str, Any] | None = None) -> list[Rule]:
    """Built-in rules, then each extra dir; a later rule with the same id replaces the earlier."""
    by_id: dict[str, Rule] = {r.id: r for r in load_rules_dir(BUILTIN_RULES_DIR)}
    for d in extra_dirs:
        for r in load_rules_dir(Path(d)):
            by_id[r.id] = r
    for key, value in (overrides or {}).items():
        rule_id, _, param = key.rpartition(".")
        if rule_id not in by_id:
            raise RuleError("--set", rule_id or key, None, "no rule with this id")
        rule = by_id[rule_id]
        if param not in rule.params:
            raise RuleError(rule.source_file or "--set", rule_id, f"params.{param}",
                            f"no such parameter (has: {', '.join(rule.params) or 'none'})")
        rule.params[param] = _coerce_like(rule.params[param], value)
    return list(by_id.values())


def _coerce_like(old: Any, value: str) -> Any:
    if isinstance(old, bool):
        return str(value).lower() in ("1", "true", "yes", "on")
    if isinstance(old, (int, float)):
        try:
            return type(old)(float(value)) if isinstance(old, float) else int(float(value))
        except ValueError:
            raise RuleError("--set", None, None, f"'{value}' is not a number") from None
    return value


# ---- SQL parameters ---------------------------------------------------------------------

_SQL_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def sql_params(rule: Rule) -> dict[str, Any]:
    """The params a rule's SQL names as $name (DuckDB named parameters)."""
    used = set(_SQL_PARAM.findall(rule.query))
    missing = used - set(rule.params)
    if missing:
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        f"uses ${sorted(missing)[0]} but params has no such entry")
    return {k: v for k, v in rule.params.items() if k in used}


def _message_value(name: str, v: Any) -> Any:
    """A metric as a message shows it: None and NaN as 0; a kernel's name (a metric named
    ..._kernel or ..._collective, as the rules name them) by its readable head, since a
    demangled C++ signature runs to kilobytes (kernelnames.display_kernel_name; the JSON's
    metrics keep it whole). Other text, such as an op sequence, is left as the rule wrote it."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return 0
    if isinstance(v, str) and name.endswith(("kernel", "collective")) and len(v) > DISPLAY_NAME_CHARS:
        return display_kernel_name(v)
    return v


def render_message(rule: Rule, values: dict[str, Any]) -> str:
    safe = {k: _message_value(k, v) for k, v in values.items()}
    try:
        return rule.message.format(**safe)
    except (KeyError, ValueError, IndexError, TypeError) as e:
        return f"{rule.title} (message template error: {e})"
