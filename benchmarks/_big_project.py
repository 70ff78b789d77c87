"""A generated project of many realistic tools, and plain-language tasks for them.

``write_project(root, count)`` writes ``root/tools/`` with ``count`` tools (at most
1,000): 25 files named after the business areas a company's agent reaches (CRM, billing,
shipping, ...), five kinds of record in each, and eight actions on each record (get,
list, create, update, delete, search, archive, and one of the area's own). Every tool
has typed parameters, a one-line summary and a Google-style ``Args`` section, as a
developer would write them; the 100-tool project is the first four records of the first
five areas, so both sizes hold the same kinds of function.

``TASKS`` are what a user might ask, written without the tools' names in mind, each
with the one tool that does it: what ``benchmarks.catalog`` measures search against.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Final

__all__ = ["AREAS", "TASKS", "TASKS_SECOND", "tool_names", "write_project"]

# area -> (what it is, the area's own action, [(record, what a record is), ...])
AREAS: Final[dict[str, tuple[str, str, list[tuple[str, str]]]]] = {
    "crm": (
        "the customer relationship manager",
        "assign",
        [
            ("contact", "a person at a customer, with their email and phone"),
            ("lead", "a prospective customer not yet qualified by sales"),
            ("account", "a customer company and its contract owner"),
            ("opportunity", "a possible sale with its expected value and stage"),
            ("note", "a free-text note a salesperson attached to a customer"),
        ],
    ),
    "billing": (
        "invoicing and payments",
        "send",
        [
            ("invoice", "a bill sent to a customer for goods or services"),
            ("payment", "money received from a customer against an invoice"),
            ("refund", "money given back to a customer for a payment"),
            ("subscription", "a recurring plan a customer pays for monthly or yearly"),
            ("coupon", "a discount code customers can apply at checkout"),
        ],
    ),
    "shipping": (
        "parcels and deliveries",
        "track",
        [
            ("shipment", "goods sent to a customer, with its carrier and status"),
            ("label", "a printable postage label for a parcel"),
            ("carrier", "a delivery company such as a courier or postal service"),
            ("pickup", "a carrier's scheduled collection of parcels from a warehouse"),
            ("return_request", "a customer's request to send an item back"),
        ],
    ),
    "inventory": (
        "stock and warehouses",
        "reserve",
        [
            ("product", "an item the company sells, with its SKU and price"),
            ("stock_level", "how many units of a product a warehouse holds"),
            ("warehouse", "a building where stock is stored"),
            ("supplier", "a vendor the company buys products from"),
            ("purchase_order", "an order the company places with a supplier"),
        ],
    ),
    "hr": (
        "people and payroll",
        "approve",
        [
            ("employee", "a person employed by the company"),
            ("leave_request", "an employee's request for vacation or sick days"),
            ("payslip", "an employee's salary statement for one month"),
            ("performance_review", "a manager's yearly evaluation of an employee"),
            ("job_opening", "a position the company is hiring for"),
        ],
    ),
    "calendar": (
        "meetings and schedules",
        "reschedule",
        [
            ("event", "an entry in someone's calendar with a start and end time"),
            ("meeting", "an event with several attendees and a video link"),
            ("reminder", "a notification sent before something is due"),
            ("meeting_room", "a bookable room in an office"),
            ("out_of_office", "a period when a person is away and unavailable"),
        ],
    ),
    "mail": (
        "email",
        "forward",
        [
            ("email", "a message sent or received by email"),
            ("draft", "an email written but not yet sent"),
            ("thread", "a conversation of emails replying to each other"),
            ("mail_filter", "a rule that sorts incoming email automatically"),
            ("signature", "the text appended at the end of outgoing email"),
        ],
    ),
    "support": (
        "the customer help desk",
        "escalate",
        [
            ("ticket", "a customer's support request and its status"),
            ("ticket_comment", "a reply or internal note on a support ticket"),
            ("canned_response", "a prepared answer agents paste into replies"),
            ("sla_policy", "the response time promised to a class of customers"),
            ("satisfaction_survey", "a customer's rating of how their ticket was handled"),
        ],
    ),
    "docs": (
        "shared documents",
        "share",
        [
            ("document", "a text document in the shared drive"),
            ("folder", "a folder that groups documents"),
            ("permission", "who may read or edit a document"),
            ("revision", "an earlier saved version of a document"),
            ("doc_template", "a starting document new ones are copied from"),
        ],
    ),
    "analytics": (
        "business reporting",
        "schedule",
        [
            ("report", "a table of business figures over a period"),
            ("dashboard", "a page of charts for a team"),
            ("metric", "a named figure such as revenue or churn, computed daily"),
            ("segment", "a group of customers defined by filters"),
            ("data_export", "a CSV file of records prepared for download"),
        ],
    ),
    "marketing": (
        "campaigns and newsletters",
        "launch",
        [
            ("campaign", "a marketing push across channels with a budget"),
            ("newsletter", "an email sent to every subscriber of a list"),
            ("mailing_list", "people who agreed to receive marketing email"),
            ("landing_page", "a web page visitors reach from an advert"),
            ("ad", "a paid advertisement on a search engine or social network"),
        ],
    ),
    "projects": (
        "project management",
        "close",
        [
            ("project", "a piece of work with a deadline and a team"),
            ("task", "one thing to do inside a project, with an assignee"),
            ("milestone", "a date by which a set of tasks must be done"),
            ("timesheet", "hours a person logged against a project"),
            ("sprint", "a two-week iteration of planned tasks"),
        ],
    ),
    "chat": (
        "team chat",
        "pin",
        [
            ("channel", "a named chat room for a team or topic"),
            ("message", "a chat message posted in a channel"),
            ("direct_message", "a private chat message between two people"),
            ("chat_user", "a member of the team chat and their status"),
            ("reaction", "an emoji someone added to a chat message"),
        ],
    ),
    "devops": (
        "servers and deployments",
        "restart",
        [
            ("deployment", "a release of a service to production or staging"),
            ("server", "a virtual machine that runs services"),
            ("alert", "a notification that a monitored value crossed a threshold"),
            ("incident", "an outage or degradation being handled by on-call"),
            ("feature_flag", "a switch that turns a feature on for some users"),
        ],
    ),
    "repo": (
        "source code hosting",
        "merge",
        [
            ("repository", "a git repository of source code"),
            ("pull_request", "a proposed change to a repository awaiting review"),
            ("branch", "a line of development in a repository"),
            ("issue", "a bug report or feature request on a repository"),
            ("release", "a tagged version of a repository with notes"),
        ],
    ),
    "finance": (
        "accounting",
        "reconcile",
        [
            ("ledger_entry", "a debit or credit booked in the general ledger"),
            ("expense", "money an employee spent and wants reimbursed"),
            ("budget", "planned spending for a department and year"),
            ("bank_transaction", "a movement on the company's bank account"),
            ("tax_rate", "the sales tax applied in a region"),
        ],
    ),
    "legal": (
        "contracts and compliance",
        "sign",
        [
            ("contract", "a signed agreement with a customer or vendor"),
            ("nda", "a non-disclosure agreement"),
            ("policy_document", "an internal rule employees must follow"),
            ("data_request", "a person's request to see or erase their personal data"),
            ("audit_finding", "a problem an auditor found that needs fixing"),
        ],
    ),
    "it": (
        "the IT help desk and devices",
        "provision",
        [
            ("laptop", "a computer issued to an employee"),
            ("software_license", "a seat of a paid software product"),
            ("access_request", "an employee's request to use a system"),
            ("vpn_account", "credentials to reach the office network remotely"),
            ("phone_line", "a company mobile phone number"),
        ],
    ),
    "travel": (
        "business travel",
        "book",
        [
            ("trip", "a business journey with its dates and purpose"),
            ("flight", "a plane ticket for a trip"),
            ("hotel_booking", "a hotel room reserved for a trip"),
            ("car_rental", "a hired car for a trip"),
            ("travel_policy", "the spending limits that apply to trips"),
        ],
    ),
    "facilities": (
        "offices and buildings",
        "report",
        [
            ("desk", "a workspace in an office that can be booked"),
            ("visitor", "a guest expected at the office reception"),
            ("parking_spot", "a reserved car parking place"),
            ("maintenance_job", "a repair needed in a building"),
            ("badge", "an access card that opens office doors"),
        ],
    ),
    "ecommerce": (
        "the online shop",
        "fulfil",
        [
            ("order", "a purchase a customer made in the online shop"),
            ("cart", "items a shopper has selected but not bought yet"),
            ("product_review", "a shopper's star rating and comment on a product"),
            ("wishlist", "products a shopper saved for later"),
            ("gift_card", "a prepaid card that can be spent in the shop"),
        ],
    ),
    "learning": (
        "training courses",
        "enroll",
        [
            ("course", "a training course employees can take"),
            ("lesson", "one part of a course"),
            ("quiz", "questions that test what a learner understood"),
            ("certificate", "proof that someone completed a course"),
            ("learning_path", "an ordered set of courses for a role"),
        ],
    ),
    "security": (
        "security operations",
        "quarantine",
        [
            ("vulnerability", "a weakness found in a system by a scanner"),
            ("api_key", "a secret token a program uses to call an API"),
            ("login_attempt", "a recorded sign-in, successful or not"),
            ("firewall_rule", "a rule that allows or blocks network traffic"),
            ("phishing_report", "a suspicious email an employee reported"),
        ],
    ),
    "weather": (
        "weather and environment data",
        "forecast",
        [
            ("observation", "temperature, wind and rain measured at a station"),
            ("station", "a place where weather is measured"),
            ("storm_warning", "an official warning of severe weather"),
            ("air_quality", "pollution levels measured in a city"),
            ("climate_normal", "average weather for a month over thirty years"),
        ],
    ),
    "social": (
        "social media accounts",
        "publish",
        [
            ("post", "a message published on a social network"),
            ("follower", "an account that follows the company"),
            ("mention", "a post by someone else that names the company"),
            ("scheduled_post", "a post queued to publish later"),
            ("social_profile", "one of the company's accounts on a network"),
        ],
    ),
}

_ACTIONS: Final = ("get", "list", "create", "update", "delete", "search", "archive")


def _plural(word: str) -> str:
    if word.endswith(("s", "x", "sh", "ch")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _tool(area: str, about: str, special: str, record: str, what: str, action: str) -> str:
    """One tool function's source."""
    words = record.replace("_", " ")
    many = _plural(record)
    if action == "get":
        return f'''
async def get_{record}({record}_id: str) -> dict[str, object]:
    """Fetch one {words} from {about} by its id.

    A {words} is {what}.

    Args:
        {record}_id: The {words}'s id, as other {area} tools return it.
    """
    return {{"id": {record}_id}}
'''
    if action == "list":
        return f'''
async def list_{many}(limit: int = 50, cursor: str | None = None) -> list[dict[str, object]]:
    """List {_plural(words)} in {about}, newest first.

    Args:
        limit: How many to return, at most 200.
        cursor: Where the previous page ended.
    """
    return []
'''
    if action == "create":
        return f'''
async def create_{record}(
    name: str, fields: dict[str, str] | None = None, notify: bool = False
) -> str:
    """Create a new {words} in {about} and return its id.

    A {words} is {what}.

    Args:
        name: A short title for the new {words}.
        fields: Other attributes to set, by field name.
        notify: Tell the people concerned about the new {words}.
    """
    return "id"
'''
    if action == "update":
        return f'''
async def update_{record}({record}_id: str, changes: dict[str, str]) -> bool:
    """Change fields of an existing {words} in {about}.

    Args:
        {record}_id: The {words} to change.
        changes: New values by field name; other fields stay as they are.
    """
    return True
'''
    if action == "delete":
        return f'''
async def delete_{record}({record}_id: str, reason: str = "") -> bool:
    """Delete a {words} from {about} for good.

    Args:
        {record}_id: The {words} to delete.
        reason: Why, kept in the change log.
    """
    return True
'''
    if action == "search":
        return f'''
async def search_{many}(query: str, since: str | None = None) -> list[str]:
    """Find {_plural(words)} in {about} whose text matches a query; returns their ids.

    Args:
        query: Words to look for in the {words}'s fields.
        since: Only those changed after this ISO date.
    """
    return []
'''
    if action == "archive":
        return f'''
async def archive_{record}({record}_id: str) -> bool:
    """Archive a {words} in {about}: hidden from lists but kept, and can be restored.

    Args:
        {record}_id: The {words} to archive.
    """
    return True
'''
    return f'''
async def {special}_{record}({record}_id: str, to: str = "", note: str = "") -> bool:
    """{special.capitalize()} a {words} ({what}) in {about}.

    Args:
        {record}_id: The {words} to {special}.
        to: Whom or where to {special} it to, when that applies.
        note: A message kept with the action.
    """
    return True
'''


