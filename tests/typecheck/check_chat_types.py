"""Checked by mypy --strict (pyproject's ``files``), never run: what ``chat()`` returns for each
``response_model``. A wrong overload fails the type check."""

from __future__ import annotations

import dataclasses
from typing import assert_type

import pydantic
from typing_extensions import TypedDict

from swiftclient import AsyncClient, ChatCompletion


class Weather(pydantic.BaseModel):
    city: str


class WeatherDict(TypedDict):
    city: str


@dataclasses.dataclass
class WeatherData:
    city: str


async def check_chat_return_types(client: AsyncClient) -> None:
    """Each call's result has the type its ``response_model`` names."""
    assert_type(await client.chat("hi"), ChatCompletion)
    assert_type(await client.chat("hi", response_model=None), ChatCompletion)
    assert_type(await client.chat("hi", response_model=Weather), Weather)
    assert_type(await client.chat("hi", response_model=WeatherDict), WeatherDict)
    assert_type(await client.chat("hi", response_model=WeatherData), WeatherData)
    assert_type(await client.chat("hi", response_model=list[Weather]), list[Weather])
    assert_type(
        await client.chat("hi", response_model=dict[str, WeatherData]), dict[str, WeatherData]
    )
