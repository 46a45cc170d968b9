"""Turn a question into model input: the chat template where the model has one (and it is wanted), else plain text."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def with_instruction(question: str, instruction: str) -> str:
    """The user turn: question, a space, the answer-format instruction (verl's GSM8K layout)."""
    return f"{question} {instruction}".strip()


class PromptFormatter:
    """`use_chat_template`: 'auto' (if the tokenizer has one), True or False; plain prompts end with a newline.
    `system_prompt` is the chat's system turn, or leads a plain prompt followed by a blank line."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        use_chat_template: bool | str = "auto",
        system_prompt: str | None = None,
    ) -> None:
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if use_chat_template is True and not has_template:
            raise ValueError("model.chat_template=true but the tokenizer has no chat template; set it to auto or false")
        self.tokenizer = tokenizer
        self.chat = has_template if use_chat_template == "auto" else bool(use_chat_template)
        self.system_prompt = system_prompt

    def text(self, question: str) -> str:
        if not self.chat:
            return (f"{self.system_prompt}\n\n" if self.system_prompt else "") + question + "\n"
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": question})
        # transformers types every form apply_chat_template returns; tokenize=False gives the text
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[return-value]

    def token_ids(self, question: str) -> list[int]:
        return self.tokenizer(self.text(question), add_special_tokens=not self.chat)["input_ids"]
