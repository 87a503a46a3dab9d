"""Run configuration: one YAML file → validated, frozen dataclasses.

Sections: ``data`` (an Energon dataset), ``encoder`` (a task-encoder config file or inline
mapping, see ``configs/encoders/``), ``loader``, ``model``, ``train``. Errors name the file, the
key and what was expected (the parsing rules are ``task_encoders.config_parser``'s). Relative paths
resolve against the YAML file's folder.

Each section is checked here by itself; what needs the encoder the config builds (packing, context
parallelism, the balance mode, the model's patch) is checked in `energon_platform.config_checks`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from energon_platform.loader.balance.settings import (
    BALANCE_MODES,
    FLAT_BALANCE_KEYS,
    LOADER_BALANCE_KEYS,
    MAX_BALANCE_LOOKAHEAD,
    MAX_BALANCE_WINDOW,
    BalanceConfig,
    balance_override,
    group_balance,
)
from energon_platform.loader.executors.settings import RAY_ACTOR_OPTIONS, ExecutorConfig
from energon_platform.loader.mixing.settings import BlendAdaptConfig
from energon_platform.loader.settings import (
    HIGHEST_WEIGHT,
    LOWEST_WEIGHT,
    MAX_BATCH,
    MAX_CONTEXT_PARALLEL,
    MAX_STEP,
    MAX_WORKERS,
    BlendStep,
    ExcludeRule,
    weight_problem,
)
from task_encoders.config_parser import (
    At,
    ConfigError,
    at_least,
    at_most,
    parse,
    read_yaml,
    require,
)

#: the run config's own names, then those of the sections' modules, importable from here as before
__all__ = [
    "ConfigError",
    "RunConfig",
    "load_config",
    "BALANCE_MODES",
    "FLAT_BALANCE_KEYS",
    "LOADER_BALANCE_KEYS",
    "MAX_BALANCE_LOOKAHEAD",
    "MAX_BALANCE_WINDOW",
    "BalanceConfig",
    "RAY_ACTOR_OPTIONS",
    "ExecutorConfig",
    "HIGHEST_WEIGHT",
    "LOWEST_WEIGHT",
    "MAX_BATCH",
    "MAX_CONTEXT_PARALLEL",
    "MAX_STEP",
    "MAX_WORKERS",
    "BlendStep",
    "ExcludeRule",
    "weight_problem",
    "BlendAdaptConfig",
]


@dataclass(frozen=True)
class DataConfig:
    """``data:``: the dataset a run reads."""

    path: Path
    """A dataset written by ``energon-platform convert`` (or any Energon webdataset): a local
    folder, or ``msc://PROFILE/prefix`` on object storage (then kept as that string)."""
    train_split: str = "train"
    """The split the run trains on."""
    val_split: str | None = "val"
    """The split ``build_val_loader`` reads; null for none."""


#: The least ``loader.sample_timeout`` (seconds): a worker's start and its first sample take
#: longer than a fraction of a second on a loaded machine.
MIN_SAMPLE_TIMEOUT = 1.0


