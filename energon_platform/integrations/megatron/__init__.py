"""Megatron-LM adapter: what ``--dataloader-type external`` calls, on top of `TrainLoader`.

Megatron-LM never imports this package's dependencies and this package never imports megatron-core
(which needs CUDA) at import time: Megatron's values come in as plain arguments, or from its
``args`` namespace through
[`make_provider_from_args`][energon_platform.integrations.megatron.make_provider_from_args]. Only
`llava` uses megatron-core (a test-only dependency), inside its functions. The names below follow
Megatron-LM's own code:

* ``examples/multimodal/dataloader_provider.py``: ``train_valid_test_dataloaders_provider`` built
  only where ``is_dataloader_rank()`` (tensor-parallel rank 0, first or last pipeline stage), an
  ``EnergonDataloader`` wrapper with ``__next__``/``__iter__``/``save_state()``, and the restore of
  ``{dataloader_save}/iter_{iteration:07d}/mp_rank_00/train_dataloader_dprank{dp:03d}.pt`` when
  ``args.load`` is set. Megatron's provider *prints* a failed or missing restore and restarts the
  data from scratch; [`make_provider`][energon_platform.integrations.megatron.make_provider] raises
  instead ([`StateMismatchError`][energon_platform.integrations.megatron.StateMismatchError],
  [`LayoutError`][energon_platform.integrations.megatron.LayoutError], or ``FileNotFoundError``
  naming the path).
* ``megatron/training/training.py`` (``build_train_valid_test_data_iterators``): with
  ``dataloader_type == "external"`` the provider's objects are passed through, wrapped in a
  ``RerunDataIterator`` that calls ``next(iterable)`` once per micro-batch
  (``global_batch // (micro_batch × dp)`` calls per iteration on each data-parallel rank). The
  provider carries ``is_distributed = True`` as in Megatron's multimodal ``train.py``, so every
  rank calls it and the rank gating happens here.
* ``megatron/training/checkpointing.py`` (``maybe_save_dataloader_state``): at a checkpoint
  iteration, the first pipeline stage's tensor-parallel rank 0 of every data-parallel rank calls
  ``train_iterator.iterable.save_state()`` and saves ``{"dataloader_state_dict": state}`` with
  ``torch.save`` to the path above (``mp_rank_00_000`` with pipeline parallelism).
  [`save_dataloader_state`][energon_platform.integrations.megatron.save_dataloader_state] writes the
  same file the same way, atomically.
* ``examples/multimodal/train.py`` (``get_batch``) and ``pretrain_gpt.py`` /
  ``megatron/core/utils.py`` (``get_batch_on_this_tp_rank``, ``flatten_batch_for_packed_sequences``):
  the batch dicts of [`to_megatron_batch`][energon_platform.integrations.megatron.to_megatron_batch].
* Vision-language training (``examples/multimodal/train.py``, ``model.py``, megatron-core's
  ``LLaVAModel``): the encoders' vision-language batches
  (`task_encoders.vision_language.VisionLanguageBatch`) carry ``<image>`` placeholders, tiles and
  ``num_tiles``;
  [`megatron_requirements`][energon_platform.integrations.megatron.megatron_requirements] says which
  Megatron arguments they need (``image_token_index`` among them) and
  [`check_megatron_args`][energon_platform.integrations.megatron.check_megatron_args] refuses a run
  whose arguments disagree, before any data is read
  ([`make_provider_from_args`][energon_platform.integrations.megatron.make_provider_from_args] calls
  it on every data rank).

The state file format
---------------------
``save_state()`` returns `TrainLoader.state_dict`, plain JSON data (dicts, lists, str, int, bool,
None). The file holds ``{"dataloader_state_dict": state}`` written with ``torch.save``, i.e. exactly
what Megatron's own ``maybe_save_dataloader_state`` writes when it saves our iterator. We chose this
over JSON bytes because Megatron writes these files itself in a real run: the reader has to read
torch's format anyway, and one format in the directory is simpler than two. Since the content is
plain data, [`load_dataloader_state`][energon_platform.integrations.megatron.load_dataloader_state]
reads it with ``torch.load(weights_only=True)`` (PyTorch's restricted unpickler: it builds dicts,
lists and primitives and executes no code from the file); a pickle that needs anything else (for
example Energon's own savable-loader state) is refused, never loaded with ``weights_only=False``.
The reader also accepts a JSON file with the same content.

The package, one module per job (import the names below from the package itself):

* `batches`: the batch dicts ([`to_megatron_batch`][energon_platform.integrations.megatron.to_megatron_batch]).
* `losses`: each sample's loss in a micro-batch
  ([`sample_losses`][energon_platform.integrations.megatron.sample_losses]), for ``StepLog``'s
  ``sample_losses`` and, through ``MegatronTrainIterator.report_losses``, for online mixing
  (``loader.blend_adapt``).
* `state_files`: where the state files live, writing and reading them.
* `iterators`: the train and validation iterators.
* `args`: the checks of Megatron's arguments.
* `provider`: the provider (its run config:
  `run_config`).
* `llava`: megatron-core's ``LLaVAModel`` on a CPU (`cpu_megatron`, `tiny_llava`,
  `megatron_batch`, `llava_loss`) and the ``energon-platform calibrate`` factory
  `calibration_model`.
"""

from __future__ import annotations

from energon_platform.integrations.megatron.args import (
    MegatronArgsError,
    check_megatron_args,
    megatron_requirements,
)
from energon_platform.integrations.megatron.batches import (
    BATCH_FORMATS,
    IGNORE_INDEX,
    to_megatron_batch,
)
from energon_platform.integrations.megatron.iterators import (
    MegatronTrainIterator,
    MegatronValidIterator,
)
from energon_platform.integrations.megatron.llava import (
    calibration_model,
    cpu_megatron,
    llava_loss,
    megatron_batch,
    tiny_llava,
)
from energon_platform.integrations.megatron.losses import sample_losses
from energon_platform.integrations.megatron.provider import (
    is_dataloader_rank,
    make_provider,
    make_provider_from_args,
    provider_kwargs_from_args,
)
from energon_platform.integrations.megatron.state_files import (
    latest_iteration,
    load_dataloader_state,
    save_dataloader_state,
    state_file,
)
from energon_platform.loader.schedule import LayoutError
from energon_platform.loader.state import StateMismatchError

__all__ = [
    "IGNORE_INDEX",
    "BATCH_FORMATS",
    "to_megatron_batch",
    "sample_losses",
    "is_dataloader_rank",
    "state_file",
    "latest_iteration",
    "save_dataloader_state",
    "load_dataloader_state",
    "make_provider",
    "provider_kwargs_from_args",
    "make_provider_from_args",
    "MegatronTrainIterator",
    "MegatronValidIterator",
    "StateMismatchError",
    "LayoutError",
    "MegatronArgsError",
    "megatron_requirements",
    "check_megatron_args",
    "cpu_megatron",
    "tiny_llava",
    "megatron_batch",
    "llava_loss",
    "calibration_model",
]
