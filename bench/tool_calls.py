"""Tool calls through the gateway on a model whose chat template has no tool-call format (DESIGN.md §4, the
`constrained` strategy): hand-written function-calling cases in three kinds, sent as an OpenAI client sends them.

    .venv/bin/python -m bench.tool_calls [--concurrency 2] [--max-tokens 100] [--show-misses]

- single: one tool is offered and the request needs it; right when the reply calls it with every required argument.
- multiple: 3 to 8 tools are offered, one fits; right when the reply calls that one with its required arguments.
- none: 1 to 5 tools are offered and none fits (small talk, writing, knowledge); right when the reply is text.

Each row also counts the calls made, the calls cut short (a reply whose text is a call's JSON that max_tokens cut,
as the one-step reply passed it on) and the share of calls that are parseable (JSON object arguments) among both.
Targets (issue 32): parseable ≥ 99%, none ≥ 0.6 while single stays ≥ 0.65. Run against a running instance
(`make run`): a `bench-tools-…` deployment of the SmolLM2 preset is made for the run and deleted after it; or name
`--gateway URL --key KEY --model NAME` to measure any OpenAI-compatible endpoint as it is.
"""

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass

import httpx


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def _text(description: str) -> dict:
    return {"type": "string", "description": description}


def _number(description: str) -> dict:
    return {"type": "number", "description": description}


