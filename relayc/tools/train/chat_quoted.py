"""The chat prompt families that quote their input (summarize, rewrite, code, names,
continue): the generated paragraphs, misspelled sentences and Python snippets they carry,
and their templates (``chat_prompts.FAMILIES`` draws them)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from relayc.tools.train.chat_asks import ALL_SUBJECTS, CHARACTERS, SETTINGS

# The word lists and templates are laid out by hand, several to a line: ruff format would
# put every word on its own line and make the lists ten times as long.
# fmt: off
# Quoted inputs: the generated text a rewrite / summarize / continue prompt carries.
NAMES = [  # (name, pronoun)
    ("Maria", "she"), ("Tom", "he"), ("Leila", "she"), ("Jonas", "he"), ("Priya", "she"),
    ("Omar", "he"), ("Sofia", "she"), ("Ben", "he"), ("Yuki", "she"), ("Carlos", "he"),
    ("Emma", "she"), ("David", "he"), ("Aisha", "she"), ("Lukas", "he"), ("Nora", "she"),
    ("Sam", "he"), ("Ines", "she"), ("Kofi", "he"), ("Hannah", "she"), ("Ravi", "he"),
]
JOBS = [
    "nurse", "baker", "bus driver", "teacher", "software developer", "gardener", "librarian",
    "chef", "photographer", "mechanic", "pharmacist", "carpenter",
]
TOWNS = [
    "a small town by a river", "a busy city", "a village in the hills", "a coastal town",
    "the suburbs", "an old market town",
]
ROUTINES = [
    ("wakes up at six", "woke up at six"), ("drinks a cup of coffee", "drank a cup of coffee"),
    ("takes the bus to work", "took the bus to work"), ("walks the dog", "walked the dog"),
    ("reads the news", "read the news"), ("calls a friend", "called a friend"),
    ("cooks dinner for the family", "cooked dinner for the family"),
    ("goes to the gym", "went to the gym"), ("waters the plants", "watered the plants"),
    ("writes in a notebook", "wrote in a notebook"), ("buys fresh bread", "bought fresh bread"),
    ("plays the piano for an hour", "played the piano for an hour"),
    ("checks the emails", "checked the emails"), ("rides a bike to the park", "rode a bike to the park"),
]


def _routine(rng: random.Random) -> tuple[str, str]:
    """A short present-tense paragraph about someone's day, and its past-tense twin."""
    (name, pronoun), job, town = rng.choice(NAMES), rng.choice(JOBS), rng.choice(TOWNS)
    steps = rng.sample(ROUTINES, rng.randint(3, 4))
    texts = []
    for tense in (0, 1):
        works = ("works", "worked")[tense]
        rest = ", ".join(step[tense] for step in steps[1:-1]) + f" and {steps[-1][tense]}"
        texts.append(
            f"{name} {works} as a {job} in {town}. Every morning {name} {steps[0][tense]}. "
            f"After that {pronoun} {rest}."
        )
    return texts[0], texts[1]


