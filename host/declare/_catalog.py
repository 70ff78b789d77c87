"""Declarations on demand: a search over the scope, one tool's or one file's stub, an index.

A project with hundreds of tools cannot put every declaration in the model's context.
The catalog lets the agent ask instead: :meth:`Catalog.search` ranks tools for a
plain-language query (names, docstrings, parameters), :meth:`Catalog.declaration` renders
the declarations of one tool or one tool file (with every type they mention, as the model
block would), and :meth:`Catalog.index` is the short text that replaces the model block:
how to search, and what files there are.

Ranking is BM25 over weighted fields (the tool's name counts most, then its file, its
summary, then its parameters, then what the file's other tools on the same thing say of
it), on words cut to a crude stem so that "refunds", "refunded" and "refunding" meet.
No model: what a tool's name and docstring say is what finds it, with one aid: what the
query asks to be done. Its verbs, the verbs its everyday words stand for (remove,
cancel, revoke: delete; change, edit, set: update; ...), its two-word verbs ("push it
back": reschedule) and, for a question, the verbs that read, make the tools whose names
begin with one of them rank above their neighbours: the tools of one thing
(``get_coupon``, ``delete_coupon``) differ mostly in that. In code mode these answer
``await toolhost.search(...)`` and ``await toolhost.declaration(...)``
(:data:`HELPERS_PYI`); over MCP the tools of ``serve --expose code``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Final

from host.errors import InvalidArguments

from ._model import ScopeModel, ToolDecl, TypeDecl
from ._render import HEADER, render_model, signature

__all__ = ["Catalog", "HELPERS", "HELPERS_PYI", "MAX_QUERY", "MAX_RESULTS", "helper_call", "words"]

HELPERS: Final = ("toolhost.search", "toolhost.declaration")
"""The names code mode's helpers are called by on the wire: never a tool's name (an export
called ``toolhost`` is only ``tools.FILE.toolhost``)."""

HELPERS_PYI: Final = '''
class toolhost:
    """Find and read the declarations of this project's tools."""

    @staticmethod
    async def search(query: str, limit: int = 5) -> list[dict[str, str]]:
        """The tools that best match what you want to do, best first: each a dict with
        "name" (how to call it), "declaration" (its signature) and "summary"."""

    @staticmethod
    async def declaration(name: str) -> str:
        """The full declarations of one tool (its name) or of one tool file (the file
        name): signatures, docstrings and the types they use."""
