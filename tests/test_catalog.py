"""Declarations on demand: search, one tool's or file's declarations, the index.

The catalog over a real scope (one pyright run for the module), a synthetic scope of a
thousand tools for the index's size, code mode's ``toolhost.search`` and
``toolhost.declaration`` in a real Wasm sandbox (checked quickly and by pyright), and
``serve --expose code`` through the official MCP client, in memory and over stdio.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from host import Host
from host.declare import Catalog, Scope, discover, helper_call, load_or_build_scope
from host.declare._model import ParamDecl, ToolDecl
from host.errors import InvalidArguments
from host.serve import READ_DECLARATION, RUN_CODE, SEARCH_TOOLS, McpServer
from host.serve._tools import MODEL_BUDGET, listing

from .conftest import ROOT
from .mcp_helpers import connect
from .test_wasm import wasm_prepared

__all__ = ["wasm_prepared"]

TOOLS = {
    "billing": '''
        from typing import Literal, TypedDict

        Currency = Literal["EUR", "USD"]


        class Money(TypedDict):
            amount: int
            currency: Currency


        class Refund(TypedDict):
            id: str
            paid_back: Money


        class Unused(TypedDict):
            x: int


        async def create_refund(payment_id: str, amount: Money) -> Refund:
            """Give a customer their money back for a payment.

            Args:
                payment_id: The payment to pay back.
                amount: How much.
            """
            return {"id": "r1", "paid_back": amount}


        def delete_invoice(invoice_id: str) -> bool:
            """Delete an invoice for good.

            Args:
                invoice_id: The invoice to delete.

            Raises:
                KeyError: when there is no such invoice.

            Returns:
                Whether it was there.
            """
            return True


        def list_invoices(limit: int = 50) -> list[str]:
            """Every invoice, newest first."""
            return []


        def keep(x: Unused) -> Unused:
            """Keep a thing."""
            return x
    ''',
    "board": '''
        class Board:
            def add(self, item: str) -> int:
                """Put an item on the board."""
                return 1


        board = Board()
    ''',
    "odd": '''
        def print(text: str) -> str:
            """Print a label on the label printer."""
            return text


        def toolhost(x: int) -> int:
            """A tool that happens to share the helpers' name."""
            return x
    ''',
}

POLICY = """
version = 1
[defaults]
agent = "allow"
[limits]
code_max_calls = 5
"""


def _write(root: Path) -> Path:
    tools = root / "tools"
    tools.mkdir(parents=True)
    for name, source in TOOLS.items():
        (tools / f"{name}.py").write_text(textwrap.dedent(source))
    (root / "policy.toml").write_text(POLICY)
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("catalog") / "project")


@pytest.fixture(scope="module")
def scope(project: Path) -> Scope:
    return load_or_build_scope(discover(project / "tools"))


def names(hits: list[dict[str, str]]) -> list[str]:
    return [h["name"] for h in hits]


# -- search ----------------------------------------------------------------------------------


def test_search_ranks_by_words_forms_and_verbs(scope: Scope) -> None:
    assert names(scope.search("give the customer money back"))[0] == "create_refund"
    assert names(scope.search("refunding"))[0] == "create_refund"  # a word form
    assert names(scope.search("remove an invoice"))[0] == "delete_invoice"  # remove: delete
    assert names(scope.search("show all invoices"))[:2] == ["list_invoices", "delete_invoice"]
    assert names(scope.search("keep", limit=1)) == ["keep"]
    # A tool's exact name comes first, whatever else matches.
    assert names(scope.search("list_invoices"))[0] == "list_invoices"
    assert names(scope.search("nothing matches zebra")) == []


def test_search_hits_say_how_to_call(scope: Scope) -> None:
    (refund,) = scope.search("money back", limit=1)
    assert refund == {
        "name": "create_refund",
        "declaration": "async def create_refund(payment_id: str, amount: Money) -> Refund",
        "summary": "Give a customer their money back for a payment.",
    }
    (label,) = scope.search("label printer", limit=1)  # shadows a builtin: not a global
    assert label["name"] == "tools.odd.print"
    assert label["declaration"] == "async def tools.odd.print(text: str) -> str"
    (method,) = scope.search("put an item on the board", limit=1)
    assert method["name"] == "board.add"
    assert method["declaration"] == "async def board.add(item: str) -> int"


@pytest.mark.parametrize(
    ("query", "limit"),
    [("", 5), ("   ", 5), ("x" * 1001, 5), (5, 5), ("refund", 0), ("refund", 51), ("a", "3")],
)
def test_search_refuses_bad_arguments(scope: Scope, query: Any, limit: Any) -> None:
    with pytest.raises(InvalidArguments):
        scope.search(query, limit)


# -- declarations ----------------------------------------------------------------------------


def test_a_tools_declaration_holds_the_types_it_uses_and_nothing_else(scope: Scope) -> None:
    text = scope.declaration("create_refund")
    ast.parse(text)  # valid Python, as the model block is
    assert "async def create_refund(payment_id: str, amount: Money) -> Refund:" in text
    assert "money back" in text and "payment_id: The payment to pay back." in text
    order = [text.index(s) for s in ("Currency =", "class Money", "class Refund", "async def")]
    assert order == sorted(order)  # types before use, in dependency order
    for absent in ("Unused", "delete_invoice", "# Every tool call must be awaited"):
        assert absent not in text
    assert scope.declaration("tools.billing.create_refund") == text


def test_declarations_of_files_methods_and_hidden_exports(scope: Scope) -> None:
    billing = scope.declaration("billing")
    assert scope.declaration("tools.billing") == billing
    for name in ("create_refund", "delete_invoice", "list_invoices", "keep", "class Unused"):
        assert name in billing
    assert "class board:" in scope.declaration("board.add")
    assert "class tools:" in scope.declaration("tools.odd.print")
    # An export called ``toolhost`` is a tool, but never the helpers' global.
    hidden = scope.tool("tools.odd.toolhost")
    assert not hidden.installed
    assert "async def toolhost(x: int) -> int" in scope.declaration("tools.odd.toolhost")


def test_an_unknown_name_names_the_nearest_tools(scope: Scope) -> None:
    with pytest.raises(InvalidArguments, match=r"nearest tools: create_refund"):
        scope.declaration("refunds")
    with pytest.raises(InvalidArguments, match="no tool or tool file is called 'zebra'"):
        scope.declaration("zebra")
    for bad in ("", "x" * 1001, 3):
        with pytest.raises(InvalidArguments):
            scope.declaration(bad)  # pyright: ignore[reportArgumentType]


def test_helper_calls_bind_like_the_stub(scope: Scope) -> None:
    catalog = scope.catalog
    assert helper_call(catalog, "toolhost.search", ["refund", 1], {}) == scope.search("refund", 1)
    assert names(helper_call(catalog, "toolhost.search", [], {"query": "refund", "limit": 1})) == [
        "create_refund"
    ]
    assert "class Refund" in helper_call(catalog, "toolhost.declaration", [], {"name": "billing"})
    for args, kwargs in (
        ([], {}),
        (["a", 1, 2], {}),
        (["a"], {"query": "b"}),
        (["a"], {"other": 1}),
    ):
        with pytest.raises(InvalidArguments):
            helper_call(catalog, "toolhost.search", args, kwargs)


# -- a thousand tools ------------------------------------------------------------------------


def _tool(file: str, name: str, line: int, summary: str, param: str = "item_id") -> ToolDecl:
    """A declared tool of one ``str`` parameter, as pyright would have built it."""
    return ToolDecl(
        name,
        f"tools.{file}.{name}",
        file,
        name,
        None,
        True,
        f"{file}.py",
        line,
        (ParamDecl(param, 1, "str", None, "The item."),),
        "bool",
        f"{summary}\n\nArgs:\n    {param}: The item.",
        f"({param}: str) -> bool",
        summary=summary,
    )


def _big_scope(count: int = 1000, files: int = 25) -> Scope:
    tools = [
        _tool(
            f"area{i % files:02d}",
            f"do_thing_number_{i}",
            i + 1,
            f"Do thing number {i} to an item.",
        )
        for i in range(count)
    ]
    return Scope(tuple(tools), (), "1.1.0")


_MORE = ("invoice", "parcel", "desk", "laptop", "course", "ticket", "contract", "flight")


def _resource_scope() -> Scope:
    """Resource tools as APIs name them (``VERB_THING``), two files of them, with the
    docstrings such tools have: only some say what their thing is."""
    said = {
        ("shop", "coupon"): "a discount code customers can apply at checkout",
        ("shop", "report"): "a table of sales figures over a period",
        ("meet", "meeting"): "an event with several attendees and a video link",
        ("meet", "reminder"): "a notification sent before something is due",
        **{("more", thing): f"one {thing} of the project" for thing in _MORE},
    }
    verbs = {
        "get": "Fetch one {0} by its id. A {0} is {1}.",
        "list": "List {0}s, newest first.",
        "create": "Create a new {0} and return its id. A {0} is {1}.",
        "update": "Change fields of an existing {0}.",
        "delete": "Delete a {0} for good.",
        "archive": "Archive a {0}: hidden from lists but kept.",
        "send": "Send a {0} ({1}).",
        "reschedule": "Reschedule a {0} ({1}).",
        "schedule": "Schedule a {0} ({1}).",
    }
    tools: list[ToolDecl] = []
    for (file, thing), what in said.items():
        for verb, text in verbs.items():
            name = f"{verb}_{thing}s" if verb == "list" else f"{verb}_{thing}"
            tools.append(_tool(file, name, len(tools) + 1, text.format(thing, what), f"{thing}_id"))
    return Scope(tuple(tools), (), "1.1.0")


@pytest.mark.parametrize(
    ("query", "first"),
    [
        # What is to be done tells one thing's tools apart: the verb itself, an everyday
        # word for it, a two-word verb, "every Monday", a question.
        ("reschedule the meeting", "reschedule_meeting"),
        ("move tomorrow's meeting to Friday", "reschedule_meeting"),
        ("push the reminder back to next week", "reschedule_reminder"),
        # Words get_coupon and create_coupon say, but what is wanted is delete_coupon:
        ("remove the discount code customers apply at checkout", "delete_coupon"),
        ("cancel the coupon", "delete_coupon"),
        ("hide the table of sales figures without deleting it", "archive_report"),
        ("email the sales report to the team every Monday", "schedule_report"),
        ("which meetings are there", "list_meetings"),
        ("what discount code does coupon c_1 give", "get_coupon"),
        ("who attends the meeting with the video link", "get_meeting"),
        ("change the discount of the coupon", "update_coupon"),
    ],
)
def test_search_puts_first_what_the_user_wants_done(query: str, first: str) -> None:
    assert names(_resource_scope().search(query, 3))[0] == first


def test_search_finds_a_thing_by_what_its_other_tools_say() -> None:
    """Only four coupon tools say a coupon is a discount code: the words find all nine,
    as words of the thing; words every list tool says ("newest first") stay with them."""
    scope = _resource_scope()
    coupons = names(scope.search("discount code", 9))
    assert all(name.endswith(("_coupon", "_coupons")) for name in coupons)
    assert len(coupons) == 9
    listed = names(scope.search("newest first", 20))
    assert len(listed) == 12 and all(name.startswith("list_") for name in listed)


def test_a_thousand_tools_cost_the_model_an_index() -> None:
    scope = _big_scope()
    full = scope.render_model()
    index = scope.render_index()
    assert len(full) > 100_000
    assert len(index) < 4000, len(index)
    assert "1000 tools in 25 files" in index and "toolhost.search" in index
    assert all(f"# area{i:02d} (40): do_thing_number_{i}," in index for i in range(25))
    assert scope.render_model(max_chars=MODEL_BUDGET) == index
    small = _big_scope(3, 1)
    assert small.render_model(max_chars=MODEL_BUDGET) == small.render_model()
    assert names(scope.search("thing number 417", 3))[0] == "do_thing_number_417"
    assert Catalog(scope).declaration("do_thing_number_9").startswith("async def do_thing_")
    # Over MCP in code mode: three tools, and run_code's description holds the index.
    code = listing(scope, {}, expose="code")
    assert [t.name for t in code.tools] == [RUN_CODE, SEARCH_TOOLS, READ_DECLARATION]
    described = sum(len(t.model_dump_json(by_alias=True, exclude_none=True)) for t in code.tools)
    assert described < 8000, described
    assert index in (code.tools[0].description or "")


# -- code mode and MCP, end to end -----------------------------------------------------------


@pytest.fixture
def served(project: Path, wasm_prepared: Any) -> Iterator[Path]:
    del wasm_prepared
    yield project


@pytest.mark.wasm
@pytest.mark.anyio
async def test_code_mode_searches_and_reads_declarations(served: Path) -> None:
    async with Host.open(served) as host:
        code = textwrap.dedent(
            """\
            hits = await toolhost.search("give money back for a payment", limit=2)
            text = await toolhost.declaration(hits[0]["name"])
            try:
                await toolhost.declaration("zebra")
            except InvalidArguments as exc:
                missing = str(exc)
            refund = await create_refund("p1", {"amount": 3, "currency": "EUR"})
            [hits[0]["name"], "class Refund" in text, "zebra" in missing, refund["id"]]
            """
        )
        result = await host.run_code(code)
        assert result.ok, result.error
        assert result.value == ["create_refund", True, True, "r1"]
        # The helpers are not tool calls: only create_refund is recorded.
        assert [c.tool for c in result.calls] == ["create_refund"]
        assert result.check is not None and result.check.status == "clean"  # quick checks
        # pyright knows the helpers' signatures: refuse runs good code, stops bad calls.
        good = await host.run_code('await toolhost.search("refund")', check="refuse")
        assert good.ok and good.check is not None and good.check.status == "clean"
        bad = await host.run_code("await toolhost.search(limit=2)", check="refuse")
        assert not bad.ok and bad.check is not None and bad.check.status == "errors"
        # Helper calls count against code_max_calls (5), as tool calls do.
        flood = await host.run_code('for _ in range(6):\n    await toolhost.search("x")')
        assert not flood.ok and flood.error is not None and flood.error.limit == "code_max_calls"


@pytest.mark.wasm
@pytest.mark.anyio
async def test_serve_expose_code_in_memory(served: Path) -> None:
    async with (
        Host.open(served) as host,
        McpServer(host, expose="code").running() as server,
        connect(server) as client,
    ):
        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == [RUN_CODE, SEARCH_TOOLS, READ_DECLARATION]
        # A small project's declarations fit: run_code's description holds them all.
        assert "async def create_refund" in (tools[0].description or "")
        found = await client.call_tool(SEARCH_TOOLS, {"query": "money back", "limit": 1})
        assert not found.is_error, found
        assert found.structured_content is not None
        assert names(found.structured_content["result"]) == ["create_refund"]
        read = await client.call_tool(READ_DECLARATION, {"name": "billing"})
        assert not read.is_error and "class Refund" in str(read.content[0])
        missing = await client.call_tool(READ_DECLARATION, {"name": "zebra"})
        assert missing.is_error and "zebra" in str(missing.content[0])
        ran = await client.call_tool(RUN_CODE, {"code": 'await toolhost.search("refund")'})
        assert ran.structured_content is not None and ran.structured_content["ok"], ran
        # Not served: the tools themselves (an unknown tool, a protocol error).
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("create_refund", {"payment_id": "p"})
    async with (
        Host.open(served) as host,
        McpServer(host, expose="tools").running() as server,
        connect(server) as client,
    ):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "create_refund" in tools and RUN_CODE not in tools
        assert SEARCH_TOOLS not in tools
        # A description is the docstring less what the schemas hold; other sections stay.
        delete = tools["delete_invoice"]
        assert delete.description == (
            "Delete an invoice for good.\n\nRaises:\n    KeyError: when there is no such invoice."
        )
        assert delete.input_schema["properties"]["invoice_id"]["description"] == (
            "The invoice to delete."
        )
        assert delete.output_schema is not None
        assert delete.output_schema["properties"]["result"]["description"] == (
            "Whether it was there."
        )


@pytest.mark.wasm
@pytest.mark.anyio
async def test_serve_expose_code_over_stdio(served: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            *("-c", "from host.cli import main; main()", "serve"),
            *("--project", str(served), "--expose", "code"),
        ],
        cwd=str(ROOT),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        tools = [t.name for t in (await client.list_tools()).tools]
        assert tools == [RUN_CODE, SEARCH_TOOLS, READ_DECLARATION]
        found = await client.call_tool(SEARCH_TOOLS, {"query": "put an item on the board"})
        assert found.structured_content is not None
        assert names(found.structured_content["result"])[0] == "board.add"
        ran = await client.call_tool(RUN_CODE, {"code": "await board.add('x')"})
        assert ran.structured_content is not None and ran.structured_content["value"] == 1
