"""The offline chat prompts: a seeded, deterministic generator of distinct English chat
prompts from the templates and word lists below, written for this project (no downloads).

Families (``FAMILIES``): explain, describe, list, compare, how-to, short stories, poems,
emails and questions across science, cooking, travel, programming, history and daily life;
and the families that quote their input -- summarize / rewrite / convert this, fix or edit
this Python code, translate the names, continue this -- whose quoted text (paragraphs,
misspelled sentences, Python functions with and without a bug, identifiers) is generated
too, because n-gram drafting and EAGLE both meet such prompts in the demo.

:func:`build_prompts` is prefix-stable (the first N prompts of a longer list with the same
seed are the list of N) and never returns a held-out chat prompt (``relayc/assets/chat``),
equal or contained, either way round.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from relayc.tools.demo import CHAT_PROMPTS


@dataclass(frozen=True)
class ChatPrompt:
    family: str  # the template family that wrote it (FAMILIES)
    text: str  # the user message


def _normalized(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".?!: ")


def heldout_texts() -> list[str]:
    """The held-out chat prompts' texts, normalized (case, whitespace, final punctuation)
    as :func:`leaks` compares them."""
    entries = json.loads(CHAT_PROMPTS.read_text())["prompts"]
    return [_normalized(entry["content"]) for entry in entries]


def leaks(text: str, heldout: Sequence[str]) -> bool:
    """Whether ``text`` equals or contains a held-out prompt, or is contained in one."""
    key = _normalized(text)
    return any(h in key or key in h for h in heldout)


def build_prompts(count: int, seed: int = 0) -> list[ChatPrompt]:
    """``count`` distinct prompts drawn from the template families by weight, in order of
    drawing (so a shorter list is a prefix of a longer one with the same seed)."""
    rng = random.Random(seed)
    heldout = heldout_texts()
    names = [family.name for family in FAMILIES]
    weights = [family.weight for family in FAMILIES]
    seen: set[str] = set()
    prompts: list[ChatPrompt] = []
    draws = 0
    while len(prompts) < count:
        draws += 1
        if draws > 50 * count + 1000:
            raise ValueError(
                f"only {len(prompts)} distinct prompts after {draws} draws; the word lists "
                f"in relayc.tools.train.chat_prompts cannot make {count}"
            )
        index = rng.choices(range(len(FAMILIES)), weights)[0]
        text = FAMILIES[index].build(rng)
        key = _normalized(text)
        if key in seen or leaks(text, heldout):
            continue
        seen.add(key)
        prompts.append(ChatPrompt(names[index], text))
    return prompts


def prompts_sha256(prompts: Sequence[ChatPrompt]) -> str:
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(prompt.text.encode() + b"\0")
    return digest.hexdigest()


# The word lists and templates are laid out by hand, several to a line: ruff format would
# put every word on its own line and make the lists ten times as long.
# fmt: off
# Word lists and templates, written for this project. Subjects the held-out prompts are
# about (the sea, the sky's colour, bicycles, the seasons, green tea, ...) are left out,
# besides the exact-text check in build_prompts, so the held-out prompts stay unseen.

SUBJECTS = {
    "science": [
        "gravity", "magnetism", "the water cycle", "plate tectonics", "black holes", "DNA",
        "natural selection", "static electricity", "the speed of light", "volcanoes",
        "earthquakes", "the immune system", "atoms", "chemical reactions", "friction",
        "sound waves", "the phases of the moon", "rainbows", "ocean tides",
        "the greenhouse effect", "batteries", "solar panels", "bacteria", "the human heart",
        "the periodic table", "erosion", "clouds", "lightning", "comets", "food chains",
        "fossils", "the nervous system", "nuclear fusion", "acids and bases", "density",
        "evaporation", "coral reefs", "antibiotics", "electric circuits", "the human eye",
    ],
    "cooking": [
        "sourdough bread", "tomato sauce", "pancakes", "fried rice", "vegetable soup",
        "hummus", "an omelette", "risotto", "banana bread", "lentil curry", "roast chicken",
        "guacamole", "pizza dough", "chocolate chip cookies", "a fruit smoothie",
        "mashed potatoes", "a Greek salad", "miso soup", "apple pie", "scrambled eggs",
        "pasta carbonara", "a vegetable stir-fry", "porridge", "falafel", "lemonade",
        "pickled cucumbers", "a chickpea salad", "garlic bread", "fish tacos",
        "a grilled cheese sandwich", "pumpkin soup", "flatbread", "a lemon cake",
    ],
    "travel": [
        "a weekend in Lisbon", "a train journey across Switzerland", "a first trip to Japan",
        "camping in a national park", "a road trip along the coast", "Rome on a budget",
        "a week in Iceland", "backpacking in Peru", "a city break in Amsterdam",
        "a ski holiday in the Alps", "island hopping in Greece", "Kyoto in autumn",
        "a day in London's museums", "a long flight with children",
        "a cycling tour of the Netherlands", "a safari in Kenya", "a visit to Mexico City",
        "a walking holiday in Scotland", "Prague in winter", "a night train to Vienna",
        "a trip to the Grand Canyon", "a market tour in Marrakech", "a week in Vietnam",
    ],
    "programming": [
        "Python decorators", "list comprehensions", "recursion", "binary search",
        "hash tables", "Git branches", "unit tests", "exceptions in Python",
        "generators in Python", "object-oriented programming", "dictionaries in Python",
        "SQL joins", "regular expressions", "big-O notation", "linked lists",
        "virtual environments in Python", "JSON", "HTTP requests", "REST APIs",
        "sorting algorithms", "the command line", "type hints in Python",
        "lambda functions", "async and await in Python", "version control",
        "stacks and queues", "variable scope", "f-strings in Python", "debugging",
        "code reviews", "caching", "pointers in C",
    ],
    "history": [
        "the Roman Empire", "the printing press", "the Industrial Revolution",
        "the pyramids of Egypt", "the French Revolution", "the Silk Road", "the Renaissance",
        "the first Moon landing", "the fall of the Berlin Wall", "the Vikings",
        "the invention of the telephone", "the ancient Olympic Games", "the Great Wall of China",
        "the Aztec Empire", "the age of exploration", "the Black Death",
        "the invention of writing", "the steam engine", "the Ottoman Empire", "the Magna Carta",
        "the Wright brothers' first flight", "the Panama Canal", "the Cold War",
        "the history of coffee", "ancient Athens", "the Inca roads",
    ],
    "daily life": [
        "saving money each month", "keeping houseplants alive", "working from home",
        "making friends in a new city", "cleaning a kitchen quickly",
        "planning a birthday party", "learning a new language", "starting to run",
        "organizing a small closet", "cooking for one", "preparing for a job interview",
        "reducing screen time", "walking a dog", "keeping a journal",
        "moving to a new apartment", "waking up early", "managing stress",
        "budgeting for groceries", "learning to swim", "recycling at home",
        "taking photos with a phone", "caring for a cat", "packing a healthy lunch",
        "fixing a flat tire", "studying for an exam", "hosting a dinner party",
    ],
}
ALL_SUBJECTS = [s for subjects in SUBJECTS.values() for s in subjects]
COUNTS = ["three", "four", "five", "six", "seven"]
AUDIENCES = [
    "a ten-year-old", "a complete beginner", "a busy adult", "a high school student",
    "my grandmother", "a new colleague", "someone who has never heard of it",
]
SUFFIXES = [
    "", "", "", "", " Keep it short.", " Use simple words.", " Answer in under 100 words.",
    " Please be concise.", " Use bullet points.", " Give an example.",
]


def _suffix(rng: random.Random) -> str:
    return rng.choice(SUFFIXES)


def _explain(rng: random.Random) -> str:
    s = rng.choice(ALL_SUBJECTS)
    template = rng.choice([
        "Explain {s} in simple terms.", "Explain {s} to {a}.", "Can you explain {s} in {n} sentences?",
        "What should everyone know about {s}?", "Give me a short explanation of {s}.",
        "I don't really understand {s}. Can you help?", "Why does {s} matter?",
    ])
    return template.format(s=s, a=rng.choice(AUDIENCES), n=rng.choice(COUNTS[:3])) + _suffix(rng)


def _describe(rng: random.Random) -> str:
    s = rng.choice(ALL_SUBJECTS)
    template = rng.choice([
        "Describe {s}.", "Describe {s} in one paragraph.", "Describe {s} to {a}.",
        "Write a short description of {s} for a school newsletter.",
        "Describe {s} using only short sentences.",
    ])
    return template.format(s=s, a=rng.choice(AUDIENCES)) + _suffix(rng)


def _list(rng: random.Random) -> str:
    domain = rng.choice(list(SUBJECTS))
    s, n = rng.choice(SUBJECTS[domain]), rng.choice(COUNTS)
    templates = [
        "List {n} interesting facts about {s}.", "List {n} common mistakes people make with {s}.",
        "What are {n} good questions to ask about {s}?", "Give me {n} reasons to learn about {s}.",
    ]
    if domain == "daily life":
        templates += ["Give me {n} tips for {s}.", "List {n} things that make {s} easier."]
    if domain == "cooking":
        templates += ["List the ingredients for {s}.", "Give me {n} ways to serve {s}."]
    if domain == "travel":
        templates += ["List {n} things to pack for {s}.", "Suggest {n} things to do on {s}."]
    return rng.choice(templates).format(n=n, s=s) + _suffix(rng)


COMPARE_PAIRS = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("speed", "velocity"),
    ("mass", "weight"), ("an atom", "a molecule"), ("a comet", "an asteroid"),
    ("a planet", "a star"), ("heat", "temperature"), ("an element", "a compound"),
    ("a frog", "a toad"), ("baking", "roasting"), ("baking soda", "baking powder"),
    ("butter", "margarine"), ("white rice", "brown rice"), ("a stew", "a soup"),
    ("frying", "steaming"), ("espresso", "filter coffee"), ("a hostel", "a hotel"),
    ("travelling by train", "flying"), ("a backpack", "a suitcase"),
    ("a package holiday", "planning your own trip"), ("a for loop", "a while loop"),
    ("a dictionary", "a set in Python"), ("a function", "a method"),
    ("compiling", "interpreting"), ("a stack", "a queue"), ("git merge", "git rebase"),
    ("SQL", "NoSQL databases"), ("a class", "an object"), ("threads", "processes"),
    ("an array", "a linked list"), ("the Roman Republic", "the Roman Empire"),
    ("the Stone Age", "the Bronze Age"), ("a monarchy", "a republic"),
    ("renting", "buying a home"), ("a debit card", "a credit card"),
    ("working from home", "working in an office"), ("a cat", "a dog"),
    ("walking", "cycling to work"), ("saving", "investing"), ("tea", "coffee"),
    ("a lake", "a pond"), ("a novel", "a short story"), ("a museum", "a gallery"),
]


def _compare(rng: random.Random) -> str:
    a, b = rng.choice(COMPARE_PAIRS)
    if rng.random() < 0.5:
        a, b = b, a
    template = rng.choice([
        "What is the difference between {a} and {b}?", "Compare {a} and {b}.",
        "Compare {a} and {b} in a short table.", "Which is better for a beginner, {a} or {b}?",
        "How are {a} and {b} alike, and how are they different?",
    ])
    return template.format(a=a, b=b) + _suffix(rng)


CODE_TASKS = [
    "read a file line by line", "reverse a list", "sort a dictionary by its values",
    "remove duplicates from a list", "count the words in a string",
    "check whether a number is prime", "merge two dictionaries", "format a date",
    "handle a missing file", "read a CSV file", "find the largest number in a list",
    "flatten a list of lists", "measure how long a function takes", "shuffle a list",
    "split a string on commas", "write a simple class", "loop over a dictionary",
    "convert a string to a number safely", "get the current date and time",
]
PYTHON_FUNCTIONS = [
    "checks whether a string is a palindrome", "returns the largest of three numbers",
    "counts the vowels in a word", "converts minutes to hours and minutes",
    "returns the n-th Fibonacci number", "removes the spaces from a string",
    "returns the second largest number in a list", "checks whether a year is a leap year",
    "turns a list of words into one sentence", "returns the average of a list",
    "counts how often each letter appears in a text", "converts Celsius to Fahrenheit",
    "returns only the even numbers of a list", "checks whether two words are anagrams",
]
LIFE_TASKS = [
    "keep my desk tidy", "fall asleep faster", "write a shopping list", "iron a shirt",
    "remove a coffee stain", "plan a week of meals", "start a vegetable garden",
    "choose a good pair of running shoes", "stay warm in a cold flat", "save for a holiday",
    "learn to touch type", "speak more confidently in meetings", "clean a laptop keyboard",
]


def _how_to(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        dish = rng.choice(SUBJECTS["cooking"])
        text = rng.choice([
            "How do I make {d}?", "What are the steps to make {d}?", "Give me a simple recipe for {d}.",
        ]).format(d=dish)
    elif kind == 1:
        text = rng.choice([
            "How do I {t} in Python?", "What is the simplest way to {t} in Python?",
            "Show me how to {t} in Python.",
        ]).format(t=rng.choice(CODE_TASKS))
    elif kind == 2:
        text = rng.choice([
            "Write a Python function that {f}.", "Write a short Python function that {f}, with an example.",
        ]).format(f=rng.choice(PYTHON_FUNCTIONS))
    else:
        text = rng.choice([
            "How do I {t}?", "What is the best way to {t}?", "Can you tell me how to {t}?",
        ]).format(t=rng.choice(LIFE_TASKS))
    return text + _suffix(rng)


CHARACTERS = [
    "a lonely lighthouse keeper", "a curious cat", "a young baker", "an old sailor",
    "a shy dragon", "a retired teacher", "a small robot", "a clever fox", "a time traveler",
    "a nervous astronaut", "a street musician", "a talking tree", "a detective mouse",
    "a lost penguin", "a knight who is afraid of the dark", "a village doctor",
    "a young inventor", "a grumpy librarian", "a brave little turtle", "a tired mail carrier",
]
ACTIONS = [
    "finds a map in the attic", "loses a very important key", "wins a baking contest",
    "gets lost in a big city", "makes an unlikely friend", "discovers a hidden door",
    "has to cross a frozen river", "learns to play the violin", "saves a village from a flood",
    "opens a tiny bookshop", "travels to the moon", "plants a garden on a rooftop",
    "receives a letter from the future", "forgets their own birthday",
    "builds a boat out of old doors", "finds a talking stone", "trains for a race",
]
SETTINGS = [
    "a snowy mountain village", "a busy market", "a space station", "a rainy harbor town",
    "a desert oasis", "an old library", "a floating city", "a quiet farm",
]


def _story(rng: random.Random) -> str:
    c, a = rng.choice(CHARACTERS), rng.choice(ACTIONS)
    template = rng.choice([
        "Write a short story about {c} who {a}.", "Tell me a bedtime story about {c} who {a}.",
        "Write a very short story about {c} who {a}, set in {s}.",
        "Write a 100-word story about {c} who {a}.",
        "Write the opening paragraph of a story about {c} who {a}.",
    ])
    return template.format(c=c, a=a, s=rng.choice(SETTINGS))


POEM_FORMS = [
    "haiku", "limerick", "short poem", "four-line rhyming poem", "poem in free verse",
    "two-stanza poem", "short poem for children",
]
POEM_SUBJECTS = [
    "autumn leaves", "the first snow", "a city at night", "morning coffee", "a thunderstorm",
    "an old oak tree", "the moon", "a train station", "friendship", "spring rain",
    "a sleepy cat", "the desert at dawn", "a lighthouse", "homework", "Monday mornings",
    "the stars", "a small garden", "bread baking in the oven", "a long journey home",
    "mountains", "fireflies", "a quiet library", "a lost umbrella", "the last day of summer",
]


def _poem(rng: random.Random) -> str:
    form, s = rng.choice(POEM_FORMS), rng.choice(POEM_SUBJECTS + ALL_SUBJECTS[:40])
    template = rng.choice([
        "Write a {f} about {s}.", "Compose a {f} about {s}.", "Can you write a {f} about {s}?",
    ])
    return template.format(f=form, s=s)


EMAIL_TONES = ["polite", "short", "friendly", "formal", "professional", "warm"]
RECIPIENTS = [
    "my landlord", "a colleague", "my manager", "my child's teacher", "a customer",
    "a hotel", "my neighbor", "a client", "the school principal", "a supplier",
]
PURPOSES = [
    "asking to fix a leaking tap", "asking for a day off next Friday",
    "thanking them for their help on a project", "apologizing for missing a meeting",
    "asking about a late delivery", "inviting them to a team lunch",
    "confirming a booking for two nights", "asking for feedback on a presentation",
    "asking for a refund for a broken kettle", "moving an appointment to next week",
    "introducing myself as the new project lead", "asking for a letter of recommendation",
    "saying I will be late on Monday", "asking for a copy of an invoice",
]


def _email(rng: random.Random) -> str:
    tone, to, why = rng.choice(EMAIL_TONES), rng.choice(RECIPIENTS), rng.choice(PURPOSES)
    template = rng.choice([
        "Write a {t} email to {r} {p}.", "Draft a {t} message to {r} {p}.",
        "Help me write a {t} email to {r} {p}.",
    ])
    return template.format(t=tone, r=to, p=why)


PEOPLE = [
    "Marie Curie", "Leonardo da Vinci", "Ada Lovelace", "Isaac Newton", "Cleopatra",
    "Nelson Mandela", "Charles Darwin", "Alan Turing", "Julius Caesar", "Galileo Galilei",
    "Florence Nightingale", "Confucius", "Joan of Arc", "Albert Einstein", "Frida Kahlo",
    "Wolfgang Amadeus Mozart", "Marco Polo", "Queen Victoria", "Grace Hopper", "Ibn Battuta",
]
WHY_QUESTIONS = [
    "cats purr", "leaves change color in autumn", "onions make us cry", "birds migrate",
    "we dream", "stars twinkle", "bread rise", "ice float on water", "metals rust",
    "we get hiccups", "people get jet lag", "bees make honey", "we yawn",
]
COUNTRIES = [
    "France", "Japan", "Brazil", "Canada", "Kenya", "Australia", "Norway", "Egypt",
    "Argentina", "India", "Portugal", "Vietnam", "Chile", "Poland", "Morocco", "Peru",
]


def _question(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        text = rng.choice(["Tell me about {s}.", "What do you know about {s}?", "Give me a short introduction to {s}."]).format(
            s=rng.choice(SUBJECTS["science"] + SUBJECTS["programming"])
        )
    elif kind == 1:
        text = rng.choice([
            "Who was {p}?", "Why is {p} famous?", "What did {p} do?",
        ]).format(p=rng.choice(PEOPLE))
    elif kind == 2:
        text = f"Why do {rng.choice(WHY_QUESTIONS)}?"
    elif kind == 3:
        text = rng.choice([
            "What is the capital of {c}, and what is it known for?",
            "What language do people speak in {c}?", "What food is {c} famous for?",
        ]).format(c=rng.choice(COUNTRIES))
    else:
        text = rng.choice([
            "Why was {h} important?", "When did {h} happen, and why does it matter?",
            "What can we learn from {h}?",
        ]).format(h=rng.choice(SUBJECTS["history"]))
    return text + _suffix(rng)


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


def _summarize(rng: random.Random) -> str:
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


def _rewrite(rng: random.Random) -> str:
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


def _code(rng: random.Random) -> str:
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


def _names(rng: random.Random) -> str:
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


def _continue(rng: random.Random) -> str:
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


@dataclass(frozen=True)
class Family:
    name: str
    weight: float  # relative share of the prompts drawn
    quotes_input: bool  # the prompt carries text the answer reuses
    build: Callable[[random.Random], str]


FAMILIES = [
    Family("explain", 8, False, _explain),
    Family("describe", 5, False, _describe),
    Family("list", 7, False, _list),
    Family("compare", 5, False, _compare),
    Family("how-to", 9, False, _how_to),
    Family("story", 5, False, _story),
    Family("poem", 4, False, _poem),
    Family("email", 4, False, _email),
    Family("question", 8, False, _question),
    Family("summarize", 6, True, _summarize),
    Family("rewrite", 14, True, _rewrite),
    Family("code", 14, True, _code),
    Family("names", 5, True, _names),
    Family("continue", 6, True, _continue),
]
# fmt: on