TOOLS = {tool["function"]["name"]: tool for tool in (
    _tool("get_weather", "Get the current weather and the forecast for a city.",
          {"city": _text("City name"), "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _tool("send_email", "Send an email message to a recipient.",
          {"to": _text("Recipient's email address"), "subject": _text("Subject line"), "body": _text("Message")},
          ["to", "subject", "body"]),
    _tool("convert_currency", "Convert an amount of money from one currency to another at today's rate.",
          {"amount": _number("Amount to convert"), "from_currency": _text("ISO code, e.g. USD"),
           "to_currency": _text("ISO code, e.g. EUR")}, ["amount", "from_currency", "to_currency"]),
    _tool("book_restaurant", "Reserve a table at a restaurant.",
          {"restaurant": _text("Restaurant name or cuisine"), "party_size": {"type": "integer"},
           "time": _text("Date and time of the booking")}, ["restaurant", "party_size", "time"]),
    _tool("set_reminder", "Set a reminder that alerts the user at a given time.",
          {"text": _text("What to be reminded of"), "time": _text("When")}, ["text", "time"]),
    _tool("search_flights", "Search for flights between two airports or cities on a date.",
          {"origin": _text("Departure city"), "destination": _text("Arrival city"), "date": _text("Travel date")},
          ["origin", "destination", "date"]),
    _tool("translate_text", "Translate a text into another language.",
          {"text": _text("Text to translate"), "target_language": _text("Language to translate into")},
          ["text", "target_language"]),
    _tool("get_stock_price", "Get the latest share price of a company listed on a stock exchange.",
          {"symbol": _text("Ticker symbol, e.g. AAPL")}, ["symbol"]),
    _tool("create_calendar_event", "Add an event or meeting to the user's calendar.",
          {"title": _text("Event title"), "start": _text("Start date and time"),
           "duration_minutes": {"type": "integer"}}, ["title", "start"]),
    _tool("play_music", "Play a song, an album, an artist or a playlist on the user's speaker.",
          {"query": _text("What to play")}, ["query"]),
    _tool("calculate_tip", "Work out the tip and the total for a restaurant bill.",
          {"bill_amount": _number("Bill before the tip"), "percent": _number("Tip percentage")},
          ["bill_amount", "percent"]),
    _tool("get_directions", "Get directions and travel time from one place to another.",
          {"origin": _text("Start"), "destination": _text("End"),
           "mode": {"type": "string", "enum": ["driving", "walking", "transit", "cycling"]}},
          ["origin", "destination"]),
    _tool("search_recipes", "Find cooking recipes that use the given ingredients.",
          {"ingredients": {"type": "array", "items": {"type": "string"}}, "diet": _text("e.g. vegetarian")},
          ["ingredients"]),
    _tool("track_package", "Track a parcel shipment by its tracking number.",
          {"tracking_number": _text("Carrier tracking number")}, ["tracking_number"]),
    _tool("get_news", "Get the latest news headlines on a topic.", {"topic": _text("News topic")}, ["topic"]),
    _tool("control_lights", "Turn the smart lights in a room on or off, or dim them.",
          {"room": _text("Room name"), "state": {"type": "string", "enum": ["on", "off"]},
           "brightness": {"type": "integer", "minimum": 0, "maximum": 100}}, ["room", "state"]),
    _tool("order_taxi", "Order a taxi to pick the user up and drive to a destination.",
          {"pickup": _text("Pickup address"), "destination": _text("Drop-off address")}, ["pickup", "destination"]),
    _tool("create_note", "Save a note with a title and its text in the user's notebook.",
          {"title": _text("Note title"), "content": _text("Note text")}, ["title", "content"]),
)}

# (the request, the tool that fits it): in the user's words, never the function's name.
NEEDS_A_TOOL = [
    ("Is it going to rain in Oslo today?", "get_weather"),
    ("How hot is it in Cairo right now, in fahrenheit?", "get_weather"),
    ("Do I need a coat in Toronto this afternoon?", "get_weather"),
    ("What's the temperature like in Lisbon?", "get_weather"),
    ("Write to anna@example.com that the meeting moved to Friday, subject 'Meeting'.", "send_email"),
    ("Email my landlord at landlord@flats.org saying the heating is broken.", "send_email"),
    ("Let bob@corp.com know by mail that the report is ready.", "send_email"),
    ("How many euros do I get for 250 US dollars?", "convert_currency"),
    ("What is 1000 yen worth in British pounds?", "convert_currency"),
    ("Change 80 Swiss francs into dollars for me.", "convert_currency"),
    ("Get us a table for four at Luigi's tonight at 8.", "book_restaurant"),
    ("I'd like to reserve dinner for two at a sushi place on Saturday at 7pm.", "book_restaurant"),
    ("Can you book a table for six people at The Green Fork tomorrow at noon?", "book_restaurant"),
    ("Remind me to call my mother at 6pm.", "set_reminder"),
    ("Don't let me forget to water the plants tomorrow morning.", "set_reminder"),
    ("Ping me at 3 o'clock to take my medicine.", "set_reminder"),
    ("Find me a flight from Berlin to Madrid on June 3rd.", "search_flights"),
    ("Are there any planes from New York to Chicago next Monday?", "search_flights"),
    ("I need to fly from Paris to Tokyo on the 12th of May.", "search_flights"),
    ("How do you say 'where is the train station' in German?", "translate_text"),
    ("Put 'thank you for your help' into Spanish.", "translate_text"),
    ("Render this sentence in French: the cat sleeps on the sofa.", "translate_text"),
    ("How much is one Apple share trading at?", "get_stock_price"),
    ("What's Tesla's stock doing today?", "get_stock_price"),
    ("Check the current price of MSFT.", "get_stock_price"),
    ("Put a dentist appointment in my calendar for Tuesday at 10am.", "create_calendar_event"),
    ("Schedule a one-hour team sync on Thursday at 2pm.", "create_calendar_event"),
    ("Add my sister's birthday party on March 14 at 5pm to my agenda.", "create_calendar_event"),
    ("Put on some jazz.", "play_music"),
    ("I want to hear Bohemian Rhapsody by Queen.", "play_music"),
    ("Start my workout playlist on the speaker.", "play_music"),
    ("Our bill is 84 dollars, how much should I leave at 15 percent?", "calculate_tip"),
    ("What's a 20% gratuity on a 56 euro dinner?", "calculate_tip"),
    ("How do I walk from the Louvre to the Eiffel Tower?", "get_directions"),
    ("What's the fastest route by car from Boston to New Haven?", "get_directions"),
    ("Show me how to get to the central station by public transport from the airport.", "get_directions"),
    ("What can I cook with eggs, spinach and cheese?", "search_recipes"),
    ("Give me a vegetarian dish using chickpeas and tomatoes.", "search_recipes"),
    ("Where is my parcel 1Z999AA10123456784?", "track_package"),
    ("Has the shipment with number JD014600003828 been delivered yet?", "track_package"),
    ("What are today's headlines about climate change?", "get_news"),
    ("Anything new in the world of football today?", "get_news"),
    ("Switch off the kitchen lights.", "control_lights"),
    ("Turn the bedroom lamp on at half brightness.", "control_lights"),
    ("I need a cab from 12 Baker Street to Heathrow airport.", "order_taxi"),
    ("Send a car to pick me up at the hotel Astoria and take me to the opera.", "order_taxi"),
    ("Jot down my shopping list: milk, bread, apples, call it Groceries.", "create_note"),
    ("Save the idea 'a bike-sharing app for students' under the title App ideas.", "create_note"),
    ("Write down that the wifi password is sunflower42, title it Wifi.", "create_note"),
    ("Will it snow in Denver this weekend?", "get_weather"),
]

# Requests that none of TOOLS can serve.
NO_TOOL_FITS = [
    "Tell me a joke about penguins.",
    "Write a haiku about autumn leaves.",
    "Who painted the Mona Lisa?",
    "Explain in one sentence what photosynthesis is.",
    "What is the square root of 144?",
    "Give me three tips for a good night's sleep.",
    "What's the difference between a virus and a bacterium?",
    "Summarise the plot of Romeo and Juliet in two lines.",
    "Hi! How are you today?",
    "Why is the sky blue?",
    "Suggest a name for my new puppy.",
    "What year did the Second World War end?",
    "Write a short limerick about a cat.",
    "How many legs does a spider have?",
    "What does a CPU do in a computer?",
    "Give me a motivational quote for Monday.",
    "Which planet is the largest in the solar system?",
    "Explain recursion to a ten-year-old.",
    "What is the boiling point of water at sea level?",
    "Can you recommend a good classic novel?",
    "How do I apologise to a friend I upset?",
    "What's 17 times 23?",
    "Write a two-line poem about the ocean.",
    "Who was the first person to walk on the moon?",
    "What are the primary colours?",
    "Thanks, that's all for now!",
    "Describe a sunset in three words.",
    "What's the chemical symbol for gold?",
    "Give me an idea for a fun weekend hobby.",
    "Is a tomato a fruit or a vegetable?",
    "Tell me a fun fact about octopuses.",
    "How do I politely decline an invitation?",
    "What is the capital of Australia?",
    "Write an opening line for a mystery story.",
    "Explain what a prime number is.",
    "What's a good way to start learning to draw?",
    "Who wrote Pride and Prejudice?",
    "Compose a riddle about time.",
    "How many continents are there?",
    "What is the meaning of life, in your opinion?",
    "Give me a synonym-free compliment for a colleague.",
    "What's the tallest mountain in Africa?",
    "Explain how a rainbow forms.",
    "Write a thank-you message for a birthday gift.",
    "Which is heavier, a kilo of feathers or a kilo of iron?",
    "What are three benefits of regular exercise?",
    "Good morning!",
    "How does a bicycle stay upright?",
    "List three famous composers of classical music.",
    "What's the plural of 'mouse'?",
]


@dataclass
class Case:
    kind: str
    prompt: str
    tools: list[str]
    expected: str | None


def cases(seed: int = 32) -> list[Case]:
    """The three kinds, with the same distractors on every run: a multiple case offers 2 to 7 other tools beside
    the right one, shuffled; a none case offers 1 to 5 tools drawn at random."""
    rng = random.Random(seed)
    names = list(TOOLS)
    made = [Case("single", prompt, [tool], tool) for prompt, tool in NEEDS_A_TOOL]
    for prompt, tool in NEEDS_A_TOOL:
        offered = [tool, *rng.sample([name for name in names if name != tool], rng.randint(2, 7))]
        rng.shuffle(offered)
        made.append(Case("multiple", prompt, offered, tool))
    made += [Case("none", prompt, rng.sample(names, rng.randint(1, 5)), None) for prompt in NO_TOOL_FITS]
    return made


@dataclass
class Outcome:
    case: Case
    seconds: float
    call: dict | None = None
    parseable: bool = False
    content: str | None = None
    error: str = ""

    @property
    def cut_call(self) -> bool:
        """A call's JSON, cut short, passed on as text."""
        text = (self.content or "").lstrip()
        return text.startswith("{") and '"name"' in text

    @property
    def right(self) -> bool:
        if self.error:
            return False
        if self.case.expected is None:
            return self.call is None and bool((self.content or "").strip())
        if not self.parseable or self.call["name"] != self.case.expected:
            return False
        required = TOOLS[self.case.expected]["function"]["parameters"]["required"]
        return all(self.call["arguments"].get(name) not in (None, "", []) for name in required)


async def ask(client: httpx.AsyncClient, *, url: str, key: str, model: str, case: Case, max_tokens: int) -> Outcome:
    body = {"model": model, "messages": [{"role": "user", "content": case.prompt}], "temperature": 0,
            "max_tokens": max_tokens, "tools": [TOOLS[name] for name in case.tools]}
    started = time.perf_counter()
    try:
        response = await client.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    except httpx.HTTPError as exc:
        return Outcome(case, time.perf_counter() - started, error=f"{exc.__class__.__name__}: {exc}")
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        return Outcome(case, seconds, error=f"HTTP {response.status_code}: {response.text[:200]}")
    message = response.json()["choices"][0]["message"]
    if not message.get("tool_calls"):
        return Outcome(case, seconds, content=message.get("content"))
    function = message["tool_calls"][0]["function"]
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        arguments = None
    return Outcome(case, seconds, call={"name": function["name"], "arguments": arguments or {}},
                   parseable=isinstance(arguments, dict))


async def run_all(*, url: str, key: str, model: str, chosen: list[Case], concurrency: int,
                  max_tokens: int) -> list[Outcome]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0)) as client:
        async def one(case: Case) -> Outcome:
            async with gate:
                return await ask(client, url=url, key=key, model=model, case=case, max_tokens=max_tokens)

        return await asyncio.gather(*(one(case) for case in chosen))


