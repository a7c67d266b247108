"""Text from a trace, a rule file or a file name, made safe for where it is shown.

Kernel names, rule titles and messages, remedies and file names are data: none of what they
hold may act on the medium that shows them.

- A terminal (`terminal_text`): control characters (ESC and the C1 controls that start
  escape sequences: colours, the window title, the clipboard via OSC 52, hyperlinks via OSC
  8; carriage returns and newlines that would overwrite or fake a line; DEL) and the Unicode
  bidirectional overrides that reorder what is read are shown as escapes (`\\x1b`, `\\u202e`).
- Markdown (`markdown_text`, `markdown_code`): on GitHub a name holding `<!--` hid the rest
  of a step summary, and `<img>`, `[text](url)`, `|` or a backtick would add markup. Every
  character Markdown or HTML could read as markup is escaped (CommonMark lets any ASCII
  punctuation be escaped with a backslash), line breaks become spaces, and a code span is
  fenced with more backticks than it holds, so that the text shows exactly as it is.
"""
from __future__ import annotations

import re

# C0 controls but tab, DEL, the C1 controls, and the bidirectional overrides and isolates
# (U+202A-U+202E, U+2066-U+2069), plus the line and paragraph separators.
_UNSAFE_TERMINAL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_text(text: str) -> str:
    """One line of text that shows as it is on a terminal: no control character reaches it."""
    text = str(text)
    return _UNSAFE_TERMINAL.sub(_escape, text) if _UNSAFE_TERMINAL.search(text) else text


def terminal_lines(text: str) -> list[str]:
    """Text of several lines (a remedy's code), each made safe (terminal_text)."""
    return [terminal_text(line) for line in str(text).splitlines()]


# What Markdown (CommonMark, GitHub's extensions: tables, strikethrough, math) or the HTML
# inside it can read as markup anywhere in a line; and what can start a block (a list, a
# heading, a quote, a rule) where the text starts a line.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~$#])")
_LINE_BREAKS = re.compile("[\r\n\u2028\u2029\x0b\x0c\x85]+")


def markdown_text(text: str, line_start: bool = True) -> str:
    """Plain text for a Markdown document: shown as it is, inside a paragraph, a list item
    or a table cell, never read as markup. line_start: the text may start a line (what
    would start a block there is escaped too)."""
    text = terminal_text(_LINE_BREAKS.sub(" ", str(text)))
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", text)
    return _block_start_escaped(text) if line_start else text


_CODE_SPAN = re.compile(r"`([^`]+)`")


def markdown_inline(text: str) -> str:
    """markdown_text, where what the text holds between two backticks (navdoctor's notes and
    rules quote commands so: `navdoctor verify`) becomes a code span (markdown_code): shown
    as it is too, since nothing inside a code span is markup."""
    text = _LINE_BREAKS.sub(" ", str(text))
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(markdown_text(text[pos:m.start()], line_start=pos == 0))
        out.append(markdown_code(m.group(1)))
        pos = m.end()
    out.append(markdown_text(text[pos:], line_start=pos == 0))
    return "".join(out)


def _block_start_escaped(text: str) -> str:
    """What would start a block where the text starts a line: a list item ('- ', '+ ',
    '1. ', '1) '), or a line of '-' or '=' alone (a rule, a heading's underline)."""
    m = re.match(r"(\s*)([-+])(\s|$)", text) or re.match(r"(\s*\d{1,9})([.)])(\s|$)", text) \
        or re.match(r"(\s*)([-=])[-=\s]*$", text)
    if m:
        return m.group(1) + "\\" + text[m.end(1):]
    return text


def markdown_code(text: str) -> str:
    """A code span holding text (its first line): fenced with one more backtick than the
    longest run inside, padded where it starts or ends with a backtick."""
    text = terminal_text(_LINE_BREAKS.sub(" ", str(text)))
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_block(text: str, lang: str = "") -> list[str]:
    """A fenced code block holding text: its fence one backtick longer than the longest run
    inside (at least three), so the text cannot close it."""
    lines = terminal_lines(str(text).rstrip())
    fence = "`" * max(3, 1 + max((len(r) for line in lines for r in re.findall(r"`+", line)), default=0))
    return [fence + lang, *lines, fence]
