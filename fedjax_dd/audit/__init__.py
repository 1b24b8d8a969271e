"""What an upload reveals: membership and reconstruction audits.

The threat model and how to call each audit: ``docs/privacy.md``.

* :mod:`~fedjax_dd.audit.image_mia`: membership inference on image uploads
  by the distance to the nearest upload of the candidate's class.
* :mod:`~fedjax_dd.audit.model_mia`: membership inference on model uploads,
  loss threshold (Yeom et al. 2018) and offline LiRA (Carlini et al. 2022).
* :mod:`~fedjax_dd.audit.reconstruction`: best PSNR / SSIM of each client
  image among the uploads, and label leakage.
* :mod:`~fedjax_dd.audit.membership` (host): AUC and TPR at low FPR.
* :mod:`~fedjax_dd.audit.workdir`: the audits of a finished run's workdir,
  written to ``WORKDIR/audit.json``.
"""
