"""README.md's Python example runs as written, and the README keeps its
promises of shape: two one-line commands and at most 150 lines."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    return f.read()


def test_readme_is_short_and_has_the_two_commands():
  text = _readme()
  assert len(text.splitlines()) <= 150
  bash = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
  assert any("fedjax-dd --config=experiments/configs/quickstart.py" in b
             and "pip install -e" in b for b in bash)
  assert any("pip install -e \".[test]\"" in b and b.strip().endswith("pytest")
             for b in bash)


def test_readme_python_example_runs_as_written(tmp_path):
  (code,) = re.findall(r"```python\n(.*?)```", _readme(), flags=re.S)
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # the example configures the CPU itself
  proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  accuracy = float(proc.stdout.strip().splitlines()[-1])
  assert 0.0 <= accuracy <= 1.0
  assert (tmp_path / "fedavg.png").stat().st_size > 0
  assert (tmp_path / "runs" / "fedavg" / "metrics.jsonl").exists()