def _order(count: int) -> list[tuple[str, int, int]]:
    """(area, record index, action index) of the first ``count`` tools: the 100-tool
    project is 5 areas x 4 records x 5 actions, and bigger ones fill in area by area."""
    if count <= 100:
        out = [(a, r, k) for a in list(AREAS)[:5] for r in range(4) for k in range(5)]
        return out[:count]
    out = [(a, r, k) for a in AREAS for r in range(5) for k in range(8)]
    return out[:count]


def tool_names(count: int) -> list[str]:
    """The canonical names of the first ``count`` tools (``FILE.TOOL`` is not needed:
    every name is unique, so each is a global)."""
    names: list[str] = []
    for area, r, k in _order(count):
        special, records = AREAS[area][1], AREAS[area][2]
        record = records[r][0]
        action = (*_ACTIONS, special)[k]
        many = _plural(record)
        names.append(f"{action}_{many}" if action in ("list", "search") else f"{action}_{record}")
    return names


def write_project(root: Path, count: int = 1000) -> Path:
    """Write a project of ``count`` tools into ``root`` (which must be empty); returns it."""
    if not 1 <= count <= 1000:
        raise ValueError("1 to 1000 tools")
    files: dict[str, list[str]] = {}
    for area, r, k in _order(count):
        about, special, records = AREAS[area]
        record, what = records[r]
        action = (*_ACTIONS, special)[k]
        files.setdefault(area, []).append(_tool(area, about, special, record, what, action))
    tools = root / "tools"
    tools.mkdir(parents=True)
    for area, sources in files.items():
        about = AREAS[area][0]
        head = f'"""Tools for {about}."""\n\nfrom __future__ import annotations\n'
        (tools / f"{area}.py").write_text(head + "".join(textwrap.dedent(s) for s in sources))
    (root / "policy.toml").write_text('version = 1\n[defaults]\nagent = "allow"\n')
    return root


