"""Differential privacy: the accountant of the library's DP defences.

:mod:`fedjax_dd.privacy.accounting` turns a Gaussian mechanism's noise
multiplier, sampling rate and number of steps into ``(epsilon, delta)``
through Google's ``dp-accounting`` (the optional ``privacy`` extra) for
DP-FedAvg (:mod:`fedjax_dd.algorithms.dp_fedavg`) and DP-KIP
(:class:`fedjax_dd.distill.kip.KipOptions` ``dp_clip``,
``dp_noise_multiplier``), which share one Gaussian mechanism on clipped
rows (:mod:`fedjax_dd.privacy.gaussian`). See ``docs/privacy.md``.
"""
