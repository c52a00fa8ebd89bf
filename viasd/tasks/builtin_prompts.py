"""The project's built-in prompts: this module owns every prompt written into the code.

Written for this project (not taken from any dataset), so nothing needs a data folder:

* :data:`BUILTIN_PROMPTS` — the ``prompts`` task's set when ``path`` is null: one or two
  short prompts per task kind, for a smoke run or a speed check. Each entry has an ``id``,
  the ``kind`` it imitates and the ``prompt`` (the user message).
* :data:`DISTILL_PROMPTS` — the open-ended chat prompts the draft is distilled on
  (:func:`viasd.distill.data.select_prompts`: alone without the data folder, added to the
  data prompts otherwise), as ``(category, prompt)`` pairs. Their order and text define the
  training prompts of a build, so edit them only together with
  :data:`viasd.distill.config.BUILD_FORMAT`.
"""

from __future__ import annotations

__all__ = ["BUILTIN_PROMPTS", "DISTILL_PROMPTS"]

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

DISTILL_PROMPTS: tuple[tuple[str, str], ...] = (
    ("writing", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    ("writing", "Compose a friendly email inviting your colleagues to a team lunch on Friday."),
    ("writing", "Write a haiku about autumn leaves and explain its imagery."),
    ("writing", "Write a product description for a reusable water bottle."),
    ("writing", "Draft a short speech for a high-school graduation ceremony."),
    ("writing", "Write a limerick about a cat who loves to code."),
    ("roleplay", "Pretend you are a tour guide in Rome. Describe the Colosseum to a group of visitors."),
    ("roleplay", "You are a chef. Explain to a beginner how to make a simple tomato pasta sauce."),
    ("roleplay", "Act as a job interviewer and ask me three questions for a software engineer role."),
    ("stem", "Explain how photosynthesis works in simple terms."),
    ("stem", "What is the difference between a virus and a bacterium?"),
    ("stem", "Explain Newton's three laws of motion with everyday examples."),
    ("stem", "Why is the sky blue? Give a short scientific explanation."),
    ("stem", "What causes the seasons on Earth?"),
    ("stem", "Describe the water cycle step by step."),
    ("humanities", "Summarize the main causes of the First World War."),
    ("humanities", "What were the main achievements of the Roman Empire?"),
    ("humanities", "Explain what democracy means and name two kinds of democracy."),
    ("humanities", "Who was Leonardo da Vinci and why is he famous?"),
    ("reasoning", "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain."),
    ("reasoning", "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost?"),
    ("math", "Tom has 12 apples. He gives 5 to his friend and buys 8 more. How many apples does he have now?"),
    ("math", "A train travels 60 miles per hour for 3 hours. How far does it travel?"),
    ("math", "What is 15% of 240? Show your work."),
    ("math", "Sara reads 20 pages a day. How many days does she need to finish a 340-page book?"),
    ("math", "A rectangle is 8 cm long and 5 cm wide. What are its area and perimeter?"),
    ("coding", "Write a Python function that returns the factorial of a number."),
    ("coding", "Write a Python function to check whether a string is a palindrome."),
    ("coding", "Write a Python function that returns the n-th Fibonacci number."),
    ("coding", "Write a Python function that removes duplicates from a list while keeping the order."),
    ("coding", "Explain what a Python list comprehension is and give an example."),
    ("coding", "Write a Python function that counts the vowels in a string."),
    ("qa", "What is the capital of Australia?"),
    ("qa", "Who wrote the novel Pride and Prejudice?"),
    ("qa", "How many planets are there in the solar system?"),
    ("qa", "What is the largest ocean on Earth?"),
    ("qa", "When did the first person land on the Moon?"),
    ("translation", "Translate the following German text to English.\n\nDer Zug kommt heute später an, weil es auf der Strecke einen Unfall gab."),
    ("translation", "Translate the following German text to English.\n\nIch habe gestern ein sehr interessantes Buch über die Geschichte Berlins gelesen."),
    ("translation", "Translate the following German text to English.\n\nDie Regierung plant, im nächsten Jahr mehr Geld in Schulen zu investieren."),
    ("summarization", "Summarize the following article in one sentence.\n\nThe city council voted on Tuesday to expand the bicycle lane network by 40 kilometres over the next three years. Supporters said the plan would reduce traffic and pollution, while some shop owners worried about losing parking spaces. The first new lanes are expected to open in the spring."),
    ("summarization", "Summarize the following article in one sentence.\n\nScientists have discovered a new species of frog in the rainforests of Peru. The tiny amphibian, which is less than two centimetres long, was found during a survey of a remote mountain area. Researchers say the discovery shows how much remains unknown about the region's wildlife."),
    ("summarization", "Summarize the following article in one sentence.\n\nA local bakery has won a national award for its sourdough bread. The owners, who opened the shop five years ago, said they were surprised and delighted by the prize. They plan to use the prize money to train two new apprentices."),
    ("extraction", "Extract the names of all the people mentioned in this sentence: Alice met Bob and Carol at the station, while Dave waited in the car."),
    ("extraction", "List the dates mentioned in this text: The project started on 3 March 2021, paused on 15 June 2021 and finished on 1 February 2022."),
    ("writing", "Give me five tips for staying productive while working from home."),
    ("stem", "Explain what machine learning is to a ten-year-old."),
    ("humanities", "Describe the main features of Gothic architecture."),
)
