"""Synthetic chat data for the embedded default model (training and the held-out set).

Every conversation is a plain dict: ``task`` (the task name used in reports), ``messages``
(OpenAI-style; the last one is the assistant turn the model must produce), ``tools`` (the
OpenAI tool list offered, or None), ``response_format`` (an OpenAI ``response_format`` dict,
or None) and ``expected`` (what the last assistant turn must be: text, a tool call
``{"name", "arguments"}`` or a JSON value). The generators draw from one ``random.Random``, so
a seed fixes the whole set. The tools are real: :func:`run_tool` computes their results, which
the demo (examples/stream_chat.py) and the follow-up conversations share
(:mod:`local_engine.builtin_tools`).

Tasks:

* ``tool_call``: a weather, unit conversion or calculator question with tools offered; the
  answer is one Hermes-style tool call with the right arguments.
* ``tool_followup``: the same, after the tool call and its result; the answer states the
  result in a sentence. Sometimes a second question follows and needs a new call.
* ``json``: extract fields from a sentence into JSON, with a ``json_schema`` or
  ``json_object`` response format.
* ``copy``: repeat a text exactly; ``rename``: swap a name for another; ``summary``: extract a
  paragraph's first sentence; ``reformat``: comma list <-> bulleted list.
* ``chat``: greetings, thanks, who-are-you and short canned facts (with or without tools).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_engine.builtin_tools import TOOLS, run_tool  # noqa: E402

__all__ = [
    "TASKS",
    "TOOLS",
    "conversation_key",
    "generate",
    "heldout_set",
    "run_tool",
    "schema_for",
    "tool_spec",
]

Conversation = dict[str, Any]

# ----------------------------------------------------------------------------- tools


def tool_spec(*names: str) -> list[dict[str, Any]]:
    """The OpenAI tool list for ``names``, in that order."""
    return [TOOLS[name] for name in names]


# unit code -> the words users write for it (the codes are those of builtin_tools.UNITS)
_UNITS: dict[str, tuple[str, ...]] = {
    "km": ("km", "kilometers", "kilometres"),
    "mi": ("miles", "mi"),
    "m": ("meters", "metres", "m"),
    "ft": ("feet", "ft"),
    "cm": ("cm", "centimeters"),
    "in": ("inches", "in"),
    "kg": ("kg", "kilograms", "kilos"),
    "lb": ("pounds", "lb", "lbs"),
    "g": ("grams", "g"),
    "oz": ("ounces", "oz"),
    "l": ("liters", "litres", "l"),
    "gal": ("gallons", "gal"),
    "c": ("celsius", "degrees celsius", "°C"),
    "f": ("fahrenheit", "degrees fahrenheit", "°F"),
}
_UNIT_PAIRS = [
    ("km", "mi"),
    ("mi", "km"),
    ("m", "ft"),
    ("ft", "m"),
    ("cm", "in"),
    ("in", "cm"),
    ("kg", "lb"),
    ("lb", "kg"),
    ("g", "oz"),
    ("oz", "g"),
    ("l", "gal"),
    ("gal", "l"),
    ("c", "f"),
    ("f", "c"),
]


# ----------------------------------------------------------------------------- vocabulary

_CITIES = """Paris London Berlin Madrid Rome Lisbon Oslo Stockholm Helsinki Copenhagen Dublin
Vienna Prague Warsaw Budapest Athens Istanbul Cairo Nairobi Lagos Accra Casablanca Tunis Dakar
Tokyo Osaka Kyoto Seoul Busan Beijing Shanghai Shenzhen Hong_Kong Taipei Singapore Bangkok
Hanoi Manila Jakarta Mumbai Delhi Bangalore Chennai Karachi Lahore Dhaka Kathmandu Colombo Dubai
Doha Riyadh Tehran Baghdad Amman Beirut Moscow Kyiv Minsk Riga Vilnius Tallinn Reykjavik
Amsterdam Rotterdam Brussels Antwerp Zurich Geneva Bern Munich Hamburg Frankfurt Cologne Milan
Naples Turin Venice Florence Barcelona Valencia Seville Porto Marseille Lyon Nice Toulouse
Bordeaux Edinburgh Glasgow Manchester Liverpool Bristol Cardiff Belfast New_York Boston Chicago
Seattle Denver Austin Dallas Houston Miami Atlanta Phoenix Portland San_Diego San_Francisco
Los_Angeles Las_Vegas Toronto Montreal Vancouver Ottawa Calgary Mexico_City Guadalajara Havana
Bogota Lima Quito Santiago Buenos_Aires Montevideo Sao_Paulo Rio_de_Janeiro Brasilia Sydney
Melbourne Brisbane Perth Adelaide Auckland Wellington Honolulu Anchorage Cape_Town Johannesburg
Addis_Ababa Kampala Kigali Zanzibar Marrakesh Granada Bilbao Krakow Gdansk Salzburg Innsbruck
Bruges Ghent Utrecht Aarhus Bergen Tromso Uppsala Tampere Tartu Split Dubrovnik Ljubljana
Zagreb Belgrade Sofia Bucharest Chisinau Tbilisi Yerevan Baku Almaty Tashkent Ulaanbaatar""".split()
_CITIES = [city.replace("_", " ") for city in _CITIES]

_FIRST = """Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Leo Maria Nina Oscar
Paula Quentin Rosa Sam Tara Umar Vera Walter Xena Yusuf Zoe Amir Bianca Chen Dmitri Elena Farah
Gustav Hana Ines Jonas Kofi Lena Marco Noor Olga Pedro Ravi Sofia Tomas Ursula Viktor Wen Yara
Aiko Bruno Clara Diego Eva Felix Greta Hugo Ida Jules Kai Lucia Mateo Nadia Omar Pia Rafael
Sven Tess Ulla Vlad Wanda Ximena Yuki Zainab""".split()

_OBJECTS = """report invoice contract proposal budget schedule presentation newsletter manual
prototype design draft summary agenda checklist roadmap survey spreadsheet letter package
parcel ticket receipt playlist recipe map poster brochure catalog license""".split()
_GROUPS = [
    "the finance team",
    "the design team",
    "the board",
    "the client",
    "the manager",
    "the support desk",
    "the sales team",
    "the new hires",
    "the landlord",
    "the school",
    "the editor",
    "the committee",
    "the suppliers",
    "the neighbours",
    "the whole class",
    "the night shift",
]
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_VERBS = ("sent", "delivered", "emailed", "showed", "mailed", "handed", "presented", "forwarded")
_ADJ = """quarterly annual weekly final revised updated short long detailed urgent signed
printed shared new old second first""".split()
_NOUN_PLACES = """office library station airport warehouse studio cafe market hospital museum
garden harbour bakery stadium theatre""".split()
_ITEMS = """apples pears plums milk bread eggs butter rice beans coffee tea sugar salt pepper
onions garlic carrots lemons oranges cheese pasta flour honey jam soap towels batteries
candles stamps envelopes pencils notebooks scissors tape glue""".split()
_COLORS = ("red", "blue", "green", "black", "white", "grey", "yellow", "silver")
_PRODUCTS = """kettle lamp backpack jacket chair desk monitor keyboard mouse blender toaster
umbrella bicycle helmet camera speaker notebook watch mug teapot""".split()
_EVENTS = [
    "team meeting",
    "product launch",
    "board review",
    "design workshop",
    "budget review",
    "book club",
    "sales call",
    "code review",
    "training session",
    "quarterly planning",
    "charity run",
    "family dinner",
    "job interview",
    "dentist visit",
]

_SYSTEMS = (
    None,
    None,
    "You are a concise assistant.",
    "You are a helpful assistant.",
    "You are swift-tiny, a small offline assistant.",
)

_FACTS: list[tuple[tuple[str, ...], str]] = [
    (("What is the capital of France?", "Capital of France?"), "The capital of France is Paris."),
    (("What is the capital of Japan?", "Capital of Japan?"), "The capital of Japan is Tokyo."),
    (("What is the capital of Italy?", "Capital of Italy?"), "The capital of Italy is Rome."),
    (
        ("What is the capital of Germany?", "Capital of Germany?"),
        "The capital of Germany is Berlin.",
    ),
    (("What is the capital of Spain?", "Capital of Spain?"), "The capital of Spain is Madrid."),
    (("What is the capital of Canada?", "Capital of Canada?"), "The capital of Canada is Ottawa."),
    (("What is the capital of Kenya?", "Capital of Kenya?"), "The capital of Kenya is Nairobi."),
    (("What is the capital of Peru?", "Capital of Peru?"), "The capital of Peru is Lima."),
    (("How many days are in a week?", "How many days does a week have?"), "A week has 7 days."),
    (
        ("How many minutes are in an hour?", "How many minutes does an hour have?"),
        "An hour has 60 minutes.",
    ),
    (("How many hours are in a day?", "How many hours does a day have?"), "A day has 24 hours."),
    (
        ("How many months are in a year?", "How many months does a year have?"),
        "A year has 12 months.",
    ),
    (
        ("What is the boiling point of water?", "At what temperature does water boil?"),
        "Water boils at 100 °C at sea level.",
    ),
    (
        ("What is the freezing point of water?", "At what temperature does water freeze?"),
        "Water freezes at 0 °C at sea level.",
    ),
    (
        ("What color is the sky?", "Why is the sky blue?"),
        "The sky looks blue because air scatters blue light more than red light.",
    ),
    (
        ("What is the largest planet?", "Which planet is the biggest?"),
        "Jupiter is the largest planet in the solar system.",
    ),
    (
        ("What is the closest star to Earth?", "Which star is nearest to us?"),
        "The Sun is the closest star to Earth.",
    ),
    (
        ("How many continents are there?", "How many continents does Earth have?"),
        "There are 7 continents.",
    ),
    (
        ("What is H2O?", "What is the chemical formula of water?"),
        "H2O is water: two hydrogen atoms and one oxygen atom.",
    ),
    (
        ("What is Python?", "What is the Python language?"),
        "Python is a popular general-purpose programming language.",
    ),
    (
        ("What is JSON?", "What does JSON stand for?"),
        "JSON is JavaScript Object Notation, a text format for data.",
    ),
    (
        ("What is an API?", "What does API mean?"),
        "An API is an application programming interface: a way for programs to talk to each other.",
    ),
    (
        ("What is swiftclient?", "What does swiftclient do?"),
        "swiftclient is an async Python client for chat model APIs, with a bundled local engine.",
    ),
    (
        ("What can you do?", "What are you able to do?"),
        "I can call tools for weather, unit conversion and arithmetic, answer in JSON, "
        "and copy or lightly edit text.",
    ),
]


def _casual(prompts: tuple[str, ...]) -> tuple[str, ...]:
    """``prompts`` as typed in a hurry as well: lowercase, and without or with end marks
    ("Hi!" also as "hi", "hi!" and "Hi")."""
    out: dict[str, None] = dict.fromkeys(prompts)
    for prompt in prompts:
        bare = prompt.rstrip("!?.")
        mark = "?" if prompt.endswith("?") else "!"
        for variant in (bare, bare + mark):
            out.setdefault(variant)
            out.setdefault(variant.lower())
    return tuple(out)


_GREETINGS: list[tuple[tuple[str, ...], str]] = [
    (
        _casual(
            (
                "Hi",
                "Hi there",
                "Hello",
                "Hello there",
                "Hey",
                "Hey there",
                "Good morning",
                "Good afternoon",
                "Good evening",
            )
        ),
        "Hello! How can I help you today?",
    ),
    (
        _casual(("Thanks", "Thank you", "Thanks a lot", "Much appreciated", "Thx")),
        "You're welcome!",
    ),
    (_casual(("Bye", "Goodbye", "See you later", "See you")), "Goodbye! Have a nice day."),
    (
        _casual(("Who are you?", "What is your name?", "What are you?")),
        "I am swift-tiny, a small assistant model that runs offline with swiftclient.",
    ),
    (
        _casual(("How are you?", "How are you doing?")),
        "I am doing well, thank you! How can I help?",
    ),
]


# ----------------------------------------------------------------------------- helpers


def _fmt_number(value: int | float) -> str:
    return json.dumps(value)


def _system(rng: random.Random) -> list[dict[str, Any]]:
    content = rng.choice(_SYSTEMS)
    return [] if content is None else [{"role": "system", "content": content}]


def _offered(rng: random.Random, needed: str | None) -> list[dict[str, Any]]:
    names = list(TOOLS)
    rng.shuffle(names)
    count = rng.choice((1, 2, 3, 3)) if needed else rng.choice((1, 2, 3))
    chosen = names[:count]
    if needed and needed not in chosen:
        chosen[rng.randrange(count)] = needed
    return tool_spec(*chosen)


def _call_message(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_" + hashlib.sha256(f"{name}{arguments}".encode()).hexdigest()[:8],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def _value(rng: random.Random) -> int | float:
    kind = rng.random()
    if kind < 0.45:
        return rng.randint(1, 500)
    if kind < 0.85:
        return round(rng.uniform(0.1, 300), 1)
    return round(rng.uniform(0.01, 100), 2)


# ----------------------------------------------------------------------------- tool questions


def _weather_question(rng: random.Random) -> tuple[str, dict[str, Any]]:
    city = rng.choice(_CITIES)
    fahrenheit = rng.random() < 0.25
    forms = (
        "What's the weather in {c}?",
        "What is the weather like in {c}?",
        "How is the weather in {c} today?",
        "Weather in {c}?",
        "Is it raining in {c}?",
        "How warm is it in {c} right now?",
        "Tell me the current weather for {c}.",
        "Should I take an umbrella in {c} today?",
    )
    question = rng.choice(forms).format(c=city)
    arguments: dict[str, Any] = {"city": city}
    if fahrenheit:
        question = question.rstrip("?.") + rng.choice(
            (" in Fahrenheit?", ", in fahrenheit please?")
        )
        arguments["unit"] = "fahrenheit"
    return question, arguments


def _conversion_question(rng: random.Random) -> tuple[str, dict[str, Any]]:
    src, dst = rng.choice(_UNIT_PAIRS)
    value = _value(rng)
    if src in ("c", "f"):
        value = rng.choice((rng.randint(-20, 110), round(rng.uniform(-20, 110), 1)))
    a, b = rng.choice(_UNITS[src]), rng.choice(_UNITS[dst])
    v = _fmt_number(value)
    forms = (
        "Convert {v} {a} to {b}.",
        "Convert {v} {a} into {b}",
        "How many {b} is {v} {a}?",
        "What is {v} {a} in {b}?",
        "{v} {a} to {b}?",
        "Please convert {v} {a} to {b}.",
    )
    question = rng.choice(forms).format(v=v, a=a, b=b)
    return question, {"value": value, "from_unit": src, "to_unit": dst}


def _expression(rng: random.Random) -> tuple[str, str]:
    """An expression as the model must write it, and how a user might say it."""
    symbols = {
        "+": ("plus", "+"),
        "-": ("minus", "-"),
        "*": ("times", "*", "x"),
        "/": ("divided by", "/"),
    }
    terms = [
        str(rng.choice((rng.randint(1, 99), rng.randint(100, 9999), round(rng.uniform(1, 99), 1))))
    ]
    spoken = [terms[0]]
    for _ in range(rng.choice((1, 1, 1, 2))):
        op = rng.choice("+-*/")
        number = str(rng.choice((rng.randint(1, 99), rng.randint(2, 999))))
        terms += [op, number]
        spoken += [rng.choice(symbols[op]), number]
    return " ".join(terms), " ".join(spoken)


def _calculator_question(rng: random.Random) -> tuple[str, dict[str, Any]]:
    expression, spoken = _expression(rng)
    forms = (
        "What is {e}?",
        "Calculate {e}.",
        "Compute {e}",
        "How much is {e}?",
        "What's {e}?",
        "Work out {e} for me.",
    )
    return rng.choice(forms).format(e=spoken), {"expression": expression}


_QUESTIONS: dict[str, Callable[[random.Random], tuple[str, dict[str, Any]]]] = {
    "get_weather": _weather_question,
    "convert_units": _conversion_question,
    "calculator": _calculator_question,
}


def _unit_word(code: str) -> str:
    return {"c": "°C", "f": "°F"}.get(code, code)


def _answer(name: str, result: dict[str, Any]) -> str:
    """The sentence stating a tool result."""
    if name == "get_weather":
        symbol = "°C" if result["unit"] == "celsius" else "°F"
        temperature = _fmt_number(result["temperature"])
        return f"It is {temperature} {symbol} and {result['conditions']} in {result['city']}."
    if name == "convert_units":
        return (
            f"{_fmt_number(result['value'])} {_unit_word(result['from_unit'])} is "
            f"{_fmt_number(result['result'])} {_unit_word(result['to_unit'])}."
        )
    return f"{result['expression']} = {_fmt_number(result['result'])}."


def _tool_turns(rng: random.Random) -> tuple[str, list[dict[str, Any]], dict[str, Any], str]:
    name = rng.choice(list(_QUESTIONS))
    question, arguments = _QUESTIONS[name](rng)
    return name, [{"role": "user", "content": question}], arguments, question


def gen_tool_call(rng: random.Random) -> Conversation:
    """A question that needs a tool; the answer is the call."""
    name, turns, arguments, _ = _tool_turns(rng)
    messages = _system(rng) + turns
    if rng.random() < 0.2:  # a finished exchange before it
        earlier = _followup_exchange(rng)
        messages = _system(rng) + earlier + turns
    messages.append(_call_message(name, arguments))
    return _conv("tool_call", messages, _offered(rng, name), {"name": name, "arguments": arguments})


def _followup_exchange(rng: random.Random) -> list[dict[str, Any]]:
    name, turns, arguments, _ = _tool_turns(rng)
    call = _call_message(name, arguments)
    result = run_tool(name, arguments)
    return [
        *turns,
        call,
        {
            "role": "tool",
            "tool_call_id": call["tool_calls"][0]["id"],
            "content": json.dumps(result),
        },
        {"role": "assistant", "content": _answer(name, result)},
    ]


def gen_tool_followup(rng: random.Random) -> Conversation:
    """A tool call and its result; the answer states the result."""
    exchange = _followup_exchange(rng)
    name = exchange[1]["tool_calls"][0]["function"]["name"]
    messages = _system(rng) + exchange
    return _conv("tool_followup", messages, _offered(rng, name), messages[-1]["content"])


def gen_tool_second_call(rng: random.Random) -> Conversation:
    """After one finished tool exchange, a new question that needs another call."""
    messages = _system(rng) + _followup_exchange(rng)
    first = messages[-3]["tool_calls"][0]["function"]["name"]
    if first == "get_weather" and rng.random() < 0.5:
        city = rng.choice(_CITIES)
        question = rng.choice(("And in {c}?", "What about {c}?", "And {c}?")).format(c=city)
        arguments: dict[str, Any] = {"city": city}
        name = "get_weather"
    else:
        name, turns, arguments, question = _tool_turns(rng)
    messages.append({"role": "user", "content": question})
    messages.append(_call_message(name, arguments))
    tools = _offered(rng, name)
    if not any(t["function"]["name"] == first for t in tools):
        tools.append(TOOLS[first])
    return _conv("tool_call_multiturn", messages, tools, {"name": name, "arguments": arguments})


# ----------------------------------------------------------------------------- JSON


def _person(rng: random.Random) -> tuple[str, dict[str, Any]]:
    name, age, city = rng.choice(_FIRST), rng.randint(18, 90), rng.choice(_CITIES)
    text = rng.choice(
        (
            "{n} is {a} years old and lives in {c}.",
            "{n}, aged {a}, lives in {c}.",
            "Meet {n} from {c}, who is {a}.",
            "{n} lives in {c} and is {a}.",
        )
    ).format(n=name, a=age, c=city)
    return text, {"name": name, "age": age, "city": city}


def _product(rng: random.Random) -> tuple[str, dict[str, Any]]:
    product = f"{rng.choice(_COLORS)} {rng.choice(_PRODUCTS)}"
    price = round(rng.uniform(2, 500), 2)
    stock = rng.random() < 0.5
    text = rng.choice(
        (
            "The {p} costs {v} dollars and is {s}.",
            "Our {p} is {s} at {v} dollars.",
            "{P}: {v} dollars, {s}.",
        )
    ).format(
        p=product,
        P=product.capitalize(),
        v=_fmt_number(price),
        s="in stock" if stock else "out of stock",
    )
    return text, {"product": product, "price": price, "in_stock": stock}


def _event(rng: random.Random) -> tuple[str, dict[str, Any]]:
    title = rng.choice(_EVENTS)
    date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    people = rng.randint(2, 40)
    text = rng.choice(
        (
            "The {t} is on {d} with {n} people.",
            "{n} people will attend the {t} on {d}.",
            "On {d} we hold the {t} for {n} attendees.",
        )
    ).format(t=title, d=date, n=people)
    return text, {"title": title, "date": date, "attendees": people}


_POSITIVE = (
    "I love this {p}, it works great.",
    "The {p} is excellent and arrived early.",
    "Great {p}, very happy with it.",
)
_NEGATIVE = (
    "The {p} broke after two days.",
    "I hate this {p}, it is too loud.",
    "Terrible {p}, I want a refund.",
)


def _sentiment(rng: random.Random) -> tuple[str, dict[str, Any]]:
    positive = rng.random() < 0.5
    text = rng.choice(_POSITIVE if positive else _NEGATIVE).format(p=rng.choice(_PRODUCTS))
    return text, {"sentiment": "positive" if positive else "negative"}


_SCHEMAS: dict[
    str, tuple[Callable[[random.Random], tuple[str, dict[str, Any]]], dict[str, Any]]
] = {
    "person": (
        _person,
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "city": {"type": "string"},
            },
            "required": ["name", "age", "city"],
        },
    ),
    "product": (
        _product,
        {
            "type": "object",
            "properties": {
                "product": {"type": "string"},
                "price": {"type": "number"},
                "in_stock": {"type": "boolean"},
            },
            "required": ["product", "price", "in_stock"],
        },
    ),
    "event": (
        _event,
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "date": {"type": "string"},
                "attendees": {"type": "integer"},
            },
            "required": ["title", "date", "attendees"],
        },
    ),
    "sentiment": (
        _sentiment,
        {
            "type": "object",
            "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative"]}},
            "required": ["sentiment"],
        },
    ),
}


def schema_for(value: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema whose required keys are the keys of ``value``."""
    for _, schema in _SCHEMAS.values():
        if set(schema["required"]) == set(value):
            return schema
    raise KeyError(f"no schema has the keys {sorted(value)}")


