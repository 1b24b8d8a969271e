"""Named random-key derivations: every stream of a run comes from two seeds.

Two roots, kept apart so that one partition can be trained under several
model seeds: the **model seed** ``seed`` gives the JAX root key
:func:`model_root`; the **partition seed** ``data_seed`` every NumPy stream of
the data side (the partition, the 80/20 re-split, public and auxiliary sets).

JAX streams, all derived by ``fold_in`` / ``split`` from the model root::

    model_root(seed) ─┬─ init (split 0) ......... global model initialisation
                      └─ run (split 1) ─ round_key(run, r) ─┬─ sample (split 0)
                                                            ├─ train  (split 1)
                                                            │    └─ client_key(train, id)
                                                            ├─ server_key(round_key)
                                                            │    ├─ epoch stream (1)
                                                            │    └─ server stage (0)
                                                            └─ finetune_key(round_key)
    stage_key(model_root, Stage.X) ........ a one-off stage (pre-training, KIP)

NumPy streams come from :func:`numpy_stream`, one number per use
(:class:`Stream`); no global random state is touched.

The derivations are fixed, so that earlier runs' results reproduce (see
``docs/architecture.md``).
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np


class Stage(enum.IntEnum):
  """One-off stages keyed by ``fold_in(model_root, stage)`` (HFLDD, FedD3)."""
  INIT = 0
  PRETRAIN = 1       # HFLDD's soft-label pre-training; FedD3's distillation.
  DISTILL = 2        # HFLDD members' KIP.
  ROUNDS = 3         # HFLDD / FedSeq rounds (the run key).
  GENERATOR = 4      # IGA's conditional generator (DisUE, FedFTG).
  CLUSTER_MODELS = 5  # IFCA's models 1 .. K-1.
  GRADIENT_SUBSET = 6  # CFL-GP's coordinate subset of the updates.


# FedD3 has always keyed its client distillation with stage 1.
FEDD3_DISTILL = Stage.PRETRAIN


class Stream(enum.IntEnum):
  """NumPy streams ``default_rng([seed, stream])``.

  ``PARTITION`` is the bare ``default_rng(data_seed)`` (NumPy treats ``s`` and
  ``[s]`` alike, so it is ``numpy_stream(data_seed)``).
  """
  AUX_DATA = 1         # HFLDD's D_g draw            (data_seed)
  TOPOLOGY = 2         # HFLDD's heads and members   (seed)
  FEDSEQ_GROUPS = 3    # FedSeq's grouping           (seed)
  RANDOM_MEMBERS = 4   # HFLDD's random-member control (seed)
  RESPLIT = 5          # the 80/20 re-split          (data_seed)
  PUBLIC_DATA = 6      # FedDF's public set          (data_seed)
  PERSONAL_TEST = 7    # per-client test sets        (data_seed)
  AUDIT = 8            # an audit's holdout and non-members (data_seed)
  AUDIT_SHADOWS = 9    # LiRA's shadow pool, shadows and retrained uploads


# Server-stage randomness of round r is folded off the round key at this
# index, well above any client id, so it never equals a client's key.
_SERVER_INDEX = 2**20


SEED_LIMIT = 2**32
"""Seeds lie in ``[0, SEED_LIMIT)``: a JAX key holds 32 bits of its seed, so
``2**32`` would give seed 0's key (and its results) under another name."""


def check_seed(seed: int, name: str = "seed") -> int:
  """``seed`` as an int, refusing one that a key cannot hold.

  Raises:
    ValueError: ``seed`` is not a whole number in ``[0, 2**32)``.
  """
  if (isinstance(seed, (bool, np.bool_))
      or not isinstance(seed, (int, np.integer))
      or not 0 <= int(seed) < SEED_LIMIT):
    raise ValueError(
        f"{name} must be an int in [0, 2**32) (a key holds 32 bits: "
        f"2**32 would repeat seed 0), got {seed!r}.")
  return int(seed)


def model_root(seed: int) -> jax.Array:
  """The JAX root key of the model seed (:func:`check_seed`)."""
  return jax.random.PRNGKey(check_seed(seed))


def init_and_run(root: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(init_key, run_key)``: model initialisation and the rounds' key."""
  init_key, run_key = jax.random.split(root)
  return init_key, run_key


def round_key(run_key: jax.Array, r: int | jax.Array) -> jax.Array:
  """The key of round ``r`` (1-based)."""
  return jax.random.fold_in(run_key, r)


def sample_and_train(round_key_: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(sample_key, train_key)`` of one round: cohort sampling, local work."""
  sample_key, train_key = jax.random.split(round_key_)
  return sample_key, train_key


def client_keys(train_key: jax.Array, client_ids: jax.Array) -> jax.Array:
  """``[S]`` keys, one per client, from its id (not its cohort position).

  So a client's randomness does not depend on the cohort or the backend.
  """
  return jax.vmap(lambda i: jax.random.fold_in(train_key, i))(
      jnp.asarray(client_ids))


def server_key(round_key_: jax.Array) -> jax.Array:
  """The server stage's key of one round, apart from every client's."""
  return jax.random.fold_in(round_key_, _SERVER_INDEX)


def finetune_key(round_key_: jax.Array) -> jax.Array:
  """The key of the fine-tuning steps of personalized evaluation after a
  round (:mod:`fedjax_dd.core.personal`), apart from the round's clients
  and server."""
  return jax.random.fold_in(round_key_, _SERVER_INDEX + 1)


def server_seed_key(server_seed: int, r: int) -> jax.Array:
  """A server key from its own seed (repeat a server stage over fixed
  clients to measure its spread)."""
  return jax.random.fold_in(
      jax.random.PRNGKey(check_seed(server_seed, "server_seed")), r)


def server_parts(server_key_: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(setup_key, epochs_key)``: the server's one-off setup (FedHydra's
  stratification) and its epochs' stream."""
  return jax.random.fold_in(server_key_, 0), jax.random.fold_in(server_key_, 1)


def stage_key(root: jax.Array, stage: Stage) -> jax.Array:
  """The key of a one-off stage."""
  return jax.random.fold_in(root, int(stage))


def numpy_from_key(key: jax.Array) -> np.random.Generator:
  """A NumPy generator seeded by a JAX key's bits (host-side stages of a
  round, e.g. Affinity Propagation's tie-breaking)."""
  bits = np.asarray(jax.random.key_data(key)).ravel()
  return np.random.default_rng([int(b) for b in bits])


def numpy_stream(seed: int, stream: Stream | None = None) -> np.random.Generator:
  """A NumPy generator of one named stream (``None``: the partition's)."""
  if stream is None:
    return np.random.default_rng(int(seed))
  return np.random.default_rng([int(seed), int(stream)])
