"""Library docstrings hold no measurements: no timings, no speed-ups, no
throughputs, no measured accuracies, no "jax 0.N ran ... slower".

Docstrings say what a function computes and why; what was measured, with
its jax version, machine and commit, lives in ``experiments/perf_notes.md``
or ``experiments/results/*.md`` (the policy table's ``measured=`` fields
name where). A compatibility fact ("jax >= 0.6 removed option X") is not a
measurement and passes. Config module docstrings (``experiments/configs``)
follow big_vision: the commands and at most one ``Expected:`` line with its
number.

Only the docstrings are read (``ast``), not comments, and nothing is
imported, so the test takes well under a second.
"""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The installed library: the package, the two folders installed as
# fedjax_dd.kernels and fedjax_dd.models, and the experiments' glue (not
# the lab: bench/, reference/ and results/ are free to hold figures).
LIBRARY_GLOBS = ("fedjax_dd/**/*.py", "kernels/*.py", "models/*.py",
                 "experiments/*.py", "experiments/configs/*.py")
CONFIG_DIR = "experiments/configs/"

_NUM = r"\d+(?:[.,]\d+)*"
_RANGE = rf"~?{_NUM}(?:\s*(?:-|–|to)\s*{_NUM})?"
_SPEED = r"(?:faster|slower|speed-?ups?|cheaper|as fast|as slow)"
_VERSION = r"\bjax[ -]?(?:==\s*)?0\.\d+(?:\.\d+|\.x)*"

# Each pattern: (name, regex). Matched against one docstring with its
# whitespace collapsed, so that a figure split over two lines still counts.
PATTERNS = (
    # "took 190 s", "6.0 vs 0.42 s per step", "448-490 ms", "30.5 seconds";
    # an "s" after a number in a sentence is a timing. Durations that are
    # settings are written as settings (``max_wall_seconds = 1800``).
    ("timing", re.compile(
        rf"(?<![\w.^*/]){_RANGE}\s*(?:s|ms|µs|us|sec|secs|seconds|min|"
        rf"minutes|hours?)\b(?!\s*[/=])(?!-)", re.I)),
    # "14x slower", "1.25x faster", "1.3-1.4x faster", "35-60× slower".
    ("speed-up", re.compile(
        rf"{_RANGE}\s*[x×]\s*(?:the\s+)?{_SPEED}", re.I)),
    # "ran at about 6 GFLOP/s", "2,000 images/s".
    ("throughput", re.compile(
        rf"{_NUM}\s*(?:[GMT]FLOP/s|GFLOPS|(?:images|examples|steps|"
        rf"clients|samples)\s*(?:/|per)\s*(?:s|sec|second))\b", re.I)),
    # "jax 0.5.3 ran ... slower", "on jax 0.12 the round was 1.19x slower":
    # a version followed, within the sentence, by a speed word.
    ("jax version and speed", re.compile(
        rf"{_VERSION}(?:(?!\.\s)[^;:]){{0,60}}?\b{_SPEED}", re.I)),
    # "faster on jax 0.5.3 and 0.12": the speed word first.
    ("speed and jax version", re.compile(
        rf"\b{_SPEED}\b[^.;:]{{0,25}}?\bon\s+{_VERSION}", re.I)),
)

# A measured accuracy: "the student reached 0.756", "accuracy is 0.967",
# "took DisUE from 0.558". Allowed in a config's one "Expected" paragraph
# (not a target such as KIP's "target accuracy 0.999").
ACCURACY = ("accuracy", re.compile(
    r"(?<!target )\b(?:accuracy|accuracies|reached|measured|gave|scored|"
    r"took \w+ from)\b[^.;]{0,40}?(?<![\w.(])0\.\d{2,4}\b", re.I))

# A config docstring's one expected result: the paragraph that begins with
# "Expected" (its number and the results file it comes from).
_EXPECTED = re.compile(r"\bExpected\b[^\n]*(?:\n(?!\s*\n)[^\n]*)*")


def library_files(root: str = ROOT) -> list[str]:
  """Paths (relative to ``root``) of the library modules checked here."""
  paths = set()
  for pattern in LIBRARY_GLOBS:
    for path in glob.glob(os.path.join(root, pattern), recursive=True):
      paths.add(os.path.relpath(path, root).replace(os.sep, "/"))
  return sorted(paths)


def docstrings(source: str) -> list[tuple[str, int, str]]:
  """``(name, line, text)`` of every module, class and function docstring."""
  tree = ast.parse(source)
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)):
      continue
    text = ast.get_docstring(node, clean=True)
    if text:
      name = getattr(node, "name", "<module>")
      found.append((name, node.body[0].lineno, text))
  return found


