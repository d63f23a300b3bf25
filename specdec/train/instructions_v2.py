"""The second instruction generator: the kinds of request the first one (`instructions.py`) lacks.

A head trained on the first generator's prompts accepted 0.62 of its first guesses on unseen prompts
of that kind but 0.40 on Spec-Bench's (docs/bench/eagle3-long-128): users ask short factual
questions, multi-step word problems, German text to translate, news to summarize, puzzles, role
play, extraction from a text, code to debug. Each family below is one such kind, filled from word
lists and small generated inputs (numbers, names, German and English news sentences written for
this file). No benchmark prompt is used. Families are drawn with equal chance; the first
generator's templates are not among them, so data from the two generators shares no instruction
(each data folder's held-out validation set stays unseen by a training on both).
"""

from __future__ import annotations

import random

from specdec.train.instructions import TOPICS, distinct

NAMES = ["Maria", "James", "Aisha", "Tom", "Lena", "Carlos", "Priya", "Ben", "Sofia", "Omar", "Emma", "Jack",
         "Yuki", "Noah", "Fatima", "Lucas", "Hannah", "Ravi", "Chloe", "Daniel"]
CITIES = ["Berlin", "Munich", "Hamburg", "Vienna", "Zurich", "Cologne", "Frankfurt", "Dresden", "Leipzig", "Bremen"]
DAYS_EN = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Kenya", "Australia", "India", "Mexico", "Norway", "Egypt",
             "Argentina", "Thailand", "Poland", "Peru", "Vietnam", "Morocco", "Sweden", "Chile", "Turkey", "Ghana"]

# Short factual questions, in the lower-case search-box form and as sentences.
FACT_QUESTIONS = [
    ("who wrote {}", ["pride and prejudice", "the old man and the sea", "hamlet", "war and peace", "the hobbit",
                      "moby dick", "to kill a mockingbird", "the great gatsby", "don quixote", "the odyssey",
                      "frankenstein", "the divine comedy", "jane eyre", "the little prince", "crime and punishment"]),
    ("when did {}", ["the first world war start", "the berlin wall fall", "the titanic sink", "humans first land on the moon",
                     "the western roman empire fall", "the second world war end", "the american civil war begin",
                     "the french revolution begin", "the first olympic games take place", "the euro come into use"]),
    ("where is {} located", ["mount kilimanjaro", "the great barrier reef", "machu picchu", "the taj mahal", "angkor wat",
                             "the dead sea", "stonehenge", "the sahara desert", "the amazon rainforest", "petra"]),
    ("what is the capital of {}", [c.lower() for c in COUNTRIES]),
    ("what language is spoken in {}", [c.lower() for c in COUNTRIES]),
    ("what is the currency of {}", [c.lower() for c in COUNTRIES]),
    ("who invented the {}", ["telephone", "light bulb", "printing press", "steam engine", "radio", "airplane",
                             "television", "world wide web", "telescope", "bicycle", "computer mouse", "dishwasher"]),
    ("how many {}", ["bones are in the human body", "players are on a soccer team", "planets are in the solar system",
                     "states are in the united states", "keys are on a piano", "chambers does the human heart have",
                     "teeth does an adult have", "strings does a violin have", "days are in a leap year",
                     "countries are in the european union"]),
    ("who was the first {}", ["president of the united states", "person to walk on the moon",
                              "woman to win a nobel prize", "emperor of rome", "person to climb mount everest",
                              "person in space", "female prime minister of the united kingdom"]),
    ("who discovered {}", ["penicillin", "radium", "the structure of dna", "the electron", "insulin", "x-rays",
                           "the planet neptune", "the law of gravity", "oxygen", "vaccination"]),
    ("what is the longest river in {}", ["africa", "europe", "asia", "south america", "north america", "australia"]),
    ("what is the tallest mountain in {}", ["africa", "europe", "asia", "south america", "north america", "japan"]),
    ("what does {} stand for", ["nasa", "dna", "html", "unesco", "gdp", "cpu", "wifi", "laser", "scuba", "radar"]),
    ("what is the meaning of the word {}", ["serendipity", "ephemeral", "ubiquitous", "melancholy", "resilience",
                                            "paradox", "nostalgia", "empathy", "hypothesis", "metaphor"]),
]


def _fact_question(r: random.Random) -> str:
    form, fillers = r.choice(FACT_QUESTIONS)
    question = form.format(r.choice(fillers))
    return question if r.random() < 0.6 else question[0].upper() + question[1:] + "?"


