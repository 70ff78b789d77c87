"""A corpus of valid agent code, as models write it in code mode, for the checks' false
positives (issue 25): every snippet runs in the REPL against the tools of
``tests/test_quick_check.py`` (``add``, ``search``, ``log``, ``close``), with the names
``KNOWN`` bound by earlier runs. None may get a diagnostic.
"""

from __future__ import annotations

KNOWN = ("notes", "totals", "seen", "client_name", "report")
"""Names earlier runs of the session bound."""

CORPUS: dict[str, str] = {
    "sum_two": "await add(2, 3)\n",
    "sum_loop": "total = 0\nfor n in range(5):\n    total = await add(total, n)\ntotal\n",
    "search_and_count": "hits = await search('invoice overdue', limit=20)\nlen(hits)\n",
    "search_filter": (
        "hits = await search('error', tags=['prod'])\n[h for h in hits if 'timeout' in h]\n"
    ),
    "gather_many": (
        "import asyncio\n"
        "queries = ['a', 'b', 'c']\n"
        "results = await asyncio.gather(*[search(q) for q in queries])\n"
        "dict(zip(queries, results))\n"
    ),
    "gather_pairs": (
        "import asyncio\n"
        "pairs = [(1, 2), (3, 4)]\n"
        "sums = await asyncio.gather(*(add(a, b) for a, b in pairs))\n"
        "sum(sums)\n"
    ),
    "task_then_await": (
        "import asyncio\n"
        "t1 = asyncio.create_task(search('x'))\n"
        "t2 = asyncio.create_task(search('y'))\n"
        "a, b = await t1, await t2\n"
        "a + b\n"
    ),
    "earlier_names": "notes.append(await search('todo'))\nlen(notes)\n",
    "update_totals": "totals['q1'] = await add(totals.get('q1', 0), 100)\ntotals\n",
    "dedupe": (
        "for hit in await search('dupes'):\n    if hit not in seen:\n        seen.add(hit)\nseen\n"
    ),
    "fstring_report": (
        "count = len(await search(client_name))\n"
        "report = f'{client_name}: {count} matches'\n"
        "print(report)\n"
    ),
    "helper_function": (
        "async def count_for(term):\n"
        "    return len(await search(term))\n"
        "\n"
        "{t: await count_for(t) for t in ['a', 'b']}\n"
    ),
    "retry_on_error": (
        "for attempt in range(3):\n"
        "    try:\n"
        "        value = await add(1, attempt)\n"
        "        break\n"
        "    except ToolError as exc:\n"
        "        print('retrying', exc)\n"
        "value\n"
    ),
    "denied": (
        "try:\n"
        "    await close('T-1', reason='fixed')\n"
        "except NotApproved as exc:\n"
        "    print('not approved:', exc)\n"
    ),
    "logging_splat": (
        "lines = ['start', 'middle', 'end']\nfields = {'run': '7'}\nawait log(*lines, **fields)\n"
    ),
    "keyword_only": "await search(query='q', limit=3)\n",
    "positional_only": "await close('T-9')\n",
    "sort_results": "sorted(await search('z'), key=lambda s: (len(s), s))\n",
    "json_out": "import json\nprint(json.dumps({'hits': await search('k')}, indent=2))\n",
    "walrus": "if (hits := await search('urgent')):\n    print(hits[0])\n",
    "match_case": (
        "match await add(1, 1):\n"
        "    case 2:\n"
        "        msg = 'ok'\n"
        "    case n:\n"
        "        msg = f'odd {n}'\n"
        "msg\n"
    ),
    "comprehension_nested": "[[await add(i, j) for j in range(2)] for i in range(2)]\n",
    "dataclass": (
        "from dataclasses import dataclass\n"
        "\n"
        "@dataclass\n"
        "class Row:\n"
        "    name: str\n"
        "    hits: int\n"
        "\n"
        "rows = [Row(q, len(await search(q))) for q in ['a', 'b']]\n"
        "rows\n"
    ),
    "class_method": (
        "class Counter:\n"
        "    def __init__(self):\n"
        "        self.n = 0\n"
        "\n"
        "    async def bump(self):\n"
        "        self.n = await add(self.n, 1)\n"
        "        return self.n\n"
        "\n"
        "c = Counter()\n"
        "await c.bump()\n"
    ),
    "with_statement": (
        "import contextlib\nwith contextlib.suppress(ToolError):\n    await add(1, 2)\n"
    ),
    "async_with_timeout": (
        "import asyncio\nresult = await asyncio.wait_for(search('slow'), timeout=5)\nresult\n"
    ),
    "global_in_function": (
        "counter = 0\ndef bump():\n    global counter\n    counter += 1\nbump()\ncounter\n"
    ),
    "nonlocal_closure": (
        "def make():\n"
        "    n = 0\n"
        "    def inc():\n"
        "        nonlocal n\n"
        "        n += 1\n"
        "        return n\n"
        "    return inc\n"
        "inc = make()\n"
        "inc()\n"
    ),
    "generator_helper": (
        "def chunks(items, size):\n"
        "    for i in range(0, len(items), size):\n"
        "        yield items[i:i + size]\n"
        "\n"
        "[len(c) for c in chunks(await search('all'), 2)]\n"
    ),
    "tools_path": "await tools.desk.add(1, 2)\n",
    "tools_path_keywords": "await tools.desk.search('q', limit=1)\n",
    "coroutine_list": (
        "import asyncio\ncoros = [add(i, i) for i in range(3)]\nawait asyncio.gather(*coros)\n"
    ),
    "pending_then_awaited": "pending = search('later')\nprint('working')\nawait pending\n",
    "print_builtin": "print('plain', await add(1, 2), sep=' | ')\n",
    "exception_group": (
        "try:\n"
        "    await close('T-2')\n"
        "except* ToolError as group:\n"
        "    print(len(group.exceptions))\n"
    ),
    "del_name": "tmp = await add(1, 2)\ndel tmp\n",
    "star_unpack": "first, *rest = await search('many')\nfirst\n",
    "lambda_default": "f = lambda x, y=2: x * y\nf(await add(1, 1))\n",
    "type_hints": "values: list[int] = [await add(1, 2)]\nvalues\n",
    # Declarations on demand (code mode's ``toolhost`` helpers).
    "find_a_tool": (
        "hits = await toolhost.search('close a ticket', limit=3)\n[h['name'] for h in hits]\n"
    ),
    "read_a_declaration": "print(await toolhost.declaration('close'))\n",
}