def measurements(source: str, path: str) -> list[str]:
  """One line per measurement found in the docstrings of ``source``.

  Args:
    source: a Python module's text.
    path: its path relative to the repository root (``experiments/configs/``
      paths get the one ``Expected:`` paragraph).

  Returns:
    ``"path:line name: pattern: 'match'"`` entries; empty when clean.
  """
  found = []
  is_config = path.startswith(CONFIG_DIR)
  for name, line, text in docstrings(source):
    rest = text
    if is_config and name == "<module>":
      expected = _EXPECTED.findall(text)
      if len(expected) > 1:
        found.append(f"{path}:{line} {name}: {len(expected)} 'Expected' "
                     "paragraphs, at most one")
      rest = _EXPECTED.sub(" ", text)
    for (pattern_name, pattern), where in (
        [(p, text) for p in PATTERNS] + [(ACCURACY, rest)]):
      for match in pattern.finditer(" ".join(where.split())):
        found.append(f"{path}:{line} {name}: {pattern_name}: "
                     f"{match.group(0)!r}")
  return found


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def test_the_library_modules_are_found():
  files = library_files()
  for expected in ("fedjax_dd/policy.py", "models/layers.py",
                   "kernels/blocking.py", "experiments/common.py",
                   "experiments/configs/quickstart.py"):
    assert expected in files
  assert not any(f.startswith(("experiments/bench/", "experiments/reference/",
                               "experiments/results/")) for f in files)


def test_library_docstrings_hold_no_measurements():
  found = []
  for path in library_files():
    found += measurements(_read(path), path)
  assert not found, (
      "Measurements in docstrings (move them, with jax version, machine "
      "and commit, to experiments/perf_notes.md or experiments/results/, "
      "and say what and why here):\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "XLA:CPU (jax 0.5.3) ran the generator step about 14x slower.",
    "the full SVDs took 190 s on 2 loaded cores",
    "(LeNet-5 SGD step: ~290 ms vs ~11 ms in a scan)",
    "the engine's round ran 1.3-1.4x faster than with lax's",
    "the convolution runs at about 6 GFLOP/s per core",
    "On jax 0.12 the same change made the round slower.",
    "True on CPU, where it was measured faster on jax 0.5.3 and 0.12.",
    "one client-step: 448-490 ms before, 249-257 after",
    "the student reached 0.756, while AE reached over 0.93",
])
def test_measurements_are_caught(text):
  source = f'"""Module.\n\n{text}\n"""\n'
  assert measurements(source, "fedjax_dd/x.py")


@pytest.mark.parametrize("text", [
    "``jax.shard_map`` from jax 0.7 on; jax 0.5.3 has only the experimental "
    "one.",
    "neural-tangents imports only with jax < 0.6.",
    "Options come and go (jax 0.10 removed ``xla_cpu_use_thunk_runtime``).",
    "XLA:CPU runs a rolled while loop of these steps much slower than "
    "separate programs, so the steps are a host loop.",
    "every dense layer of a ``[C, B, H, W, Ch]`` batch; 28x28 images, 8x8.",
    "``max_seconds``: the wall-clock budget (``0``: none).",
    "a 4 GiB budget admits blocks of 14 x 14 images",
    "KIP stops at target accuracy 0.999, at most 3000 iterations.",
    "as many rounds as fit in ``run.max_wall_seconds = 1800``",
])
def test_facts_and_reasons_pass(text):
  source = f'"""Module.\n\n{text}\n"""\n'
  assert not measurements(source, "fedjax_dd/x.py")


def test_a_config_keeps_one_expected_number():
  one = ('"""A config.\n\n  fedjax-dd --config=x.py:a --workdir=/tmp/a\n\n'
         "Expected: final test accuracy about 0.68 (30 rounds, seeds 0-2, "
         '0.684 ± 0.058; experiments/results/x.md).\n"""\n')
  assert not measurements(one, "experiments/configs/x.py")
  assert measurements(one, "fedjax_dd/x.py")  # only configs get the line
  two = one.replace('"""\n', "\nExpected: accuracy 0.5 on b.\n\"\"\"\n")
  assert measurements(two, "experiments/configs/x.py")
  measured = one.replace("Expected", "Measured: accuracy 0.71 on b.\n\n"
                         "Expected")
  assert measurements(measured, "experiments/configs/x.py")
  timed = one.replace("30 rounds", "30 rounds in 93-101 s")
  assert measurements(timed, "experiments/configs/x.py")