def _word_problem(r: random.Random) -> str:
    """A multi-step arithmetic story with whole-number answers."""
    n, m = r.sample(NAMES, 2)
    a, b, c, k = r.randint(3, 12), r.randint(2, 9), r.randint(2, 15), r.randint(2, 6)
    problem = r.choice([
        f"{n} buys {a} packs of stickers. Each pack has {b} stickers and costs ${c}. How many stickers does {n} "
        f"have now, and how much did {n} spend?",
        f"{n} earns ${c + 8} an hour and works {b} hours a day, {min(a, 6)} days a week. How much does {n} earn in "
        f"{k} weeks?",
        f"A bakery bakes {2 * a * 10} loaves of bread every morning. It sells {a * 10} in the morning and half of the "
        "rest in the afternoon. How many loaves are left at the end of the day?",
        f"{n} has {a} marbles. {m} has {k} times as many. Together they give {b} marbles to a friend. How many "
        "marbles do they have left?",
        f"A farmer has {a * 3} chickens and {b + 4} cows. How many legs do the animals have altogether?",
        f"{n} reads {a * 5} pages on Monday, twice as many on Tuesday and {b * 4} pages on Wednesday. The book has "
        f"{a * 15 + b * 4 + c * 10} pages. How many pages are left to read?",
        f"A jacket costs ${a * 20}. It is on sale for {k * 5}% off, and delivery costs ${b}. How much does {n} pay?",
        f"{n} is {a + 6} years old. {n}'s sister is {b} years older, and their grandfather is {5 * k + 40} years "
        "older than the sister. How old is the grandfather?",
        f"A train leaves at {b}:00 and travels at {c * 10 + 40} km per hour for {k} hours. How far does it go, and "
        "when does it arrive?",
        f"There are {a * 4 + 8} students in a class. A quarter of them walk to school and the rest take the bus. How "
        "many take the bus?",
        f"{n} saves ${a} every week. How many weeks does {n} need to save to buy a bike that costs ${a * (c + 5)}?",
        f"A recipe needs {b} cups of flour for {a * 6} cookies. How many cups are needed for {a * 6 * k} cookies?",
        f"{n} and {m} share {a * 3} candies so that {n} gets twice as many as {m}. How many candies does each get?",
        f"A garden is {a + 4} metres long and {b + 2} metres wide. Fencing costs ${c} per metre. How much does it "
        "cost to fence the whole garden?",
    ])
    return problem if r.random() < 0.7 else problem + r.choice([" Let's think step by step.", " Explain your reasoning."])


WRITING_FORMS = ["blog post", "persuasive essay", "product review", "short speech", "formal letter", "short story",
                 "cover letter", "press release", "travel diary entry", "newsletter article", "thank-you note"]
WRITING_ANGLES = ["highlighting three key points", "in a friendly tone", "for a school newsletter", "in under 200 words",
                  "ending with a question to the reader", "with a catchy title", "for readers who know nothing about it",
                  "using vivid descriptions", "in a humorous tone", "with a clear call to action"]
CHARACTERS = ["a pirate captain", "a medieval knight", "a famous chef", "a detective", "a space explorer",
              "a tour guide in Rome", "a personal trainer", "a wise old wizard", "a customer service agent",
              "a museum curator", "a sports commentator", "a time traveller from the year 1900", "a friendly robot"]
CHARACTER_ASKS = ["Describe your typical day.", "What advice would you give to a young person?",
                  "Introduce yourself to a new neighbour.", "Tell me about your greatest adventure.",
                  "How would you handle a very unhappy customer?", "What do you think of modern smartphones?",
                  "Convince me to visit your favourite place."]
STEM_PAIRS = [("speed", "velocity"), ("mass", "weight"), ("an atom", "a molecule"), ("a virus", "a bacterium"),
              ("weather", "climate"), ("alternating current", "direct current"), ("mitosis", "meiosis"),
              ("an acid", "a base"), ("memory", "storage in a computer"), ("a compiler", "an interpreter"),
              ("heat", "temperature"), ("a star", "a planet"), ("renewable", "non-renewable energy"),
              ("an element", "a compound"), ("TCP", "UDP")]
THINKERS = ["Plato", "Aristotle", "Confucius", "Adam Smith", "John Locke", "Immanuel Kant", "Mary Wollstonecraft",
            "Socrates", "Simone de Beauvoir", "Thomas Hobbes", "Jean-Jacques Rousseau", "Hannah Arendt"]