def print_table(outcomes: list[Outcome]) -> None:
    print(f"{'kind':<9}{'cases':>6}{'right':>8}{'calls':>7}{'cut calls':>11}{'parseable':>11}{'errors':>8}"
          f"{'p50 s':>8}")
    for kind in ("single", "multiple", "none"):
        rows = [outcome for outcome in outcomes if outcome.case.kind == kind]
        if not rows:
            continue
        right = sum(outcome.right for outcome in rows) / len(rows)
        calls = sum(outcome.call is not None for outcome in rows)
        cut = sum(outcome.cut_call for outcome in rows)
        parseable = f"{sum(outcome.parseable for outcome in rows) / (calls + cut):.2f}" if calls + cut else "-"
        errors = sum(bool(outcome.error) for outcome in rows)
        p50 = statistics.median(outcome.seconds for outcome in rows)
        print(f"{kind:<9}{len(rows):>6}{right:>8.2f}{calls:>7}{cut:>11}{parseable:>11}{errors:>8}{p50:>8.2f}")


def print_misses(outcomes: list[Outcome]) -> None:
    for outcome in outcomes:
        if not outcome.right:
            got = outcome.error or (json.dumps(outcome.call) if outcome.call else f"text: {outcome.content!r:.80}")
            print(f"  [{outcome.case.kind}] {outcome.case.prompt!r} expected {outcome.case.expected} "
                  f"(offered {', '.join(outcome.case.tools)}); got {got}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--kinds", default="single,multiple,none")
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument("--gateway", help="an OpenAI-compatible /v1 URL to measure as it is (with --key, --model)")
    parser.add_argument("--key", default="")
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    chosen = [case for case in cases() if case.kind in args.kinds.split(",")]

    def measure(url: str, key: str, model: str) -> None:
        started = time.perf_counter()
        outcomes = asyncio.run(run_all(url=url, key=key, model=model, chosen=chosen, concurrency=args.concurrency,
                                       max_tokens=args.max_tokens))
        print(f"{len(outcomes)} requests in {time.perf_counter() - started:.0f} s (max_tokens {args.max_tokens}, "
              f"temperature 0, concurrency {args.concurrency})")
        print_table(outcomes)
        if args.show_misses:
            print_misses(outcomes)

    if args.gateway:
        print(f"== Tool calls through {args.gateway}, model {args.model}")
        measure(args.gateway.rstrip("/"), args.key, args.model)
        return
    # Sets Django up on the running instance's settings: only this path needs it.
    from bench.helpers.running_instance import GATEWAY_URL, PRESET_MODEL, bench_deployment, print_header

    print_header("Tool calls through the gateway", f"{PRESET_MODEL}, constrained tool strategy, "
                                                   f"{len(chosen)} hand-written cases")
    with bench_deployment(label="tools", weights=[1.0], threads=2) as deployment:
        print(deployment.describe(), f"tool strategy: {deployment.deployment.tool_strategy}")
        measure(GATEWAY_URL, deployment.api_key, deployment.name)


if __name__ == "__main__":
    main()
