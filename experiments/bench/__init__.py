"""The lab's benchmarks: engine, KIP, DisUE, FedHydra, PCSC, personalisation
and accelerator measurements (``python -m fedjax_dd.experiments.bench.NAME``).

They live in the checkout and are not installed: ``pyproject.toml`` lists no
``fedjax_dd.experiments.bench`` package, so a wheel holds none of them
(``tests/test_packaging.py``), while an editable install (``pip install -e
.``) imports them from here as ``fedjax_dd.experiments.bench.bench_engine``
and so on. Their measured reports are in ``experiments/results/``.
"""