def gen_json(rng: random.Random) -> Conversation:
    """Fields of a sentence as JSON, under a json_schema or json_object response format."""
    name = rng.choice(list(_SCHEMAS))
    make, schema = _SCHEMAS[name]
    text, value = make(rng)
    if rng.random() < 0.7:
        response_format: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema},
        }
        prompt = rng.choice(("{t}", "Extract the data: {t}", "{t}\nAnswer in JSON."))
    else:
        response_format = {"type": "json_object"}
        keys = ", ".join(schema["required"])
        prompt = rng.choice(("Extract {k} as JSON: {t}", "Give {k} as a JSON object. Text: {t}"))
        prompt = prompt.replace("{k}", keys)
    messages = [
        *_system(rng),
        {"role": "user", "content": prompt.format(t=text)},
        {"role": "assistant", "content": json.dumps(value)},
    ]
    conv = _conv("json", messages, None, value)
    conv["response_format"] = response_format
    return conv


# ----------------------------------------------------------------------------- copy / edit


def _sentence(rng: random.Random, name: str | None = None) -> str:
    who = name or rng.choice(_FIRST)
    forms = (
        "{w} {v} the {a} {o} to {g} on {d}.",
        "On {d}, {w} {v} the {o} to {g}.",
        "{w} left the {o} at the {pl} in {c}.",
        "{w} will meet {g} at the {pl} on {d}.",
        "The {a} {o} from {w} arrived in {c} on {d}.",
        "{w} needs {n} {it} and {m} {it2} before {d}.",
        "{w} moved to {c} and now works at the {pl}.",
        "{w} asked {g} to review the {o} by {d}.",
    )
    return rng.choice(forms).format(
        w=who,
        v=rng.choice(_VERBS),
        a=rng.choice(_ADJ),
        o=rng.choice(_OBJECTS),
        g=rng.choice(_GROUPS),
        d=rng.choice(_DAYS),
        pl=rng.choice(_NOUN_PLACES),
        c=rng.choice(_CITIES),
        n=rng.randint(2, 12),
        m=rng.randint(2, 12),
        it=rng.choice(_ITEMS),
        it2=rng.choice(_ITEMS),
    )