# Plain-language tasks and the tool that does each: written as a user would ask, not from
# the tools' names (synonyms, other word forms, the record described rather than named).
TASKS: Final[list[tuple[str, str]]] = [
    ("give a customer their money back for a payment", "create_refund"),
    ("send the invoice for last month's consulting to the customer", "send_invoice"),
    ("where is the parcel I sent to Lyon? follow its delivery", "track_shipment"),
    ("print postage for a parcel", "create_label"),
    ("put aside 20 units of a product for a big order", "reserve_stock_level"),
    ("approve Maria's vacation request", "approve_leave_request"),
    ("move tomorrow's team meeting to Friday", "reschedule_meeting"),
    ("pass this email on to the legal team", "forward_email"),
    ("a customer is angry, hand their support ticket to a senior agent", "escalate_ticket"),
    ("give Bob edit access to the quarterly plan document", "share_document"),
    ("email the sales dashboard to the team every Monday", "schedule_dashboard"),
    ("start the spring sale campaign", "launch_campaign"),
    ("mark the website redesign project as finished", "close_project"),
    ("pin the release announcement in the chat channel", "pin_message"),
    ("the payments service is stuck, restart its server", "restart_server"),
    ("merge the pull request that fixes login", "merge_pull_request"),
    ("match the bank statement lines with the ledger", "reconcile_bank_transaction"),
    ("get the supplier contract signed", "sign_contract"),
    ("set up a laptop for the new hire", "provision_laptop"),
    ("book a flight to Berlin for the conference", "book_flight"),
    ("tell facilities the kitchen tap is broken", "report_maintenance_job"),
    ("ship the items of order 1182 to the customer", "fulfil_order"),
    ("sign up Ana for the security awareness course", "enroll_course"),
    ("isolate the laptop that clicked the phishing link", "quarantine_phishing_report"),
    ("publish our product launch announcement on social media", "publish_post"),
    ("find every support ticket that mentions 'refund'", "search_tickets"),
    ("show the newest leads from the website form", "list_leads"),
    ("look up contact c_381's phone number", "get_contact"),
    ("remove the discount code SPRING10, it was leaked", "delete_coupon"),
    ("raise the price of SKU 1009 to 24 euros", "update_product"),
    ("add a new employee who starts on Monday", "create_employee"),
    ("hide last year's reports without deleting them", "archive_report"),
    ("revoke the API key that was committed to git", "delete_api_key"),
    ("what was the air pollution in Paris yesterday", "get_air_quality"),
    ("which meeting rooms can be booked", "list_meeting_rooms"),
    ("cancel the hotel reservation for the Madrid trip", "delete_hotel_booking"),
]
"""What a user might ask, and the tool that does it (all within the 1,000-tool project)."""

