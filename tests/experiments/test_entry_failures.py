"""Unhelpful failures of the two entry points, each now one line (issue 41):
presets, seeds, the backend, SIGTERM, a full disk, fedjax-dd-sweep inputs."""

import signal
import sys

import pytest

from fedjax_dd.experiments import main as main_lib
from fedjax_dd.experiments import sweep

_CONFIGS = "experiments/configs"


@pytest.mark.parametrize("arg,message", [
    ("fedavg.py:bogus", r"^--config=experiments/configs/fedavg.py:bogus: "
     r"Unknown preset 'bogus'; expected one of \["),
    # quickstart.py has no presets; the name was dropped and the run went on.
    ("quickstart.py:bogus", r"Unknown preset 'bogus': quickstart.py has "
     r"none"),
])
def test_an_unknown_preset_is_one_line(arg, message):
  error = main_lib._config_file_error(["fedjax-dd", f"--config={_CONFIGS}/"
                                       f"{arg}", "--workdir=/nowhere"])
  assert error is not None and "Traceback" not in error
  assert pytest.importorskip("re").search(message, error), error
  for good in ("fedavg.py:smoke", "quickstart.py"):
    assert main_lib._config_file_error(
        ["fedjax-dd", f"--config={_CONFIGS}/{good}"]) is None


def test_a_missing_config_file_is_one_line():
  error = main_lib._config_file_error(
      ["fedjax-dd", f"--config={_CONFIGS}/nothere.py:smoke"])
  assert error.startswith(f"--config={_CONFIGS}/nothere.py:smoke: no such "
                          f"file '{_CONFIGS}/nothere.py' (relative to ")
  assert error.endswith("e.g. --config=experiments/configs/fedavg.py:smoke.")


@pytest.mark.parametrize("seeds,message", [
    ("0,a", r"--seeds entries must be ints in \[0, 2\*\*32\) .*got 'a' in "
            r"0,a\."),
    ("1,-1", r"got '-1'"),
    ("0,4294967296", r"got '4294967296'"),  # would repeat seed 0's keys
    ("0,1,0", r"--seeds repeats 0: each seed runs once"),
    (",", r"--seeds names no seed"),
    ("", r"--seeds names no seed"),
])
def test_bad_seeds_are_named(seeds, message):
  with pytest.raises(ValueError, match=message):
    sweep.parse_seeds(seeds)
  assert sweep.parse_seeds(" 2, 0 ,1") == [2, 0, 1]


def test_a_failed_seed_ends_with_its_own_refusal(capfd):
  # A child that prints usage text and then its refusal, as absl does.
  child = [sys.executable, "-c", "import sys; sys.stderr.write('usage: "
           "long text\\nFATAL config.x must be 1\\n\\n  more usage\\n'); "
           "sys.exit(1)"]
  with pytest.raises(sweep.SeedFailedError,
                     match=r"^--seeds: seed 3 failed \(exit 1\) in .*: "
                     r"config.x must be 1$"):
    sweep._run_seed(child, 3)
  assert "usage: long text" in capfd.readouterr().err  # passed through


