"""The small built-in text the embedded default model's tokenizer is trained on.

Written for this project. It mixes prose, chat-shaped text, code, JSON and a few lines in
other scripts so that the byte-level BPE learns merges for each kind of text. Changing it
changes the default model's tokenizer (and so its files and cache key).
"""

from __future__ import annotations

__all__ = ["CORPUS"]

CORPUS = r"""
The swiftclient library talks to chat models. An agent sends a list of messages, the model
answers with a message of its own, and the client measures how long the first token took and
how steady the stream was. When a provider is slow, the client can try a second one; when a
call runs out of time, it stops waiting and says so with a clear error.

This small model has random weights. It was never trained, so what it writes is noise: words
glued together, stray punctuation, numbers that mean nothing. It exists so that the whole
pipeline can run on a laptop with no network: the tokenizer, the chat template, the scheduler,
the cache of attention keys and values, the sampler and the streaming of text back to you.

A user asks: What is the weather like in Paris today?
The assistant answers: I cannot see the weather, but I can call a tool that can.
A user asks: Please add 17 and 25.
The assistant answers: 17 plus 25 is 42.
A user writes: Summarize this paragraph in one sentence.
The assistant writes: The paragraph says that small tests catch big mistakes early.

Good software is boring in the best way. It starts quickly, it fails loudly, it cleans up
after itself, and it tells you what went wrong. Tests should be small and fast, and each one
should be able to fail. Logs should never contain secrets. Timeouts should add up to one
deadline for the whole call, not one per step.

def add(a: int, b: int) -> int:
    '''Return the sum of two integers.'''
    return a + b


async def main() -> None:
    async with AsyncClient() as client:
        messages = [{"role": "user", "content": "Hi"}]
        reply = await client.chat(model="local/swift-tiny", messages=messages)
        print(reply.text)


for index, value in enumerate(values):
    if value is None:
        continue
    total += value * weights[index]

class Cache:
    def __init__(self, size: int) -> None:
        self.size = size
        self.items: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.items.get(key)

{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "add", "arguments": {"a": 17, "b": 25}}
{"name": "search", "arguments": {"query": "open source inference engines", "limit": 5}}
{"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
 "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
 "required": ["zone"]}}}
{"role": "tool", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}"}

Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 24 32 42 64 100 128 256 512 1000 1024 2048 4096 65536.
Dates and times: 2024-01-31, 12:30:45, Monday, Tuesday, Wednesday, Thursday, Friday.
Punctuation: a, b; c: d. e! f? (g) [h] {i} <j> "k" 'l' `m` -n- _o_ /p/ \q\ |r| ~s~
More: @t #u $v %w ^x &y *z

Le modèle répond en français quand on lui parle en français, du moins en principe.
Das kleine Modell hat zufällige Gewichte und schreibt deshalb nur Unsinn.
El modelo pequeño existe para probar el camino completo sin conexión.
Маленькая модель нужна только для проверки всего конвейера.
小さなモデルはテストのためだけにあります。
这个小模型只用于离线测试整个流程。
작은 모델은 파이프라인을 시험하기 위한 것입니다.
Το μικρό μοντέλο υπάρχει μόνο για δοκιμές.
Emoji and symbols: ✓ ✗ → ← ★ ☕ 🚀 🙂 🧪 € £ ¥ ° ± × ÷ ≤ ≥ ∞ π Σ.

Every request carries a deadline. The deadline covers connecting, waiting for the first token,
reading the stream and any retries. If a retry would start after the deadline, it does not
start at all. A stream that stalls for too long is cut, and the error names the stall.

The engine keeps a pool of blocks for the attention cache. A request that shares a prefix with
an earlier one reuses those blocks, so a long system prompt is computed once and read many
times. When the pool runs low, the scheduler waits before admitting new work, and when a
request is cancelled, its blocks go back to the pool at once.
"""