FIELDS = ["modern education", "economics", "politics", "art", "science", "city life", "family life", "literature"]
ALGORITHMS = ["binary search", "bubble sort", "merge sort", "quicksort", "breadth-first search", "depth-first search",
              "Dijkstra's algorithm", "a hash table lookup", "insertion sort", "dynamic programming for Fibonacci"]
CLASS_LANGUAGES = ["Python", "Python", "Java", "JavaScript", "C++"]
CLASS_SUBJECTS = ["a bank account", "a library book", "a to-do list", "a shopping cart", "a traffic light",
                  "a deck of cards"]
REPORT_SUBJECTS = ["a new bridge", "a storm", "a school concert", "a museum reopening", "a city marathon",
                   "a new train line"]
SQL_TASKS = ["lists all customers from Berlin", "counts the orders per customer",
             "finds the five most expensive products", "shows the average salary per department",
             "deletes users who never logged in", "finds employees hired after 2020"]
BUGGY_CODE = [
    "def average(numbers):\n    return sum(numbers) / len(numbers) + 1",
    "def is_even(n):\n    return n % 2 == 1",
    "def last_item(items):\n    return items[len(items)]",
    "def count_words(text):\n    return len(text.split(','))",
    "def factorial(n):\n    result = 0\n    for i in range(1, n + 1):\n        result *= i\n    return result",
    "def reverse(text):\n    return text[1::-1]",
    "def maximum(values):\n    best = 0\n    for v in values:\n        if v < best:\n            best = v\n    return best",
    "def greet(name):\n    print('Hello, ' + name)\n    return greet",
]


def _puzzle(r: random.Random) -> str:
    a, b, c = r.sample(NAMES, 3)
    n, d, start = r.randint(4, 12), r.randint(2, 9), r.randint(1, 20)
    return r.choice([
        f"{a} is taller than {b}, and {b} is taller than {c}. Who is the shortest? Explain.",
        f"{a} is older than {b}. {c} is younger than {b}. Who is the oldest, and who is the youngest?",
        f"There are {n} people in a room and each shakes hands with every other person once. How many handshakes "
        "are there?",
        f"What comes next in the sequence {start}, {start + d}, {start + 2 * d}, {start + 3 * d}? Why?",
        f"If today is {r.choice(DAYS_EN)}, what day of the week will it be in {n * 3} days?",
        f"{a}, {b} and {c} each own a different pet: a cat, a dog and a fish. {a} does not own the dog, and {b} owns "
        f"the fish. Who owns the cat?",
        f"A clock shows {d}:00. What angle do the hour and minute hands make?",
        "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain.",
    ])


