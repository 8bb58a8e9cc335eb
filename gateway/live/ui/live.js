// llm-gateway live view: plain JavaScript, no build step, nothing fetched from elsewhere.
// Data comes from the gateway itself: api/requests (the ring buffer), api/stream (SSE, one
// event per finished request or realtime session), api/backends, api/spend, api/realtime (the
// realtime sessions open now). Every value from a request is put into the page
// with textContent / dataset, never parsed as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const state = {
    records: new Map(), // seq -> record
    rows: new Map(), // seq -> <tr> (records never change: built once)
    size: 500,
    slowMs: 500,
    last: 0,
    selected: null,
    es: null,
    scheduled: false,
    opened: 0,
    backendTimer: null,
    open: new Map(), // request id -> an open realtime session (api/realtime)
    selectedOpen: null, // the open session shown in the detail
  };

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function ms(v) {
    if (v === null || v === undefined) return "–";
    return Number(v).toFixed(v < 10 ? 3 : v < 1000 ? 1 : 0);
  }

  function pct(fraction) {
    return (Math.max(0, Math.min(1, fraction)) * 100).toFixed(4) + "%";
  }

  // nearest-rank percentile, as gateway/live/recent.py computes it
  function percentile(sorted, p) {
    if (!sorted.length) return null;
    return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)];
  }

  function setConn(kind, text) {
    const c = $("conn");
    c.dataset.state = kind;
    c.textContent = text || kind;
  }

  // ---------------------------------------------------------------- loading

  async function load() {
    let r;
    try {
      r = await fetch("api/requests", { credentials: "same-origin", cache: "no-store" });
    } catch (err) {
      setConn("closed", "gateway unreachable");
      setTimeout(load, 3000);
      return;
    }
    if (r.status === 401 || r.status === 403) {
      showSignin(await errorMessage(r));
      return;
    }
    if (!r.ok) {
      setConn("closed", "error " + r.status);
      return;
    }
    const body = await r.json();
    state.size = body.buffer.size;
    state.slowMs = body.slow_ms;
    $("slow-ms").textContent = "(≥ " + body.slow_ms + " ms)";
    $("signout").hidden = !body.auth;
    $("buffer").textContent = "buffer " + body.buffer.size;
    state.records.clear();
    state.rows.clear();
    for (const rec of body.requests.slice().reverse()) add(rec, false);
    $("signin").hidden = true;
    $("view").hidden = false;
    render();
    connect();
    loadBackends();
    loadSpend();
    loadRealtime();
    if (state.backendTimer === null) {
      state.backendTimer = setInterval(() => {
        loadBackends();
        loadSpend();
        loadRealtime();
      }, 5000);
    }
  }

  async function errorMessage(r) {
    try {
      return (await r.json()).error.message;
    } catch (err) {
      return "HTTP " + r.status;
    }
  }

  function add(rec, live) {
    if (state.records.has(rec.seq)) return;
    state.records.set(rec.seq, rec);
    if (rec.seq > state.last) state.last = rec.seq;
    if (live) rec._fresh = true;
    while (state.records.size > state.size) {
      const oldest = Math.min(...state.records.keys());
      state.records.delete(oldest);
      state.rows.delete(oldest);
    }
  }

  function connect() {
    if (state.es !== null) state.es.close();
    const es = new EventSource("api/stream?after=" + state.last);
    state.es = es;
    es.addEventListener("open", () => {
      state.opened = Date.now();
      setConn("live");
    });
    es.addEventListener("request", (ev) => {
      const rec = JSON.parse(ev.data);
      add(rec, true);
      schedule();
      if (rec.realtime) loadRealtime(); // a session ended: it is no longer open
    });
    es.addEventListener("error", () => {
      if (es.readyState === EventSource.CLOSED) {
        // refused (signed out, gateway restarted without the view): start over
        setConn("closed", "disconnected");
        state.es = null;
        setTimeout(load, 2000);
        return;
      }
      // streams end every few seconds and EventSource resumes (Last-Event-ID): only a
      // reconnect that takes a while is worth showing
      const at = Date.now();
      setTimeout(() => {
        if (state.opened < at && es.readyState !== EventSource.OPEN) setConn("reconnecting");
      }, 1500);
    });
  }

  async function loadBackends() {
    let r;
    try {
      r = await fetch("api/backends", { credentials: "same-origin", cache: "no-store" });
    } catch (err) {
      return;
    }
    if (!r.ok) return;
    const body = await r.json();
    const tbody = $("backends").tBodies[0];
    tbody.replaceChildren(...body.backends.map(backendRow));
    const cache = body.cache || {};
    $("cache-state").textContent =
      "cache " + (cache.backend || "?") + (cache.state ? " (" + cache.state + ")" : "");
    const tracing = body.tracing || {};
    $("tracing-state").textContent =
      "tracing " + (tracing.exporter || "?") + (tracing.state ? " (" + tracing.state + ")" : "");
  }

  // budgets per tenant and key (api/spend): what was spent this period, what requests in
  // flight hold, the budget; keys are named by tenant and a digest prefix, never the key
  async function loadSpend() {
    let r;
    try {
      r = await fetch("api/spend", { credentials: "same-origin", cache: "no-store" });
    } catch (err) {
      return;
    }
    if (!r.ok) return;
    const body = await r.json();
    const rows = [...body.tenants, ...body.keys];
    $("spend-section").hidden = rows.length === 0;
    $("spend-state").textContent = body.shared ? "shared by the replicas" : "this process";
    $("spend").tBodies[0].replaceChildren(...rows.map(spendRow));
  }

  function usd(v) {
    if (v === null || v === undefined) return "–";
    return v >= 1 || v === 0 ? v.toFixed(2) : v.toPrecision(3);
  }

  function spendRow(b) {
    const tr = el("tr");
    const used = b.budget_usd ? b.spent_usd / b.budget_usd : 0;
    tr.dataset.tenant = b.tenant;
    tr.append(
      el("td", "", b.tenant),
      el("td", "mono", b.key || "(tenant)"),
      el("td", "", b.period),
      el("td", "num", usd(b.spent_usd)),
      el("td", "num", usd(b.reserved_usd)),
      el("td", "num", usd(b.budget_usd)),
      el("td", "num" + (used >= 0.8 ? " error" : ""), (used * 100).toFixed(1) + "%"),
      el("td", "mono", b.resets_at || "never"),
    );
    return tr;
  }

  // passive health as /readyz reports it: the backend's state and its models out of rotation
  function backendRow(b) {
    const tr = el("tr");
    tr.dataset.backend = b.name;
    const h = b.health || {};
    tr.dataset.state = h.state || "";
    const models = Object.entries(h.models || {});
    const health = el("td", h.state && h.state !== "up" ? "error health" : "health", h.label || h.state || "unknown");
    if (h.probe_in_s !== undefined && h.state === "ejected") health.append(el("span", "muted", " (probe in " + h.probe_in_s + " s)"));
    if (models.length) {
      const list = el("span", "models error");
      list.textContent = " · models out: " + models.map(([m, state]) => m + " " + state).join(", ");
      health.append(list);
    }
    health.title = Object.entries(h)
      .map(([k, v]) => k + ": " + (typeof v === "object" ? JSON.stringify(v) : v))
      .join("\n");
    tr.append(
      el("td", "mono", b.name),
      el("td", "", b.provider),
      el("td", "mono", b.url),
      el("td", "", b.transport),
      health,
      ...loadCells(b.load),
      el("td", "num", b.attempts),
      el("td", "num" + (b.failed ? " error" : ""), b.failed),
      el("td", "num", b.last_status === null ? "–" : b.last_status),
      el("td", "num", ms(b.attempt_ms.p50)),
    );
    return tr;
  }

  // the model server's load as last scraped (docs/spec.md §21): queue depth and KV-cache usage;
  // "–" when its load is not read, "unknown" while a scrape fails or is stale
  function loadCells(load) {
    if (!load) return [el("td", "num muted", "–"), el("td", "num muted", "–")];
    if (!load.known) {
      const why = "metrics " + (load.age_s === null ? "never scraped" : load.age_s + " s old");
      const queue = el("td", "num muted load-queue", "unknown");
      queue.title = why;
      return [queue, el("td", "num muted load-kv", "unknown")];
    }
    const hot = load.saturated ? " error" : "";
    const queue = el("td", "num load-queue" + hot, String(load.queue));
    if (load.running !== null) queue.append(el("span", "muted", " (" + load.running + " running)"));
    if (load.saturated) queue.append(el("span", "", " saturated"));
    queue.title = "scraped " + load.age_s + " s ago";
    const kv = load.kv_cache === null ? "–" : Math.round(load.kv_cache * 100) + " %";
    return [queue, el("td", "num load-kv" + hot, kv)];
  }

  // ---------------------------------------------------------------- rendering

  function schedule() {
    if (state.scheduled) return;
    state.scheduled = true;
    requestAnimationFrame(() => {
      state.scheduled = false;
      render();
    });
  }

  function filters() {
    return {
      status: $("f-status").value,
      model: $("f-model").value,
      route: $("f-route").value,
      slow: $("f-slow").checked,
    };
  }

  function statusMatches(wanted, r) {
    if (wanted === "error") return r.status >= 400 || r.error !== null;
    if (wanted.endsWith("xx")) return Math.floor(r.status / 100) === Number(wanted[0]);
    return r.status === Number(wanted);
  }

  function matches(r, f) {
    if (f.model && r.model !== f.model) return false;
    if (f.route && r.route !== f.route) return false;
    if (f.slow && r.request_ms < state.slowMs) return false;
    return !f.status || statusMatches(f.status, r);
  }

  function render() {
    if ($("f-pause").checked) return;
    const f = filters();
    const seqs = [...state.records.keys()].sort((a, b) => b - a);
    const shown = [];
    for (const seq of seqs) {
      const rec = state.records.get(seq);
      if (matches(rec, f)) shown.push(rec);
    }
    $("requests").tBodies[0].replaceChildren(...shown.map(rowFor));
    $("shown").textContent =
      "(" + shown.length + (shown.length === state.records.size ? "" : " of " + state.records.size) + ")";
    $("empty").hidden = state.records.size > 0;
    renderStats(shown);
    refreshOptions("f-model", "model");
    refreshOptions("f-route", "route");
  }

  // over the requests shown; realtime sessions are left out (their "request time" is how long
  // they stayed open), as gateway/live/recent.py's stats() leaves them out
  function renderStats(shown) {
    const records = shown.filter((r) => !r.realtime);
    for (const card of document.querySelectorAll("#stats .card")) {
      const key = card.dataset.metric;
      const values = records.map((r) => r[key]).filter((v) => v !== null && v !== undefined);
      values.sort((a, b) => a - b);
      const dl = card.querySelector("dl");
      dl.replaceChildren();
      for (const p of [50, 90, 99]) {
        const dd = el("dd", "", values.length ? ms(percentile(values, p)) + " ms" : "–");
        dd.dataset.p = "p" + p;
        const v = percentile(values, p);
        dd.dataset.value = v === null ? "" : String(v);
        dl.append(el("dt", "", "p" + p), dd);
      }
      const n = el("dd", "", values.length);
      n.dataset.p = "count";
      dl.append(el("dt", "", "n"), n);
    }
  }

  function refreshOptions(id, key) {
    const select = $(id);
    const values = [...new Set([...state.records.values()].map((r) => r[key]).filter((v) => v))].sort();
    const have = [...select.options].slice(1).map((o) => o.value);
    if (have.length === values.length && have.every((v, i) => v === values[i])) return;
    const current = select.value;
    select.replaceChildren(el("option", "", "all"));
    select.options[0].value = "";
    for (const v of values) {
      const o = el("option", "", v);
      o.value = v;
      select.append(o);
    }
    if (values.includes(current)) select.value = current;
  }

  function rowFor(rec) {
    let tr = state.rows.get(rec.seq);
    if (tr) return tr;
    tr = el("tr", "req");
    const d = tr.dataset;
    d.seq = rec.seq;
    d.id = rec.id;
    d.status = rec.status;
    d.cache = rec.cache;
    d.requestMs = rec.request_ms;
    d.totalMs = rec.total_ms;
    d.edgeMs = rec.edge_ms;
    if (rec.status >= 400 || rec.error) tr.classList.add("err");
    if (state.selected === rec.seq) tr.classList.add("selected");
    if (rec._fresh) {
      tr.classList.add("fresh");
      setTimeout(() => tr.classList.remove("fresh"), 1600);
    }
    const when = new Date(rec.time * 1000);
    const time = when.toLocaleTimeString([], { hour12: false }) + "." + String(when.getMilliseconds()).padStart(3, "0");
    const wf = el("td", "wf-cell");
    const method = el("td", "method", rec.method);
    if (rec.realtime) {
      tr.classList.add("ws");
      d.messagesIn = rec.realtime.messages_in;
      d.messagesOut = rec.realtime.messages_out;
      d.closeCode = rec.realtime.close_code ?? "";
      method.append(badge());
      wf.append(sessionSummary(rec));
    } else {
      wf.append(waterfall(rec));
    }
    tr.append(
      el("td", "mono", time),
      el("td", "mono id", rec.id),
      method,
      el("td", "mono path", rec.path),
      el("td", "mono", rec.mcp ? mcpLabel(rec.mcp) : rec.a2a ? a2aLabel(rec.a2a) : rec.model || "–"),
      el("td", "", rec.route || "–"),
      el("td", "", rec.backend || "–"),
      el("td", "status", rec.status),
      el("td", rec.cache === "hit" ? "cache-hit" : "", rec.cache),
      el("td", "", rec.tenant || "–"),
      el("td", "num cost", usd(rec.cost_usd)),
      el("td", "num", ms(rec.request_ms)),
      el("td", "num", ms(rec.overhead_ms)),
      el("td", "num", ms(rec.upstream_ms)),
      el("td", "num", ms(rec.ttft_ms)),
      wf,
    );
    tr.children[1].title = rec.id;
    tr.children[3].title = rec.path;
    if (rec.error) tr.children[7].title = rec.error.type + ": " + rec.error.message;
    tr.addEventListener("click", () => select(rec));
    state.rows.set(rec.seq, tr);
    return tr;
  }

  // an MCP request (docs/spec.md §23): "tools/call echo" in the model column
  function mcpLabel(m) {
    const label = [m.method, m.tool].filter(Boolean).join(" ");
    return m.status && m.status !== "ok" ? label + " (" + m.status + ")" : label;
  }

  // an A2A call (docs/spec.md §30): "SendMessage echo → completed" in the model column
  function a2aLabel(a) {
    const label = [a.method, a.agent].filter(Boolean).join(" ") + (a.state ? " → " + a.state : "");
    return a.status && a.status !== "ok" ? label + " (" + a.status + ")" : label;
  }

  // ---------------------------------------------------------------- realtime sessions (§19)

  function badge() {
    const b = el("span", "badge", "WS");
    b.title = "realtime session (WebSocket)";
    return b;
  }

  // how long a session was (or has been) open: ms below a second, then s, m, h
  function duration(v) {
    if (v === null || v === undefined) return "–";
    if (v < 1000) return ms(v) + " ms";
    const s = v / 1000;
    if (s < 60) return s.toFixed(1) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " m " + String(Math.floor(s % 60)).padStart(2, "0") + " s";
    return Math.floor(m / 60) + " h " + String(m % 60).padStart(2, "0") + " m";
  }

  // 1000 (normal) and 1001 (going away) are how sessions end; anything else is worth a look
  function oddClose(code) {
    return code !== 1000 && code !== 1001;
  }

  // "1000 by client"; an open session has no close yet, one that ended without one says so
  function closeText(rt) {
    if (rt.open) return "– (open)";
    if (rt.close_code === null || rt.close_code === undefined) return "no close code";
    return rt.close_code + (rt.closed_by ? " by " + rt.closed_by : "");
  }

  // what a finished session's row shows where a request shows its waterfall
  function sessionSummary(rec) {
    const rt = rec.realtime;
    const sum = el("div", "session-sum");
    const close = el("span", "close" + (oddClose(rt.close_code) ? " close-odd" : ""), "close " + closeText(rt));
    if (rt.close_reason) close.title = rt.close_reason;
    sum.append(
      el("span", "dur", duration(rec.request_ms)),
      el("span", "", " · messages in "),
      el("span", "msgs-in", rt.messages_in),
      el("span", "", " / out "),
      el("span", "msgs-out", rt.messages_out),
      el("span", "", " · "),
      el("span", "resp-count", rt.responses_total + (rt.responses_total === 1 ? " response" : " responses")),
      el("span", "", " · "),
      close,
    );
    return sum;
  }

  async function loadRealtime() {
    let r;
    try {
      r = await fetch("api/realtime", { credentials: "same-origin", cache: "no-store" });
    } catch (err) {
      return;
    }
    if (!r.ok) return;
    const body = await r.json();
    state.open = new Map(body.open.map((s) => [s.request_id, s]));
    $("sessions-section").hidden = body.open.length === 0;
    $("sessions-count").textContent = "(" + body.open.length + ")";
    $("sessions").tBodies[0].replaceChildren(...body.open.map(openRow));
    // an open session shown in the detail: its responses so far; once it ended, its record
    const id = state.selectedOpen;
    if (id === null) return;
    if (state.open.has(id)) {
      showOpen(state.open.get(id));
      return;
    }
    const ended = [...state.records.values()].find((rec) => rec.id === id && rec.realtime);
    if (ended) select(ended);
  }

  function lastTtft(responses) {
    for (let i = responses.length - 1; i >= 0; i--) {
      if (responses[i].ttft_ms !== null && responses[i].ttft_ms !== undefined) return responses[i].ttft_ms;
    }
    return null;
  }

  function openRow(s) {
    const tr = el("tr", "open-session");
    tr.dataset.id = s.request_id;
    tr.dataset.messagesIn = s.messages_in;
    tr.dataset.messagesOut = s.messages_out;
    tr.dataset.responses = s.responses_total;
    const started = new Date(s.started_ns / 1e6);
    const id = el("td", "mono id", s.request_id);
    id.title = s.request_id;
    id.append(badge());
    tr.append(
      el("td", "mono", started.toLocaleTimeString([], { hour12: false })),
      id,
      el("td", "mono", s.model || "–"),
      el("td", "", s.route || "–"),
      el("td", "", s.backend || "–"),
      el("td", "", s.tenant || "–"),
      el("td", "num dur", duration(s.duration_ms)),
      el("td", "num msgs-in", s.messages_in),
      el("td", "num msgs-out", s.messages_out),
      el("td", "num", s.responses_total),
      el("td", "num ttft", ms(lastTtft(s.responses))),
    );
    tr.addEventListener("click", () => showOpen(s));
    return tr;
  }

  function sessionFacts(rt) {
    const shown = rt.responses.length;
    return [
      ["messages in / out", rt.messages_in + " / " + rt.messages_out],
      ["close", closeText(rt) + (rt.close_reason ? " (" + rt.close_reason + ")" : "")],
      ["responses", rt.responses_total + (shown < rt.responses_total ? " (the last " + shown + " listed)" : "")],
    ];
  }

  // the session's responses (the last 50 it kept), oldest first as they happened
  function showResponses(rt) {
    $("d-responses-block").hidden = !rt;
    const tbody = $("d-responses").tBodies[0];
    if (!rt) {
      tbody.replaceChildren();
      return;
    }
    $("d-responses-title").textContent = rt.responses.length ? "responses" : "responses: none yet";
    tbody.replaceChildren(
      ...rt.responses.map((x) => {
        const tr = el("tr", "response");
        tr.dataset.id = x.id;
        tr.dataset.ttftMs = x.ttft_ms ?? "";
        tr.append(
          el("td", "mono", x.id),
          el("td", x.status === "completed" ? "" : "error", x.status),
          el("td", "num ttft", ms(x.ttft_ms)),
          el("td", "num", ms(x.duration_ms)),
          el("td", "num tokens-in", x.input_tokens ?? "–"),
          el("td", "num", x.cached_tokens ?? "–"),
          el("td", "num tokens-out", x.output_tokens ?? "–"),
          el("td", "num cost", usd(x.cost_usd)),
        );
        return tr;
      }),
    );
  }

  // an open session in the detail (from api/realtime; refreshed with it while it stays open)
  function showOpen(s) {
    unselect();
    state.selectedOpen = s.request_id;
    $("detail").hidden = false;
    $("d-kind").textContent = "Open session";
    $("d-id").textContent = s.request_id;
    const facts = [
      ["model", s.model || "–"],
      ["backend", s.backend || "–"],
      ["open for", duration(s.duration_ms)],
      ...sessionFacts(s),
    ];
    const dl = $("d-facts");
    dl.replaceChildren();
    for (const [k, v] of facts) dl.append(el("dt", "", k), el("dd", "mono", v));
    showResponses(s);
    $("d-hops").hidden = true;
    $("d-content").replaceChildren();
  }

  function hopLabel(h) {
    if (h.kind === "upstream") {
      return "upstream #" + h.attempt + " " + h.backend + (h.status ? " → " + h.status : "") + (h.error ? " (" + h.error + ")" : "");
    }
    if (h.kind === "edge") return "hop " + h.name + " (from its header)";
    if (h.kind === "backoff") return "backoff (waiting to retry)";
    if (h.name === "intake") return "intake (the gateway's server: parsing, dispatch)";
    return h.name;
  }

  function waterfall(rec) {
    const wf = el("div", "wf");
    let scale = rec.total_ms;
    for (const s of rec.details) scale = Math.max(scale, s.start_ms + s.dur_ms);
    scale = Math.max(scale, 0.001);
    for (const h of rec.hops) {
      const bar = el("span", "bar k-" + h.kind + " n-" + String(h.name).replace(/[^A-Za-z0-9_-]/g, "_"));
      bar.style.left = pct(h.start_ms / scale);
      bar.style.width = pct(h.dur_ms / scale);
      bar.dataset.name = h.name;
      bar.dataset.kind = h.kind;
      bar.dataset.startMs = h.start_ms;
      bar.dataset.durMs = h.dur_ms;
      bar.title = hopLabel(h) + ": " + ms(h.dur_ms) + " ms";
      if (h.kind === "upstream") {
        if (h.error || h.status >= 500) bar.classList.add("failed");
        if (h.first_byte_ms !== undefined && h.dur_ms > 0) {
          const wait = el("span", "wait");
          wait.style.width = pct((h.first_byte_ms - h.start_ms) / h.dur_ms);
          bar.append(wait);
        }
      }
      wf.append(bar);
    }
    for (const s of rec.details) {
      const sub = el("span", "sub");
      sub.style.left = pct(s.start_ms / scale);
      sub.style.width = pct(s.dur_ms / scale);
      sub.dataset.name = s.name;
      sub.dataset.durMs = s.dur_ms;
      sub.title = s.name + (s.error ? " (cache unavailable)" : "") + ": " + ms(s.dur_ms) + " ms";
      wf.append(sub);
    }
    const first = rec.marks.first_content_ms;
    if (first !== null && first !== undefined) {
      const mark = el("span", "mark");
      mark.style.left = pct(first / scale);
      mark.title = "first token at " + ms(rec.ttft_ms) + " ms";
      wf.append(mark);
    }
    wf.title = "total " + ms(rec.total_ms) + " ms";
    return wf;
  }

  // ---------------------------------------------------------------- one request in detail

  function unselect() {
    if (state.selected !== null) {
      const old = state.rows.get(state.selected);
      if (old) old.classList.remove("selected");
    }
    state.selected = null;
    state.selectedOpen = null;
  }

  function select(rec) {
    unselect();
    state.selected = rec.seq;
    const row = state.rows.get(rec.seq);
    if (row) row.classList.add("selected"); // (a row not drawn yet is marked when it is)
    $("detail").hidden = false;
    $("d-kind").textContent = rec.realtime ? "Session" : "Request";
    $("d-id").textContent = rec.id;
    const facts = [
      ["trace id", rec.trace_id ? rec.trace_id + (rec.sampled ? "" : " (not sampled)") : "–"],
      ["status", rec.status],
      ["error", rec.error ? rec.error.type + ": " + rec.error.message : "–"],
      ["stream", rec.stream ? "yes" : "no"],
      ["tokens in / out", (rec.tokens.input ?? "–") + " / " + (rec.tokens.output ?? "–")],
      ["cost $", rec.cost_usd === null || rec.cost_usd === undefined ? "– (no price)" : String(rec.cost_usd)],
      ["attempts", rec.attempts.length],
      ["backoff ms", ms(rec.backoff_ms)],
      ["edge ms", ms(rec.edge_ms)],
      ["total ms", ms(rec.total_ms)],
    ];
    if (rec.realtime) facts.push(["duration", duration(rec.request_ms)], ...sessionFacts(rec.realtime));
    const discarded = Object.entries(rec.edge_discarded || {});
    if (discarded.length) facts.push(["edge headers discarded", discarded.map(([k, v]) => k + ": " + v).join(", ")]);
    const dl = $("d-facts");
    dl.replaceChildren();
    for (const [k, v] of facts) dl.append(el("dt", "", k), el("dd", "mono", v));
    const rows = [];
    for (const h of rec.hops) rows.push([hopLabel(h), h.start_ms, h.dur_ms, h.kind]);
    for (const s of rec.details) rows.push(["  " + s.name, s.start_ms, s.dur_ms, "inside " + (s.parent || "the request") + ", not in the sum"]);
    showResponses(rec.realtime);
    $("d-hops").hidden = false;
    const tbody = $("d-hops").tBodies[0];
    tbody.replaceChildren(
      ...rows.map(([name, start, dur, about]) => {
        const tr = el("tr");
        tr.append(el("td", "mono", name), el("td", "num", ms(start)), el("td", "num", ms(dur)), el("td", "muted", about));
        return tr;
      }),
    );
    const content = $("d-content");
    content.replaceChildren();
    if (rec.input !== undefined) {
      content.append(el("h3", "", "prompt (tracing.capture_content)"), el("pre", "", rec.input ?? "–"));
      content.append(el("h3", "", "completion"), el("pre", "", rec.output ?? "–"));
    }
  }

  // ---------------------------------------------------------------- sign in / out

  function showSignin(message) {
    $("view").hidden = true;
    $("signin").hidden = false;
    $("signin-message").textContent = message || "";
    setConn("closed", "signed out");
    if (state.es !== null) {
      state.es.close();
      state.es = null;
    }
  }

  $("signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = $("signin-key").value.trim();
    // cleared now, not when the answer comes: a late answer (a loaded machine) would wipe a
    // key typed meanwhile, and the next submit of the empty required field would do nothing
    $("signin-key").value = "";
    const r = await fetch("api/session", {
      method: "POST",
      credentials: "same-origin",
      headers: { Authorization: "Bearer " + key },
    });
    if (r.ok) load();
    else $("signin-message").textContent = await errorMessage(r);
  });

  $("signout").addEventListener("click", async () => {
    await fetch("api/session", { method: "DELETE", credentials: "same-origin" });
    showSignin("signed out");
  });

  $("d-close").addEventListener("click", () => {
    $("detail").hidden = true;
    unselect();
  });

  for (const id of ["f-status", "f-model", "f-route", "f-slow", "f-pause"]) {
    $(id).addEventListener("change", render);
  }

  load();
})();
