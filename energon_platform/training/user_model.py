"""A user's model for ``calibrate --model FILE_OR_MODULE:FACTORY``: imported, built and checked.

The user's code is the user's: whatever it does wrong (an import that fails, a factory that takes
no encoder, raises or returns no ``torch.nn.Module``, a ``forward`` that returns no scalar loss
with a gradient, or raises) is one `UserModelError` line naming ``--model``, the problem and the
user's own ``file:line`` (`user_frame`), never this project's traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_REPO = Path(__file__).resolve().parents[2]


class UserModelError(ValueError):
    """The user's model cannot be imported, built or timed (one line, with their frame)."""


def user_frame(error: BaseException) -> str:
    """``file:line`` of the innermost frame of ``error``'s traceback in the user's code (not this
    project's packages, an installed library or the standard library); the innermost frame when
    none is."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    user = [f for f in frames if not f.filename.startswith(_NOT_USER)]
    frame = (user or frames)[-1] if frames else None
    return f"{frame.filename}:{frame.lineno}" if frame else "no frame"


#: Where code is not the user's: this project's packages, installed libraries, the standard library.
_NOT_USER = (
    *(str(_REPO / name) for name in ("energon_platform", "task_encoders", "storage", "converters")),
    *{sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")},
    "<frozen",
)


def _user_error(spec: str, doing: str, error: BaseException) -> UserModelError:
    """The one line of the user's model code raising ``error`` while ``doing``."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return UserModelError(
        f"--model {spec}: {doing} raised {type(error).__name__}"
        f"{': ' + message if message else ''} (at {user_frame(error)})"
    )


def load_factory(spec: str) -> Callable[[Any], torch.nn.Module]:
    """``FILE_OR_MODULE:FACTORY`` → the factory: a ``.py`` file's or an importable module's
    attribute. `UserModelError` naming what is missing."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise UserModelError(f"--model {spec!r}: expected FILE_OR_MODULE:FACTORY")
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise UserModelError(f"--model {spec!r}: file {where} not found")
        module_spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise _user_error(spec, f"importing {where}", e) from None
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            raise UserModelError(f"--model {spec!r}: cannot import {where} ({e})") from None
        except Exception as e:
            raise _user_error(spec, f"importing {where}", e) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UserModelError(f"--model {spec!r}: {where} has no callable {name}")
    return factory


def build_user_model(factory: Callable[[Any], Any], encoder: Any, spec: str) -> torch.nn.Module:
    """``factory(encoder)``, checked: a factory that cannot take the encoder, raises or returns no
    ``torch.nn.Module`` is a one-line `UserModelError` naming ``spec`` (and the user's frame)."""
    try:
        inspect.signature(factory).bind(encoder)
    except TypeError:
        raise UserModelError(
            f"--model {spec}: the factory must take one argument, the encoder "
            f"(FACTORY(encoder) returns a torch.nn.Module)"
        ) from None
    except ValueError:
        pass  # no signature to read (a builtin): call it and see
    try:
        model = factory(encoder)
    except Exception as e:
        raise _user_error(spec, "the factory", e) from None
    if not isinstance(model, torch.nn.Module):
        raise UserModelError(
            f"--model {spec}: the factory returned {type(model).__name__} "
            f"(expected a torch.nn.Module whose forward(batch) returns a scalar loss)"
        )
    return model


def check_loss(model: torch.nn.Module, batch: Any, spec: str) -> None:
    """One forward + backward of the user's ``model`` on ``batch``, checked before any timing:
    ``forward`` must return a scalar tensor that has a gradient. `UserModelError` (one line,
    the user's frame for an exception) otherwise; a loss that is not finite is a warning (its
    time is still the model's time)."""
    try:
        loss = model(batch)
    except Exception as e:
        raise _user_error(spec, "the model's forward", e) from None
    what = None
    if not isinstance(loss, torch.Tensor):
        what = f"returned {type(loss).__name__}"
    elif loss.numel() != 1:
        what = f"returned a tensor of shape {tuple(loss.shape)}"
    elif not loss.requires_grad:
        what = "returned a tensor without a gradient (it does not depend on the model's parameters)"
    if what:
        raise UserModelError(
            f"--model {spec}: the model's forward(batch) {what}; it must return the scalar loss "
            f"of the batch, with a gradient"
        )
    try:
        loss.backward()
    except Exception as e:
        raise _user_error(spec, "the model's backward", e) from None
    model.zero_grad(set_to_none=True)
    if not torch.isfinite(loss.detach()).all():
        print(
            f"warning: --model {spec}: the loss of the first micro-batch is {loss.item()}; "
            f"its time is timed all the same",
            file=sys.stderr,
        )
