"use strict";
// The approval inbox's page. Every element is built with createElement and textContent:
// nothing the agent wrote (arguments, tool names, comments) is ever parsed as HTML. The
// Content-Security-Policy requires Trusted Types, so assigning a string to innerHTML
// would throw anyway.
(() => {
  // The page's key: in the page only when it answered the printed link (with its token);
  // kept in this tab's storage, which no other origin (another port included) can read,
  // and sent with every request as X-CSRF-Token. The session cookie alone is worth nothing.
  const KEY_NAME = "toolhost-inbox-key";
  let csrf = document.querySelector('meta[name="csrf-token"]').content;
  try {
    if (csrf) window.sessionStorage.setItem(KEY_NAME, csrf);
    else csrf = window.sessionStorage.getItem(KEY_NAME) || "";
  } catch (e) {
    /* storage may be off: the key then lasts as long as the page */
  }
  if (window.location.search) {
    // No credential stays in the address bar or the history after the first exchange.
    window.history.replaceState(null, "", window.location.pathname);
  }
  const statusEl = document.getElementById("status");
  const errorEl = document.getElementById("error");
  const pendingEl = document.getElementById("pending");
  const emptyEl = document.getElementById("empty");
  const closedEl = document.getElementById("closed");
  const grantsEl = document.getElementById("grants");
  const noGrantsEl = document.getElementById("no-grants");
  const auditEl = document.getElementById("audit");
  const filterEl = document.getElementById("audit-filter");
  const nameEl = document.getElementById("approver");
  const NAME_KEY = "toolhost-inbox-approver";

  try {
    nameEl.value = window.localStorage.getItem(NAME_KEY) || "";
  } catch (e) {
    /* storage may be off: the name is then typed each visit */
  }
  nameEl.addEventListener("change", () => {
    try {
      window.localStorage.setItem(NAME_KEY, nameEl.value);
    } catch (e) {
      /* ignored */
    }
  });

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function seconds(value) {
    const s = Math.max(0, Math.round(value));
    if (s < 120) return `${s} s`;
    if (s < 7200) return `${Math.floor(s / 60)} min ${s % 60} s`;
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }

  function when(unix) {
    return unix ? new Date(unix * 1000).toLocaleTimeString() : "";
  }

  async function post(path, body) {
    const response = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body),
    });
    let data;
    try {
      data = await response.json();
    } catch (e) {
      data = { status: "refused", message: `${response.status} ${response.statusText}` };
    }
    return { ok: response.ok, data };
  }

  // -- pending requests -------------------------------------------------------------------

  const BUTTONS = [
    ["approve_once", "Approve once", "approve"],
    ["approve_session", "Approve for this session", "approve"],
    ["approve_always", "Always approve", "approve"],
    ["deny", "Deny", "deny"],
  ];

  function fact(list, term, value) {
    if (value === null || value === undefined || value === "") return null;
    list.append(el("dt", {}, term));
    const dd = el("dd", {}, value);
    list.append(dd);
    return dd;
  }

  function buildRequest(item) {
    const li = el("li", { class: "request", "data-id": item.id });
    li.append(el("h3", { class: "tool" }, item.tool));
    if (item.description) li.append(el("p", { class: "description" }, item.description));
    const facts = el("dl", { class: "facts" });
    fact(facts, "rule", item.reason ? `${item.rule}: ${item.reason}` : item.rule);
    fact(facts, "caller", item.caller);
    // A nested call: who started it, then each tool whose context made the next call.
    if (item.chain && item.chain.length) fact(facts, "via", [...item.chain, item.tool].join(" → "));
    fact(facts, "session", item.session);
    fact(facts, "host", item.host);
    const age = fact(facts, "waiting", "0 s");
    age.classList.add("age");
    const left = fact(facts, "time left", "…");
    left.classList.add("left");
    li.append(facts);

    let ack = null;
    if (item.warnings.length) {
      const box = el("div", { class: "warnings", role: "alert" });
      box.append(el("strong", {}, "Warnings"));
      const list = el("ul");
      for (const warning of item.warnings) list.append(el("li", {}, warning));
      box.append(list);
      const label = el("label", { class: "ack" });
      ack = el("input", { type: "checkbox", name: "acknowledged" });
      label.append(ack, " I have read the warnings and the arguments");
      box.append(label);
      li.append(box);
    }
    li.append(el("h4", { class: "args-title" }, "Arguments, exactly as the tool will receive them"));
    li.append(el("pre", { class: "arguments" }, item.arguments));

    if (!item.offered) {
      li.append(
        el(
          "p",
          { class: "elsewhere" },
          "Asked on another channel (a terminal, or the MCP client's user): this inbox cannot answer it.",
        ),
      );
      return li;
    }
    const form = el("form", { class: "answer" });
    const label = el("label", {}, "Comment (optional; a denied caller is shown it)");
    const comment = el("textarea", { name: "comment", rows: "2", maxlength: "2000" });
    label.append(comment);
    form.append(label);
    const restricted = Array.isArray(item.approvers);
    const buttons = [];
    for (const [value, text, kind] of BUTTONS) {
      if (restricted && (value === "approve_session" || value === "approve_always")) continue;
      const button = el("button", { type: "submit", name: "decision", value, class: kind }, text);
      buttons.push(button);
      form.append(button);
    }
    if (restricted) {
      form.append(
        el("p", { class: "note" }, `Only ${item.approvers.join(", ") || "no channel"} may allow this rule's calls, and it asks every time.`),
      );
    }
    const msg = el("p", { class: "msg", role: "status" });
    form.append(msg);
    const sync = () => {
      for (const button of buttons) {
        if (button.classList.contains("approve")) button.disabled = ack !== null && !ack.checked;
      }
    };
    if (ack !== null) ack.addEventListener("change", sync);
    sync();
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const decision = event.submitter ? event.submitter.value : "deny";
      for (const button of buttons) button.disabled = true;
      msg.textContent = "sending…";
      try {
        const { ok, data } = await post(`api/approvals/${encodeURIComponent(item.id)}`, {
          decision,
          comment: comment.value,
          approver: nameEl.value,
          acknowledged: ack !== null && ack.checked,
        });
        msg.textContent = data.message;
        li.dataset.answer = data.status;
        if (!ok && (data.status === "refused" || data.status === "unavailable")) sync();
        if (!ok && data.status === "refused") {
          for (const button of buttons) if (!button.classList.contains("approve")) button.disabled = false;
        }
      } catch (e) {
        msg.textContent = `not sent: ${e.message}`;
        for (const button of buttons) button.disabled = false;
        sync();
      }
    });
    li.append(form);
    return li;
  }

  const shown = new Map(); // id -> {li, item}

  function renderPending(items) {
    const wanted = new Set(items.map((item) => item.id));
    for (const [id, entry] of shown) {
      if (!wanted.has(id)) {
        entry.li.remove();
        shown.delete(id);
      }
    }
    for (const item of items) {
      const entry = shown.get(item.id);
      if (entry === undefined) {
        const li = buildRequest(item);
        pendingEl.append(li);
        shown.set(item.id, { li, item });
      } else if (entry.item.offered !== item.offered || entry.item.expires !== item.expires) {
        // The host started waiting for this inbox (buttons appear) or moved the deadline:
        // build it again, keeping a comment already typed.
        const li = buildRequest(item);
        const typed = entry.li.querySelector("textarea[name=comment]");
        const fresh = li.querySelector("textarea[name=comment]");
        if (typed !== null && fresh !== null) fresh.value = typed.value;
        entry.li.replaceWith(li);
        shown.set(item.id, { li, item });
      }
    }
    emptyEl.hidden = items.length > 0;
    document.body.dataset.pending = String(items.length);
    tick();
  }

  function tick() {
    const now = Date.now() / 1000;
    for (const { li, item } of shown.values()) {
      li.querySelector(".age").textContent = seconds(now - item.created);
      const left = item.expires - now;
      li.querySelector(".left").textContent = left > 0 ? seconds(left) : "expired: the call is denied";
      li.classList.toggle("expired", left <= 0);
    }
  }
  window.setInterval(tick, 1000);

  function renderClosed(items) {
    closedEl.replaceChildren(
      ...items.map((item) => {
        const li = el("li", { "data-id": item.id });
        li.append(el("strong", {}, item.tool), ` (${item.caller}, session ${item.session}) `, el("span", { class: "how" }, item.how), ` · ${when(item.closed)}`);
        return li;
      }),
    );
  }

  // -- grants -----------------------------------------------------------------------------

  function renderGrants(grants) {
    const body = grantsEl.tBodies[0];
    body.replaceChildren(
      ...grants.map((grant) => {
        const tr = el("tr", { "data-id": String(grant.id) });
        tr.append(
          el("td", {}, grant.id),
          el("td", { class: "mono" }, grant.tool),
          el("td", {}, grant.caller),
          el("td", {}, grant.allow ? "allow" : "deny"),
          el("td", { class: "mono" }, grant.scope === "tool" ? "every call of the tool" : grant.summary || "these exact arguments"),
          el("td", {}, grant.rule || ""),
          el("td", {}, when(grant.created)),
        );
        const cell = el("td");
        const button = el("button", { type: "button", class: "revoke" }, "Revoke");
        button.addEventListener("click", async () => {
          button.disabled = true;
          const { data } = await post(`api/grants/${grant.id}/revoke`, {});
          button.textContent = data.message;
        });
        cell.append(button);
        tr.append(cell);
        return tr;
      }),
    );
    grantsEl.hidden = grants.length === 0;
    noGrantsEl.hidden = grants.length > 0;
  }

  // -- audit ------------------------------------------------------------------------------

  let auditTimer = null;

  async function loadAudit() {
    const params = new URLSearchParams(new FormData(filterEl));
    params.set("limit", "100");
    try {
      const response = await fetch(`api/audit?${params}`, {
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf },
      });
      if (!response.ok) return;
      const data = await response.json();
      auditEl.tBodies[0].replaceChildren(
        ...data.records.map((r) => {
          const tr = el("tr", { "data-call": r.call_id });
          tr.append(
            el("td", {}, when(r.started)),
            el("td", { class: "mono" }, r.tool),
            el("td", {}, r.caller),
            el("td", {}, r.session),
            el("td", {}, r.decision || ""),
            el("td", {}, r.rule || ""),
            el("td", {}, r.approval || ""),
            el("td", { class: "outcome" }, r.outcome),
            el("td", { class: "mono" }, r.args_summary || ""),
            el("td", {}, r.error || ""),
          );
          return tr;
        }),
      );
    } catch (e) {
      /* the next refresh tries again */
    }
  }

  function auditSoon() {
    if (auditTimer !== null) window.clearTimeout(auditTimer);
    auditTimer = window.setTimeout(loadAudit, 300);
  }
  filterEl.addEventListener("submit", (event) => {
    event.preventDefault();
    loadAudit();
  });
  filterEl.addEventListener("input", auditSoon);

  if (!csrf) {
    statusEl.textContent = "not signed in: open the link toolhost printed";
    return;
  }
  window.setInterval(loadAudit, 5000);
  loadAudit();

  // -- live updates -----------------------------------------------------------------------
  // The event stream is read with fetch (EventSource cannot send the key): server-sent
  // events, one "snapshot" per change, comments as keep-alives.

  function onSnapshot(text) {
    statusEl.textContent = "live";
    const data = JSON.parse(text);
    errorEl.hidden = !data.error;
    errorEl.textContent = data.error || "";
    renderPending(data.pending);
    renderClosed(data.closed);
    renderGrants(data.grants);
    auditSoon();
  }

  function onFrame(frame) {
    let kind = "message";
    const data = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith("event:")) kind = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (kind === "snapshot" && data.length) onSnapshot(data.join("\n"));
  }

  async function follow() {
    const response = await fetch("events", {
      credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf, Accept: "text/event-stream" },
    });
    if (response.status === 401 || response.status === 403) return false;
    if (!response.ok || !response.body) return true;
    statusEl.textContent = "live";
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return true;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        onFrame(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  }

  (async () => {
    for (;;) {
      let again = true;
      try {
        again = await follow();
      } catch (e) {
        /* the connection broke: try again */
      }
      if (!again) {
        statusEl.textContent = "disconnected: reopen the link toolhost printed";
        return;
      }
      statusEl.textContent = "reconnecting…";
      await new Promise((resolve) => window.setTimeout(resolve, 2000));
    }
  })();
})();
