"""Varied instructions for self-distillation, generated from templates (no benchmark prompt is used).

A drafter trained on the target's own answers learns what the target says; the prompts only have
to be varied enough to cover the kinds of requests users make: explaining, listing, writing,
coding, arithmetic, rewriting and translating given text, comparing, advising. Each instruction
is one task template filled with a topic (or a small generated input), drawn with a seeded
generator, so a seed gives the same list on every machine.
"""

from __future__ import annotations

import random

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "the French Revolution", "the printing press",
    "vaccines", "climate change", "the stock market", "inflation", "machine learning", "the internet",
    "electric cars", "solar panels", "the human heart", "sleep", "coffee", "chess", "the Roman Empire",
    "the moon landing", "honey bees", "rainforests", "earthquakes", "the immune system", "DNA", "gravity",
    "magnets", "the Olympic Games", "jazz music", "impressionist painting", "the pyramids of Egypt",
    "recycling", "compound interest", "time management", "public speaking", "learning a language",
    "healthy eating", "running a marathon", "starting a small business", "remote work", "social media",
    "video games", "the ocean tides", "the seasons", "rainbows", "antibiotics", "the Silk Road",
    "the Industrial Revolution", "democracy", "the periodic table", "plate tectonics", "bread baking",
    "composting", "bicycles", "trains", "airplanes", "submarines", "the Great Wall of China", "penguins",
    "elephants", "octopuses", "mushrooms", "cheese making", "tea", "the piano", "poetry", "libraries",
    "museums", "cloud computing", "passwords and security", "databases", "open source software",
    "spreadsheets", "email etiquette", "job interviews", "budgeting", "renting an apartment", "gardening",
    "houseplants", "camping", "first aid", "meditation", "friendship", "teamwork", "negotiation",
    "electricity", "batteries", "wind power", "nuclear energy", "the speed of light", "prime numbers",
    "probability", "statistics", "the Pythagorean theorem", "fractions", "algebra", "geometry",
    "the solar system", "Mars", "comets", "telescopes", "microscopes", "bacteria", "viruses",
    "the brain", "memory", "habits", "motivation", "creativity", "writing a novel", "film making",
    "photography", "architecture", "bridges", "skyscrapers", "city planning", "public transport",
    "the postal service", "money", "banks", "cryptocurrency", "taxes", "trade", "maps", "compasses",
    "glaciers", "deserts", "rivers", "lakes", "coral reefs", "whales", "dinosaurs", "fossils", "evolution",
]

AUDIENCES = ["a ten-year-old", "a beginner", "a busy manager", "a university student", "a grandparent",
             "an engineer", "a tourist", "a new employee"]
STYLES = ["in three sentences", "in a short paragraph", "as a bulleted list", "step by step",
          "with a simple example", "in plain words", "as a short dialogue", "in under 100 words"]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
FORMS = ["a haiku", "a limerick", "a short poem", "a short story opening", "a product description",
         "a tweet", "a motivational quote", "a riddle", "a slogan", "a short letter"]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "sorts a list of numbers",
    "removes duplicates from a list", "finds the largest element of a list", "checks whether a word is a palindrome",
    "converts Celsius to Fahrenheit", "merges two sorted lists", "counts word frequencies in a text",
    "computes the greatest common divisor of two numbers", "flattens a nested list", "validates an email address",
    "reads a CSV file and prints the number of rows", "computes the average of a list", "capitalizes every word",
    "finds the second smallest number in a list", "checks whether two strings are anagrams",
]
CODE_LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go"]
SENTENCES = [
    "The meeting has been moved to Thursday afternoon because the manager is travelling.",
    "Our new cafe opens next week and every visitor gets a free cup of tea.",
    "The library will be closed on Monday for repairs to the heating system.",
    "She finished the marathon in under four hours despite the rain.",
    "Please remember to bring your passport and a copy of your booking.",
    "The train was late, so we missed the first part of the concert.",
    "Regular exercise improves sleep, mood and concentration.",
    "The company reported higher profits thanks to strong online sales.",
    "Children learn languages faster when they hear them every day.",
    "The museum's new exhibition shows paintings from three centuries.",
]