@dataclass(frozen=True)
class LoaderOptions:
    """The loader's own keys of ``loader:`` (`LoaderConfig`: these, then the executor's)."""

    global_batch_size: int = 8
    """Items per training step over all data-parallel ranks (samples, or pack groups with
    packing); fixed for the life of a run."""
    micro_batch_size: int | None = None
    """Items per ``next()`` on a rank; null: the rank's whole share (no gradient accumulation)."""
    num_workers: int = 2
    """Loader worker processes per rank (may change between save and restore)."""
    seed: int = 1234
    """The seed of the sample order and of per-sample randomness."""
    shuffle_buffer: int | None = None
    """null: a full permutation per epoch; K: a windowed shuffle of K (shard-local reads)."""
    pack_group: int | None = None
    """Samples handed to the encoder's packer together; null: the encoder's
    ``packing.buffer_size`` when its packing is enabled, else 1 (no packing)."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead."""
    shuffle_run: int = 1
    """With ``shuffle_buffer``: runs of this many consecutive samples stay together (one read
    each on object storage)."""
    blend_unit: Literal["sample", "batch"] = "sample"
    """Blends: ``sample`` (datasets interleave sample by sample) or ``batch`` (every micro-batch
    from one dataset; needs ``micro_batch_size``)."""
    blend_schedule: tuple[BlendStep, ...] = ()
    """Blends: weights from given steps on (a curriculum), a list of ``{step, weights}``
    overriding the metadataset's weights from each entry's step on."""
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    """How global batches are made: a mode alone (``balance: attention``) or the group below."""
    length_cache: str | None = None
    """A folder for length indexes that cannot be stored with their dataset (object storage, a
    read-only folder; a folder every node sees, shared); null: ``$ENERGON_PLATFORM_CACHE/lengths``
    or ``~/.cache/energon-platform/lengths``."""
    length_index: Literal["build", "require"] = "build"
    """A dataset without a length index at start-up: ``build`` it then (after one line naming
    ``energon-platform index`` and the time it takes), or ``require`` it (stop with that line)."""
    exclude: tuple[ExcludeRule, ...] = ()
    """Samples skipped from given steps on: a list of ``{step, keys, shards, datasets}``."""
    blend_adapt: BlendAdaptConfig | None = None
    """Blends: weights that follow the per-dataset loss (`BlendAdaptConfig`); null: fixed
    weights (the metadataset's, ``blend_schedule``)."""
    sample_timeout: float | None = None
    """Seconds a loader worker may spend reading and encoding one sample; null: no limit."""
    context_parallel: int = 1
    """The model's context-parallel ranks (Megatron's ``--context-parallel-size``; 1: off)."""


@dataclass(frozen=True)
class LoaderConfig(ExecutorConfig, LoaderOptions):
    """``loader:``: the order and batching of the training data, one rank's loader.

    ``num_workers`` may change between save and restore; the others may not. Its keys are
    `LoaderOptions`'s, then the executor's (`ExecutorConfig`: ``executor``, ``ray_address``,
    ``ray_actor_options``).

    Blends (``data.path`` an Energon metadataset): weights may change at resume and datasets may
    be added; the history is kept in the loader state.

    Balance: ``balance`` (`BalanceConfig`, a mode or a group). With a mode set and a
    packing encoder every micro-batch is exactly ``micro_batch_size`` rows of ``seq_len``
    (``global_batch_size`` counts rows), packed globally from a pool of ``balance.lookahead``
    global batches of positions (at most ``balance.window`` samples); samples that do not fit
    wait for a later global batch. Unpacked, ``balance.global_batch_tokens`` makes a global batch
    a cost budget (``global_batch_size`` samples at least). Lengths come from a cached length
    index (``length_cache``).

    ``sample_timeout``: a worker stuck longer is killed, the sample counts as failed (its
    stand-in is used, as for a corrupt sample, and it is not waited for again in this process)
    and the workers restart where the loader is: the order and every other batch stay the same, and so does the
    state. With ``num_workers: 0`` it runs one worker process (a sample stuck in the training
    process could not be stopped). The trainer's start-up check, which encodes a few samples in
    its own process, counts a sample past it as failed too (it tries the next). At
    least 1 second; set it well above the slowest normal sample: a sample that only sometimes
    finishes within it makes runs differ.

    ``context_parallel``: with ``N > 1`` ranks the encoder must pack (``packing.enabled``,
    with or without a balance mode), ``text.seq_len`` must be a multiple of ``2N``, and every
    document's attention segment is padded (loss-masked) to a multiple of ``2N``
    (`energon_platform.loader.context_parallel`); vision-language encoders are refused.
    """

    def check(self, at: At) -> None:
        at_least(
            self,
            at,
            global_batch_size=1,
            num_workers=0,
            prefetch_factor=1,
            seed=0,
            shuffle_run=1,
            context_parallel=1,
        )
        require(
            self.shuffle_run == 1 or self.shuffle_buffer is not None,
            at.child("shuffle_run"),
            f"got {self.shuffle_run} with shuffle_buffer null",
            "1 unless shuffle_buffer is set",
        )
        steps = [b.step for b in self.blend_schedule]
        require(
            steps == sorted(set(steps)) and all(s >= 0 for s in steps),
            at.child("blend_schedule"),
            f"steps {steps}",
            "increasing steps >= 0",
        )
        require(self.seed < 2**63, at.child("seed"), f"got {self.seed}", "< 2**63")
        at_least(self, at, null_ok=True, micro_batch_size=1, shuffle_buffer=1, pack_group=1)
        at_most(
            self,
            at,
            global_batch_size=MAX_BATCH,
            micro_batch_size=MAX_BATCH,
            pack_group=MAX_BATCH,
            num_workers=MAX_WORKERS,
            prefetch_factor=MAX_WORKERS,
            context_parallel=MAX_CONTEXT_PARALLEL,
        )
        mode = self.balance.mode
        require(
            mode == "none" or self.balance.window >= self.global_batch_size,
            at.child("balance").child("window"),
            f"{self.balance.window} < global_batch_size {self.global_batch_size}",
            "at least global_batch_size (the pool must hold a global batch)",
        )
        if mode != "none":
            require(
                not self.blend_schedule,
                at.child("blend_schedule"),
                f"set with balance {mode!r}",
                "no blend_schedule with balance (change weights at resume instead)",
            )
            require(
                self.blend_unit == "sample",
                at.child("blend_unit"),
                f"{self.blend_unit!r} with balance {mode!r}",
                "sample (the planner interleaves samples)",
            )
        if self.blend_adapt is not None:
            require(
                not self.blend_schedule,
                at.child("blend_adapt"),
                "set with blend_schedule",
                "one of blend_adapt and blend_schedule",
            )
            require(
                not any(r.datasets for r in self.exclude),
                at.child("exclude"),
                "datasets listed with blend_adapt",
                "keys or shards (the mixer sets every dataset's weight)",
            )
        require(
            mode == "none" or not any(r.datasets for r in self.exclude),
            at.child("exclude"),
            f"datasets listed with balance {mode!r}",
            "keys or shards (with balance, set a dataset's weight to 0 at resume instead)",
        )
        require(
            self.sample_timeout is None
            or (self.sample_timeout > 0 and math.isfinite(self.sample_timeout)),
            at.child("sample_timeout"),
            f"got {self.sample_timeout}",
            "seconds > 0, or null for no limit",
        )
        self.check_executor(at, self.num_workers)
        require(
            self.sample_timeout is None or self.sample_timeout >= MIN_SAMPLE_TIMEOUT,
            at.child("sample_timeout"),
            f"got {self.sample_timeout}: below it every worker is killed before its first "
            f"sample (a new worker takes seconds to start)",
            f"at least {MIN_SAMPLE_TIMEOUT:g} second, well above the slowest normal sample",
        )


