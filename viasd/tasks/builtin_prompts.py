"""The project's built-in prompt set, used by the ``prompts`` task when ``path`` is null.

Written for this project (not taken from any dataset): one or two short prompts per task
kind, so a smoke run or a speed check needs no data folder. Each entry has an ``id``, the
``kind`` it imitates and the ``prompt`` (the user message).
"""

from __future__ import annotations

__all__ = ["BUILTIN_PROMPTS"]

BUILTIN_PROMPTS: list[dict[str, str]] = [
    {
        "id": "summarize-bakery",
        "kind": "summarization",
        "prompt": (
            "Summarize the following paragraph in one sentence.\n\n"
            "The town of Millbrook opened its first community bakery on Saturday. Volunteers had spent six "
            "months restoring an old fire station, installing two brick ovens and a long wooden counter. "
            "By noon the bakery had sold out of rye bread, and the organizers said the profits would pay "
            "for free baking classes for teenagers during the winter."
        ),
    },
    {
        "id": "summarize-robot",
        "kind": "summarization",
        "prompt": (
            "Summarize in one sentence: A small robot built by students at a regional college learned to "
            "sort recycling by color and shape. After two weeks of testing in the cafeteria it sorted "
            "nine out of ten items correctly, and the college plans to build three more."
        ),
    },
    {
        "id": "translate-train",
        "kind": "translation",
        "prompt": (
            "Translate this German sentence into English:\n\n"
            "Der Zug nach Hamburg hat heute wegen eines Sturms eine Stunde Verspätung."
        ),
    },
    {
        "id": "math-apples",
        "kind": "reasoning",
        "prompt": (
            "A farmer picks 48 apples in the morning and 35 in the afternoon. She puts them into bags of "
            "6 apples each. How many full bags does she fill? Think step by step and end with "
            '"The answer is N."'
        ),
    },
    {
        "id": "math-tickets",
        "kind": "reasoning",
        "prompt": (
            "A museum ticket costs $12 for adults and $7 for children. How much do 3 adults and 4 children "
            'pay in total? End your answer with "The answer is N."'
        ),
    },
    {
        "id": "qa-planet",
        "kind": "qa",
        "prompt": "Answer with a few words: which planet in our solar system is known as the Red Planet?",
    },
    {
        "id": "code-is-palindrome",
        "kind": "coding",
        "prompt": (
            "Complete this Python function:\n\n"
            "def is_palindrome(text: str) -> bool:\n"
            '    """Return True if text reads the same forwards and backwards, ignoring case and spaces."""\n'
        ),
    },
]
