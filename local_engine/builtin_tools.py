"""The three tools the embedded default model was trained to call, with runnable stand-ins.

:data:`TOOLS` holds their OpenAI tool definitions (offer them as ``tools=`` exactly as they
are: the model's tokenizer knows each definition as a whole, and the model has seen no
other); :func:`run_tool` runs one call locally. ``get_weather`` is a deterministic stand-in
(the weather is derived from a hash of the city name), ``convert_units`` converts between
length, mass, volume and temperature units, and ``calculator`` evaluates ``+ - * /``
arithmetic without ``eval``. ``make demo`` (examples/stream_chat.py) runs them in an agent
loop; ``scripts/default_model_data.py`` uses them to make the training data.
"""

from __future__ import annotations

import ast
import hashlib
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["TOOLS", "UNITS", "run_tool"]

#: The OpenAI tool definitions, by name.
TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    "convert_units": {
        "type": "function",
        "function": {
            "name": "convert_units",
            "description": "Convert a value from one unit to another.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from_unit": {"type": "string"},
                    "to_unit": {"type": "string"},
                },
                "required": ["value", "from_unit", "to_unit"],
            },
        },
    },
    "calculator": {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
}

#: Unit codes ``convert_units`` accepts: code -> (factor to the base unit, base).
#: Temperatures (``c``, ``f``) convert by formula.
UNITS: dict[str, tuple[float, str]] = {
    "km": (1000.0, "m"),
    "mi": (1609.344, "m"),
    "m": (1.0, "m"),
    "ft": (0.3048, "m"),
    "cm": (0.01, "m"),
    "in": (0.0254, "m"),
    "kg": (1.0, "kg"),
    "lb": (0.45359237, "kg"),
    "g": (0.001, "kg"),
    "oz": (0.028349523125, "kg"),
    "l": (1.0, "l"),
    "gal": (3.785411784, "l"),
    "c": (1.0, "temp"),
    "f": (1.0, "temp"),
}
_SKIES = ("clear", "sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "partly cloudy")
_OPS: dict[type[ast.operator], Callable[[Any, Any], int | float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
#: Results past this size are refused: a float would be infinite, an int too long to print.
_LIMIT = 10**300


def _finite(value: int | float) -> int | float:
    """``value``, or ValueError when it is not finite or beyond :data:`_LIMIT`."""
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) >= _LIMIT:
        raise ValueError("the result is out of range")
    return value


def _number(value: int | float) -> int | float:
    """A float rounded to 2 places, as an int when it is whole; an int as it is."""
    if isinstance(value, int):
        return value
    rounded = round(_finite(value), 2)
    return int(rounded) if rounded == int(rounded) else rounded


def _convert(value: float, from_unit: str, to_unit: str) -> float:
    if from_unit not in UNITS or to_unit not in UNITS:
        raise ValueError(f"unknown unit {from_unit!r} or {to_unit!r}; known: {sorted(UNITS)}")
    factor_from, base_from = UNITS[from_unit]
    factor_to, base_to = UNITS[to_unit]
    if base_from != base_to:
        raise ValueError(f"cannot convert {from_unit} to {to_unit}")
    if base_from == "temp":
        if from_unit == to_unit:
            return value
        return value * 9 / 5 + 32 if from_unit == "c" else (value - 32) * 5 / 9
    return value * factor_from / factor_to


def _evaluate(node: ast.AST) -> int | float:
    """The value of an arithmetic expression: whole numbers stay exact under ``+ - *``
    (``123456789 * 987654321`` is not rounded to a float's 53 bits), ``/`` and decimals
    compute in floats."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _finite(value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        return _finite(_OPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("only numbers and + - * / are allowed")


def _weather(city: str, unit: str) -> dict[str, Any]:
    digest = hashlib.sha256(city.strip().lower().encode()).digest()
    celsius = (digest[0] % 45) - 10 + (digest[1] % 10) / 10
    temperature = celsius if unit == "celsius" else celsius * 9 / 5 + 32
    return {
        "city": city,
        "temperature": _number(temperature),
        "unit": unit,
        "conditions": _SKIES[digest[2] % len(_SKIES)],
    }


def run_tool(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Run one of :data:`TOOLS` and return its JSON-ready result.

    Raises:
        ValueError: an unknown tool, or arguments it cannot use.
    """
    if name == "get_weather":
        city, unit = arguments.get("city"), arguments.get("unit", "celsius")
        if not isinstance(city, str) or unit not in ("celsius", "fahrenheit"):
            raise ValueError("get_weather needs a city and a unit of celsius or fahrenheit")
        return _weather(city, unit)
    if name == "convert_units":
        value, src, dst = (
            arguments.get("value"),
            arguments.get("from_unit"),
            arguments.get("to_unit"),
        )
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not isinstance(src, str)
            or not isinstance(dst, str)
        ):
            raise ValueError("convert_units needs a number value, from_unit and to_unit")
        if not math.isfinite(value) or abs(value) >= _LIMIT:
            raise ValueError(f"convert_units needs a finite value under 1e300, got {value!r}")
        result = _number(_convert(float(value), src, dst))
        return {"value": value, "from_unit": src, "to_unit": dst, "result": result}
    if name == "calculator":
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ValueError("calculator needs an expression string")
        try:
            result = _evaluate(ast.parse(expression, mode="eval"))
        except (SyntaxError, ZeroDivisionError, RecursionError, OverflowError) as exc:
            shown = expression if len(expression) <= 80 else expression[:77] + "..."
            raise ValueError(f"cannot evaluate {shown!r}: {exc}") from exc
        return {"expression": expression, "result": _number(result)}
    raise ValueError(f"unknown tool {name!r}; known: {sorted(TOOLS)}")