def test_a_backend_jax_cannot_start_is_one_line(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top

  def no_gpu():
    raise AssertionError()  # jax 0.12's second call after a failed init
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  monkeypatch.setattr(jax, "devices", no_gpu)
  assert main_lib.check_backend() == (
      "JAX cannot start a backend for JAX_PLATFORMS=cuda: no backend "
      "initialised (AssertionError). Set JAX_PLATFORMS to a platform this "
      "machine has (cpu; cuda needs a GPU and jax[cuda]), or unset it.")
  monkeypatch.undo()
  assert main_lib.check_backend() is None


def test_sigterm_is_handled_as_ctrl_c(monkeypatch):
  monkeypatch.setattr(main_lib, "_exit_status", main_lib.EXIT_INTERRUPTED)
  old = signal.signal(signal.SIGTERM, main_lib._on_sigterm)
  try:
    with pytest.raises(KeyboardInterrupt):
      signal.raise_signal(signal.SIGTERM)
  finally:
    signal.signal(signal.SIGTERM, old)
  assert main_lib._exit_status == main_lib.EXIT_TERMINATED == 143


def test_disk_full_message_without_a_checkpoint(tmp_path):
  error = OSError(28, "No space left on device")
  assert main_lib.disk_full_message(str(tmp_path), error) == (
      f"No space left on the device of {tmp_path}; no checkpoint was written "
      "yet. Free some space and re-run the same command to resume.")


def _sweep_error(capsys, *argv):
  with pytest.raises(SystemExit) as e:
    sweep.main(list(argv))
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return err.strip().splitlines()[-1]


def test_sweep_tool_inputs(tmp_path, capsys):
  run = tmp_path / "run"
  run.mkdir()
  (run / "summary.json").write_text('{"method": ')  # cut
  out_file = tmp_path / "out.txt"
  out_file.write_text("")
  assert _sweep_error(capsys, str(run), f"--out={out_file}") == (
      f"fedjax-dd-sweep: error: --out {out_file} is a file; give a directory "
      "for the report.")
  assert _sweep_error(capsys, str(tmp_path / "missing"),
                      f"--out={tmp_path}/o").endswith("does not exist; give "
                      "a sweep workdir (seed_* runs) or a run workdir.")
  (tmp_path / "empty").mkdir()
  assert _sweep_error(capsys, str(tmp_path / "empty"),
                      f"--out={tmp_path}/o").endswith(
                          "holds neither seed_*/summary.json nor "
                          "summary.json.")
  assert "is not valid JSON" in _sweep_error(capsys, str(run),
                                             f"--out={tmp_path}/o")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_flags_every_config_and_its_presets(flag, capsys):
  import os  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    main_lib.parse_flags(["fedjax-dd", flag])
  assert e.value.code == 0
  out = capsys.readouterr().out
  # This command's own flags first, before any config.
  flags_at = [out.index(f"  --{f}: ") for f in ("config", "workdir", "seeds")]
  assert max(flags_at) < out.index("Configs")
  files = sorted(f for f in os.listdir(_CONFIGS)
                 if f.endswith(".py") and f not in ("__init__.py", "base.py"))
  listed = [l.split(":")[0].strip() for l in out.splitlines()
            if l.startswith("  ") and l.strip().endswith((".", ")"))
            and l.split(":")[0].strip().endswith(".py")]
  assert listed == files
  assert out.count("      presets: ") == len(files)
  # The presets are the ones each file accepts.
  assert ("presets: cifar10_c1, cifar10_c2, cifar10_fedd3, mnist_c1, "
          "mnist_c10, mnist_c2, mnist_fedd3, mnist_iid, mnist_iid_fedd3, "
          "smoke") in out
  assert "quickstart.py: Quickstart:" in out and "presets: none" in out
  assert ("fedjax-dd --config=experiments/configs/quickstart.py "
          "--workdir=workdir/quickstart") in out


def test_every_preset_the_help_lists_loads():
  import importlib  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import configs  # pylint: disable=g-import-not-at-top
  for file, description, presets in configs.catalog():
    assert description, file
    module = importlib.import_module(
        f"fedjax_dd.experiments.configs.{file[:-3]}")
    if presets == "none":
      module.get_config()
    elif "<" not in presets:  # a list of names, not a pattern
      for preset in presets.split(", "):
        assert module.get_config(preset) is not None, (file, preset)


# --- Issue 76: each unhelpful or silent-wrong probe, now one line. ---------


def _config(arg="fedavg.py:smoke"):
  return main_lib.flags.FLAGS["config"].parser.parse(f"{_CONFIGS}/{arg}")


@pytest.mark.parametrize("override,message", [
    # Before: a KeyError traceback 138 s in, after the data loaded.
    ({"method": "bogus"}, r"^config.method must be one of \['centralized', "
     r".*'scaffold'\] for runner 'federated', got 'bogus'; set "
     r"--config.method"),
    # Before: the same traceback, no hint of the FedD3 config.
    ({"method": "fedd3"}, r"^config.method='fedd3' runs under runner "
     r"'fedd3', not this config's 'federated', .*use "
     r"--config=experiments/configs/fedd3.py:<preset>"),
    ({"method": "hfldd_random"}, r"--config=experiments/configs/"
     r"hfldd_random.py:<preset>"),
    # Before: the right words inside a traceback.
    ({"runner": "bogus"}, r"^config.runner must be one of \['fedd3', "
     r"'federated', .*got 'bogus'"),
])
def test_a_method_or_runner_no_runner_has_is_one_line(override, message):
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  config = _config()
  registry.check_method(config)
  for k, v in override.items():
    config[k] = v
  with pytest.raises(ValueError) as info:
    registry.check_method(config)
  assert "\n" not in str(info.value)
  assert pytest.importorskip("re").search(message, str(info.value)), info.value


def test_every_config_file_runs_a_method_of_its_runner():
  from fedjax_dd.experiments import configs  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  for file, _, _ in configs.catalog():
    registry.check_method(_config(file.split("/")[-1]))


@pytest.mark.parametrize("file,message", [
    # Before: 'NoneType' object has no attribute 'loader'.
    ("/etc/passwd:smoke", "'/etc/passwd' is not a Python config file"),
    ("README.md", "'README.md' is not a Python config file"),
    ("experiments/__init__.py", "defines no get_config(arg)"),
])
def test_a_file_that_is_no_config_is_one_line(file, message):
  error = main_lib._config_file_error(["fedjax-dd", f"--config={file}"])
  assert error is not None and "Traceback" not in error and "\n" not in error
  assert message in error, error


def test_settings_that_name_no_usable_file_are_refused_before_the_data():
  from fedjax_dd.experiments import common  # pylint: disable=g-import-not-at-top
  config = _config()
  config.data.dataset = "npz:/dev/zero"
  # Before: "file not found", the wrong cause.
  with pytest.raises(ValueError, match=r"/dev/zero is not a regular file \(a "
                     r"device, pipe or socket\)"):
    common.validate(config)
  config = _config()
  config.run.max_wall_seconds = -1   # before: exit 0, read as no budget
  with pytest.raises(ValueError, match=r"^config.run.max_wall_seconds must "
                     r"be a finite number >= 0, got -1"):
    common.validate(config)


def test_teachers_from_a_directory_without_clients_is_one_line(tmp_path):
  import os  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import common  # pylint: disable=g-import-not-at-top
  config = _config("fedhydra.py:smoke")
  config.server.teachers_from = str(tmp_path)
  # Before: a clear message inside a traceback, after the data loaded (and
  # r1/clients created inside the named directory).
  with pytest.raises(ValueError, match=r"^config.server.teachers_from=.* "
                     r"holds no committed round-1 client checkpoint"):
    common.validate(config)
  assert os.listdir(tmp_path) == []
  config.server.teachers_from = str(tmp_path / "none")
  with pytest.raises(ValueError, match="is not a directory"):
    common.validate(config)


def test_a_write_the_workdir_refuses_mid_run_is_one_line(tmp_path):
  import errno  # pylint: disable=g-import-not-at-top
  where = str(tmp_path / "checkpoints" / "3")
  inner = OSError(errno.EROFS, "Read-only file system", where)
  try:
    raise ValueError("orbax wrapped it") from inner
  except ValueError as e:
    outer = e
  assert main_lib.unwritable_message(str(tmp_path), outer) == (
      f"{where} cannot be written (Read-only file system): the run in "
      f"{tmp_path} stopped; its last committed checkpoint is kept. Make the "
      "workdir writable and re-run the same command to resume.")
  assert main_lib.unwritable_message(str(tmp_path), ValueError("x")) is None


def test_a_signal_after_the_run_finished_is_one_line(monkeypatch, capsys):
  # Before: "Exception ignored in atexit callback" and the handler's
  # KeyboardInterrupt traceback.
  exits = []
  monkeypatch.setattr(main_lib.os, "_exit", exits.append)
  monkeypatch.setattr(main_lib._WORKDIR, "_value", "W", raising=False)
  main_lib.flags.FLAGS(["fedjax-dd", "--workdir=W",
                        f"--config={_CONFIGS}/fedavg.py:smoke"])
  main_lib._after_finish(signal.SIGTERM, None)
  assert exits == [143]
  assert capsys.readouterr().err == (
      "SIGTERM after the run finished: its results in W are complete.\n")
  main_lib.flags.FLAGS.unparse_flags()