def _extraction(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    city, other = r.sample(CITIES, 2)
    year, shop = r.randint(1990, 2024), r.choice(["bakery", "bookshop", "bicycle repair shop", "cafe", "design studio"])
    text = (f"{a} moved from {city} to {other} in {year} and opened a {shop} with {b}. "
            f"By {year + r.randint(1, 6)} the {shop} had {r.randint(3, 40)} employees and a second branch in {city}.")
    ask = r.choice(["Extract every person, place and year from this text.",
                    "Extract the names, cities and dates from the text below and give them as JSON.",
                    "From the text below, list who did what, where and when.",
                    "Read the text and answer: how many years passed between the two events it mentions?"])
    return f"{ask}\n\n{text}"


# English news stories with slots (written for this file): the articles that summary requests hold.
# Each story's first sentence is the lead; a summary request takes it and some of the rest, in order.
NEWS_STORIES = [
    ["The city council of {city} approved a plan on {day} to build {hundreds} new homes near the river.",
     "The project is expected to cost about {n} million euros and to be finished by {year}.",
     "Supporters say the homes are badly needed, as rents in {city} have risen for ten years in a row.",
     "Critics say the money would be better spent on schools and public transport.",
     "Building work is due to start next spring, once the last permits have been granted."],
    ["Police in {city} said nobody was hurt when a lorry overturned on the motorway early on {day}.",
     "The driver told officers he had swerved to avoid a deer.",
     "The road was closed for several hours while the cargo, mostly fruit and vegetables, was cleared.",
     "Traffic jams stretched for more than {n} kilometres during the morning rush hour.",
     "Police have asked witnesses to come forward."],
    ["Energy prices rose by {n} percent last year, according to figures published on {day}.",
     "Households with low incomes have been hit hardest, the report said.",
     "Many families have cut back on heating and turned to second-hand shops for clothes.",
     "The government has promised a support payment of {hundreds} euros per household this winter.",
     "Consumer groups say the help comes too late and is too small."],
    ["The local football club of {city} won the cup final {a} to {b} in front of {n} thousand fans on {day}.",
     "It was the club's first trophy in more than twenty years.",
     "The winning goal came in the last minute from a substitute who had joined the team in the summer.",
     "Thousands of supporters celebrated in the old town until late at night.",
     "The coach said the victory belonged to the whole city."],
    ["Scientists at a university in {city} say they have found a cheaper way to recycle batteries.",
     "Their method recovers {n} percent of the metals using less energy than current plants.",
     "The team tested the process on batteries from old phones and electric bikes.",
     "A company has already offered to build a first small factory by {year}.",
     "Other researchers say the results are promising but must still be confirmed at a larger scale."],
    ["Ticket prices for buses and trams in {city} will rise by {a} percent from next month.",
     "The transport company says higher wages and fuel costs leave it no choice.",
     "Residents have started a petition against the increase, which has gathered {hundreds} signatures.",
     "Students and pensioners will keep their reduced monthly passes.",
     "The mayor said the decision was difficult but necessary to keep the service running."],
    ["A study of {hundreds} adults found that people who walk for half an hour every day sleep better.",
     "The participants wore activity trackers for six months and kept a sleep diary.",
     "Those who walked the most fell asleep faster and woke up less often at night.",
     "The effect was strongest among people over sixty.",
     "The researchers say more work is needed before firm advice can be given."],
    ["A new exhibition about the history of {topic} opens at the city museum in {city} on {day}.",
     "It shows more than {n} objects, many of them lent by private collectors.",
     "Visitors can also try hands-on experiments in a room designed for children.",
     "Entry is free on the first Sunday of every month.",
     "The exhibition runs until the end of {year}."],
]
def _news(r: random.Random) -> str:
    lead, *rest = r.choice(NEWS_STORIES)
    kept = sorted(r.sample(range(len(rest)), r.randint(2, len(rest))))
    a = r.randint(1, 5)
    slots = dict(city=r.choice(CITIES), day=r.choice(DAYS_EN), n=r.randint(2, 90), year=r.randint(2026, 2035),
                 a=a, b=r.randint(0, a - 1), hundreds=100 * r.randint(2, 40), topic=r.choice(TOPICS))
    return " ".join(s.format(**slots) for s in [lead] + [rest[i] for i in kept])


def _summary(r: random.Random) -> str:
    article = _news(r)
    return r.choice([
        f"Summarize the following news article in two sentences.\n\n{article}",
        f"Summarize: {article}",
        f"{article}\n\nWrite a one-line headline and a short summary of this article.",
        f"Give the main points of this report as a short list.\n\n{article}",
    ])


# German sentences for translation requests (written for this file; the slots keep them grammatical).
GERMAN_SUBJECTS = ["Mein Bruder", "Die Lehrerin", "Unser Nachbar", "Der Bürgermeister", "Meine Großmutter",
                   "Die neue Kollegin", "Der Arzt", "Meine Tante", "Der Student", "Die Journalistin"]  # people
GERMAN_CITIES = ["Berlin", "München", "Hamburg", "Wien", "Zürich", "Köln", "Frankfurt", "Dresden", "Leipzig", "Bremen"]
GERMAN_SENTENCES = [
    "{s} fährt {when} mit dem Zug nach {city}.",
    "{s} hat letzte Woche ein neues Fahrrad gekauft.",
    "{s} wohnt seit {years} Jahren in {city}.",
    "{s} möchte im Sommer in den Bergen wandern.",
    "{s} war gestern krank und ist deshalb zu Hause geblieben.",
    "Die Regierung hat am {day} ein neues Gesetz zum Schutz der Wälder beschlossen.",
    "Nach Angaben der Polizei wurde bei dem Unfall niemand verletzt.",
    "Die Preise für Strom und Gas sind im vergangenen Jahr um {n} Prozent gestiegen.",
    "Der Verein gewann das Spiel am Samstag mit drei zu eins.",
    "Das Museum in {city} zeigt ab {month} eine Ausstellung über die Geschichte der Stadt.",
    "Wegen des starken Regens wurden mehrere Straßen in {city} gesperrt.",
    "Die Firma will bis {year} rund {hundreds} neue Arbeitsplätze schaffen.",
    "Viele Menschen kaufen ihre Lebensmittel inzwischen im Internet.",
    "Die Schule bleibt wegen Bauarbeiten bis Ende {month} geschlossen.",
    "Experten erwarten, dass die Zahl der Touristen im nächsten Jahr weiter steigt.",
    "Am Wochenende findet in {city} ein großes Musikfestival statt.",
    "Die Forscher haben eine neue Methode entwickelt, um Plastik zu recyceln.",
    "Der Zug hatte wegen eines technischen Problems über eine Stunde Verspätung.",
]
GERMAN_WHEN = ["am Montag", "am Wochenende", "nächste Woche", "morgen früh", "im Dezember"]
GERMAN_DAYS = ["Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag"]
GERMAN_MONTHS = ["Januar", "März", "Mai", "Juli", "September", "November"]


def _german(r: random.Random, sentences: int) -> str:
    slots = dict(s=r.choice(GERMAN_SUBJECTS), when=r.choice(GERMAN_WHEN), city=r.choice(GERMAN_CITIES),
                 n=r.randint(2, 30), years=r.randint(2, 9), hundreds=100 * r.randint(2, 40), day=r.choice(GERMAN_DAYS),
                 month=r.choice(GERMAN_MONTHS), year=r.randint(2026, 2035))
    return " ".join(s.format(**slots) for s in r.sample(GERMAN_SENTENCES, sentences))


def _translation(r: random.Random) -> str:
    text = _german(r, r.randint(1, 3))
    return r.choice([
        f"Translate German to English: {text}",
        f"Translate this German text into English.\n\n{text}",
        f"What does this mean in English? \"{text}\"",
        f"Please translate into English: {text}",
    ])


FAMILIES = [
    _fact_question,
    _word_problem,
    _puzzle,
    _extraction,
    _summary,
    _translation,
    lambda r: f"Compose a {r.choice(WRITING_FORMS)} about {r.choice(TOPICS)}, {r.choice(WRITING_ANGLES)}.",
    lambda r: f"Pretend you are {r.choice(CHARACTERS)}. {r.choice(CHARACTER_ASKS)}",
    lambda r: "What is the difference between {} and {}? Give an everyday example.".format(*r.choice(STEM_PAIRS)),
    lambda r: f"Describe the main ideas of {r.choice(THINKERS)} and their influence on {r.choice(FIELDS)}.",
    lambda r: f"Explain the time complexity of {r.choice(ALGORITHMS)} and when you would use it.",
    lambda r: f"Write an SQL query that {r.choice(SQL_TASKS)}, and explain it.",
    lambda r: f"Find and fix the bug in this Python function:\n\n```python\n{r.choice(BUGGY_CODE)}\n```",
    lambda r: f"Write a {r.choice(CLASS_LANGUAGES)} class that models {r.choice(CLASS_SUBJECTS)}.",
    lambda r: f"Write a short news report about {r.choice(REPORT_SUBJECTS)} in {r.choice(CITIES)}.",
]


def instructions_v2(count: int, seed: int = 0) -> list[str]:
    """`count` distinct instructions of the second generator, the same list for the same seed."""
    return distinct(count, seed, lambda rng: rng.choice(FAMILIES)(rng),
                    f"the second generator cannot make {count} distinct instructions; ask for fewer")


FOLLOW_UPS = [
    "Can you explain that more simply?", "Give me a concrete example.", "Summarize your answer in one sentence.",
    "Now rewrite it as a short poem.", "What are the weak points of your answer?", "Make it shorter.",
    "Turn your answer into a bulleted list.", "Translate your answer into French.", "Why is that important?",
    "Can you add more detail to the second point?", "Rewrite your answer for a ten-year-old.",
    "What would someone who disagrees say?", "Now write a title for it.", "What should I read to learn more?",
]


def follow_up_conversations(answered: list[tuple[str, str]], count: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """`count` distinct two-turn conversations (question, the target's answer, a follow-up request)
    over `answered` ((instruction, answer) pairs), the same list for the same seed: what a
    conversation's second turn looks like to a drafter."""
    if not answered:
        raise ValueError("follow-up conversations need at least one answered instruction")
    return distinct(count, seed, lambda rng: (*rng.choice(answered), rng.choice(FOLLOW_UPS)),
                    f"{len(answered)} answers cannot make {count} distinct conversations; ask for fewer")
