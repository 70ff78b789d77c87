"""Showing arguments to people safely: approval prompts, audit summaries, the CLI.

What a person sees must be what the capsule will run, and nothing in it may hide or
rewrite the screen:

* control characters (``\\x1b``, bare ``\\r``, NUL, C1), invisible and bidirectional
  format characters (U+200B, U+202E, U+2066-2069, tags, variation selectors, odd
  spaces) are shown as visible escapes, ``\\u{202E}``, and raise a warning;
* runs of padding are collapsed to a count (``⟨5000 x SP⟩``, shown with a times sign);
  long values are shown by length, head and tail, so nothing can be pushed off screen;
* strings mixing scripts (``apple`` spelt with a Cyrillic ``a``, U+0430) and URLs with
  non-ASCII hosts (shown in punycode) raise a warning;
* the values of secrets (``[env] secret``) are replaced by ``⟨secret NAME⟩``; the
  brackets are escaped wherever a value itself contains them, so no marker is forged.

Rendering time and size are bounded whatever the input: containers are cut after a few
items and a few levels, long strings are only scanned by regular expressions. Whatever is
cut is a warning (``not everything is shown: ...``), so an approver is never shown less
than they approve without being told; :func:`render_full` shows everything, uncut.

The :class:`Redactor` also serves what leaves the host as data or text, not for display:
event fields, error messages, results for agent code (:meth:`Redactor.value`), and console
output written in pieces (:class:`StreamRedactor`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from capsule.protocol import encode

__all__ = [
    "Rendered",
    "Redactor",
    "StreamRedactor",
    "render_arguments",
    "render_full",
    "summarize_arguments",
    "escape_text",
    "quote_text",
]

_BIDI: Final = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
_INVISIBLE_LETTERS: Final = frozenset([0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x180E])
_SUSPICIOUS: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00a0\u00ad\u034f\u061c\u115f\u1160\u1680\u180e"
    "\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164\ufe00-\ufe0f\ufeff"
    "\uffa0\ufff9-\ufffb\U000e0000-\U000e007f\U000e0100-\U000e01ef]"
)
"""Characters worth a warning anywhere in a value (scanned over the whole string)."""
_RUN: Final = re.compile(r" {8,}|\t{4,}")
_PADDING: Final = re.compile(r"[ \t]{64,}")
_URL_HOST: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://(?:[^/@\s]*@)?([^/:?#\s]+)")
_TIMES: Final = "\u00d7"
_NOT_ALL: Final = "not everything is shown: "
"""How every warning about a cut in the rendering begins."""


def _char_escape(ch: str) -> str | None:
    """The visible escape for one character, or None when it may be shown as is."""
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if ch == '"':
        return '\\"'
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if code < 0x20 or 0x7F <= code < 0xA0:
        return f"\\x{code:02x}"
    if code < 0x80:
        return None
    if ch in "⟨⟩":  # our own markers: a value can never forge one
        return f"\\u{{{code:04X}}}"
    category = unicodedata.category(ch)
    if (
        category in ("Cf", "Cc", "Co", "Cn", "Cs", "Zl", "Zp", "Zs")
        or code in _INVISIBLE_LETTERS
        or 0xFE00 <= code <= 0xFE0F
        or 0xE0100 <= code <= 0xE01EF
        or code == 0x034F
    ):
        return f"\\u{{{code:04X}}}"
    return None


def _warn_chars(text: str, warnings: set[str]) -> None:
    for match in _SUSPICIOUS.finditer(text):
        code = ord(match.group())
        if code in _BIDI:
            warnings.add("bidirectional control characters")
        elif code < 0x20 or 0x7F <= code < 0xA0:
            warnings.add("control characters (terminal escapes, carriage returns, NUL)")
        else:
            warnings.add("invisible or look-alike space characters")
    if _PADDING.search(text):
        warnings.add("long runs of spaces or tabs (padding that may push text out of view)")
    if not text.isascii():
        for ch in text[:4096]:
            code = ord(ch)
            if code >= 0x80 and code not in _BIDI and unicodedata.category(ch) in ("Co", "Cn"):
                warnings.add("invisible or look-alike space characters")
                break


def _scripts(text: str) -> set[str]:
    scripts: set[str] = set()
    for ch in text[:4096]:
        if ch.isalpha():
            if ch.isascii():
                scripts.add("LATIN")
            else:
                name = unicodedata.name(ch, "")
                if name:
                    scripts.add(name.split(" ", 1)[0])
    return scripts


def _warn_lookalikes(text: str, warnings: set[str]) -> None:
    if text.isascii():
        return
    scripts = _scripts(text)
    if len(scripts) > 1 and "LATIN" in scripts:
        warnings.add(f"mixed scripts ({', '.join(sorted(scripts))}): look-alike letters?")
    match = _URL_HOST.match(text)
    if match and not match.group(1).isascii():
        host = match.group(1)
        try:
            puny = host.encode("idna").decode("ascii")
        except UnicodeError:
            puny = "(not a valid international name)"
        warnings.add(f"a URL host with non-ASCII letters: {escape_text(host)} is {puny}")


def _escape_plain(text: str) -> str:
    return "".join(e if (e := _char_escape(ch)) is not None else ch for ch in text)


def escape_text(text: str) -> str:
    """``text`` with every character that could hide or rewrite something escaped."""
    out: list[str] = []
    last = 0
    for run in _RUN.finditer(text):
        out.append(_escape_plain(text[last : run.start()]))
        name = "SP" if run.group()[0] == " " else "TAB"
        out.append(f"⟨{len(run.group())}{_TIMES}{name}⟩")
        last = run.end()
    out.append(_escape_plain(text[last:]))
    return "".join(out)


# -- secrets ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Secret:
    name: str

    @property
    def marker(self) -> str:
        return f"⟨secret {self.name}⟩"


_Piece = str | _Secret


class Redactor:
    """Finds the values of secrets so they are shown as ``⟨secret NAME⟩``, never as is."""

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        # Longest first, so a secret containing another is replaced whole.
        items = [(name, value) for name, value in (secrets or {}).items() if value]
        self._secrets = sorted(items, key=lambda item: -len(item[1]))
        self._raw = [
            (name, value.encode("utf-8", "surrogatepass")) for name, value in self._secrets
        ]
        self._markers = {f"⟨secret {name}⟩": name for name, _ in self._secrets}
        self._by_tools: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __len__(self) -> int:
        """How many secret values this redactor finds."""
        return len(self._secrets)

    def copy(self) -> Redactor:
        """A redactor that finds the same secrets; adding to one leaves the other alone."""
        other = Redactor()
        other._secrets = list(self._secrets)
        other._raw = list(self._raw)
        other._markers = dict(self._markers)
        other._by_tools = self._by_tools
        return other

    def finds(self, name: str, value: str) -> bool:
        """Whether ``value`` is already replaced, as ``⟨secret NAME⟩``."""
        return (name, value) in self._secrets

    def set_by_tool(self, name: str) -> bool:
        """Whether the secret ``name`` was set by a tool (``ctx.set_env``), not the policy."""
        return name in self._by_tools

    def add(self, name: str, value: str, *, by_tool: bool = False) -> None:
        """Redact ``value`` from now on too, shown as ``⟨secret NAME⟩``.

        ``by_tool``: a secret a tool set for its session (the host keeps such secrets in
        a copy of its redactor made for that session, dropped when the session closes).
        """
        if by_tool:
            self._by_tools |= {name}
        if not value or (name, value) in self._secrets:
            return
        secrets = sorted([*self._secrets, (name, value)], key=lambda item: -len(item[1]))
        self._raw = [(n, v.encode("utf-8", "surrogatepass")) for n, v in secrets]
        self._markers = {f"⟨secret {n}⟩": n for n, _ in secrets}
        self._secrets = secrets

    def __repr__(self) -> str:  # names only, never values
        return f"<Redactor {[name for name, _ in self._secrets]}>"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._secrets)

    def pieces(self, text: str, *, markers: bool = False) -> list[_Piece]:
        """``text`` split into plain runs and secrets.

        With ``markers``, a marker already in the text (``⟨secret NAME⟩`` for a known
        name) is kept as that secret, so redacting twice changes nothing; the display
        leaves this off, and escapes such brackets instead (no forged markers).
        """
        pieces: list[_Piece] = [text]
        if markers and "⟨secret " in text:
            pieces = self._split_markers(text)
        for name, value in self._secrets:
            out: list[_Piece] = []
            for piece in pieces:
                if isinstance(piece, _Secret) or value not in piece:
                    out.append(piece)
                    continue
                for i, part in enumerate(piece.split(value)):
                    if i:
                        out.append(_Secret(name))
                    if part:
                        out.append(part)
            pieces = out
        return pieces

    def _split_markers(self, text: str) -> list[_Piece]:
        out: list[_Piece] = []
        last = 0
        for match in _MARKER.finditer(text):
            name = self._markers.get(match.group())
            if name is None:
                continue
            if match.start() > last:
                out.append(text[last : match.start()])
            out.append(_Secret(name))
            last = match.end()
        if last < len(text):
            out.append(text[last:])
        return out

    def text(self, text: str) -> str:
        """``text`` with secrets replaced (for plain text such as error messages)."""
        if not self._secrets:
            return text
        pieces = self.pieces(text, markers=True)
        return "".join(p.marker if isinstance(p, _Secret) else p for p in pieces)

    def data(self, data: bytes, found: set[str] | None = None) -> bytes:
        for name, raw in self._raw:
            if raw in data:
                data = data.replace(raw, f"⟨secret {name}⟩".encode())
                if found is not None:
                    found.add(name)
        return data

    def value(self, value: Any) -> Any:
        """Plain data with secrets replaced at any depth: in strings, bytes and dict keys.

        The value itself comes back (nothing copied) when no secret occurs in it. A key
        that becomes equal to another once redacted gets a ``#2`` (``#3``...) suffix, so
        no entry is lost. Types other than plain data are kept as they are.
        """
        if not self._secrets:
            return value
        kind: object = type(value)  # pyright: ignore[reportUnknownVariableType]
        if kind is str:
            return self.text(value)
        if kind is bytes:
            return self.data(value)
        if kind is not list and kind is not dict and kind is not tuple:
            return value
        if not self._occurs(value):
            return value
        return self._rebuild(value)

    def _occurs(self, value: Any) -> bool:
        """Whether a secret may occur in ``value`` (one encode, then byte searches)."""
        try:
            packed = encode(value)
        except (TypeError, ValueError, OverflowError):  # not plain, or deeper than msgpack
            return True
        return any(raw in packed for _, raw in self._raw)

    def _rebuild(self, value: Any) -> Any:
        # An explicit stack, not recursion: values may be nested as deep as the wire lets.
        root: list[Any] | dict[Any, Any] = {} if type(value) is dict else []
        stack: list[tuple[Any, list[Any] | dict[Any, Any]]] = [(value, root)]
        while stack:
            source, target = stack.pop()
            if isinstance(target, list):
                for item in cast("list[Any]", source):
                    target.append(self._child(item, stack))
            else:
                for key, item in cast("dict[Any, Any]", source).items():
                    new_key = self.text(key) if type(key) is str else key
                    if new_key in target:
                        n = 2
                        while f"{new_key}#{n}" in target:
                            n += 1
                        new_key = f"{new_key}#{n}"
                    target[new_key] = self._child(item, stack)
        return root

    def _child(self, item: Any, stack: list[tuple[Any, list[Any] | dict[Any, Any]]]) -> Any:
        kind: object = type(item)  # pyright: ignore[reportUnknownVariableType]
        if kind is str:
            return self.text(item)
        if kind is bytes:
            return self.data(item)
        if kind is list or kind is tuple or kind is dict:
            shell: list[Any] | dict[Any, Any] = {} if kind is dict else []
            stack.append((item, shell))
            return shell
        return item

    def stream(self) -> StreamRedactor:
        """A redactor for one stream of text written in pieces (console output)."""
        return StreamRedactor(self)


_MARKER: Final = re.compile(r"⟨secret [^⟩\n]{1,200}⟩")


class StreamRedactor:
    """Redacts text that arrives in pieces, so a secret split across writes is still found.

    :meth:`feed` returns what may be shown now: the text so far with secrets replaced,
    less its end when that end could be the start of a secret (``sk-`` of ``sk-123``),
    which is held back until the next piece shows whether it is. :meth:`flush` returns
    what is held when the stream ends. Text is thus delayed, never shown raw: output that
    stops in the middle of what could be a secret waits for more output, or the end.
    """

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = ""

    def use(self, redactor: Redactor) -> None:
        """Find the secrets of ``redactor`` from now on (a session's tool set its first
        secret); what is held back is scanned again with the next piece."""
        self._redactor = redactor

    @property
    def held(self) -> int:
        """Characters held back."""
        return len(self._held)

    def feed(self, text: str) -> str:
        redactor = self._redactor
        if not redactor:
            return text
        text = self._held + text
        self._held = ""
        pieces = redactor.pieces(text, markers=True)
        if pieces and isinstance(pieces[-1], str):
            last = pieces[-1]
            keep = _partial_secret(last, redactor._secrets)  # pyright: ignore[reportPrivateUsage]
            if keep:
                self._held = last[-keep:]
                pieces[-1] = last[:-keep]
        return "".join(p.marker if isinstance(p, _Secret) else p for p in pieces)

    def flush(self) -> str:
        """What is held back (the stream ended: it was not a secret after all)."""
        held, self._held = self._held, ""
        return self._redactor.text(held)


def _partial_secret(text: str, secrets: list[tuple[str, str]]) -> int:
    """The length of the longest end of ``text`` that begins some secret (but is not all of it)."""
    best = 0
    for _, value in secrets:
        start = max(0, len(text) - (len(value) - 1))
        first = value[0]
        i = text.find(first, start)
        while i != -1 and len(text) - i > best:
            if value.startswith(text[i:]):
                best = len(text) - i
                break
            i = text.find(first, i + 1)
    return best


def _length(pieces: list[_Piece]) -> int:
    return sum(len(p.marker) if isinstance(p, _Secret) else len(p) for p in pieces)


def _take(pieces: list[_Piece], count: int) -> list[_Piece]:
    """The first ``count`` characters of ``pieces``; a secret is taken whole or not at all."""
    out: list[_Piece] = []
    for piece in pieces:
        if count <= 0:
            break
        if isinstance(piece, _Secret):
            out.append(piece)
            count -= len(piece.marker)
        else:
            out.append(piece[:count])
            count -= len(piece)
    return out


def _take_last(pieces: list[_Piece], count: int) -> list[_Piece]:
    backwards = [p if isinstance(p, _Secret) else p[::-1] for p in reversed(pieces)]
    return [p if isinstance(p, _Secret) else p[::-1] for p in reversed(_take(backwards, count))]


def _show(pieces: list[_Piece]) -> str:
    return "".join(p.marker if isinstance(p, _Secret) else escape_text(p) for p in pieces)


# -- rendering -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rendered:
    """Arguments as text for people, and what about them deserves a warning."""

    text: str
    warnings: tuple[str, ...] = ()
    elided: bool = False
    """Part of the arguments is not in ``text`` (each cut is also a warning): show
    :func:`render_full` before trusting it."""


class _Renderer:
    def __init__(self, redactor: Redactor, max_str: int, max_items: int, max_depth: int) -> None:
        self.redactor = redactor
        self.max_str = max_str
        self.max_items = max_items
        self.max_depth = max_depth
        self.warnings: set[str] = set()
        self.secrets: set[str] = set()
        self.elided = False

    def elide(self, what: str) -> None:
        self.elided = True
        self.warnings.add(f"{_NOT_ALL}{what}")

    @property
    def too_deep(self) -> str:
        return f"what is nested more than {self.max_depth} levels deep is hidden"

    @property
    def too_long(self) -> str:
        return f"lists and dicts are cut after {self.max_items} entries"

    def string(self, value: str) -> str:
        _warn_chars(value, self.warnings)
        pieces = self.redactor.pieces(value)
        self.secrets.update(p.name for p in pieces if isinstance(p, _Secret))
        total = _length(pieces)
        if total <= self.max_str:
            for piece in pieces:
                if isinstance(piece, str):
                    _warn_lookalikes(piece, self.warnings)
            return f'"{_show(pieces)}"'
        head = _take(pieces, self.max_str * 2 // 3)
        tail = _take_last(pieces, self.max_str // 3)
        for piece in (*head, *tail):
            if isinstance(piece, str):
                _warn_lookalikes(piece, self.warnings)
        hidden = total - _length(head) - _length(tail)
        self.elide(f"strings longer than {self.max_str:,} chars are shown in part (head and tail)")
        return (
            f'⟨str, {len(value):,} chars⟩ "{_show(head)}" '
            f'⟨… {hidden:,} chars not shown …⟩ "{_show(tail)}"'
        )

    def bytes_(self, value: bytes) -> str:
        value = self.redactor.data(value, self.secrets)
        if len(value) <= self.max_str:
            return f'b"{_escape_bytes(value)}"'
        head, tail = value[: self.max_str * 2 // 3], value[-(self.max_str // 3) :]
        self.elide(f"bytes values over {self.max_str:,} bytes are shown in part (head and tail)")
        return (
            f'⟨bytes, {len(value):,} bytes⟩ b"{_escape_bytes(head)}" '
            f"⟨… {len(value) - len(head) - len(tail):,} bytes not shown …⟩ "
            f'b"{_escape_bytes(tail)}"'
        )

    def value(self, value: Any, depth: int = 0) -> str:
        if value is None or type(value) in (bool, int, float):
            return repr(value)
        if type(value) is str:
            return self.string(value)
        if type(value) is bytes:
            return self.bytes_(value)
        if type(value) is list:
            items = cast("list[Any]", value)
            if depth >= self.max_depth:
                self.elide(self.too_deep)
                return f"⟨list of {len(items):,} items⟩"
            shown = [self.value(v, depth + 1) for v in items[: self.max_items]]
            if len(items) > self.max_items:
                self.elide(self.too_long)
                shown.append(f"⟨… {len(items) - self.max_items:,} more items⟩")
            return "[" + ", ".join(shown) + "]"
        if type(value) is dict:
            table = cast("dict[str, Any]", value)
            if depth >= self.max_depth:
                self.elide(self.too_deep)
                return f"⟨dict of {len(table):,} keys⟩"
            shown = [
                f"{self.string(str(k))}: {self.value(v, depth + 1)}"
                for k, v in list(table.items())[: self.max_items]
            ]
            if len(table) > self.max_items:
                self.elide(self.too_long)
                shown.append(f"⟨… {len(table) - self.max_items:,} more keys⟩")
            return "{" + ", ".join(shown) + "}"
        return f"⟨{escape_text(type(value).__name__)}⟩"  # not plain data: never bound


def _escape_bytes(data: bytes) -> str:
    out: list[str] = []
    for byte in data:
        if byte == 0x5C:
            out.append("\\\\")
        elif byte == 0x22:
            out.append('\\"')
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out)


def render_arguments(
    arguments: Mapping[str, Any],
    *,
    redactor: Redactor | None = None,
    max_str: int = 300,
    max_items: int = 20,
    max_depth: int = 6,
) -> Rendered:
    """One ``name = value`` line per bound argument, escaped, bounded and redacted."""
    renderer = _Renderer(redactor or Redactor(), max_str, max_items, max_depth)
    lines = [f"{escape_text(name)} = {renderer.value(value)}" for name, value in arguments.items()]
    # What was cut comes first: it changes how far the rest of the view can be trusted.
    warnings = sorted(renderer.warnings, key=lambda w: (not w.startswith(_NOT_ALL), w))
    warnings.extend(_secret_warning(name, renderer.redactor) for name in sorted(renderer.secrets))
    return Rendered("\n".join(lines) or "(no arguments)", tuple(warnings), renderer.elided)


def _secret_warning(name: str, redactor: Redactor) -> str:
    if redactor.set_by_tool(name):
        # The policy did not name this secret: a tool of the session did, and a tool could
        # name any text so (a path, a recipient) to hide it from the approver.
        return (
            f"hides as ⟨secret {name}⟩ a value a tool of this session marked secret "
            "(ctx.set_env): the call gets the value itself, which is not shown"
        )
    return f"contains the value of the secret {name}"


def render_full(arguments: Mapping[str, Any], *, redactor: Redactor | None = None) -> str:
    """Every bound argument in full, one item per line, escaped and redacted: nothing cut.

    What :func:`render_arguments` shows in part is here whole (long strings, every item,
    every level), so it can be long: page it. Runs of padding are still written as a
    count (``⟨5000 x SP⟩``, with a times sign), which hides nothing.
    """
    r = redactor or Redactor()
    lines: list[str] = []
    for name, value in arguments.items():
        _full_lines(lines, f"{escape_text(name)} = ", value, r)
    return "\n".join(lines) or "(no arguments)"


def _full_scalar(value: Any, redactor: Redactor) -> str:
    if value is None or type(value) in (bool, int, float):
        return repr(value)
    if type(value) is str:
        return f'"{_show(redactor.pieces(value))}"'
    if type(value) is bytes:
        return f'b"{_escape_bytes(redactor.data(value))}"'
    return f"⟨{escape_text(type(value).__name__)}⟩"


_Frame = tuple[Iterator[tuple[str, Any]], str, str]
"""(the entries left, as (label, item); their indent; the closing bracket)."""


def _full_lines(lines: list[str], head: str, value: Any, redactor: Redactor) -> None:
    # An explicit stack, not recursion: arguments may be nested as deep as the wire lets.
    stack: list[_Frame] = []

    def begin(label: str, item: Any, indent: str, comma: str) -> None:
        kind: object = type(item)  # pyright: ignore[reportUnknownVariableType]
        if (kind is list or kind is tuple) and item:
            lines.append(f"{indent}{label}[")
            entries = (("", v) for v in cast("list[Any]", item))
            stack.append((iter(entries), indent + "  ", "]" + comma))
        elif kind is dict and item:
            lines.append(f"{indent}{label}{{")
            table = cast("dict[Any, Any]", item)
            keyed = ((f"{_full_scalar(str(k), redactor)}: ", v) for k, v in table.items())
            stack.append((iter(keyed), indent + "  ", "}" + comma))
        elif kind is list or kind is tuple or kind is dict:
            lines.append(f"{indent}{label}{'{}' if kind is dict else '[]'}{comma}")
        else:
            lines.append(f"{indent}{label}{_full_scalar(item, redactor)}{comma}")

    begin(head, value, "", "")
    while stack:
        entries, indent, closing = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            lines.append(f"{indent[:-2]}{closing}")
            continue
        begin(entry[0], entry[1], indent, ",")


def quote_text(text: str, *, redactor: Redactor | None = None, limit: int = 1000) -> str:
    """``text`` as quoted data (``"..."``): escaped as arguments are, secrets replaced, and
    cut to about ``limit`` characters (head and tail) when longer. For free text a person
    or a tool wrote that is passed on inside a message of the host's own."""
    return _Renderer(redactor or Redactor(), limit, 1, 1).string(text)


def summarize_arguments(
    arguments: Mapping[str, Any], *, redactor: Redactor | None = None, limit: int = 512
) -> str:
    """A one-line, redacted summary for the audit: short previews, at most ``limit`` chars."""
    renderer: _Renderer | None = None
    parts: list[str] = []
    for key, value in arguments.items():
        name = key if key.isascii() and key.isidentifier() else escape_text(key)
        kind: object = type(value)  # pyright: ignore[reportUnknownVariableType]
        if value is None or kind is bool or kind is int or kind is float:
            shown = repr(value)
        elif kind is str and not redactor and _plain_short(value):
            shown = f'"{value}"'  # what the renderer shows for it, without its work
        else:
            if renderer is None:
                renderer = _Renderer(redactor or Redactor(), 40, 4, 2)
            shown = renderer.value(value)
        parts.append(f"{name}={shown}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain_short(text: str) -> bool:
    """Short printable ASCII with nothing to escape, collapse or warn about."""
    return (
        len(text) <= 40
        and text.isascii()
        and text.isprintable()
        and "\\" not in text
        and '"' not in text
        and "        " not in text
    )
