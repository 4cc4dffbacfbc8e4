"""Minibatch generators of the rollout buffer (flat steps and recurrent chunks).

The functions here read a rollout's arrays (``[pos, num_envs, *shape]``) and yield
batches; index arithmetic is in :mod:`replaybank.ops.minibatch`. Validation happens when
the function is called, before the first batch is requested.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> data = {"obs": np.arange(6.0).reshape(3, 2), "terminated": np.zeros((3, 2), bool),
    ...         "truncated": np.zeros((3, 2), bool)}
    >>> adv = ret = np.zeros((3, 2))
    >>> sizes = [b.batch_size for b in flat_batches(data, adv, ret, rng,
    ...          mini_batch_size=4)]
    >>> sizes
    [4, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.batch import Batch, SequenceBatch
from replaybank.errors import ConfigError, SpecError
from replaybank.ops.minibatch import split_minibatches, time_chunks
from replaybank.spec import SEP

__all__ = ["flat_batches", "hidden_names", "normalise", "recurrent_batches"]

AnyArray = npt.NDArray[Any]
_STANDARD = ("obs", "action", "reward", "value", "log_prob", "terminated", "truncated")


def normalise(adv: AnyArray, eps: float, valid: AnyArray | None = None) -> AnyArray:
    """``(adv - mean) / (std + eps)`` with the population std (ddof=0), in float64.

    Args:
        adv: Advantages of any shape.
        eps: Added to the std.
        valid: Optional bool mask of the entries the statistics use (others become 0).

    Returns:
        Normalised advantages in ``adv``'s dtype.

    Example:
        >>> normalise(np.array([1.0, 3.0]), 0.0).tolist()
        [-1.0, 1.0]
    """
    a = adv.astype(np.float64)
    sel = a if valid is None else a[valid]
    out = (a - sel.mean()) / (sel.std() + eps)
    if valid is not None:
        out = np.where(valid, out, 0.0)
    result: AnyArray = out.astype(adv.dtype)
    return result


def _epochs(num_epochs: Any) -> int:
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, (int, np.integer)) \
            or num_epochs <= 0:
        raise ConfigError(f"num_epochs={num_epochs!r}: must be a positive int")
    return int(num_epochs)


def flat_batches(data: Mapping[str, AnyArray], adv: AnyArray, ret: AnyArray,
                 rng: np.random.Generator, num_mini_batch: Any = None,
                 mini_batch_size: Any = None, num_epochs: Any = 1, mode: str | None = None,
                 eps: float = 1e-8, emit: Callable[[Batch], Any] = lambda b: b,
                 valid: AnyArray | None = None) -> Iterator[Any]:
    """Shuffled single-step minibatches; see :meth:`RolloutBuffer.generate_batches`.

    With ``valid`` given, only the valid steps are shuffled and split (``n`` below is
    their count) and ``"batch"`` normalisation uses their statistics only.

    Args:
        data: Stored fields ``[pos, num_envs, *shape]``.
        adv: Raw advantages ``[pos, num_envs]``.
        ret: Returns ``[pos, num_envs]``.
        rng: Shuffling generator (one permutation per epoch).
        num_mini_batch: Minibatches per epoch (exactly one of the two sizes).
        mini_batch_size: Steps per minibatch.
        num_epochs: Passes over the data.
        mode: Advantage normalisation: ``"batch"``, ``"minibatch"`` or None.
        eps: Added to the std when normalising.
        emit: Applied to each batch before yielding (e.g. conversion to torch).
        valid: Optional ``[pos, num_envs]`` bool; False steps are never yielded.

    Returns:
        An iterator of batches.

    Raises:
        ConfigError, EmptyBufferError: Bad sizes (raised at the call).
    """
    size = adv.size
    keep = None if valid is None else np.flatnonzero(valid.reshape(size))  # [n] flat ids
    n = size if keep is None else len(keep)
    epochs = _epochs(num_epochs)
    split_minibatches(n, np.random.default_rng(0), num_mini_batch, mini_batch_size)  # checks
    flat = {k: a.reshape((size, *a.shape[2:])) for k, a in data.items()}
    flat["advantages"] = (normalise(adv, eps, valid) if mode == "batch" else adv).reshape(size)
    flat["returns"] = ret.reshape(size)

    def gen() -> Iterator[Any]:
        for _ in range(epochs):
            for part in split_minibatches(n, rng, num_mini_batch, mini_batch_size):
                idx = part if keep is None else keep[part]  # [B] flat t * num_envs + env
                out = {k: a[idx] for k, a in flat.items()}
                if mode == "minibatch":
                    out["advantages"] = normalise(out["advantages"], eps)
                out["indices"] = idx
                yield emit(Batch(out))

    return gen()


def hidden_names(names: list[str], hidden_fields: Any) -> list[str]:
    """Resolve ``hidden_fields`` to flat stored names (default: the ``hidden`` field(s)).

    Raises:
        SpecError: A name that is not a stored extra field.

    Example:
        >>> hidden_names(["obs", "hidden/h", "hidden/c"], None)
        ['hidden/h', 'hidden/c']
    """
    if hidden_fields is None:
        return [n for n in names if n.split(SEP)[0] == "hidden"]
    wanted = [hidden_fields] if isinstance(hidden_fields, str) else list(hidden_fields)
    out: list[str] = []
    for h in wanted:
        got = [n for n in names if n == h or n.startswith(f"{h}{SEP}")]
        if not got or str(h).split(SEP)[0] in _STANDARD:
            raise SpecError(
                f"hidden_fields={wanted!r}: {h!r} is not a stored extra field; stored fields "
                f"are {names}; pass the name of the recurrent-state extra given to add()"
            )
        out += got
    return out


def recurrent_batches(data: Mapping[str, AnyArray], adv: AnyArray, ret: AnyArray,
                      first_done: AnyArray, rng: np.random.Generator,
                      num_mini_batch: Any = None, mini_batch_size: Any = None,
                      chunk_length: Any = None, num_epochs: Any = 1,
                      hidden_fields: Any = None, mode: str | None = None, eps: float = 1e-8,
                      emit: Callable[[SequenceBatch], Any] = lambda b: b,
                      valid: AnyArray | None = None) -> Iterator[Any]:
    """Shuffled minibatches of per-env time chunks; see
    :meth:`RolloutBuffer.recurrent_generator` for the output fields.

    With ``valid`` given, invalid steps are treated like padding (``mask`` False,
    ``indices`` -1, fields zeroed) but keep their place in time; the step after an invalid
    one is ``is_first`` (the recurrent state restarts there), and chunks without a valid
    step are dropped before the split.

    Args:
        data: Stored fields ``[pos, num_envs, *shape]``.
        adv: Raw advantages ``[pos, num_envs]``.
        ret: Returns ``[pos, num_envs]``.
        first_done: ``[num_envs]`` bool, whether an episode starts at step 0.
        rng: Shuffling generator.
        num_mini_batch: Minibatches per epoch, counted in chunks.
        mini_batch_size: Chunks per minibatch.
        chunk_length: Steps per chunk (default: all ``pos`` steps).
        num_epochs: Passes over the data.
        hidden_fields: See :func:`hidden_names`.
        mode: Advantage normalisation mode.
        eps: Added to the std when normalising.
        emit: Applied to each batch before yielding.
        valid: Optional ``[pos, num_envs]`` bool; False steps are never yielded.

    Returns:
        An iterator of sequence batches.

    Raises:
        ConfigError, EmptyBufferError, SpecError: Bad arguments (raised at the call).
    """
    p, n_env = adv.shape
    if chunk_length is None:
        length = p
    elif isinstance(chunk_length, bool) or not isinstance(chunk_length, (int, np.integer)) \
            or chunk_length <= 0:
        raise ConfigError(f"chunk_length={chunk_length!r}: must be a positive int or None")
    else:
        length = int(chunk_length)
    epochs = _epochs(num_epochs)
    hidden = hidden_names(list(data), hidden_fields)
    t, env, inside = time_chunks(p, n_env, length)  # [C, L], [C], [C, L] (not padding)
    ok = np.ones((p, n_env), dtype=bool) if valid is None else valid  # [p, E]
    use = inside & ok[t, env[:, None]]  # [C, L]: yielded steps
    if valid is not None:  # drop chunks that hold no valid step
        has = use.any(axis=1)
        t, env, inside, use = t[has], env[has], inside[has], use[has]
    n_chunks = len(env)
    split_minibatches(n_chunks, np.random.default_rng(0), num_mini_batch, mini_batch_size,
                      "chunks", "recurrent_generator")
    done = (data["terminated"] | data["truncated"]) & ok  # [p, E]
    first = np.concatenate([first_done[None], (done | ~ok)[:-1]])  # [p, E]
    series = {k: a for k, a in data.items() if k not in hidden}
    series["advantages"] = normalise(adv, eps, valid) if mode == "batch" else adv
    series["returns"] = ret

    def gen() -> Iterator[Any]:
        for _ in range(epochs):
            for cid in split_minibatches(n_chunks, rng, num_mini_batch, mini_batch_size,
                                         "chunks", "recurrent_generator"):
                tt, ee, vv = t[cid], env[cid][:, None], use[cid]  # [B, L], [B, 1], [B, L]
                out: dict[str, Any] = {}
                for k, a in series.items():
                    g = a[tt, ee]  # [B, L, *shape]; padding zeroed
                    out[k] = np.where(vv.reshape(vv.shape + (1,) * (g.ndim - 2)), g,
                                      np.zeros((), g.dtype))
                if mode == "minibatch":
                    out["advantages"] = normalise(out["advantages"], eps, vv)
                for k in hidden:
                    out[k] = data[k][tt[:, 0], ee[:, 0]]  # [B, *shape] at chunk start
                last_pos = np.arange(length)[None] == (inside[cid].sum(1) - 1)[:, None]  # [B, L]
                out.update(
                    indices=np.where(vv, tt * n_env + ee, -1), mask=vv,
                    is_first=first[tt, ee] & vv, is_last=(done[tt, ee] | last_pos) & vv,
                    is_terminal=data["terminated"][tt, ee] & vv,
                    burn_in=np.zeros_like(vv), starts=tt[:, 0] * n_env + ee[:, 0])
                yield emit(SequenceBatch(out))

    return gen()