@dataclass(frozen=True)
class ModelConfig:
    """``model:``: the reference model (``energon_platform.training.model`` and
    ``energon_platform.training.two_tower``)."""

    kind: Literal["tiny", "two_tower"] = "tiny"
    """``tiny`` (the captioning model) or ``two_tower`` (a ViT over image tiles and a conv +
    transformer audio encoder feeding the language model)."""
    dim: int = 64
    """The language model's width (a multiple of ``heads``)."""
    layers: int = 2
    """The language model's transformer blocks."""
    heads: int = 4
    """The language model's attention heads."""
    patch: int = 8
    """The image patch side, in pixels."""
    dropout: float = 0.0
    """Dropout probability, in [0, 1)."""
    vision_dim: int = 32
    """``two_tower``: the vision tower's width (a multiple of ``vision_heads``)."""
    vision_layers: int = 2
    """``two_tower``: the vision tower's transformer blocks."""
    vision_heads: int = 2
    """``two_tower``: the vision tower's attention heads."""
    audio_dim: int = 32
    """``two_tower``: the audio tower's width (a multiple of ``audio_heads``)."""
    audio_layers: int = 1
    """``two_tower``: the audio tower's transformer blocks."""
    audio_heads: int = 2
    """``two_tower``: the audio tower's attention heads."""

    def check(self, at: At) -> None:
        at_least(
            self,
            at,
            dim=1,
            layers=0,
            heads=1,
            patch=1,
            vision_dim=1,
            vision_layers=0,
            vision_heads=1,
            audio_dim=1,
            audio_layers=0,
            audio_heads=1,
        )
        for width, heads in (
            ("dim", "heads"),
            ("vision_dim", "vision_heads"),
            ("audio_dim", "audio_heads"),
        ):
            require(
                getattr(self, width) % getattr(self, heads) == 0,
                at.child(width),
                f"{getattr(self, width)} is not divisible by {heads}={getattr(self, heads)}",
                f"a multiple of {heads}",
            )
        require(
            0.0 <= self.dropout < 1.0,
            at.child("dropout"),
            f"got {self.dropout}",
            "a number in [0, 1)",
        )


