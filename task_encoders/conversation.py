"""Instruction conversations and VQA → vision-language batches (``encoder: conversation``).

Input:

* `converters.sample_types.ConversationSample` (what ``energon-platform convert llava``
  writes): ``images`` (a list, possibly empty, of float (C, H, W) tensors) and ``conversation``, a
  list of turns ``{"from": "human" | "gpt" | "system", "value": str}`` (LLaVA) or
  ``{"role": "user" | "assistant" | "system", "content": str}``.
* Energon's ``VQASample``: ``image``, ``context`` (the question) and ``answers`` (with optional
  ``answer_weights``): one user turn and one assistant turn; with several answers one is drawn from
  the sample's own generator (stream ``"answer"``), by weight when weights are given.

Everything of `task_encoders.vision_language` (the vision-language mode of ``image_text``)
applies (``prompt``, ``vision``, ``image.tiling``, spliced lengths, packing,
`VisionLanguageBatch`); the config is ``image_text``'s plus ``chat:``. ``prompt.enabled``
is always on here (``prompt.template`` and ``prompt.instructions`` are not used).

Placeholders: each ``<image>`` in a turn stands for the next image, in order. With fewer
placeholders than images the missing ones go, each followed by ``"\\n"``, in front of the first user
turn (as Megatron-LM's ``encode_llava_sft`` does); more placeholders than images, or a placeholder
in an assistant turn, skips the sample (counted). A conversation without images is text only.

The chat template (``chat:``, `ChatConfig`) renders a document as:

    [BOS] system.prefix + system + system.suffix        (only with a system turn or chat.system)
          user.prefix + content + user.suffix
          assistant.prefix + content + assistant.suffix  ... one pair per exchange ...
          [EOS]

The shipped template is plain text the shipped tokenizer knows (``"User: "``, ``"Assistant: "``,
each turn ending in ``"\\n"``):

    <bos>User: <image>
    What animal is this?
    Assistant: A tabby cat.
    User: What colour are its eyes?
    Assistant: Green.
    <eos>

Loss on assistant turns only: ``loss_mask`` is 1 exactly where ``labels`` is a token of an
assistant turn's content or suffix, or the final EOS; prefixes, system and user turns are context.
Each piece is tokenized on its own and the ids are concatenated, so the answer spans are exact.
A conversation longer than ``text.seq_len`` (spliced) is cut at the end (EOS kept); it is skipped
if that would drop an image placeholder or leave no answer token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.energon import VQASample

from task_encoders.config_parser import At, require
from task_encoders.image_text import ImageTextConfig, PromptConfig
from task_encoders.registry import register
from task_encoders.seeding import sample_key
from task_encoders.vision_language import VisionLanguageTaskEncoder

#: Role names accepted in a turn, mapped to the template's roles.
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class TurnTemplate:
    """How one turn of a role is written: ``prefix + content + suffix``."""

    prefix: str = ""
    """The text before the turn's content."""
    suffix: str = "\n"
    """The text after the turn's content."""


@dataclass(frozen=True)
class ChatConfig:
    """``chat:``: the chat template (module doc). No prefix or suffix may hold
    ``prompt.image_token``."""

    system: str | None = None
    """The system message of a conversation that has none; null: no system turn."""
    system_turn: TurnTemplate = field(default_factory=lambda: TurnTemplate("System: ", "\n"))
    """How a system turn is written (``prefix``, ``suffix``)."""
    user_turn: TurnTemplate = field(default_factory=lambda: TurnTemplate("User: ", "\n"))
    """How a user turn is written (``prefix``, ``suffix``)."""
    assistant_turn: TurnTemplate = field(default_factory=lambda: TurnTemplate("Assistant: ", "\n"))
    """How an assistant turn is written (``prefix``, ``suffix``); the loss covers its content and
    suffix."""

    def turn(self, role: str) -> TurnTemplate:
        return {
            "system": self.system_turn,
            "user": self.user_turn,
            "assistant": self.assistant_turn,
        }[role]


@dataclass(frozen=True)
class ConversationConfig(ImageTextConfig):
    """Top level of a ``conversation`` config: ``image_text``'s plus ``chat``, with
    ``prompt.enabled`` always true (``prompt.template`` and ``prompt.instructions`` are unused)."""

    encoder: str = "conversation"
    """The registered name of the encoder: ``conversation``."""
    prompt: PromptConfig = field(default_factory=lambda: PromptConfig(enabled=True))
    """The placeholder and special tokens; ``enabled`` must stay true (the ``prompt`` keys
    below)."""
    chat: ChatConfig = field(default_factory=ChatConfig)
    """The chat template (the ``chat`` keys below)."""

    def check(self, at: At) -> None:
        require(
            self.prompt.enabled,
            at.child("prompt").child("enabled"),
            "false",
            "true (the conversation encoder always puts image placeholders in the text)",
        )
        super().check(at)
        for role in ("system", "user", "assistant"):
            turn = self.chat.turn(role)
            for name in ("prefix", "suffix"):
                require(
                    self.prompt.image_token not in getattr(turn, name),
                    at.child("chat").child(f"{role}_turn"),
                    f"{name} holds the image placeholder",
                    "template text without prompt.image_token",
                )