def gen_copy(rng: random.Random) -> Conversation:
    """Repeat a text exactly."""
    text = " ".join(_sentence(rng) for _ in range(rng.choice((1, 1, 2, 3))))
    prompt = rng.choice(
        (
            "Repeat exactly: {t}",
            "Repeat this text exactly:\n{t}",
            "Copy this verbatim: {t}",
            "Echo back: {t}",
        )
    ).format(t=text)
    return _text_conv("copy", prompt, text, rng)


def gen_rename(rng: random.Random) -> Conversation:
    """Replace every use of one name with another."""
    old, new = rng.sample(_FIRST, 2)
    sentences = [_sentence(rng, old) for _ in range(rng.choice((1, 2, 2, 3)))]
    text = " ".join(sentences)
    prompt = rng.choice(
        (
            "Rename {a} to {b} in this text: {t}",
            "Replace {a} with {b}:\n{t}",
            "Change the name {a} to {b}. Text: {t}",
        )
    ).format(a=old, b=new, t=text)
    return _text_conv("rename", prompt, text.replace(old, new), rng)


def gen_summary(rng: random.Random) -> Conversation:
    """Summarize by extraction: the paragraph's first sentence."""
    sentences = [_sentence(rng) for _ in range(rng.choice((2, 3, 4)))]
    prompt = rng.choice(
        (
            "Summarize in one sentence: {t}",
            "Give a one-sentence summary of this text:\n{t}",
            "TL;DR: {t}",
            "Summarize: {t}",
        )
    ).format(t=" ".join(sentences))
    return _text_conv("summary", prompt, sentences[0], rng)