FACILITIES = ["library", "swimming pool", "bakery", "community garden", "bike path", "museum"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TOWN_NAMES = ["Millbrook", "Ashford", "Riverton", "Kestrel Bay", "Oakhill", "Stonebridge", "Westmere"]
QUOTES = [
    "it was a great day for everyone", "the project took two years to finish",
    "young people would love it", "it was paid for by local families",
    "more events are planned for the summer",
]


def _report(rng: random.Random) -> str:
    """A short local-news paragraph (a summary's input)."""
    place, facility = rng.choice(TOWN_NAMES), rng.choice(FACILITIES)
    day, closed = rng.sample(WEEKDAYS, 2)
    return (
        f"The town of {place} opened a new {facility} on {day}. About {rng.randint(2, 40) * 25} "
        f"people came to the opening. The mayor said that {rng.choice(QUOTES)}. The {facility} "
        f"will be open from {rng.randint(7, 10)} a.m. to {rng.randint(5, 9)} p.m. every day "
        f"except {closed}."
    )


RECIPE_STEPS = [
    "preheat the oven to {n} degrees", "mix the flour, sugar and eggs", "chop the onions",
    "boil a large pot of water", "add a pinch of salt", "stir in the butter",
    "pour the batter into a tin", "bake for {m} minutes", "let it cool on a rack",
    "slice the bread", "grate the cheese", "wash the vegetables", "heat a pan with oil",
    "fry the garlic for a minute", "serve it warm",
]


def _steps_paragraph(rng: random.Random) -> str:
    steps = [s.format(n=rng.choice([160, 180, 200, 220]), m=rng.choice([10, 20, 25, 40]))
             for s in rng.sample(RECIPE_STEPS, rng.randint(3, 5))]
    joins = ["First", "Then", "After that", "Next", "Finally"]
    words = [f"{joins[i] if i < len(steps) - 1 else 'Finally'} {s}." for i, s in enumerate(steps)]
    return " ".join(words)


def summarize_prompt(rng: random.Random) -> str:
    text = rng.choice([_routine(rng)[0], _report(rng), _report(rng)])
    template = rng.choice([
        "Summarize this paragraph in one sentence: {t}", "Summarize the following text in two sentences:\n{t}",
        "Give a short title for this paragraph and a one-line summary:\n{t}",
        "What is the main idea of this text? {t}", "Summarize this for a child: {t}",
    ])
    return template.format(t=text)


ITEM_LISTS = [
    ["apples", "pears", "plums", "grapes", "oranges", "lemons", "figs", "peaches"],
    ["hammer", "screwdriver", "saw", "drill", "wrench", "pliers", "tape measure"],
    ["Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Delhi", "Madrid", "Toronto", "Nairobi"],
    ["red", "blue", "green", "yellow", "purple", "orange", "brown", "silver"],
    ["milk", "eggs", "bread", "rice", "butter", "cheese", "tomatoes", "onions", "coffee"],
    ["piano", "violin", "guitar", "flute", "drums", "cello", "trumpet", "harp"],
    ["tiger", "otter", "zebra", "owl", "whale", "beetle", "falcon", "lizard", "rabbit"],
]
INFORMAL = [
    "Hey, can you send me the {x} by tomorrow? Thanks!", "gonna be late for the {y}, sorry!!",
    "Thanks a ton for the {x}, you're the best.", "Can't make it to the {y}, something came up.",
    "Yo, did you get my message about the {x}?", "Need the {x} asap, pls check.",
    "The {y} was kinda boring, not gonna lie.",
]
INFORMAL_X = ["slides", "report", "photos", "invoice", "spreadsheet", "tickets", "notes"]
INFORMAL_Y = ["meeting", "party", "call", "workshop", "lunch", "review", "class"]
SENTENCES = [
    "The children planted three apple trees behind the school last spring.",
    "Our neighbor repaired the old fence before the storm arrived.",
    "The museum will open a new exhibition about ancient maps next month.",
    "My brother usually takes the early train because the roads are busy.",
    "The team finished the project two days before the deadline.",
    "A small bakery on the corner sells the best cinnamon rolls in town.",
    "The scientist measured the temperature of the lake every morning.",
    "We watched the fireworks from the roof of our apartment building.",
    "The committee approved the plan after a long discussion.",
    "The cat knocked a glass of water off the kitchen table.",
    "Thousands of birds fly south across the valley every autumn.",
    "The students wrote a letter to the mayor about the broken swings.",
]


def _typos(rng: random.Random, sentence: str) -> str:
    """``sentence`` with two or three words misspelled (a letter doubled, dropped or two
    swapped)."""
    words = sentence.split(" ")
    long_words = [i for i, w in enumerate(words) if len(w.strip(".,")) >= 5]
    for i in rng.sample(long_words, min(len(long_words), rng.randint(2, 3))):
        w = words[i]
        j = rng.randrange(1, len(w.strip(".,")) - 2)
        kind = rng.randrange(3)
        if kind == 0:
            w = w[:j] + w[j] + w[j:]
        elif kind == 1:
            w = w[:j] + w[j + 1 :]
        else:
            w = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
        words[i] = w
    return " ".join(words)


def rewrite_prompt(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return f"Rewrite this paragraph in the past tense: {_routine(rng)[0]}"
    if kind == 1:
        text = rng.choice(INFORMAL).format(x=rng.choice(INFORMAL_X), y=rng.choice(INFORMAL_Y))
        return rng.choice(["Make this sentence more formal: {t}", "Rewrite this message politely: {t}"]).format(t=text)
    if kind == 2:
        return (
            "Correct the spelling mistakes in this sentence and write it out again: "
            + _typos(rng, rng.choice(SENTENCES))
        )
    if kind == 3:
        return rng.choice([
            "Rewrite this sentence in the passive voice: {s}", "Rewrite this sentence in the future tense: {s}",
            "Repeat the following text exactly, then say how many words it has: {s}",
            "Rewrite this sentence so it is shorter: {s}", "Translate this sentence into French: {s}",
        ]).format(s=rng.choice(SENTENCES))
    if kind == 4:
        return f"Turn this into a bulleted list of steps: {_steps_paragraph(rng)}"
    items = rng.sample(rng.choice(ITEM_LISTS), rng.randint(4, 7))
    if kind == 5:
        return "Convert this list into a numbered list:\n" + "\n".join(f"- {i}" for i in items)
    if kind == 6:
        return f"Put these words in alphabetical order: {', '.join(items)}."
    if kind == 7:
        return rng.choice([
            "Turn this comma-separated line into a bulleted list: {t}",
            "Write these items as a JSON list of strings: {t}",
        ]).format(t=", ".join(items))
    past = _routine(rng)[1]
    return rng.choice([
        "Rewrite this paragraph in the first person: {t}",
        "Rewrite this paragraph in the present tense: {t}",
    ]).format(t=past)


# Python snippets: (correct code, the same code with one bug, a variable to rename).
LIST_NAMES = ["numbers", "values", "scores", "prices", "items", "data", "readings", "ages"]
ITEM_NAMES = {"numbers": "n", "values": "v", "scores": "score", "prices": "price", "items": "item",
              "data": "x", "readings": "r", "ages": "age"}
NEW_NAMES = ["count", "result", "total_sum", "current", "value", "element", "entry", "acc"]


@dataclass(frozen=True)
class Snippet:
    code: str
    buggy: str
    rename: str  # a variable in the code, for the rename prompts


def _snippet_average(rng: random.Random) -> Snippet:
    xs = rng.choice(LIST_NAMES)
    x, fn = ITEM_NAMES[xs], rng.choice(["average", "mean", "mean_value", "compute_average"])
    code = (
        f"def {fn}({xs}):\n    total = 0\n    for {x} in {xs}:\n        total += {x}\n"
        f"    return total / len({xs})\n"
    )
    bug = rng.choice([(f"len({xs})", f"len({xs[:-1]})"), ("total = 0", "total = 1"),
                      (f"total += {x}", f"total = {x}")])
    return Snippet(code, code.replace(*bug), "total")


def _snippet_largest(rng: random.Random) -> Snippet:
    xs = rng.choice(LIST_NAMES)
    x, fn = ITEM_NAMES[xs], rng.choice(["largest", "find_max", "biggest", "max_value"])
    code = (
        f"def {fn}({xs}):\n    best = {xs}[0]\n    for {x} in {xs}:\n        if {x} > best:\n"
        f"            best = {x}\n    return best\n"
    )
    bug = rng.choice([(f"if {x} > best", f"if {x} < best"), ("    return best\n", "")])
    return Snippet(code, code.replace(*bug), "best")


def _snippet_count(rng: random.Random) -> Snippet:
    xs = rng.choice(LIST_NAMES)
    x, target = ITEM_NAMES[xs], rng.choice(["target", "wanted", "key", "needle"])
    code = (
        f"def count_matches({xs}, {target}):\n    count = 0\n    for {x} in {xs}:\n"
        f"        if {x} == {target}:\n            count += 1\n    return count\n"
    )
    bug = rng.choice([("count += 1", "count + 1"), (f"{x} == {target}", f"{x} != {target}")])
    return Snippet(code, code.replace(*bug), "count")


def _snippet_palindrome(rng: random.Random) -> Snippet:
    s, fn = rng.choice(["text", "word", "s", "phrase"]), rng.choice(["is_palindrome", "reads_same_backwards"])
    code = f'def {fn}({s}):\n    cleaned = {s}.lower().replace(" ", "")\n    return cleaned == cleaned[::-1]\n'
    bug = rng.choice([("cleaned[::-1]", "cleaned[::1]"), (".lower()", ".upper")])
    return Snippet(code, code.replace(*bug), "cleaned")


def _snippet_factorial(rng: random.Random) -> Snippet:
    n = rng.choice(["n", "number", "k"])
    code = (
        f"def factorial({n}):\n    result = 1\n    for i in range(1, {n} + 1):\n"
        f"        result *= i\n    return result\n"
    )
    bug = rng.choice([(f"range(1, {n} + 1)", f"range(1, {n})"), ("result = 1", "result = 0")])
    return Snippet(code, code.replace(*bug), "result")


def _snippet_celsius(rng: random.Random) -> Snippet:
    c, fn = rng.choice(["celsius", "c", "degrees"]), rng.choice(["to_fahrenheit", "c_to_f", "convert"])
    code = f"def {fn}({c}):\n    fahrenheit = {c} * 9 / 5 + 32\n    return fahrenheit\n"
    bug = rng.choice([("9 / 5", "5 / 9"), ("+ 32", "- 32")])
    return Snippet(code, code.replace(*bug), "fahrenheit")


def _snippet_word_counts(rng: random.Random) -> Snippet:
    text, fn = rng.choice(["text", "sentence", "document"]), rng.choice(["word_counts", "count_words"])
    code = (
        f"def {fn}({text}):\n    counts = {{}}\n    for word in {text}.split():\n"
        f"        counts[word] = counts.get(word, 0) + 1\n    return counts\n"
    )
    bug = rng.choice([("counts.get(word, 0)", "counts.get(word, 1)"), (f"{text}.split()", text)])
    return Snippet(code, code.replace(*bug), "counts")


def _snippet_evens(rng: random.Random) -> Snippet:
    xs = rng.choice(LIST_NAMES)
    x, fn = ITEM_NAMES[xs], rng.choice(["even_only", "keep_even", "filter_even"])
    code = (
        f"def {fn}({xs}):\n    result = []\n    for {x} in {xs}:\n        if {x} % 2 == 0:\n"
        f"            result.append({x})\n    return result\n"
    )
    bug = rng.choice([("% 2 == 0", "% 2 == 1"), (f"result.append({x})", f"result.append({xs})")])
    return Snippet(code, code.replace(*bug), "result")


def _snippet_reverse(rng: random.Random) -> Snippet:
    s, fn = rng.choice(["text", "word", "s"]), rng.choice(["reverse", "reversed_text", "backwards"])
    code = f'def {fn}({s}):\n    result = ""\n    for ch in {s}:\n        result = ch + result\n    return result\n'
    return Snippet(code, code.replace("result = ch + result", "result = result + ch"), "ch")


def _snippet_index(rng: random.Random) -> Snippet:
    xs = rng.choice(LIST_NAMES)
    target = rng.choice(["target", "wanted", "value"])
    code = (
        f"def find_index({xs}, {target}):\n    for i in range(len({xs})):\n"
        f"        if {xs}[i] == {target}:\n            return i\n    return -1\n"
    )
    bug = rng.choice([(f"range(len({xs}))", f"range(len({xs}) - 1)"), ("return -1", "return 0")])
    return Snippet(code, code.replace(*bug), "i")


def _snippet_class(rng: random.Random) -> Snippet:
    cls, attr = rng.choice([("Basket", "owner"), ("Wallet", "currency"), ("Playlist", "title"),
                            ("Order", "customer"), ("Cart", "user")])
    code = (
        f"class {cls}:\n    def __init__(self, {attr}):\n        self.{attr} = {attr}\n"
        f"        self.items = []\n\n    def add(self, item):\n        self.items.append(item)\n\n"
        f"    def total(self):\n        return sum(self.items)\n"
    )
    bug = rng.choice([("self.items.append(item)", "self.items.append(items)"),
                      ("        self.items = []\n", "")])
    return Snippet(code, code.replace(*bug), "item")


def _snippet_fizzbuzz(rng: random.Random) -> Snippet:
    i, n = rng.choice(["i", "n", "number"]), rng.choice([16, 21, 31, 51, 101])
    code = (
        f"for {i} in range(1, {n}):\n    if {i} % 15 == 0:\n        print(\"FizzBuzz\")\n"
        f"    elif {i} % 3 == 0:\n        print(\"Fizz\")\n    elif {i} % 5 == 0:\n"
        f"        print(\"Buzz\")\n    else:\n        print({i})\n"
    )
    return Snippet(code, code.replace(f"{i} % 15", f"{i} % 10"), i)


SNIPPETS = [
    _snippet_average, _snippet_largest, _snippet_count, _snippet_palindrome, _snippet_factorial,
    _snippet_celsius, _snippet_word_counts, _snippet_evens, _snippet_reverse, _snippet_index,
    _snippet_class, _snippet_fizzbuzz,
]


def code_prompt(rng: random.Random) -> str:
    snippet = rng.choice(SNIPPETS)(rng)
    if rng.random() < 0.4:
        return rng.choice([
            "Fix the bug in this function and show the whole corrected function:\n{c}",
            "This code does not work as expected. Find the mistake and fix it:\n{c}",
            "Why does this code give the wrong answer? Explain and fix it:\n{c}",
        ]).format(c=snippet.buggy)
    new = rng.choice([n for n in NEW_NAMES if n != snippet.rename])
    return rng.choice([
        "Add type hints to this Python code and print it again:\n{c}",
        "Add a docstring to this code and show the whole code:\n{c}",
        "Explain what this code does, line by line:\n{c}",
        "Rename the variable {v} to {w} in this code and show the result:\n{c}",
        "Add comments to this Python code:\n{c}",
        "Write two unit tests with pytest for this code:\n{c}",
        "Rewrite this code to be shorter, keeping what it does:\n{c}",
    ]).format(c=snippet.code, v=snippet.rename, w=new)


NAME_WORDS = [
    "user", "name", "total", "price", "is", "active", "max", "retry", "count", "created",
    "at", "file", "path", "order", "id", "first", "last", "item", "start", "time", "end",
    "date", "page", "size", "email", "address", "shopping", "cart", "error", "message",
    "default", "value", "next", "token", "min", "height", "width", "score", "row", "index",
]
NAME_STYLES = {
    "camelCase": lambda w: w[0] + "".join(p.capitalize() for p in w[1:]),
    "snake_case": lambda w: "_".join(w),
    "PascalCase": lambda w: "".join(p.capitalize() for p in w),
    "UPPER_SNAKE_CASE": lambda w: "_".join(w).upper(),
    "kebab-case": lambda w: "-".join(w),
}
FOREIGN = ["French", "Spanish", "German", "Italian", "Portuguese"]
WORDS_TO_TRANSLATE = [
    "house", "dog", "water", "bread", "friend", "book", "window", "apple", "school", "river",
    "morning", "city", "train", "chair", "flower", "sun", "money", "door", "table", "cheese",
]


def names_prompt(rng: random.Random) -> str:
    if rng.random() < 0.25:
        words = rng.sample(WORDS_TO_TRANSLATE, rng.randint(4, 7))
        return f"Translate these words into {rng.choice(FOREIGN)}: {', '.join(words)}."
    source, target = rng.sample(list(NAME_STYLES), 2)
    names = [NAME_STYLES[source](rng.sample(NAME_WORDS, rng.randint(2, 3)))
             for _ in range(rng.randint(4, 6))]
    return rng.choice([
        "Translate these variable names from {s} to {t}: {n}.",
        "Convert these names from {s} to {t}: {n}.",
        "Rewrite these identifiers in {t}: {n}.",
    ]).format(s=source, t=target, n=", ".join(names))


OPENINGS = [
    "{C} stood at the edge of {s} and looked at the sky.",
    "Nobody in {s} had ever seen {c} before that morning.",
    "It was raining when {c} first arrived in {s}.",
    "The note said only three words, and {c} read it twice.",
]


def continue_prompt(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        c, s = rng.choice(CHARACTERS), rng.choice(SETTINGS)
        opening = rng.choice(OPENINGS).format(C=c[0].upper() + c[1:], c=c, s=s)
        return rng.choice(["Continue this story: {o}", "Write the next paragraph of this story: {o}"]).format(o=opening)
    if kind == 1:
        s = rng.choice(ALL_SUBJECTS)
        return rng.choice([
            "Finish this sentence: The most surprising thing about {s} is",
            "Complete this sentence in three different ways: Learning about {s} taught me",
        ]).format(s=s)
    if kind == 2:
        items = rng.sample(rng.choice(ITEM_LISTS), 4)
        return f"Continue this list with five more items of the same kind: {', '.join(items)}"
    snippet = rng.choice(SNIPPETS)(rng).code.splitlines()
    head = "\n".join(snippet[: max(2, len(snippet) // 2)])
    return f"Complete this Python code:\n{head}\n"
# fmt: on