TASKS_SECOND: Final[list[tuple[str, str]]] = [
    ("hand the Acme lead over to Priya in sales", "assign_lead"),
    ("who owns the contract of the Globex customer company", "get_account"),
    ("write down that the client prefers calls in the morning", "create_note"),
    ("stop the yearly plan of customer 88, they are leaving", "delete_subscription"),
    ("when will the courier come to collect parcels from the warehouse", "track_pickup"),
    ("a customer wants to send back a broken kettle", "create_return_request"),
    ("how many units of SKU 4411 are in the Leeds warehouse", "get_stock_level"),
    ("order 500 more chairs from our supplier", "create_purchase_order"),
    ("sign off on Tom's payslip for March", "approve_payslip"),
    ("open a new position for a backend engineer", "create_job_opening"),
    ("push my dentist reminder to next week", "reschedule_reminder"),
    ("set my out of office while I am on holiday", "create_out_of_office"),
    ("stop sorting newsletters into a folder automatically", "delete_mail_filter"),
    ("change the text at the end of my outgoing emails", "update_signature"),
    ("add an internal note to the support ticket", "create_ticket_comment"),
    ("how did customers rate the help they got", "list_satisfaction_surveys"),
    ("export the customer records to a CSV file", "create_data_export"),
    ("send the newsletter to every subscriber", "launch_newsletter"),
    ("log 6 hours against the migration project", "create_timesheet"),
    ("finish the current two-week iteration", "close_sprint"),
    ("send Maria a private chat message", "create_direct_message"),
    ("turn off the dark mode feature for everyone", "update_feature_flag"),
    ("the site is down, open an incident for on-call", "create_incident"),
    ("file a bug report about the broken login page", "create_issue"),
    ("claim back the 30 euros I spent on a taxi", "create_expense"),
    ("what is the sales tax in Bavaria", "get_tax_rate"),
    ("sign the non-disclosure agreement with the new vendor", "sign_nda"),
    ("give the new designer a seat of the drawing software", "provision_software_license"),
    ("hire a car in Rome for the trip", "book_car_rental"),
    ("a visitor is coming at 10, let reception know", "create_visitor"),
    ("leave a five star review for the blender", "create_product_review"),
    ("which weaknesses did the scanner find", "list_vulnerabilities"),
    ("will there be a storm warning tomorrow", "forecast_storm_warning"),
    ("what was the temperature at the Oslo station this morning", "get_observation"),
    ("find posts by other people that name our company", "search_mentions"),
    ("queue a post to go out on Friday at 9", "create_scheduled_post"),
]
"""A second set like ``TASKS``, for other tools, written (2026-12-07) before the search
learned what a query asks to be done (its verbs, two-word verbs, "every Monday",
questions); its two-word verbs were written having seen both sets' misses, so neither set
is a blind test of them."""