def normalize_turns(conversation: Any, key: str) -> list[tuple[str, str]]:
    """``[(role, content)]`` with roles ``system``/``user``/``assistant``; ``ValueError`` naming the
    sample for anything else (not a list, a turn without text, an unknown role, no assistant turn)."""
    if not isinstance(conversation, list) or not conversation:
        raise ValueError(
            f"sample {key!r}: conversation is {type(conversation).__name__}, not a non-empty list of turns"
        )
    turns = []
    for i, turn in enumerate(conversation):
        if not isinstance(turn, dict):
            raise ValueError(f"sample {key!r}: turn {i} is {type(turn).__name__}, not an object")
        role = turn.get("from", turn.get("role"))
        content = turn.get("value", turn.get("content"))
        if role not in ROLES or not isinstance(content, str):
            raise ValueError(
                f"sample {key!r}: turn {i} has role {role!r} and {type(content).__name__} content "
                f"(expected one of {sorted(ROLES)} and a string)"
            )
        turns.append((ROLES[role], content.strip()))
    if not any(role == "assistant" and content for role, content in turns):
        raise ValueError(f"sample {key!r}: no assistant turn with text (nothing to learn)")
    return turns


@register("conversation")
class ConversationTaskEncoder(VisionLanguageTaskEncoder):
    """``ConversationTaskEncoder(config=None, *, seed=None, training=True)``: batches are
    `task_encoders.vision_language.VisionLanguageBatch`; see the module doc."""

    config_class = ConversationConfig
    config: ConversationConfig
    facts_width = 5  # (id layout of 3, images, tiles): see sample_facts

    def sample_images(self, sample: Any) -> list:
        if isinstance(sample, VQASample):
            return [sample.image]
        images = getattr(sample, "images", None)
        if not isinstance(images, (list, tuple)):
            raise TypeError(
                f"{type(sample).__name__} has no 'images' list (expected a ConversationSample or VQASample)"
            )
        return list(images)

    def sample_turns(self, sample: Any) -> list[tuple[str, str]]:
        """The conversation as ``[(role, content)]`` (VQA: question and one answer)."""
        key = sample_key(sample)
        if isinstance(sample, VQASample):
            answers = sample.answers
            if isinstance(answers, str):
                answers = [answers]
            if not answers:
                raise ValueError(
                    f"sample {key!r}: a VQASample without answers has nothing to learn"
                )
            index = 0
            if len(answers) > 1:
                generator = self.sample_generator(sample, "answer")
                weights = sample.answer_weights
                weights = (
                    torch.as_tensor(weights, dtype=torch.float64)
                    if weights is not None
                    else torch.ones(len(answers))
                )
                index = int(torch.multinomial(weights.double(), 1, generator=generator))
            return normalize_turns(
                [
                    {"from": "human", "value": sample.context},
                    {"from": "gpt", "value": answers[index]},
                ],
                key,
            )
        return normalize_turns(getattr(sample, "conversation", None), key)

    def text_pieces(self, sample: Any, num_images: int) -> list[tuple[str, bool]]:
        chat, token = self.config.chat, self.config.prompt.image_token
        turns = self.sample_turns(sample)
        found = sum(content.count(token) for _, content in turns)
        if found < num_images:
            first_user = next((i for i, (role, _) in enumerate(turns) if role == "user"), None)
            if first_user is None:
                raise ValueError(
                    f"sample {sample_key(sample)!r}: {num_images} image(s) and no user turn to put them in"
                )
            role, content = turns[first_user]
            turns[first_user] = (role, (token + "\n") * (num_images - found) + content)
        if turns[0][0] != "system" and chat.system is not None:
            turns.insert(0, ("system", chat.system))
        pieces = []
        for role, content in turns:
            template = chat.turn(role)
            answer = role == "assistant"
            pieces += [(template.prefix, False), (content, answer), (template.suffix, answer)]
        return pieces

    # --- lengths without decoding (DocumentTaskEncoder's contract) ------------------------------

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(ids, end of the last placeholder, first answer id, images, tiles)`` of the whole document
        (`fitted_length`), uncut: a conversation draws nothing per epoch. A VQA sample's answer is
        drawn per epoch, so one whose answers differ in layout raises ``NotImplementedError``."""
        if (
            isinstance(sample, VQASample)
            and sample.answers is not None
            and not isinstance(sample.answers, str)
            and len(sample.answers) > 1
        ):
            facts = {
                self.sample_facts(dataclasses.replace(sample, answers=[a], answer_weights=None))
                for a in sample.answers
            }
            if len(facts) > 1:
                raise NotImplementedError(
                    f"sample {sample_key(sample)!r}: VQA answers of different lengths are drawn "
                    f"per epoch; fixed-width facts cannot hold every answer's length"
                )
            return facts.pop()
        images = self.sample_images(sample)
        ids, targets = self.document_ids(self.text_pieces(sample, len(images)), sample)
        self.check_placeholders(ids, len(images), sample)
        return (*self.id_layout(ids, targets, self.image_token_index), *self.image_facts(images))

    def document_layout(
        self, facts: tuple[int, ...], key: str, epoch: int
    ) -> tuple[tuple[int, int, int], int, int]:
        return (facts[0], facts[1], facts[2]), facts[3], facts[4]
