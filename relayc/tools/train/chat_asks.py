"""The chat prompt families that ask (explain, describe, list, compare, how-to, story, poem,
email, question): their templates and word lists (``chat_prompts.FAMILIES`` draws them)."""

from __future__ import annotations

import random

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


def explain_prompt(rng: random.Random) -> str:
    s = rng.choice(ALL_SUBJECTS)
    template = rng.choice([
        "Explain {s} in simple terms.", "Explain {s} to {a}.", "Can you explain {s} in {n} sentences?",
        "What should everyone know about {s}?", "Give me a short explanation of {s}.",
        "I don't really understand {s}. Can you help?", "Why does {s} matter?",
    ])
    return template.format(s=s, a=rng.choice(AUDIENCES), n=rng.choice(COUNTS[:3])) + _suffix(rng)


def describe_prompt(rng: random.Random) -> str:
    s = rng.choice(ALL_SUBJECTS)
    template = rng.choice([
        "Describe {s}.", "Describe {s} in one paragraph.", "Describe {s} to {a}.",
        "Write a short description of {s} for a school newsletter.",
        "Describe {s} using only short sentences.",
    ])
    return template.format(s=s, a=rng.choice(AUDIENCES)) + _suffix(rng)


def list_prompt(rng: random.Random) -> str:
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


def compare_prompt(rng: random.Random) -> str:
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


def how_to_prompt(rng: random.Random) -> str:
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


def story_prompt(rng: random.Random) -> str:
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


def poem_prompt(rng: random.Random) -> str:
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


def email_prompt(rng: random.Random) -> str:
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


def question_prompt(rng: random.Random) -> str:
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
# fmt: on