@dataclass(frozen=True)
class TrainConfig:
    """``train:``: the reference trainer's run."""

    steps: int = 40
    """Optimizer steps."""
    lr: float = 3e-3
    """Peak learning rate."""
    weight_decay: float = 0.01
    """The optimizer's weight decay."""
    warmup: int = 5
    """Steps of linear learning-rate warm-up."""
    checkpoint_every: int = 10
    """A checkpoint every this many steps, into ``out``/checkpoints."""
    keep_checkpoints: int = 3
    """The newest checkpoints kept; older ones are deleted."""
    out: Path = Path("out/train")
    """The run's folder: checkpoints and the JSON-lines log ``log.jsonl``."""

    def check(self, at: At) -> None:
        at_least(
            self, at, steps=1, warmup=0, checkpoint_every=1, keep_checkpoints=1, weight_decay=0.0
        )
        at_most(
            self,
            at,
            steps=MAX_STEP,
            warmup=MAX_STEP,
            checkpoint_every=MAX_STEP,
            keep_checkpoints=MAX_STEP,
        )
        require(
            self.lr > 0 and math.isfinite(self.lr),
            at.child("lr"),
            f"got {self.lr}",
            "a finite number > 0",
        )


@dataclass(frozen=True)
class RunConfig:
    """A whole run config: what `load_config` returns."""

    data: DataConfig
    """The dataset (the ``data`` table below)."""
    encoder: Any
    """The path of an encoder YAML (``configs/encoders/``), or an inline mapping
    (``task_encoders.registry.get_encoder``)."""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    """The loader (the ``loader`` table below)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The reference model (the ``model`` table below)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The reference trainer (the ``train`` table below)."""
    source: str = "<dict>"
    """Set by `load_config`, not read from the file: the YAML file's path, or ``<dict>``."""

    def check(self, at: At) -> None:
        if isinstance(self.encoder, str):
            object.__setattr__(self, "encoder", str(parse(Path, self.encoder, at.child("encoder"))))
        require(
            isinstance(self.encoder, (str, dict)),
            at.child("encoder"),
            f"got {type(self.encoder).__name__}",
            "a path to an encoder YAML or a mapping",
        )


def config_dict(cfg: RunConfig) -> dict:
    """``cfg`` as plain YAML data (mappings, lists, strings, numbers; paths absolute): `load_config`
    of it gives ``cfg`` back (its ``source`` aside; a path it held relative, as a default one,
    absolute from the working folder)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {
                f.name: plain(getattr(value, f.name))
                for f in dataclasses.fields(value)
                if f.name != "source"
            }
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return os.path.abspath(value) if isinstance(value, Path) else value

    return plain(cfg)


def load_config(path_or_dict: str | Path | dict, overrides: dict | None = None) -> RunConfig:
    """Read and validate a run config. ``overrides``: ``{"train.steps": 10, ...}`` applied first."""
    if isinstance(path_or_dict, dict):
        data, at = copy.deepcopy(path_or_dict), At()  # overrides never touch the caller's sections
    else:
        data, at = read_yaml(path_or_dict)
    group_balance(data, at)
    shell = set()
    for dotted, value in (overrides or {}).items():
        dotted = balance_override(data, dotted, value, at)
        if dotted is not None:
            _set_dotted(data, dotted, value, at)
            shell.add(dotted)
    group_balance(data, at)
    data["source"] = at.source
    return parse(RunConfig, data, dataclasses.replace(at, shell_keys=frozenset(shell)))


def _set_dotted(data: dict, dotted: str, value: Any, at: At) -> None:
    """``data["train"]["steps"] = value`` for ``dotted="train.steps"``; ConfigError naming the key
    when a part is empty or a parent is a value, not a section."""
    *parents, leaf = dotted.split(".")
    if not all(parents) or not leaf:
        raise ConfigError(at.source, dotted, "not a key (expected SECTION.KEY, e.g. train.steps)")
    node = data
    for i, name in enumerate(parents):
        if node.get(name) is None:
            node[name] = {}
        node = node[name]
        if not isinstance(node, dict):
            raise ConfigError(
                at.source,
                ".".join(parents[: i + 1]),
                f"is {node!r}, not a section; cannot set {dotted}",
            )
    node[leaf] = value