'''
"""The helpers' stub, added to the declarations' ``.pyi`` where agent code is checked."""

MAX_QUERY: Final = 1000
"""Characters a search query may have."""
MAX_RESULTS: Final = 50
"""Results one search may return."""

_WEIGHTS: Final = {"name": 3.0, "file": 1.5, "summary": 1.0, "params": 0.5, "kin": 0.5}
"""How much a word counts in each field of a tool; ``kin`` is what the other tools of its
file on the same thing say (:meth:`Catalog._kin`)."""
_K1: Final = 1.2
_B: Final = 0.75
_WORD: Final = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_STOP: Final = frozenset(
    {"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "i"}
    | {"in", "is", "it", "its", "me", "my", "of", "on", "or", "our", "so", "that", "the"}
    | {"their", "them", "then", "there", "these", "they", "this", "to", "us", "was", "we"}
    | {"what", "when", "where", "which", "who", "will", "with", "you", "your", "any"}
    | {"can", "do", "does", "how", "into", "one", "some"}
)
_VERBS: Final = {
    "delete": "remove erase drop cancel revoke destroy discard purge withdraw deactivate",
    "create": "add new make register open file log write submit start",
    "update": "change edit modify set raise lower rename adjust increase decrease correct",
    "search": "find look query lookup",
    "get": "fetch read show view detail see check retrieve",
    "list": "all every browse enumerate",
    "archive": "hide shelve retire",
    "send": "email mail deliver dispatch",
    "reschedule": "move postpone delay shift",
    "forward": "relay",
    "launch": "start begin",
    "close": "finish finished complete completed end done resolve",
    "restart": "reboot",
    "merge": "combine",
    "reconcile": "match balance",
    "book": "reserve hire rent",
    "fulfil": "ship dispatch fulfill",
    "enroll": "enrol register",
    "quarantine": "isolate contain",
    "publish": "announce",
    "track": "follow trace locate",
    "reserve": "hold",
    "approve": "accept",
    "assign": "allocate delegate",
    "forecast": "predict",
    "share": "grant",
}
"""Everyday words for the verbs tool names begin with: a query word on the right also
counts, at half weight, as the verb on the left, and makes a tool named with that verb
rank above its neighbours (:data:`_INTENT_BOOST`). The verbs are the common ones of
resource APIs; a word stands for one only where a user would mean it so, and a word
that is as often a noun ("post", "issue", "record") stands for none."""
_PHRASES: Final = {
    ("look", "up"): "get",
    ("give", "back"): "refund",
    ("pay", "back"): "refund",
    ("send", "back"): "return",
    ("set", "up"): "provision create",
    ("sign", "up"): "enroll register create",
    ("sign", "off"): "approve",
    ("put", "aside"): "reserve",
    ("set", "aside"): "reserve",
    ("push", "back"): "reschedule",
    ("bring", "forward"): "reschedule",
    ("hand", "over"): "assign",
    ("pass", "on"): "forward",
    ("turn", "off"): "update disable",
    ("turn", "on"): "update enable",
    ("switch", "off"): "update disable",
    ("switch", "on"): "update enable",
    ("write", "down"): "create note",
    ("kick", "off"): "launch start",
    ("roll", "out"): "deploy create",
    ("take", "down"): "delete",
    ("get", "rid"): "delete",
    ("claim", "back"): "expense create",
    ("wrap", "up"): "close",
}
"""Two-word verbs (and what they mean, as the verbs of :data:`_VERBS` and others tool
names use): the words alone say something else."""
_SPLIT: Final = 4
"""How far apart the words of a two-word verb may be ("hand the Acme lead over")."""
_NOT: Final = frozenset({"not", "without", "never", "dont", "don", "no", "nor", "instead"})
"""Words after which the next word is not what the user wants done ("hide, without
deleting")."""
_EVERY: Final = frozenset(
    {"day", "days", "daily", "week", "weeks", "weekly", "month", "months", "monthly", "year"}
    | {"years", "morning", "evening", "night", "hour", "hours", "monday", "tuesday"}
    | {"wednesday", "thursday", "friday", "saturday", "sunday", "weekday", "weekend"}
)
"""Words that make ``every`` a schedule ("every Monday") rather than all of something."""
_READING: Final = frozenset({"get", "list", "search", "find", "fetch", "show", "view", "read"})
"""Verbs of tools that only read: what a question asks for when it names no verb."""
_QUESTIONS: Final = frozenset(
    {"what", "who", "whom", "whose", "which", "when", "where", "how", "why", "is", "are"}
    | {"was", "were", "will", "does", "did", "do", "can", "has", "have"}
)
_ALSO_WEIGHT: Final = 0.5
"""How much a verb a query word stands for counts, beside the word itself (1)."""
_INTENT_BOOST: Final = 1.0
"""How much more a tool scores when its name begins with a verb the query asks for
(a word of the query, a word standing for it, or a two-word verb): among the tools of one
record (``get_coupon``, ``send_coupon``, ``delete_coupon``) what the user wants done is
what tells them apart."""
_INDEX_NAMES: Final = 60
"""Characters of tool names the index shows per file."""


def _stem(word: str) -> str:
    """A crude stem: plurals and the common verb endings cut, so word forms meet."""
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + keep
            break
    else:
        if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
            word = word[:-1]
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def words(text: str) -> list[str]:
    """The stems of ``text``'s words, stop words left out (``snake_case`` and ``camelCase``
    split)."""
    out: list[str] = []
    for raw in _WORD.findall(text):
        word = raw.lower()
        if word not in _STOP:
            out.append(_stem(word))
    return out


def _also() -> dict[str, frozenset[str]]:
    also: dict[str, set[str]] = {}
    for verb, said in _VERBS.items():
        for word in said.split():
            also.setdefault(_stem(word), set()).add(_stem(verb))
    return {word: frozenset(verbs) for word, verbs in also.items()}


_ALSO: Final = _also()
_PHRASE_VERBS: Final = {
    pair: frozenset(_stem(verb) for verb in verbs.split()) for pair, verbs in _PHRASES.items()
}


def _query_terms(query: str) -> tuple[dict[str, float], frozenset[str]]:
    """The query's stems with their weights (1, and 0.5 for a verb a word stands for), and
    the verbs it asks for (:data:`_INTENT_BOOST`): its words, the verbs they stand for, its
    two-word verbs, or, for a question that names no verb, the verbs that read."""
    terms: dict[str, float] = {}
    asked: set[str] = set()
    raw = [word.lower() for word in _WORD.findall(query)]
    kept: list[str] = []
    phrased: set[str] = set()
    particles: set[int] = set()
    for n, word in enumerate(raw):
        if n in particles:
            continue  # the second word of a two-word verb
        if n and raw[n - 1] in _NOT:
            continue  # "without deleting": not a word of what is wanted
        # "send back", also split: "push the reminder back"
        later = range(n + 1, min(n + 1 + _SPLIT, len(raw)))
        found = next((m for m in later if (word, raw[m]) in _PHRASE_VERBS), None)
        if found is not None:
            phrased.update(_PHRASE_VERBS[word, raw[found]])
            particles.add(found)
        elif word == "every" and n + 1 < len(raw) and raw[n + 1] in _EVERY:
            kept.append("schedule")
        else:
            kept.append(word)
    for term in words(" ".join(kept)):
        terms[term] = max(terms.get(term, 0.0), 1.0)
        asked.add(term)
        for verb in _ALSO.get(term, ()):
            terms[verb] = max(terms.get(verb, 0.0), _ALSO_WEIGHT)
            asked.add(verb)
    for verb in phrased:
        asked.add(verb)
        terms[verb] = max(terms.get(verb, 0.0), _ALSO_WEIGHT)
    if raw and raw[0] in _QUESTIONS:
        asked.update(_stem(verb) for verb in _READING)
    return terms, frozenset(asked)


def _verb(tool: ToolDecl) -> str | None:
    """The stem of the verb a tool's name begins with (``send`` of ``send_invoice``), if
    its name has more than one word."""
    parts = _WORD.findall(tool.member or tool.export)
    return _stem(parts[0].lower()) if len(parts) > 1 else None


def _call_name(tool: ToolDecl) -> str:
    """How agent code calls the tool: its global, or its place under ``tools``."""
    return tool.name if tool.installed else tool.qualified


def _first_line(text: str | None) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


class Catalog:
    """The search index and stub renderer of one scope (built once, read many times)."""

    def __init__(self, scope: ScopeModel) -> None:
        self._scope = scope
        self._tools = scope.tools
        self._by_call: dict[str, ToolDecl] = {}
        for tool in scope.tools:
            for alias in (tool.name, tool.qualified, _call_name(tool)):
                self._by_call.setdefault(alias, tool)
        self._files: dict[str, list[ToolDecl]] = {}
        for tool in scope.tools:
            self._files.setdefault(tool.file, []).append(tool)
        self._types = {t.name: t for t in scope.types}
        # BM25F: per tool, weighted term frequencies and a weighted length.
        self._tf: list[dict[str, float]] = []
        self._verbs: list[str | None] = []
        self._len: list[float] = []
        df: Counter[str] = Counter()
        summaries = [words(tool.summary or tool.docstring or "") for tool in scope.tools]
        kin = self._kin(scope.tools, summaries)
        for n, tool in enumerate(scope.tools):
            fields = {
                "name": words(tool.export + " " + (tool.member or "")),
                "file": words(tool.file),
                "summary": summaries[n],
                "params": words(" ".join(f"{p.name} {p.description or ''}" for p in tool.params)),
                "kin": kin[n],
            }
            tf: dict[str, float] = {}
            for field_name, terms in fields.items():
                weight = _WEIGHTS[field_name]
                for term in terms:
                    tf[term] = tf.get(term, 0.0) + weight
            self._tf.append(tf)
            self._verbs.append(_verb(tool))
            self._len.append(sum(tf.values()))
            df.update(tf.keys())
        count = len(scope.tools)
        self._avg = (sum(self._len) / count) if count else 1.0
        self._idf = {t: math.log(1 + (count - n + 0.5) / (n + 0.5)) for t, n in df.items()}

    @staticmethod
    def _kin(tools: Sequence[ToolDecl], summaries: Sequence[list[str]]) -> list[list[str]]:
        """Per tool, the words the other tools of its file on the same thing use in their
        summaries (each once), and it does not: the thing of ``delete_coupon`` is
        ``coupon``, and what ``get_coupon`` says a coupon is (a discount code) finds the
        other coupon tools too, whose own docstrings need not say it again."""
        things: dict[tuple[str, str], list[int]] = {}
        for n, tool in enumerate(tools):
            parts = [part.lower() for part in _WORD.findall(tool.member or tool.export)]
            if len(parts) > 1:
                things.setdefault((tool.file, _stem("_".join(parts[1:]))), []).append(n)
        # Words many things' summaries use say what the tool does, not what its thing
        # is ("newest first" of every list tool): they stay with their own tools.
        users: Counter[str] = Counter()
        for members in things.values():
            users.update({word for n in members for word in summaries[n]})
        common = max(2, len(things) // 10)
        out: list[list[str]] = [[] for _ in tools]
        for members in things.values():
            if len(members) < 2:
                continue
            for n in members:
                own = set(summaries[n])
                said: set[str] = set()
                for other in members:
                    if other != n:
                        said.update(summaries[other])
                out[n] = sorted(word for word in said - own if users[word] <= common)
        return out

    # -- search ---------------------------------------------------------------------------

    def search(self, query: str, limit: int = 5) -> list[dict[str, str]]:
        """The ``limit`` tools that best match ``query``, best first: each a dict with
        ``name`` (how code calls it), ``declaration`` (its signature) and ``summary``.
        A query naming a tool exactly puts that tool first. Raises
        :class:`InvalidArguments` for a query that is not a string of at most
        :data:`MAX_QUERY` characters, or a limit outside 1..:data:`MAX_RESULTS`."""
        if not isinstance(query, str) or not query.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidArguments("toolhost.search", "the query is a non-empty string")
        if len(query) > MAX_QUERY:
            raise InvalidArguments(
                "toolhost.search", f"the query is {len(query)} characters; at most {MAX_QUERY}"
            )
        if type(limit) is not int or not 1 <= limit <= MAX_RESULTS:
            raise InvalidArguments(
                "toolhost.search", f"limit is an int from 1 to {MAX_RESULTS}", parameter="limit"
            )
        terms, asked = _query_terms(query)
        scores: list[tuple[float, int]] = []
        for i, tf in enumerate(self._tf):
            score = 0.0
            norm = _K1 * (1 - _B + _B * self._len[i] / self._avg)
            for term, weight in terms.items():
                f = tf.get(term)
                if f:
                    score += weight * self._idf[term] * f * (_K1 + 1) / (f + norm)
            if score > 0:
                if self._verbs[i] in asked:
                    score *= 1 + _INTENT_BOOST
                scores.append((score, i))
        exact = self._by_call.get(query.strip())
        scores.sort(key=lambda s: (-s[0], s[1]))
        ranked = [self._tools[i] for _, i in scores]
        if exact is not None:
            ranked = [exact, *(t for t in ranked if t is not exact)]
        return [self._hit(tool) for tool in ranked[:limit]]

    @staticmethod
    def _hit(tool: ToolDecl) -> dict[str, str]:
        name = _call_name(tool)
        shown = tool.member if tool.member is not None else name.rpartition(".")[2]
        head = signature(tool, shown).removesuffix(":")
        if name != shown:
            head = head.replace(f"def {shown}(", f"def {name}(", 1)
        return {"name": name, "declaration": head, "summary": _first_line(tool.summary)}

    # -- declarations ---------------------------------------------------------------------

    def declaration(self, name: str) -> str:
        """The declarations of the tool ``name`` (as code calls it, or its canonical name)
        or of every tool of the file ``name`` (``crm`` or ``tools.crm``), with the types
        they mention, as the model block renders them. Raises :class:`InvalidArguments`
        naming the nearest tools when there is no such tool or file."""
        if not isinstance(name, str) or not name or len(name) > MAX_QUERY:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidArguments(
                "toolhost.declaration", "give the name of a tool or of a tool file"
            )
        key = name.strip()
        tool = self._by_call.get(key)
        chosen = [tool] if tool is not None else self._files.get(key.removeprefix("tools."), [])
        if not chosen:
            near = ", ".join(hit["name"] for hit in self.search(key.replace(".", " "), 3))
            raise InvalidArguments(
                "toolhost.declaration",
                f"no tool or tool file is called {name!r}"
                + (f"; the nearest tools: {near}" if near else "")
                + " (toolhost.search finds tools by what they do)",
            )
        sub = ScopeModel(tuple(chosen), tuple(self._types_of(chosen)), self._scope.pyright)
        return render_model(sub).split("\n", len(HEADER) + 1)[-1]

    def _types_of(self, tools: Iterable[ToolDecl]) -> list[TypeDecl]:
        """The referenced types the tools' signatures use, directly or through another
        type, in the scope's (dependency) order."""
        wanted: set[str] = set()
        todo: list[str] = []
        for tool in tools:
            todo += [p.type for p in tool.params]
            todo.append(tool.returns)
        while todo:
            for word in re.findall(r"[A-Za-z_]\w*", todo.pop()):
                decl = self._types.get(word)
                if decl is not None and word not in wanted:
                    wanted.add(word)
                    todo += [f.type for f in decl.fields]
                    todo += [decl.value or "", *decl.constraints]
        return [t for t in self._scope.types if t.name in wanted]

    # -- the index ------------------------------------------------------------------------

    def index(self) -> str:
        """What replaces the model block when the declarations are read on demand: the
        header, how to find and read tools, and each file with its tool count and names
        (cut to a line)."""
        count = len(self._tools)
        lines = [
            *HEADER,
            f"# This project has {count} tools in {len(self._files)} files. Their "
            "declarations are not listed here: find them when you need them.",
            '# `await toolhost.search("what you want to do", limit=5)` returns the best '
            'matches, each {"name", "declaration", "summary"};',
            '# `print(await toolhost.declaration("NAME"))` shows the full declarations '
            "of one tool, or of every tool in one file (its file name).",
            "# Call a tool by the name search returns: `await NAME(...)`.",
            "",
            "# Files: name (tools): some of their tools",
        ]
        for file, tools in self._files.items():
            names: list[str] = []
            used = 0
            for tool in tools:
                call = _call_name(tool)
                if used + len(call) > _INDEX_NAMES:
                    names.append("...")
                    break
                names.append(call)
                used += len(call) + 2
            lines.append(f"# {file} ({len(tools)}): {', '.join(names)}")
        return "\n".join(lines) + "\n"


def helper_call(catalog: Catalog, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Answer one call of a code-mode helper (``toolhost.search``, ...). Raises
    :class:`InvalidArguments` for arguments the helper does not take."""
    params = ("query", "limit") if name == "toolhost.search" else ("name",)
    if len(args) > len(params):
        raise InvalidArguments(name, f"takes at most {len(params)} arguments")
    bound: dict[str, Any] = dict(zip(params, args, strict=False))
    for key, value in kwargs.items():
        if key not in params or key in bound:
            raise InvalidArguments(name, f"unexpected or repeated argument {key!r}")
        bound[key] = value
    if params[0] not in bound:
        raise InvalidArguments(name, f"missing the argument {params[0]!r}")
    if name == "toolhost.search":
        return catalog.search(bound["query"], bound.get("limit", 5))
    return catalog.declaration(bound["name"])