def gen_reformat(rng: random.Random) -> Conversation:
    """A comma-separated list as bullets, or bullets as a comma-separated list."""
    items = rng.sample(_ITEMS, rng.randint(2, 6))
    commas, bullets = ", ".join(items), "\n".join(f"- {item}" for item in items)
    if rng.random() < 0.6:
        prompt = rng.choice(
            (
                "Format as a bulleted list: {t}",
                "Turn this into bullet points: {t}",
                "Make a list: {t}",
            )
        ).format(t=commas)
        return _text_conv("reformat", prompt, bullets, rng)
    prompt = rng.choice(
        ("Write this list on one line, separated by commas:\n{t}", "Join these with commas:\n{t}")
    ).format(t=bullets)
    return _text_conv("reformat", prompt, commas, rng)


# ----------------------------------------------------------------------------- chat


def gen_chat(rng: random.Random) -> Conversation:
    """Greetings and short canned facts; sometimes tools are offered and not needed."""
    table = _GREETINGS if rng.random() < 0.4 else _FACTS
    prompts, answer = rng.choice(table)
    conv = _text_conv("chat", rng.choice(prompts), answer, rng)
    if rng.random() < 0.3:
        conv["tools"] = _offered(rng, None)
    return conv


def _text_conv(task: str, prompt: str, answer: str, rng: random.Random) -> Conversation:
    messages = [
        *_system(rng),
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": answer},
    ]
    return _conv(task, messages, None, answer)


