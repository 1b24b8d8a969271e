"""Griffe extension: render the docstrings' house idioms as Markdown.

The library's Google-style docstrings use two reST idioms that Markdown
does not know, literal blocks introduced by ``::`` and roles such as
``:func:`fit```, and one Google-style liberty: several arguments sharing
one entry (``first_loss, last_loss: [C] host arrays.``). This extension
rewrites each docstring's text before mkdocstrings parses it: a ``::``
block becomes a fenced Python block, a role becomes inline code, and a
shared entry becomes one entry per name with the same description. The
source files are not touched.
"""

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|mod|class|data|meth|attr|obj|exc|const):`~?([^`]+)`")
_SECTION_LIKE = re.compile(r"^(\s*)(\w+)::\s*$")
_ARGS_TITLE = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Attributes|Other Parameters):\s*$")
_NAMES_WRAPPED = re.compile(r"^(\s+)(\*{0,2}\w+(?:,\s*\*{0,2}\w+)*),\s*$")
_SHARED_ENTRY = re.compile(r"^(\s+)(\*{0,2}\w+(?:,\s*\*{0,2}\w+)+):(.*)$")


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


def _convert_literal_blocks(text: str) -> str:
  lines = text.splitlines()
  out = []
  i = 0
  while i < len(lines):
    line = lines[i]
    if not line.rstrip().endswith("::"):
      out.append(line)
      i += 1
      continue
    base = _indent(line)
    j = i + 1
    while j < len(lines) and not lines[j].strip():
      j += 1
    if j == len(lines) or _indent(lines[j]) <= base:
      out.append(line)
      i += 1
      continue
    block = []
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
      block.append(lines[j])
      j += 1
    while block and not block[-1].strip():
      block.pop()
    strip = min(_indent(b) for b in block if b.strip())
    pad = " " * base
    section_like = _SECTION_LIKE.match(line)
    if section_like:
      # "Example::" would read as a Google section title.
      out.append(f"{pad}*{section_like.group(2)}:*")
    elif line.strip() != "::":
      out.append(line.rstrip()[:-1])
    out.append("")
    out.append(f"{pad}```python")
    out.extend(pad + b[strip:] if b.strip() else "" for b in block)
    out.append(f"{pad}```")
    out.append("")
    i = j
  return "\n".join(out)


def _split_shared_entries(text: str) -> str:
  lines = text.splitlines()
  out = []
  i = 0
  section_indent = None
  while i < len(lines):
    line = lines[i]
    title = _ARGS_TITLE.match(line)
    if title:
      section_indent = len(title.group(1))
      out.append(line)
      i += 1
      continue
    if section_indent is not None and line.strip() and _indent(line) <= section_indent:
      section_indent = None
    if section_indent is not None:
      # A name list wrapped onto the next line(s): "a, b,\n    c: ...".
      while (_NAMES_WRAPPED.match(line) and i + 1 < len(lines)
             and _indent(lines[i + 1]) > _indent(line)):
        line = line.rstrip() + " " + lines[i + 1].strip()
        lines[i + 1] = line
        i += 1
    shared = _SHARED_ENTRY.match(line) if section_indent is not None else None
    if not shared:
      out.append(line)
      i += 1
      continue
    pad = shared.group(1)
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > len(pad)):
      j += 1
    continuation = lines[i + 1:j]
    while continuation and not continuation[-1].strip():
      continuation.pop()
    for name in shared.group(2).split(","):
      out.append(f"{pad}{name.strip()}:{shared.group(3)}")
      out.extend(continuation)
    out.extend([""] * (j - i - 1 - len(continuation)))
    i = j
  return "\n".join(out)


class RstCompat(griffe.Extension):
  """Rewrites literal blocks, roles and shared entries in every docstring."""

  def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
    del kwargs
    if obj.docstring is None:
      return
    value = _split_shared_entries(_convert_literal_blocks(obj.docstring.value))
    obj.docstring.value = _ROLE.sub(r"`\1`", value)
