"""A second evaluation set for the embedded model, written apart from its training data.

``scripts/eval_general.py`` runs it (``--model DIR`` for a checkpoint); this module only
builds the conversations and judges replies. The held-out set of
``scripts/eval_default_model.py`` is drawn from the training generators themselves, so it
says whether the model learned those generators; this set asks the same tasks the way
other people ask them. It is kept independent on purpose: it never imports the training
generator (``scripts/default_model_data.py``), and its templates, word lists, tool-result
field names and JSON styles were written here, without reading the generator's.
``tests/engine/test_general_eval_data.py`` enforces both (no import, no shared string of 20
characters or more).

What it holds (:func:`build`, fixed seed, 360 conversations):

* ``tool_call`` (90): a weather, unit-conversion or arithmetic question, with the built-in
  tools (:data:`local_engine.builtin_tools.TOOLS`, the model's interface) offered in any
  order or subset; the reply must be one call with the right arguments. Arithmetic always
  goes to the calculator: the call's expression must compute the asked value.
* ``tool_result`` (90): the same questions after the call and the tool's result, the result
  written in other field names (nested, with units in strings, reordered) and JSON styles
  (compact as pydantic-ai sends it, spaced, indented, ASCII-escaped); the reply must state
  the result's number, sign included, and invent no number of its own.
* ``copy`` (80): repeat a text of 3-20 words exactly: random words from this module's own
  list, letters and digits, punctuation, mixed case, accented and non-Latin letters.
* ``structured`` (60): fill a small schema from a sentence, as ``response_format``
  ``json_schema``, as pydantic-ai's forced ``final_result`` tool, and as LangChain's
  ``with_structured_output(method="function_calling")`` named tool; the value must be
  schema-valid and equal the expected one.
* ``session`` (40): six user turns mixing tool questions, thanks, greetings, small talk and
  copy requests; the runner feeds the model's own replies and scripted tool results back.
  No reply may be malformed (:func:`malformed`); each turn is also judged (:func:`check_turn`).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from local_engine.builtin_tools import TOOLS, run_tool

SEED = 4_812_2026
TOOL_NAMES = ("get_weather", "convert_units", "calculator")
MAX_TOOL_ROUNDS = 3
"""A session turn that needs more model calls than this is a tool loop (malformed)."""

Case = dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """A model reply as the local backend returns it: text, parsed tool calls, finish."""

    content: str
    calls: tuple[tuple[str, str], ...] = ()
    finish_reason: str = "stop"


# --------------------------------------------------------------------------- word lists

PLACES = (
    "Oslo", "Lagos", "Quito", "Hanoi", "Tromsø", "Kraków", "São Paulo", "Reykjavík",
    "Springfield", "Ouagadougou", "Winnipeg", "Tbilisi", "Valparaíso", "Da Nang", "Kyoto",
    "Marrakesh", "Bilbao", "Anchorage", "Perugia", "Cork", "Gdańsk", "Hobart", "Asunción",
    "Yerevan", "Tartu", "Nairobi", "Chiang Mai", "Bergen", "Cusco", "Halifax", "Düsseldorf",
    "Fremantle", "Montevideo", "Ljubljana", "Kingston", "Ulaanbaatar", "Tampere", "Bordeaux",
    "Salvador", "Windhoek", "Izmir", "Jaipur", "Tórshavn", "Nuuk", "Boise", "Timbuktu",
)  # fmt: skip
SKIES = (
    "overcast", "light drizzle", "sunny", "thunderstorms", "clear skies", "hazy", "sleet",
    "scattered showers", "fog", "breezy", "heavy snow", "mostly cloudy",
)  # fmt: skip
# Ordinary words of many kinds, for texts to repeat and for fields to fill.
WORDS = (
    "lantern", "orbit", "velvet", "quarry", "meadow", "pistachio", "harbor", "syntax",
    "glacier", "pepper", "tunnel", "violin", "saddle", "cobalt", "ferry", "juniper", "marble",
    "nozzle", "oyster", "parcel", "riddle", "sparrow", "thimble", "umbrella", "walnut",
    "yodel", "zephyr", "anchor", "biscuit", "canyon", "dolphin", "ember", "falcon", "gadget",
    "hammock", "igloo", "jigsaw", "kettle", "lobster", "mosaic", "nectar", "orchid", "pebble",
    "quill", "rhubarb", "scooter", "tangerine", "utensil", "vortex", "wombat", "xylophone",
    "yarn", "zucchini", "abacus", "bramble", "cactus", "dagger", "easel", "fjord", "gravel",
    "hazel", "ivory", "jasmine", "kayak", "lagoon", "mango", "nutmeg", "olive", "paddle",
    "quiver", "raven", "salmon", "tulip", "valley", "whistle", "anvil", "beacon", "cinder",
    "drizzle", "engine", "fossil", "goblet", "helmet", "inkwell", "jacket", "kernel", "ledger",
    "magnet", "napkin", "oxygen", "pigeon", "quartz", "ribbon", "sketch", "trumpet", "vessel",
    "wrench", "blue", "quietly", "seven", "under", "broken", "eager", "lazy", "tiny",
    "enormous", "slowly", "never", "almost", "bright", "hollow", "crisp", "fuzzy", "loud",
    "purple", "sour", "ancient", "modern", "runs", "jumps", "borrowed", "painted", "melts",
    "whispers", "carries", "folds", "counts", "leans", "bakes", "hides", "shouts", "between",
    "beneath", "toward", "despite", "without", "around", "the", "a", "our", "their", "every",
    "some", "and", "but", "or", "because", "although", "spreadsheet", "firmware", "bandwidth",
    "compiler", "kernel", "cursor", "router", "backup", "payload", "invoice", "deadline",
    "budget", "roadmap", "tractor", "wheelbarrow", "greenhouse", "scarecrow", "haystack",
    "porridge", "dumpling", "croissant", "lentil", "sardine", "paprika", "vinegar", "honey",
)  # fmt: skip
UNICODE_WORDS = (
    "café", "naïve", "Zürich", "smørbrød", "crème", "jalapeño", "façade", "Ærø", "Łódź",
    "señor", "über", "déjà", "piñata", "fiancée", "Ñandú", "größer", "Åland", "coöperate",
    "€12", "30°", "—", "…", "Ελλάδα", "привет", "mañana", "Straße", "Øresund", "São",
)  # fmt: skip
PEOPLE_FIRST = (
    "Ingrid", "Tomasz", "Aiko", "Rafael", "Nkechi", "Bjørn", "Priya", "Mateo", "Yusuf",
    "Saoirse", "Dmitri", "Leilani", "Oluwaseun", "Camille", "Hamish", "Zeynep", "Kofi",
    "Mirela", "Tadashi", "Esperanza", "Finnegan", "Wanjiru", "Anouk", "Caspian",
)  # fmt: skip
PEOPLE_LAST = (
    "Okafor", "Lindqvist", "Moreau", "Tanaka", "Kowalski", "Haddad", "Fitzgerald", "Ivanova",
    "Castellanos", "Nguyen", "Abernathy", "Varga", "Oyelaran", "Delacroix", "Mbeki", "Sato",
)  # fmt: skip
BOOK_TITLES = (
    "The Salt Road", "Winter Orchard", "Glass Harbor", "A Map of Small Rivers",
    "Nine Lanterns", "The Copper Field", "Quiet Machines", "Letters from Tarn",
    "The Last Ferry", "Paper Comets", "Under the Linden", "The Borrowed Coast",
)  # fmt: skip
PETS = ("cat", "dog", "rabbit", "parrot", "hamster", "tortoise")
PET_NAMES = ("Biscuit", "Pixel", "Mochi", "Captain", "Pepper", "Ziggy", "Noodle", "Olive")
ROOMS = ("Aurora", "Basalt", "Cedar", "Delta-4", "East Wing 2", "Fjord", "Granite", "Helix")
TOPICS = (
    "budget review", "onboarding plan", "security audit", "Q3 roadmap", "hiring sync",
    "design critique", "vendor contract", "release retro",
)  # fmt: skip
ITEMS = (
    "ceramic mug", "desk lamp", "wool scarf", "USB-C cable", "yoga mat", "garden hose",
    "cast iron pan", "notebook", "bike pump", "phone stand", "tea kettle", "snow shovel",
)  # fmt: skip
SENSORS = ("boiler-2", "attic", "greenhouse-east", "freezer", "server rack 7", "porch")
AIRPORTS = ("Lisbon", "Dakar", "Calgary", "Busan", "Porto", "Cairo", "Denver", "Sapporo")


# --------------------------------------------------------------------------- phrasing

SYSTEM_PROMPTS = (
    None,
    None,
    "You are a friendly, helpful assistant.",
    "You are an assistant with access to tools. Be brief.",
    "Keep answers short and friendly.",
    "You help people plan their day.",
)
PREAMBLES = (
    "",
    "",
    "",
    "Quick question. ",
    "I'm packing for a trip next week. ",
    "My manager just asked me this: ",
    "ok so ",
    "Hi there! ",
    "Sorry to bother you, ",
    "Random thing I was wondering about - ",
    "For my homework: ",
)
CLOSERS = ("", "", "", " Thanks!", " Please.", " thx", " Cheers.", " if you can")

WEATHER_ASKS = (
    "What's the weather like in {city}?",
    "How's the weather in {city} right now",
    "is it cold in {city} today?",
    "Tell me the current conditions in {city}.",
    "Could you check the weather for {city}?",
    "weather {city}",
    "Do I need a jacket in {city} today?",
    "What is the temperature in {city} at the moment?",
    "Any idea what it's like outside in {city}?",
    "Give me a weather update for {city}, please.",
    "How warm is it in {city}?",
    "Look up {city} weather for me",
    "current weather in {city}?",
    "Is there any rain in {city} right now?",
    "I'd like to know the weather in {city}.",
)
WEATHER_ASKS_F = (
    "What's the temperature in {city} in Fahrenheit?",
    "How hot is it in {city}? Give it to me in fahrenheit.",
    "weather in {city} in °F please",
    "Check {city}'s weather, in degrees Fahrenheit.",
)
WEATHER_ASKS_C = (
    "What's the weather in {city} in Celsius?",
    "How cold is it in {city}, in degrees C?",
)
CONVERT_ASKS = (
    "Convert {v} {a} over to {b}.",
    "How many {b} would {v} {a} be?",
    "what is {v} {a} in {b}",
    "{v} {a} to {b}?",
    "Can you turn {v} {a} into {b}?",
    "I have {v} {a}. How much is that in {b}?",
    "Please express {v} {a} in {b}.",
    "How much is {v} {a} when converted to {b}?",
    "Change {v} {a} into {b} for me.",
    "{v} {a} equals how many {b}?",
    "Quick conversion: {v} {a} -> {b}",
    "What do {v} {a} come to in {b}?",
)
UNIT_WORDS: dict[str, tuple[str, ...]] = {
    "km": ("km", "kilometers", "kilometres"),
    "mi": ("miles", "mi"),
    "m": ("meters", "metres", "m"),
    "ft": ("feet", "ft"),
    "cm": ("centimeters", "cm"),
    "in": ("inches",),
    "kg": ("kg", "kilograms", "kilos"),
    "lb": ("pounds", "lbs"),
    "g": ("grams", "g"),
    "oz": ("ounces", "oz"),
    "l": ("liters", "litres"),
    "gal": ("gallons", "gal"),
    "c": ("degrees Celsius", "°C", "celsius"),
    "f": ("degrees Fahrenheit", "°F", "fahrenheit"),
}
UNIT_PAIRS = (
    ("km", "mi"), ("mi", "km"), ("m", "ft"), ("ft", "m"), ("cm", "in"), ("in", "cm"),
    ("kg", "lb"), ("lb", "kg"), ("g", "oz"), ("oz", "g"), ("l", "gal"), ("gal", "l"),
    ("c", "f"), ("f", "c"), ("km", "m"), ("m", "cm"), ("kg", "g"), ("mi", "ft"),
)  # fmt: skip
# (how the sum is said, the expression the calculator must evaluate); {x} and {y} are operands.
ARITHMETIC = (
    ("What is {x} + {y}?", "{x} + {y}"),
    ("what's {x} plus {y}", "{x} + {y}"),
    ("Add {x} and {y}.", "{x} + {y}"),
    ("the sum of {x} and {y}?", "{x} + {y}"),
    ("How much is {x} minus {y}?", "{x} - {y}"),
    ("Subtract {y} from {x}.", "{x} - {y}"),
    ("{x} - {y} = ?", "{x} - {y}"),
    ("What's {x} times {y}?", "{x} * {y}"),
    ("Multiply {x} by {y}", "{x} * {y}"),
    ("calculate {x}*{y}", "{x} * {y}"),
    ("the product of {x} and {y}, please", "{x} * {y}"),
    ("What is {x} divided by {y}?", "{x} / {y}"),
    ("{x} / {y}?", "{x} / {y}"),
    ("Split {x} evenly into {y} parts: how much is each?", "{x} / {y}"),
    ("Work out {x} + {y} - {z} for me.", "{x} + {y} - {z}"),
    ("Can you compute {x} * {y} + {z}?", "{x} * {y} + {z}"),
    ("If I had {x} apples and bought {y} more, how many would I have?", "{x} + {y}"),
    ("I spent {x} and then {y}. What's the total?", "{x} + {y}"),
)

COPY_ASKS = (
    "Repeat exactly: {t}",
    "Please say this back to me word for word: {t}",
    "echo: {t}",
    "Copy the following text exactly, with nothing else:\n{t}",
    'Type back exactly what is inside the quotes: "{t}"',
    "Can you repeat after me? {t}",
    "I need this repeated verbatim -> {t}",
    "Return this string unchanged:\n{t}",
    "Say precisely this and nothing more: {t}",
    "Write back the text below exactly as given.\n\n{t}",
    "Mirror my message exactly: {t}",
    "Please reproduce, character for character: {t}",
)
THANKS = (
    "cheers, that helps",
    "great, thank you so much",
    "perfect",
    "ok thanks!",
    "nice one",
    "Thank you!",
    "appreciate it",
    "awesome, thanks a lot",
)
GREETINGS = ("hey", "hello again", "good evening!", "Hi", "yo", "Good afternoon.")
SMALL_TALK = (
    "what can you do?",
    "Who are you?",
    "how are you today?",
    "Are you a robot?",
    "ok, anything else I should know?",
    "Can you help me with something?",
)


def _typo(text: str, rng: random.Random) -> str:
    """One swap of two adjacent letters in a template word (never in a placeholder)."""
    words = text.split(" ")
    spots = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 4 and "{" not in w]
    if not spots:
        return text
    i = rng.choice(spots)
    w = words[i]
    j = rng.randrange(1, len(w) - 2)
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
    return " ".join(words)


def _dress(template: str, rng: random.Random) -> str:
    """A template as people type it: a preamble, a closer, lowercase, a typo, no end mark."""
    text = template
    if rng.random() < 0.2:
        text = _typo(text, rng)
    if rng.random() < 0.15 and text[-1:] in ".?!":
        text = text[:-1]
    text = rng.choice(PREAMBLES) + text + rng.choice(CLOSERS)
    if rng.random() < 0.2:
        # Lowercase around the placeholders only, so a value keeps its own case.
        text = re.sub(r"[^{}]+(?=\{|$)", lambda m: m.group(0).lower(), text)
    return text


def _messages(user: str, rng: random.Random) -> list[dict[str, Any]]:
    system = rng.choice(SYSTEM_PROMPTS)
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": user}]


def _offer(needed: str, rng: random.Random) -> list[dict[str, Any]]:
    """The built-in tool definitions as they are, in a random order or subset with ``needed``."""
    others = [name for name in TOOL_NAMES if name != needed]
    chosen = [needed, *rng.sample(others, rng.randint(0, 2))]
    rng.shuffle(chosen)
    return [TOOLS[name] for name in chosen]


def _num(value: float) -> int | float:
    """A value rounded to 2 places, whole ones as int (how the tools report numbers)."""
    rounded = round(value, 2)
    return int(rounded) if rounded == int(rounded) else rounded


def _operand(rng: random.Random) -> int | float:
    if rng.random() < 0.5:
        return rng.randint(2, 999)
    return round(rng.uniform(0.5, 400), rng.choice((1, 2)))


# --------------------------------------------------------------------------- questions


@dataclass(frozen=True)
class Question:
    """A user question that needs one tool, and the call it needs."""

    text: str
    call: dict[str, Any]


def weather_question(rng: random.Random) -> Question:
    """A weather question for a city, sometimes with a unit asked for."""
    city = rng.choice(PLACES)
    roll = rng.random()
    arguments: dict[str, Any] = {"city": city}
    if roll < 0.2:
        template = rng.choice(WEATHER_ASKS_F)
        arguments["unit"] = "fahrenheit"
    elif roll < 0.27:
        template = rng.choice(WEATHER_ASKS_C)
        arguments["unit"] = "celsius"
    else:
        template = rng.choice(WEATHER_ASKS)
    text = _dress(template, rng).format(city=city)
    return Question(text, {"name": "get_weather", "arguments": arguments})


def convert_question(rng: random.Random) -> Question:
    """A unit conversion in words or symbols."""
    src, dst = rng.choice(UNIT_PAIRS)
    value = _operand(rng) if src not in ("c", "f") else rng.choice((-18, -4.5, 0, 21, 37, 100))
    text = _dress(rng.choice(CONVERT_ASKS), rng).format(
        v=value, a=rng.choice(UNIT_WORDS[src]), b=rng.choice(UNIT_WORDS[dst])
    )
    arguments = {"value": value, "from_unit": src, "to_unit": dst}
    return Question(text, {"name": "convert_units", "arguments": arguments})


def arithmetic_question(rng: random.Random) -> Question:
    """Arithmetic in words or symbols: the calculator's job, never the model's."""
    said, expression = rng.choice(ARITHMETIC)
    values = {"x": _operand(rng), "y": _operand(rng), "z": rng.randint(1, 60)}
    if "/" in expression and values["y"] == 0:
        values["y"] = 4
    text = _dress(said, rng).format(**values)
    call = {"name": "calculator", "arguments": {"expression": expression.format(**values)}}
    return Question(text, call)


QUESTIONS: dict[str, Callable[[random.Random], Question]] = {
    "get_weather": weather_question,
    "convert_units": convert_question,
    "calculator": arithmetic_question,
}


# --------------------------------------------------------------------------- tool results


def _weather_facts(arguments: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    unit = arguments.get("unit", "celsius")
    low, high = (-25.0, 42.0) if unit == "celsius" else (-10.0, 105.0)
    temperature = _num(round(rng.uniform(low, high), rng.choice((0, 1))))
    return {
        "city": arguments["city"],
        "temperature": temperature,
        "unit": unit,
        "sky": rng.choice(SKIES),
    }


def _shape_weather(facts: dict[str, Any], style: int) -> tuple[Any, Any]:
    """A weather result in one of several shapes, and the number an answer must state."""
    city, t, unit, sky = facts["city"], facts["temperature"], facts["unit"], facts["sky"]
    letter = "C" if unit == "celsius" else "F"
    shapes: list[Any] = [
        {"city": city, "temperature": t, "unit": unit, "conditions": sky},
        {"location": city, f"temp_{letter.lower()}": t, "sky": sky},
        {"place": city, "reading": {"value": t, "scale": letter}, "summary": sky},
        {"data": {"current": {"degrees": t, "unit": f"°{letter}"}, "desc": sky}, "query": city},
        {"conditions": sky, "temperature": t, "city": city},
        {"weather": {"city": city, "temp": f"{t} °{letter}", "outlook": sky}},
    ]
    return shapes[style % len(shapes)], t


def _shape_convert(arguments: dict[str, Any], result: Any, style: int) -> Any:
    value, src, dst = arguments["value"], arguments["from_unit"], arguments["to_unit"]
    shapes: list[Any] = [
        {"value": value, "from_unit": src, "to_unit": dst, "result": result},
        {"input": {"amount": value, "unit": src}, "output": {"amount": result, "unit": dst}},
        {"converted": result, "unit": dst},
        {"answer": f"{result} {dst}"},
        {"to_unit": dst, "result": result, "from_unit": src, "value": value},
    ]
    return shapes[style % len(shapes)]


def _shape_calc(expression: str, result: Any, style: int) -> Any:
    shapes: list[Any] = [
        {"expression": expression, "result": result},
        {"value": result},
        {"answer": result, "input": expression},
        {"output": {"number": result}},
        {"result": result, "expression": expression},
    ]
    return shapes[style % len(shapes)]


JSON_STYLES: tuple[Callable[[Any], str], ...] = (
    lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False),  # pydantic-ai
    lambda v: json.dumps(v),  # Conversation.tool_result, json.dumps's defaults
    lambda v: json.dumps(v, indent=2, ensure_ascii=False),
    lambda v: json.dumps(v, separators=(",", ":"), sort_keys=True),
    lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True),
)


def tool_result(
    name: str, arguments: dict[str, Any], style: int, rng: random.Random
) -> tuple[str, float]:
    """A tool's result as a tool message's text, and the number the answer must state.

    Weather is drawn (any sign); conversion and arithmetic are computed by the built-in
    tools. ``style`` picks the field names and the JSON style. ValueError for arguments
    the built-in tools refuse.
    """
    if name == "get_weather":
        shaped, number = _shape_weather(_weather_facts(arguments, rng), style)
    elif name == "convert_units":
        number = run_tool(name, arguments)["result"]
        shaped = _shape_convert(arguments, number, style)
    elif name == "calculator":
        number = run_tool(name, arguments)["result"]
        shaped = _shape_calc(arguments["expression"], number, style)
    else:
        raise ValueError(f"no such tool: {name!r}")
    return JSON_STYLES[(style // 2 + style) % len(JSON_STYLES)](shaped), float(number)


def _call_message(call: dict[str, Any], call_id: str, compact: bool) -> dict[str, Any]:
    separators = (",", ":") if compact else (", ", ": ")
    arguments = json.dumps(call["arguments"], separators=separators, ensure_ascii=False)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments},
            }
        ],
    }


# --------------------------------------------------------------------------- texts to copy


def _text_words(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
        return " ".join(words) + rng.choice((".", "!", "?", ""))
    return " ".join(words)


def _text_codes(rng: random.Random, n: int) -> str:
    alphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    return " ".join(
        "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 6))) for _ in range(n)
    )


def _text_punctuated(rng: random.Random, n: int) -> str:
    marks = (",", ";", ":", "!", "?", "...", ")", "%", "#1", "&", "'s", "-x", "/2", '"')
    words = []
    for _ in range(n):
        word = rng.choice(WORDS)
        roll = rng.random()
        if roll < 0.3:
            word += rng.choice(marks)
        elif roll < 0.4:
            word = f"({word})"
        elif roll < 0.5:
            word = str(rng.randint(0, 9999))
        words.append(word)
    return " ".join(words)


def _text_mixed_case(rng: random.Random, n: int) -> str:
    words = []
    for _ in range(n):
        word = rng.choice(WORDS)
        kind = rng.randrange(4)
        if kind == 0:
            word = word.upper()
        elif kind == 1:
            word = "".join(c.upper() if rng.random() < 0.5 else c for c in word)
        elif kind == 2:
            word = word.capitalize()
        words.append(word)
    return " ".join(words)


def _text_unicode(rng: random.Random, n: int) -> str:
    pool = UNICODE_WORDS + WORDS[:60]
    words = [rng.choice(pool) for _ in range(n)]
    if not any(w in UNICODE_WORDS for w in words):
        words[rng.randrange(n)] = rng.choice(UNICODE_WORDS)
    return " ".join(words)


COPY_TEXTS: dict[str, Callable[[random.Random, int], str]] = {
    "words": _text_words,
    "codes": _text_codes,
    "punctuation": _text_punctuated,
    "mixed_case": _text_mixed_case,
    "unicode": _text_unicode,
}


def copy_request(rng: random.Random, kind: str) -> tuple[str, str]:
    """A request to repeat a text of 3-20 words, and the text."""
    text = COPY_TEXTS[kind](rng, rng.randint(3, 20))
    template = rng.choice(COPY_ASKS)
    if '"{t}"' in template:
        text = text.replace('"', "'")
    return template.replace("{t}", text), text


# --------------------------------------------------------------------------- schemas


def _obj(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
NUM: dict[str, Any] = {"type": "number"}
BOOL: dict[str, Any] = {"type": "boolean"}


@dataclass(frozen=True)
class Record:
    """A small schema to fill, the sentences that state a record's fields, and a draw of
    one record (keys starting with ``_`` are words the sentences use, not fields)."""

    name: str
    schema: dict[str, Any]
    sentences: tuple[str, ...]
    draw: Callable[[random.Random], dict[str, Any]]

    def sample(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """One sentence and the record it states."""
        drawn = self.draw(rng)
        sentence = rng.choice(self.sentences).format(**drawn)
        return sentence, {k: v for k, v in drawn.items() if not k.startswith("_")}


def _person_name(rng: random.Random) -> str:
    return f"{rng.choice(PEOPLE_FIRST)} {rng.choice(PEOPLE_LAST)}"


def _meeting(rng: random.Random) -> dict[str, Any]:
    online = rng.random() < 0.5
    return {
        "topic": rng.choice(TOPICS),
        "room": rng.choice(ROOMS),
        "attendees": rng.randint(2, 30),
        "online": online,
        "_where": "on a video call" if online else "in person",
    }


def _reading(rng: random.Random) -> dict[str, Any]:
    ok = rng.random() < 0.6
    return {
        "sensor": rng.choice(SENSORS),
        "value": round(rng.uniform(-30, 90), 1),
        "in_range": ok,
        "_state": "within range" if ok else "out of range",
    }


def _contact(rng: random.Random) -> dict[str, Any]:
    first, last = rng.choice(PEOPLE_FIRST), rng.choice(PEOPLE_LAST)
    email = f"{first.lower()}.{last.lower()}@{rng.choice(WORDS[:40])}.org"
    return {
        "first_name": first,
        "last_name": last,
        "email": email.encode("ascii", "ignore").decode(),
    }


def _flight(rng: random.Random) -> dict[str, Any]:
    origin, destination = rng.sample(AIRPORTS, 2)
    return {
        "code": f"{rng.choice('AZKQLT')}{rng.choice('XYBF')}{rng.randint(10, 9999)}",
        "origin": origin,
        "destination": destination,
        "gate": rng.randint(1, 60),
    }


RECORDS = (
    Record(
        "Book",
        _obj({"title": STR, "author": STR, "year": INT}),
        (
            '"{title}" was written by {author} and came out in {year}.',
            "{author} published {title} in {year}.",
            "Published in {year}, {title} is a novel by {author}.",
        ),
        lambda rng: {
            "title": rng.choice(BOOK_TITLES),
            "author": _person_name(rng),
            "year": rng.randint(1921, 2025),
        },
    ),
    Record(
        "Pet",
        _obj({"name": STR, "species": {"type": "string", "enum": list(PETS)}, "age": INT}),
        (
            "Our {species} {name} turned {age} this spring.",
            "{name} is a {age}-year-old {species}.",
            "Meet {name}: {species}, {age} years old.",
        ),
        lambda rng: {
            "name": rng.choice(PET_NAMES),
            "species": rng.choice(PETS),
            "age": rng.randint(1, 19),
        },
    ),
    Record(
        "Order",
        _obj({"item": STR, "quantity": INT, "unit_price": NUM}),
        (
            "Please send {quantity} x {item} at {unit_price} dollars each.",
            "I ordered {quantity} of the {item}, unit price {unit_price}.",
            "Order: {item}, quantity {quantity}, {unit_price} per piece.",
        ),
        lambda rng: {
            "item": rng.choice(ITEMS),
            "quantity": rng.randint(1, 12),
            "unit_price": round(rng.uniform(2, 180), 2),
        },
    ),
    Record(
        "Meeting",
        _obj({"topic": STR, "room": STR, "attendees": INT, "online": BOOL}),
        (
            "The {topic} is in room {room} with {attendees} people, held {_where}.",
            "{attendees} of us meet {_where} in {room} for the {topic}.",
        ),
        _meeting,
    ),
    Record(
        "Reading",
        _obj({"sensor": STR, "value": NUM, "in_range": BOOL}),
        (
            "Sensor {sensor} reports {value} degrees, {_state}.",
            "The {sensor} reading is {value}; status: {_state}.",
        ),
        _reading,
    ),
    Record(
        "Contact",
        _obj({"first_name": STR, "last_name": STR, "email": STR}),
        (
            "You can reach {first_name} {last_name} at {email}.",
            "New contact - first name {first_name}, surname {last_name}, mail {email}",
        ),
        _contact,
    ),
    Record(
        "Flight",
        _obj({"code": STR, "origin": STR, "destination": STR, "gate": INT}),
        (
            "Flight {code} from {origin} to {destination} boards at gate {gate}.",
            "Boarding at gate {gate}: {code}, {origin} to {destination}.",
        ),
        _flight,
    ),
)
EXTRACT_ASKS = (
    "Extract the details from this: {s}",
    "{s}\n\nPull out the fields.",
    "Fill in the record from the following text. {s}",
    "Parse this for me: {s}",
    "Here's a note: {s} Give me the structured data.",
)


def valid(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` follows one of this set's small schemas (objects of scalars), as
    JSON Schema says: other keys are allowed unless ``additionalProperties`` is false."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "object":
        props = schema.get("properties", {})
        closed = schema.get("additionalProperties") is False
        return (
            isinstance(value, dict)
            and set(schema.get("required", ())) <= set(value)
            and (not closed or set(value) <= set(props))
            and all(valid(item, props[key]) for key, item in value.items() if key in props)
        )
    if kind == "string":
        return isinstance(value, str)
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, int | float) and math.isfinite(value)
    return False


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=0, abs_tol=1e-9)
    return bool(a == b)


# --------------------------------------------------------------------------- the set


def _tool_call_case(rng: random.Random, tool: str) -> Case:
    question = QUESTIONS[tool](rng)
    return {
        "task": "tool_call",
        "style": tool,
        "request": {"messages": _messages(question.text, rng), "tools": _offer(tool, rng)},
        "expected": question.call,
    }


def _tool_result_case(rng: random.Random, tool: str, index: int) -> Case:
    question = QUESTIONS[tool](rng)
    style = index % 30
    content, number = tool_result(tool, question.call["arguments"], style, rng)
    call_id = rng.choice(("call_1", f"call_{rng.randrange(10**6):06x}", "pyd_ai_tool_0"))
    messages = _messages(question.text, rng)
    messages += [
        _call_message(question.call, call_id, compact=rng.random() < 0.5),
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]
    return {
        "task": "tool_result",
        "style": tool,
        "request": {"messages": messages, "tools": _offer(tool, rng)},
        "expected": number,
    }


def _copy_case(rng: random.Random, kind: str) -> Case:
    user, text = copy_request(rng, kind)
    messages = _messages(user, rng)
    request: dict[str, Any] = {"messages": messages}
    if rng.random() < 0.3:
        request["tools"] = [TOOLS[name] for name in TOOL_NAMES]
    return {"task": "copy", "style": kind, "request": request, "expected": text}


def structured_request(style: str, name: str, schema: dict[str, Any], user: str) -> dict[str, Any]:
    """A structured-output request as each client sends it for the same schema.

    ``json_schema``: OpenAI's ``response_format``; ``final_result``: pydantic-ai's default
    (a forced tool named ``final_result``, strict, no other keys); ``named_tool``:
    LangChain's ``with_structured_output(method="function_calling")`` (a tool named after
    the model, forced by name).
    """
    messages = [{"role": "user", "content": user}]
    if style == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        return {"messages": messages, "response_format": fmt}
    if style == "final_result":
        parameters = {**schema, "additionalProperties": False}
        tool = {
            "type": "function",
            "function": {
                "name": "final_result",
                "description": "The final response which ends this conversation",
                "parameters": parameters,
                "strict": True,
            },
        }
        return {"messages": messages, "tools": [tool], "tool_choice": "required"}
    tool = {"type": "function", "function": {"name": name, "description": "", "parameters": schema}}
    choice = {"type": "function", "function": {"name": name}}
    return {
        "messages": messages,
        "tools": [tool],
        "tool_choice": choice,
        "parallel_tool_calls": False,
    }


def _structured_case(rng: random.Random, style: str) -> Case:
    record = rng.choice(RECORDS)
    sentence, value = record.sample(rng)
    user = rng.choice(EXTRACT_ASKS).format(s=sentence)
    return {
        "task": "structured",
        "style": style,
        "request": structured_request(style, record.name, record.schema, user),
        "schema": record.schema,
        "expected": value,
    }


def _session_case(rng: random.Random, index: int) -> Case:
    kinds = ["tool", "tool", "chat", "chat"] + rng.sample(["tool", "chat", "copy", "tool"], 2)
    rng.shuffle(kinds)
    if kinds[0] != "chat" and rng.random() < 0.5:  # half the sessions open with chat
        later = kinds.index("chat")
        kinds[0], kinds[later] = kinds[later], kinds[0]
    turns: list[dict[str, Any]] = []
    for kind in kinds:
        if kind == "tool":
            question = QUESTIONS[rng.choice(TOOL_NAMES)](rng)
            turns.append({"kind": "tool", "user": question.text, "expected": question.call})
        elif kind == "copy":
            user, text = copy_request(rng, rng.choice(tuple(COPY_TEXTS)))
            turns.append({"kind": "copy", "user": user, "expected": text})
        else:
            pool = THANKS if turns and turns[-1]["kind"] == "tool" else GREETINGS + SMALL_TALK
            turns.append({"kind": "chat", "user": rng.choice(pool), "expected": None})
    tools = [TOOLS[name] for name in rng.sample(TOOL_NAMES, 3)]
    system = rng.choice(SYSTEM_PROMPTS)
    return {
        "task": "session",
        "style": f"result style {index % 5}",
        "system": system,
        "tools": tools,
        "turns": turns,
        "result_style": index,
        "expected": [turn["expected"] for turn in turns],
    }


def build(seed: int = SEED) -> list[Case]:
    """The whole set, the same for the same seed."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for i in range(90):
        cases.append(_tool_call_case(rng, TOOL_NAMES[i % 3]))
    for i in range(90):
        cases.append(_tool_result_case(rng, TOOL_NAMES[i % 3], i // 3))
    kinds = tuple(COPY_TEXTS)
    for i in range(80):
        cases.append(_copy_case(rng, kinds[i % len(kinds)]))
    for i in range(60):
        cases.append(_structured_case(rng, ("json_schema", "final_result", "named_tool")[i % 3]))
    for i in range(40):
        cases.append(_session_case(rng, i))
    return cases


# --------------------------------------------------------------------------- judging

NUMBER = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?")
MARKUP = ("<tool_call", "</tool_call", "<tool_response", "</tool_response", "<|im_", '{"name"')


def numbers(text: str) -> list[float]:
    """The numbers written in ``text``, signs included (a Unicode minus too)."""
    return [float(m.replace("−", "-")) for m in NUMBER.findall(text)]


def call_matches(expected: dict[str, Any], name: str, arguments: str) -> bool:
    """Whether a call is the expected one: same tool, and arguments that mean the same.

    Weather: the city (case aside) and the unit when one was asked for (absent or
    ``celsius`` otherwise). Conversion: the same value and unit codes. Calculator: an
    expression with an operator whose value (by the built-in calculator) is the expected
    expression's: arithmetic is the tool's, so a bare number is wrong.
    """
    if name != expected["name"]:
        return False
    try:
        args = json.loads(arguments)
    except ValueError:
        return False
    if not isinstance(args, dict):
        return False
    want = expected["arguments"]
    if name == "get_weather":
        city = args.get("city")
        unit = args.get("unit", "celsius")
        return (
            isinstance(city, str)
            and city.strip().casefold() == want["city"].casefold()
            and unit == want.get("unit", "celsius")
            and set(args) <= {"city", "unit"}
        )
    if name == "convert_units":
        value = args.get("value")
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isclose(value, want["value"], abs_tol=1e-9)
            and args.get("from_unit") == want["from_unit"]
            and args.get("to_unit") == want["to_unit"]
        )
    expression = args.get("expression")
    if not isinstance(expression, str) or not re.search(r"\d\s*[-+*/]\s*[\d(]", expression):
        return False
    try:
        got = run_tool("calculator", {"expression": expression})["result"]
    except ValueError:
        return False
    return bool(got == run_tool("calculator", want)["result"])


def _context_numbers(messages: Sequence[dict[str, Any]]) -> set[float]:
    found: set[float] = set()
    for message in messages:
        found.update(numbers(str(message.get("content") or "")))
        for call in message.get("tool_calls") or ():
            found.update(numbers(call["function"]["arguments"]))
    return found


def result_used(number: float, messages: Sequence[dict[str, Any]], reply: Reply) -> bool:
    """An answer states the tool's number (sign included) and no number not in the
    conversation, as text, not as another call."""
    if reply.calls or reply.finish_reason != "stop" or malformed(reply) is not None:
        return False
    said = numbers(reply.content)
    allowed = _context_numbers(messages)
    return number in said and all(n in allowed for n in said)


def _parsed_value(case: Case, reply: Reply) -> Any:
    style = case["style"]
    if style == "json_schema":
        if reply.calls:
            return None
        text = reply.content
    else:
        name = case["request"]["tools"][0]["function"]["name"]
        if len(reply.calls) != 1 or reply.calls[0][0] != name:
            return None
        text = reply.calls[0][1]
    try:
        return json.loads(text)
    except ValueError:
        return None


def check(case: Case, reply: Reply) -> dict[str, bool]:
    """The metrics of one single-turn case's reply; ``ok`` is the task's goal metric."""
    task, expected = case["task"], case["expected"]
    well_formed = malformed(reply) is None
    if task == "tool_call":
        one = len(reply.calls) == 1 and not reply.content.strip()
        ok = one and call_matches(expected, *reply.calls[0])
        return {
            "ok": ok,
            "one_call": one,
            "right_tool": one and reply.calls[0][0] == expected["name"],
        }
    if task == "tool_result":
        return {
            "ok": result_used(expected, case["request"]["messages"], reply),
            "text": well_formed and not reply.calls,
        }
    if task == "copy":
        return {"ok": not reply.calls and reply.content.strip() == expected, "text": well_formed}
    if task == "structured":
        value = _parsed_value(case, reply)
        schema = case["schema"]
        if case["style"] == "final_result":
            schema = case["request"]["tools"][0]["function"]["parameters"]
        is_valid = value is not None and valid(value, schema)
        # What the caller's model class keeps: the schema's fields (pydantic ignores others).
        fields = {k: v for k, v in value.items() if k in schema["properties"]} if is_valid else {}
        return {"ok": is_valid and _same(fields, expected), "valid": is_valid}
    raise ValueError(f"not a single-turn task: {task!r}")


def malformed(reply: Reply, offered: Sequence[str] = TOOL_NAMES) -> str | None:
    """Why a reply is malformed, or None: cut by the token limit, empty, tool-call markup
    left in the text, or a call to a tool not offered or with arguments it cannot run."""
    if reply.finish_reason == "length":
        return "cut at max_tokens"
    if not reply.calls and not reply.content.strip():
        return "empty"
    for mark in MARKUP:
        if mark in reply.content:
            return f"raw markup {mark!r} in the text"
    for name, arguments in reply.calls:
        if name not in offered:
            return f"call to {name!r}, not offered"
        try:
            args = json.loads(arguments)
        except ValueError:
            return "arguments are not JSON"
        if not isinstance(args, dict):
            return "arguments are not an object"
        if name in TOOLS:
            try:
                run_tool(name, args)
            except ValueError as exc:
                return f"the tool refuses its arguments: {exc}"
    return None


def check_turn(turn: dict[str, Any], replies: Sequence[Reply], result: float | None) -> bool:
    """Whether a finished session turn was answered right: a tool turn's first reply is the
    expected call and its last states ``result`` (the number of the tool's last result); a
    chat turn is one text reply; a copy turn is the exact text."""
    last = replies[-1]
    if turn["kind"] == "tool":
        first = replies[0]
        if len(first.calls) != 1 or not call_matches(turn["expected"], *first.calls[0]):
            return False
        return not last.calls and result is not None and result in numbers(last.content)
    if turn["kind"] == "copy":
        return len(replies) == 1 and not last.calls and last.content.strip() == turn["expected"]
    return len(replies) == 1 and not last.calls and bool(last.content.strip())


def session_result(
    case: Case, name: str, arguments: dict[str, Any], round_index: int
) -> tuple[str, float]:
    """The scripted result a session's ``round_index``-th tool call gets (in the session's
    own rotation of shapes and JSON styles), and the number an answer must state."""
    seed = f"{case['result_style']}:{round_index}"
    return tool_result(name, arguments, case["result_style"] + round_index, random.Random(seed))
