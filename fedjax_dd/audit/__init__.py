"""What an upload reveals: membership and reconstruction audits.

The threat model and how to call each audit: ``docs/privacy.md``.

* :mod:`~fedjax_dd.audit.image_mia`: membership inference on image uploads
  (FedD3's and HFLDD's KIP images), by the distance to the nearest upload of
  the candidate's class, in pixel space and a fixed random-feature space.
* :mod:`~fedjax_dd.audit.model_mia`: membership inference on model uploads,
  the loss threshold (Yeom et al. 2018) and offline LiRA (Carlini et al.
  2022) with shadow models trained by the engine's local update.
* :mod:`~fedjax_dd.audit.reconstruction`: each client image's best PSNR and
  SSIM among the uploads, and the label histogram an upload shows against
  the true one (total-variation distance).
* :mod:`~fedjax_dd.audit.membership` (host, scikit-learn): AUC and TPR at
  low FPR of the attacks' scores.
* :mod:`~fedjax_dd.audit.workdir`: the audits of a finished run's workdir
  (FedD3's cached uploads, a rounds run's final global model), written to
  ``WORKDIR/audit.json``.
"""