def _arithmetic(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    return rng.choice([
        f"What is {a} plus {b} times {c}? Show your working.",
        f"A shop sells pencils at {c} cents each. How much do {a} pencils cost?",
        f"If a train travels {a * c} kilometres in {c} hours, what is its average speed?",
        f"Tom has {a} apples and gives away {min(a, b)}. How many are left?",
        f"What is {c * 10} percent of {a * 10}?",
        f"Solve for x: {c}x + {a} = {a + c * b}.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    ])


TEMPLATES = [
    lambda r: f"Explain {r.choice(TOPICS)} to {r.choice(AUDIENCES)}.",
    lambda r: f"Explain {r.choice(TOPICS)} {r.choice(STYLES)}.",
    lambda r: f"What are the main advantages and disadvantages of {r.choice(TOPICS)}?",
    lambda r: f"Give me five interesting facts about {r.choice(TOPICS)}.",
    lambda r: f"Write {r.choice(FORMS)} about {r.choice(TOPICS)}.",
    lambda r: f"Compare {r.choice(TOPICS)} and {r.choice(TOPICS)}.",
    lambda r: f"What is the history of {r.choice(TOPICS)}?",
    lambda r: f"How does {r.choice(TOPICS)} affect everyday life?",
    lambda r: f"Give some practical tips about {r.choice(TOPICS)}.",
    lambda r: f"Write a short essay outline about {r.choice(TOPICS)}.",
    lambda r: f"What questions would a student ask about {r.choice(TOPICS)}? Answer two of them.",
    lambda r: f"Write a {r.choice(CODE_LANGUAGES)} function that {r.choice(CODE_TASKS)}.",
    lambda r: f"Write a {r.choice(CODE_LANGUAGES)} function that {r.choice(CODE_TASKS)}, with a short explanation.",
    lambda r: f"Explain what a function that {r.choice(CODE_TASKS)} should do, and list test cases for it.",
    _arithmetic,
    _arithmetic,
    lambda r: f"Translate into {r.choice(LANGUAGES)}: \"{r.choice(SENTENCES)}\"",
    lambda r: f"Rewrite this sentence in a more formal tone: \"{r.choice(SENTENCES)}\"",
    lambda r: f"Summarize in a few words: \"{r.choice(SENTENCES)} {r.choice(SENTENCES)}\"",
    lambda r: f"List the nouns in this sentence: \"{r.choice(SENTENCES)}\"",
    lambda r: f"Turn this into a question: \"{r.choice(SENTENCES)}\"",
    lambda r: f"Write an email to a colleague about {r.choice(TOPICS)}.",
    lambda r: f"Plan a one-day lesson about {r.choice(TOPICS)} for {r.choice(AUDIENCES)}.",
    lambda r: f"What are common misconceptions about {r.choice(TOPICS)}?",
    lambda r: f"Describe a day in the life of someone who works with {r.choice(TOPICS)}.",
    lambda r: f"Pretend you are a tour guide and describe {r.choice(TOPICS)}.",
]


def instructions(count: int, seed: int = 0) -> list[str]:
    """`count` distinct instructions, the same list for the same seed."""
    return distinct(count, seed, lambda rng: rng.choice(TEMPLATES)(rng),
                    f"the templates cannot make {count} distinct instructions; ask for fewer")


def distinct(count: int, seed: int, draw, shortage: str) -> list:
    """The first `count` distinct prompts (texts, or tuples of turns) `draw(rng)` makes from one
    generator seeded with `seed`; ValueError(`shortage`) when they run out (after 50 × count + 1000
    draws)."""
    rng = random.Random(seed)
    seen: set = set()
    out: list = []
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(shortage)
        prompt = draw(rng)
        if prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
    return out


# Long-input tasks over passages (the target's own earlier answers): what summarization, retrieval-
# augmented answering and document rewriting look like to a drafter: a long user turn whose words
# the answer reuses. `question` is the instruction a passage answered.
PASSAGE_TEMPLATES = [
    lambda r, p, q: f"Summarize the following text in {r.choice(['one sentence', 'two sentences', 'three sentences', 'a short paragraph', 'a few bullet points'])}.\n\n{p}",
    lambda r, p, q: f"{p}\n\nSummarize the text above for {r.choice(AUDIENCES)}.",
    lambda r, p, q: f"Read the passage and answer the question.\n\nPassage: {p}\n\nQuestion: {q}",
    lambda r, p, q: f"List the key points of this text.\n\n{p}",
    lambda r, p, q: f"Give this text a title and explain its main idea in one sentence.\n\n{p}",
    lambda r, p, q: f"Rewrite the following text for {r.choice(AUDIENCES)}, keeping its facts.\n\n{p}",
    lambda r, p, q: f"Translate the following text into {r.choice(LANGUAGES)}.\n\n{p}",
    lambda r, p, q: f"What questions does this text answer? List three, with their answers from the text.\n\n{p}",
]


def passage_instructions(passages: list[tuple[str, str]], count: int, seed: int = 0) -> list[str]:
    """`count` distinct long-input instructions over `passages` ((question, text) pairs: an
    instruction and the target's answer to it), the same list for the same seed: one passage with a
    task (summarize, answer from it, list its points, rewrite, translate), or several passages as
    numbered documents with one passage's question (retrieval-augmented answering)."""
    if len(passages) < 3:
        raise ValueError(f"long-input instructions need at least 3 passages, got {len(passages)}")

    def draw(rng: random.Random) -> str:
        if rng.random() < 0.3:
            chosen = rng.sample(passages, rng.choice([2, 3]))
            question = chosen[0][0]
            rng.shuffle(chosen)
            documents = "\n\n".join(f"Document {i + 1}: {text}" for i, (_, text) in enumerate(chosen))
            return f"Answer the question using the documents below.\n\n{documents}\n\nQuestion: {question}"
        question, passage = rng.choice(passages)
        return rng.choice(PASSAGE_TEMPLATES)(rng, passage, question)

    return distinct(count, seed, draw, f"{len(passages)} passages cannot make {count} distinct instructions; ask for fewer")