def _conv(
    task: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, expected: Any
) -> Conversation:
    return {
        "task": task,
        "messages": messages,
        "tools": tools,
        "response_format": None,
        "expected": expected,
    }


# ----------------------------------------------------------------------------- sets

#: task name -> (generator, sampling weight in training). Copying (and the copying of
#: arguments inside tool calls) is what a small model learns last, so the copy and edit
#: tasks weigh most: list reformatting (whose copy skips the list's delimiters) and renaming
#: most of all, as they learned slowest (31.7% and 66.7% exact at 2.5 and 3). The tool
#: calls, tool answers and JSON, learnt by mid-run, weigh less; the canned chat least.
TASKS: dict[str, tuple[Callable[[random.Random], Conversation], float]] = {
    "tool_call": (gen_tool_call, 2.5),
    "tool_second_call": (gen_tool_second_call, 1.5),
    "tool_followup": (gen_tool_followup, 2.0),
    "json": (gen_json, 2.0),
    "copy": (gen_copy, 3.0),
    "rename": (gen_rename, 3.5),
    "summary": (gen_summary, 2.5),
    "reformat": (gen_reformat, 4.5),
    "chat": (gen_chat, 0.5),
}


def conversation_key(conv: Conversation) -> str:
    """A stable key for the prompt side of a conversation (to keep held-out sets apart)."""
    prompt = {k: conv[k] for k in ("messages", "tools", "response_format")}
    prompt["messages"] = conv["messages"][:-1]
    return hashlib.sha256(json.dumps(prompt, sort_keys=True).encode()).hexdigest()


def generate(
    count: int, seed: int, exclude: set[str] | frozenset[str] = frozenset()
) -> list[Conversation]:
    """``count`` conversations drawn by task weight from ``seed``, skipping ``exclude`` keys."""
    rng = random.Random(seed)
    names = list(TASKS)
    weights = [TASKS[name][1] for name in names]
    out: list[Conversation] = []
    while len(out) < count:
        conv = TASKS[rng.choices(names, weights)[0]][0](rng)
        if exclude and conversation_key(conv) in exclude:
            continue
        out.append(conv)
    return out


HELDOUT_SEED = 20261201


def heldout_set(per_task: int = 60) -> list[Conversation]:
    """The held-out evaluation set: ``per_task`` conversations of each generator."""
    rng = random.Random(HELDOUT_SEED)
    out: list[Conversation] = []
    for name in TASKS:
        make = TASKS[name][0]
        out.extend(make(rng) for _ in range(per_task))
    return out
