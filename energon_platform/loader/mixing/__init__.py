"""Online data mixing: blend weights that follow the model's per-dataset loss, resumed exactly.

``loader.blend_adapt`` (`BlendAdaptConfig`) names a `MixingMethod` (``odm``: a bandit over the
datasets; ``loss_ratio``: weight to the datasets whose loss still falls beyond its noise; ``ado``: weight to
the datasets whose fitted loss curve still falls fastest); `BlendAdapter` collects
the per-dataset losses the trainer reports, has the method set new weights every ``every`` global
batches, and appends them to the blend from ``lag`` batches later on. The loader's executor sends
the new weights to its workers with the micro-batches it asks for (`run_mixer`: the trainer's side).
Every change is a segment of the blend history in the loader
state, with the method's own state: a resume on any world size replays the same weights.
"""

from energon_platform.loader.mixing.adapter import AdaptError, BlendAdapter
from energon_platform.loader.mixing.method import METHODS, MixingMethod, make_method, register

# the methods register themselves when imported (in the order loader.blend_adapt.method lists them)
from energon_platform.loader.mixing import odm, loss_ratio, ado  # noqa: E402,F401  isort: skip

__all__ = [
    "METHODS",
    "AdaptError",
    "BlendAdapter",
    "MixingMethod",
    "make_method",
    "register",
]
