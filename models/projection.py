"""A registered classifier split into representation, projection head and
output layer, for MOON's model-contrastive loss.

MOON (Li, He, Song, CVPR 2021, Sec. 3.2; the authors' ``ModelFedCon``) is a
base encoder (a classifier without its last linear layer), a projection head
``Linear(d, d) -> ReLU -> Linear(d, out_dim)`` (``out_dim = 256``) and an
output layer ``Linear(out_dim, num_classes)``; the contrastive loss reads
the projection ``z``, the cross-entropy the logits.

:class:`ProjectionNet` builds that from any model of this package without
changing it: the base's last ``Dense`` (``ModelSpec.head``) is skipped
through ``flax.linen.intercept_methods``, so the base returns its
penultimate representation ``h`` and has the registered model's parameters
less its output layer.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dd.models.layers import LayerSet


class ProjectionNet(nn.Module):
  """``base`` less its output layer, then MOON's head and output layer.

  Layout (``d`` the base's representation width)::

    h = base without `head`        # [B, d]
    z = Dense(d) -> ReLU -> Dense(proj_dim)   (proj1, proj2)
    logits = Dense(num_classes)(z)            (out)

  Attributes:
    base: a classifier of this package (``spec.build(...)``).
    head: the name of the base's output ``Dense`` (a direct child of the
      base), skipped.
    num_classes: number of output logits.
    proj_dim: the projection's width (MOON: 256).
    layers: the head's layer forms (``layers.LayerSet``; only its compute
      ``dtype`` applies), as the base's.
  """

  base: nn.Module
  head: str
  num_classes: int = 10
  proj_dim: int = 256
  layers: LayerSet = LayerSet()

  def represent(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """The base's representation ``h [B, d]``."""
    # A plain function: a module method as interceptor would intercept itself.
    with nn.intercept_methods(_skip(self.head)):
      h = self.base(x, train=train)
    return h.reshape((h.shape[0], -1))

  @nn.compact
  def project(self, x: jnp.ndarray, *, train: bool
              ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(z [B, proj_dim], logits [B, num_classes])`` for images ``x``."""
    h = self.represent(x, train=train)
    ls = self.layers
    z = nn.relu(ls.dense(h.shape[-1], name="proj1")(h))
    z = ls.dense(self.proj_dim, name="proj2")(z)
    return z, ls.dense(self.num_classes, name="out")(z)

  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Logits ``[B, num_classes]`` (the package's classifier interface)."""
    return self.project(x, train=train)[1]


def _skip(head: str):
  """An interceptor returning the input of the base's ``Dense`` ``head``."""

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if (context.method_name == "__call__" and isinstance(module, nn.Dense)
        and module.name == head
        and getattr(module.parent, "name", None) == "base"):
      # The output layer's input is the representation h.
      return args[0]
    return next_fun(*args, **kwargs)

  return interceptor


def projection_builder(base_build: Any, head: str, proj_dim: int = 256):
  """``build(num_classes, conv_impl="auto", proj_dim=proj_dim,
  compute_dtype="auto")`` of a :class:`ProjectionNet` over ``base_build``'s
  model, its head in the base's layer set (compute dtype).

  ``proj_dim`` is the head's output width (MOON's ``--out_dim``); a build
  call may override it.

  Raises:
    ValueError: (from the build) a ``proj_dim`` below 1, before any layer
      is made.
  """

  def build(num_classes: int, conv_impl: str = "auto",
            proj_dim: int = proj_dim,
            compute_dtype: str = "auto") -> nn.Module:
    if int(proj_dim) < 1:
      raise ValueError(f"proj_dim must be at least 1, got {proj_dim}.")
    base = base_build(num_classes, conv_impl=conv_impl,
                      compute_dtype=compute_dtype)
    return ProjectionNet(base=base, head=head, num_classes=num_classes,
                         proj_dim=int(proj_dim), layers=base.layers)

  return build
