"""What a run will learn from: the rows that keep no label token, and why. One wording for every data path (text
templates, data handlers, pretokenised rows, vision conversations): data with no label token at all is a
``UserInputError`` naming the data, its row count and each reason (truncation by ``--max_seq_length`` with the
longest prompt's length, a response template never matched); rows that lose every label are one warning per dataset.
aLoRA's invocation tokens are looked for in the rows as the data tokenises them (``invocation_rows``)."""

import dataclasses
import logging
from array import array
from collections.abc import Iterable, Sequence

from tuning.utils.error_logging import UserInputError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class LabelLoss:
    """The rows of one dataset that keep no label token: ``truncated`` lost them to ``--max_seq_length`` (the
    longest of their prompts is ``longest_prompt`` tokens, ``or more`` when only known to be at least that),
    ``untemplated`` lack the response ``template``, ``unlabelled`` came with nothing to train on (every label
    -100, no assistant turn)."""

    template: str | None = None
    truncated: int = 0
    longest_prompt: int = 0
    prompt_at_least: bool = False
    untemplated: int = 0
    unlabelled: int = 0

    @property
    def rows(self) -> int:
        return self.truncated + self.untemplated + self.unlabelled

    def add_truncated(self, prompt_tokens: int, at_least: bool = False) -> None:
        self.truncated += 1
        if prompt_tokens > self.longest_prompt or (prompt_tokens == self.longest_prompt and not at_least):
            self.longest_prompt, self.prompt_at_least = prompt_tokens, at_least

    def reasons(self, max_length: int) -> str:
        parts = []
        if self.truncated:
            more = " or more" if self.prompt_at_least else ""
            parts.append(
                f"{self.truncated} lost every label to truncation at --max_seq_length {max_length} (the longest "
                f"prompt takes {self.longest_prompt} tokens{more})"
            )
        if self.untemplated:
            parts.append(f"{self.untemplated} lack the response template {self.template!r}")
        if self.unlabelled:
            parts.append(f"{self.unlabelled} hold no token to train on as given (no label, no assistant turn)")
        return " and ".join(parts)


def check_label_loss(loss: LabelLoss, rows: int, source: str, max_length: int) -> None:
    """Refuse ``source`` when none of its ``rows`` keeps a label token (a ``UserInputError`` saying why); warn once
    when some lost theirs."""
    if not loss.rows:
        return
    if loss.rows >= rows:
        advice = "; raise --max_seq_length or shorten the prompts" if loss.truncated else ""
        raise UserInputError(
            f"{source}: none of its {rows} rows keeps a token to train on: {loss.reasons(max_length)}{advice}"
        )
    logger.warning(
        "%s: %d of %d rows keep no token to train on and are left out: %s",
        source,
        loss.rows,
        rows,
        loss.reasons(max_length),
    )


def invocation_rows(rows: Iterable[Sequence[int]], tokens: Sequence[int]) -> tuple[int, int]:
    """``(rows holding tokens as a contiguous run, rows)``: a byte search of each row's token ids (4 bytes each)."""
    needle = array("i", tokens).tobytes()
    found = total = 0
    for row in rows:
        total += 1
        haystack = array("i", row).tobytes()
        position = haystack.find(needle)
        while position >= 0 and position % 4:  # a match across token boundaries: look on
            position = haystack.find(needle, position + 1)
        found += position >= 0
    return found, total


def check_invocation(rows: Iterable[Sequence[int]], tokens: Sequence[int], text: str | None, source: str) -> None:
    """aLoRA trains only the tokens after its invocation tokens: refuse ``source`` when no row holds them as the
    data tokenises them (every adapter weight would stay as initialised); warn how many rows lack them. ``text``:
    the --alora_invocation_string they came from (None: the tokens were given as such)."""
    found, total = invocation_rows(rows, tokens)
    named = f"--alora_invocation_string {text!r}: its tokens" if text is not None else "aLoRA's invocation tokens"
    if not found:
        raise UserInputError(
            f"{named} {list(tokens)} occur in none of the {total} rows of {source} as the data tokenises them, so "
            "the adapter would train on nothing; a string inside the text may tokenise otherwise than alone (a "
            "leading space or newline joins its first token): give it as it appears there, with the character "
            "before it"
        )
    if found < total:
        logger.warning(
            "%s %s: %d of %d rows of %s lack them as the data tokenises them; the adapter learns nothing from them",
            named,
            list(tokens),
            total - found,
            total,
            source,
        )
